"""Where each tool result on a branch came from, as a step records it.

A branch answers a side-effect call without running the tool (from the record, by the user's
simulator, or with a forced result) and runs a safe tool live. Every adapter notes the source
of each call it answers, by tool call id, and writes it on the step the call belongs to as
``meta["tool_sources"]`` (``{tool call id: ToolSource}``), so the step shows a simulated result
as simulated, not as a call that happened. This module imports no framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from car_core.contract import Step, ToolSource

from .messages import calls_of

TOOL_SOURCES = "tool_sources"  # the step meta key


def sources_of(action: Any, found: Mapping[str, ToolSource]) -> dict[str, ToolSource]:
    """The ``meta["tool_sources"]`` of a step whose action is ``action``: the source of each of
    its tool calls the branch answered (``found``: tool call id -> source), in call order."""
    return {cid: found[cid] for cid, _, _ in calls_of(action) if cid in found}


def with_sources(step: Step, found: Mapping[str, ToolSource]) -> Step:
    """``step`` with ``meta["tool_sources"]`` for its answered tool calls (unchanged when the
    branch answered none of them)."""
    sources = sources_of(step.action, found)
    if not sources:
        return step
    return replace(step, meta={**step.meta, TOOL_SOURCES: sources})


__all__ = ["TOOL_SOURCES", "sources_of", "with_sources"]
