"""Where each tool result on a branch came from, as a step records it.

A branch answers a side-effect call without running the tool (from the record, by the user's
simulator, or with a forced result) and runs a safe tool live. Every adapter notes the source
of each call it answers, by tool call id, and writes it on the step the call belongs to as
``meta["tool_sources"]`` (``{tool call id: ToolSource}``), so the step shows a simulated result
as simulated, not as a call that happened. This module imports no framework.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from car_core.contract import Step, ToolSource, says_service_down

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


def tool_errors(messages: Iterable[Any]) -> dict[str, str]:
    """The tool results that came back as errors, by tool call id, with their text: from a
    final state's stored dicts (``"status": "error"``) or a framework's message objects, and
    results a tool returned as plain text that read as an outage (``reads_as_outage``)."""
    out = {}
    for m in messages:
        get = m.get if isinstance(m, Mapping) else lambda k, m=m: getattr(m, k, None)
        if not get("tool_call_id"):
            continue
        text = result_text(get("content"))
        if get("status") == "error" or reads_as_outage(text):
            out[str(get("tool_call_id"))] = text
    return out


_ERROR_FIRST = re.compile(r"\s*(?:error|exception|failed|failure)\b", re.IGNORECASE)


def reads_as_outage(text: str) -> bool:
    """A result a tool returned, not raised, that opens as an error and blames its service
    ("Error: hotel search service unavailable (503)"): the tool caught its own failure. A user
    trial's branches got that text from a search that was down and the agent apologised,
    which CAR scored as a rescue of 65% at a step whose rescue was 0. Only a text that opens
    with the error counts: a search result that mentions a 503 is an answer."""
    return bool(_ERROR_FIRST.match(text)) and says_service_down(text)


def result_text(content: Any) -> str:
    """A tool result's words: its content blocks' text joined (an MCP tool's result is a
    list of blocks; a record may keep them as JSON text), else the content as a string, so a
    branch's result and the record's compare alike."""
    if isinstance(content, str) and content[:1] in ("[", "{"):
        try:
            content = json.loads(content)
        except ValueError:
            return str(content)
    if isinstance(content, Mapping) and "text" in content:
        content = [content]
    if isinstance(content, list):
        texts = [str(b.get("text")) for b in content if isinstance(b, Mapping) and "text" in b]
        if texts:
            return " ".join(texts)
    if isinstance(content, (list, Mapping)):
        return json.dumps(content, sort_keys=True)
    return str(content or "")


def drifted_tools(recorded: Iterable[Step], recorded_errors: Collection[str],
                  branch: Iterable[Step], branch_errors: Mapping[str, str]) -> str | None:
    """What a branch must not be scored for: a safe tool that ran live on it and returned an
    error (``branch_errors``: call id -> its text) for a call the record made with the same
    arguments and got an answer for (``recorded_errors``: the record's errored call ids), or,
    for any call, an error that says its service is down (``says_service_down``). The tool's
    world has changed since the record (a service down, a credential missing where the
    estimate runs), and the agent's reply to the error would be scored as what re-deciding
    the step does. An error for arguments the record never used that blames the call (an
    unknown order) is the agent's own doing, and is scored; so is one from a tool the record
    saw fail too (the same world). None when no call drifted."""
    calls = [(cid, name, args) for step in recorded for cid, name, args in calls_of(step.action)]
    answered = {(name, args) for cid, name, args in calls if cid not in recorded_errors}
    # a tool the record saw fail (or cannot say it did not) was in the same world then
    failing = {name for cid, name, _ in calls if cid in recorded_errors}
    for step in branch:
        sources = step.meta.get(TOOL_SOURCES) or {}
        for cid, name, args in calls_of(step.action):
            if cid not in branch_errors or sources.get(cid) != ToolSource.LIVE:
                continue
            said = " ".join(branch_errors[cid].split())[:200]
            if (name, args) in answered:
                return (f"safe tool {name!r} ran live at step {step.index} and returned an "
                        f"error for arguments {args} ({said!r}), where the record's identical "
                        "call was answered: the tool answers differently where this estimate "
                        "runs (a service down, a credential missing), so the branch cannot "
                        "stand for the recorded run and is not scored")
            if name not in failing and says_service_down(said):
                return (f"safe tool {name!r} ran live at step {step.index} and returned an "
                        f"error that says its service is down ({said!r}): the agent's reply "
                        "to an outage is not what re-deciding the step does, so the branch is "
                        "not scored")
    return None


__all__ = ["TOOL_SOURCES", "drifted_tools", "reads_as_outage", "sources_of", "tool_errors",
           "with_sources"]
