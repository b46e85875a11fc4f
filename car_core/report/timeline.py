"""The run as the page draws it: a row per step (who decided it, what it cost, how long it
took, where a branch step and its tool results came from), the context the locus decided from,
and a branch beside the factual run, line by line with long identical stretches folded."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from car_core import formatting as fmt
from car_core.model.checks import is_real
from car_core.model.context_sources import before_run
from car_core.model.trajectory import Trajectory, step_label
from car_core.model.vocabulary import Origin
from car_core.report.values import _fmt, _is_message, _message_text, compact, seconds, show

RECENT = 6  # earlier context items (and identical diff lines) shown before folding the rest


def _timeline(run: Trajectory, locus: int | None) -> list[dict[str, Any]]:
    items = []
    for s in run.steps:
        origin = s.meta.get("origin", Origin.RECORD) if run.lineage else Origin.RECORD
        items.append({
            "index": s.index, "locus": s.index == locus,
            "origin": origin, "origin_label": fmt.origin_label(origin),
            "tool_marks": [{"name": name, "source": source, "words": words}
                           for name, source, words in fmt.tool_marks(s.action, s.meta)],
            "model": s.meta.get("model"),
            "who": step_label(run, s.index) if s.meta.get("agent") else None,
            "node": s.meta.get("node"),
            "prompt": show(" ".join(_message_text(m) for m in s.meta["prompt"]
                                    if isinstance(m, Mapping)))
            if isinstance(s.meta.get("prompt"), list) else None,
            "action": show(s.action), "observation": show(s.observation) if s.observed else None,
            "state": show(s.state) if s.state is not None else None,
            **_cost(s.meta),
        })
    return items


def _cost(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A step's latency and tokens as its recorder stored them (``latency_s``, ``usage``), each
    None when it did not."""
    latency = meta.get("latency_s")
    usage = meta.get("usage") if isinstance(meta.get("usage"), Mapping) else None
    if not is_real(latency) \
            or not math.isfinite(latency) or latency < 0:
        latency = None

    def count(key: str) -> int | None:
        v = (usage or {}).get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return {"latency": None if latency is None else float(latency),
            "prompt_tokens": count("prompt_tokens"),
            "completion_tokens": count("completion_tokens")}


def _costs(timeline: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-step latency and token table, with totals over the steps that recorded them."""
    if not timeline:
        return {}

    def total(key: str) -> Any:
        vals = [t[key] for t in timeline if t[key] is not None]
        return sum(vals) if vals else None

    recorded = any(t[k] is not None for t in timeline
                   for k in ("latency", "prompt_tokens", "completion_tokens"))
    return {"recorded": recorded, "latency": seconds(total("latency")),
            "prompt_tokens": total("prompt_tokens"),
            "completion_tokens": total("completion_tokens")}


def _decided_from(run: Trajectory, k: int) -> dict[str, Any]:
    """The exact state ``s_k``: the recorded messages when the agent kept them, else the run's
    context and every earlier step (which is exactly what a FunctionAgent policy receives)."""
    step = run.steps[k]
    if step.state is not None:
        if isinstance(step.state, list) and all(_is_message(m) for m in step.state):
            # what the run began from (an earlier turn's, a session's) marked as `car what`
            # marks it: a trial read a first turn's note as the run's own
            before = before_run(run, k) if run.steps[0].state is not None else 0
            msgs = [{"role": _role_class(m.get("role")),
                     "text": (f"(before this run) {_message_text(m)}"
                              if i < before and m.get("role") == "assistant"
                              else _message_text(m))}
                    for i, m in enumerate(step.state)]
            return {"messages": msgs[-RECENT:], "folded_messages": msgs[:-RECENT],
                    "context": None, "prior": [], "folded": []}
        return {"messages": None, "folded_messages": [], "context": show(step.state),
                "prior": [], "folded": []}
    prior = [{"index": p.index, "action": show(p.action),
              "observation": show(p.observation) if p.observed else None}
             for p in run.steps[:k]]
    return {"messages": None, "folded_messages": [], "context": show(run.context),
            "prior": prior[-RECENT:], "folded": prior[:-RECENT]}


ROLE_CLASSES = ("system", "user", "assistant", "tool")


def _role_class(role: Any) -> str:
    """The style a message's role gets: one of the four chat roles, else ``other``. The role
    is the agent's text, so it never becomes a class name of its own (``system tag locus``
    would otherwise be styled as the locus)."""
    return role if role in ROLE_CLASSES else "other"


def _diff_lines(run: Trajectory | Mapping[str, Any], marked: bool = False) -> list[str]:
    """One line per action, observation and the outcome; ``marked``: each line of a branch
    also says where it came from (held or re-decided; each tool result live, from the record
    or simulated), the same lines in the same places."""
    data = run.to_dict() if isinstance(run, Trajectory) else dict(run)
    branch = marked and bool(data.get("lineage"))  # a recorded run's steps are all "live"
    lines = []
    for s in data.get("steps") or []:
        meta = s.get("meta") or {}
        origin = fmt.origin_label(meta.get("origin")) if branch else None
        lines.append(f"step {s['index']} action{f' ({origin})' if origin else ''}: "
                     f"{compact(s.get('action'))}")
        if s.get("observed"):
            marks = fmt.tool_marks_text(s.get("action"), meta) if marked else None
            lines.append(f"step {s['index']} observation{f' ({marks})' if marks else ''}: "
                         f"{compact(s.get('observation'))}")
    out = data.get("outcome")
    if out:
        lines.append(f"outcome: {_fmt(out.get('value'))}")
    return lines


def _diff(factual: Trajectory | Mapping[str, Any], branch: Mapping[str, Any]
          ) -> list[dict[str, Any]]:
    """Side-by-side rows (left = factual, right = counterfactual) from difflib opcodes, matched
    on the values; the right side's lines say where each came from (``_diff_lines``)."""
    a, b = _diff_lines(factual), _diff_lines(branch)
    shown = _diff_lines(branch, marked=True)
    rows: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        left, right = a[i1:i2], shown[j1:j2]
        chunk: list[dict[str, Any]] = [{"tag": tag, "left": left[i] if i < len(left) else "",
                  "right": right[i] if i < len(right) else ""}
                 for i in range(max(len(left), len(right)))]
        keep = RECENT // 2
        if tag == "equal" and len(chunk) > RECENT:
            # Long identical stretches (the held prefix) fold away, keeping a few lines of
            # context on each side of a change.
            head = chunk[:keep] if rows else []
            tail = chunk[-keep:]
            hidden = chunk[len(head):len(chunk) - keep]
            chunk = [*head, {"tag": "fold", "rows": hidden, "left": "", "right": ""}, *tail]
        rows.extend(chunk)
    return rows
