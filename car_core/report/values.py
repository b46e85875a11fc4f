"""Agent values and numbers as the page writes them: chat messages as ``[role] text``,
other JSON shown in full (``show``) or on one line (``compact``), numbers in the digits of
every other surface (``car_core.formatting``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from car_core import formatting as fmt
from car_core.errors import InvalidInput
from car_core.formatting.rows import NOT_RULED_OUT, NOT_TESTED, RULED_OUT
from car_core.model.trajectory import Trajectory


def show(value: Any) -> str:
    """A readable rendering of a JSON value: chat messages as ``[role] text``, strings as is,
    anything else as indented JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if _is_message(value):
        return _message_text(value)
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        return "\n".join(_message_text(m) for m in value)
    one_line = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(one_line) <= 100:
        return one_line
    return json.dumps(value, indent=2, ensure_ascii=False)


def compact(value: Any) -> str:
    """One line per value, for diffs and summaries."""
    if isinstance(value, str):
        return value.replace("\n", " ⏎ ")
    if _is_message(value) or (isinstance(value, list) and value
                              and all(_is_message(m) for m in value)):
        return show(value).replace("\n", " ⏎ ")
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str)


def _message_text(msg: Mapping[str, Any]) -> str:
    role = msg.get("role")
    name = msg.get("name")
    head = f"[{role}{' ' + str(name) if name and role == 'tool' else ''}]"
    parts = []
    content = msg.get("content")
    if isinstance(content, list):  # multi-part content: keep the text parts
        content = " ".join(str(p.get("text", p)) if isinstance(p, dict) else str(p)
                           for p in content)
    if content:
        parts.append(str(content))
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f"→ {fn.get('name', '?')}({fn.get('arguments', '')})")
    return f"{head} {' '.join(parts) if parts else '(empty)'}"


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _as_dict(result: Any) -> dict[str, Any]:
    if isinstance(result, Mapping):
        return dict(result)
    to_dict = getattr(result, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise InvalidInput(f"cannot render a {type(result).__name__} as an attribution",
                       hint="pass a contrastive/Shapley result or its to_dict()")


def _as_run(run: Any) -> Trajectory | None:
    if run is None or isinstance(run, Trajectory):
        return run
    if isinstance(run, Mapping):
        return Trajectory.from_dict(dict(run), verify=False)
    raise InvalidInput(f"run must be a car.Trajectory or its dict, not {type(run).__name__}")


def _fmt(x: Any, digits: int = 2) -> str:
    return fmt.num(x, digits)


def _ci(ci: Any) -> str:
    return fmt.interval(ci)


def _pct(level: Any) -> str:
    return fmt.pct(level)


def _step_cells(s: Mapping[str, Any], r: Mapping[str, Any] | None = None) -> dict[str, str]:
    """A rescue-table row in the words and digits of every other surface
    (``formatting.shown_sample``): held and re-drawn are of the sample the rescue and its
    interval were computed from, so the row's three numbers agree; ``tested`` in the plain
    table's words (``formatting.step_row``): a later step the budget left open is "not ruled
    out", as the plot and the CLI say (a trial's table said "not tested" beside them)."""
    held, redrawn, n = fmt.shown_sample(SimpleNamespace(
        estimate=s.get("estimate", "raw"), refit_held=s.get("refit_held"),
        refit_resampled=s.get("refit_resampled"), refit_n=s.get("refit_n", 0),
        fail_held=s.get("fail_held"), fail_resampled=s.get("fail_resampled"),
        n=s.get("n", 0) or 0))
    return {"rescue": fmt.effect(s.get("effect")), "ci": fmt.effect_interval(s.get("ci")),
            "held": fmt.prob(held), "redrawn": fmt.prob(redrawn),
            "n": str(n), "tested": _tested_cell(s, r or {})}


def _tested_cell(s: Mapping[str, Any], r: Mapping[str, Any]) -> str:
    if s.get("ruled_out"):
        return RULED_OUT
    if s.get("tested"):
        return "yes" + (" · significant" if s.get("significant") else "")
    untested = fmt.untested_mark(r, int(s.get("step", 0))) if r else NOT_TESTED
    return NOT_RULED_OUT if untested == NOT_RULED_OUT else NOT_TESTED


def seconds(x: float | None) -> str:
    """A latency for people: milliseconds under a second, else seconds; ``—`` when absent."""
    if x is None:
        return fmt.MISSING
    if x < 0.01:
        return f"{x * 1000:.1f} ms"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"
