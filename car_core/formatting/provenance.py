"""Where a branch step and its tool results came from, in the words every view uses.

A branch step is either held (copied from the record: no model or tool call) or decided on
the branch; each tool result of a decided step ran live, came from the record, was simulated
or was forced (``step.meta["tool_sources"]``, a ``ToolSource`` per tool call id). ``car show``
and the report say so beside the step, so a simulated order never reads as one that was placed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core.model.vocabulary import Origin, ToolSource

# what each origin means, after its name: "held: copied from the record"
ORIGIN_MEANINGS: dict[str, str] = {
    Origin.RECORD: "as recorded",
    Origin.HELD: "copied from the record",
    Origin.FORCED: "its action was set, not decided",
    Origin.LIVE: "re-decided",
    Origin.EDITED: "re-decided after a do_context edit",
    Origin.POLICY_SWAPPED: "re-decided by the swapped-in policy",
}
SOURCE_WORDS: dict[str, str] = {
    ToolSource.LIVE: "ran live",
    ToolSource.RECORD: "from the record, the tool did not run",
    ToolSource.SIMULATOR: "simulated, the tool did not run",
    ToolSource.FORCED: "given by do_observation, the tool did not run",
}


def origin_label(origin: Any) -> str | None:
    """``"held: copied from the record"``, ``"live: re-decided"``, …; None for no origin."""
    if not origin:
        return None
    meaning = ORIGIN_MEANINGS.get(str(origin))
    return f"{origin}: {meaning}" if meaning else str(origin)


def origins_legend(origins: Any) -> str | None:
    """One line saying what each origin among ``origins`` means, in first-seen order
    (``"held = copied from the record; live = re-decided"``), None when only recorded steps,
    or none, are there."""
    seen = [str(o) for o in dict.fromkeys(origins) if o and o != Origin.RECORD]
    return "; ".join(f"{o} = {ORIGIN_MEANINGS.get(o, o)}" for o in seen) or None


def tool_marks(action: Any, meta: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """``(tool name, source, words)`` for each tool result the step's meta says the source
    of, in the order of the action's calls; none for a held step (its results are the
    record's, copied whole). A source this version does not know is shown as its name."""
    meta = meta or {}
    sources = meta.get("tool_sources")
    if not isinstance(sources, Mapping) or meta.get("origin") == Origin.HELD:
        return []
    names = _call_names(action)
    order = [cid for cid in names if cid in sources] + [c for c in sources if c not in names]
    return [(names.get(cid, str(cid)), str(sources[cid]),
             SOURCE_WORDS.get(str(sources[cid]), str(sources[cid]))) for cid in order]


def tool_marks_text(action: Any, meta: Mapping[str, Any] | None) -> str | None:
    """The step's tool marks on one line (``"order_laptop: simulated, the tool did not run"``),
    or None when it has none."""
    marks = tool_marks(action, meta)
    return "; ".join(f"{name}: {words}" for name, _, words in marks) or None


def _call_names(action: Any) -> dict[str, str]:
    """Tool call id -> tool name, for an OpenAI-style assistant message."""
    calls = action.get("tool_calls") if isinstance(action, Mapping) else None
    out: dict[str, str] = {}
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, Mapping):
            fn = call.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else call.get("name")
            out[str(call.get("id"))] = str(name)
    return out
