"""What the report's "what" panel and "fixes" table show, shaped from a context attribution and
a repair ranking (their ``to_dict()`` or the objects); the partials ``what.html.j2`` and
``fixes.html.j2`` draw it. Kept apart from ``car_core.report`` so the page gains both with one
call there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core.secrets.redact import redact_json


def _dict(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    data = value.to_dict() if hasattr(value, "to_dict") else dict(value)
    return dict(redact_json(data))


def _signed(x: Any) -> str:
    return "—" if x is None else f"{float(x):+.2f}"


def _interval(ci: Any) -> str:
    return "" if not ci else f"[{float(ci[0]):+.2f}, {float(ci[1]):+.2f}]"


def what_panel(result: Any) -> dict[str, Any] | None:
    r = _dict(result)
    if r is None:
        return None
    rows = sorted(r.get("sources") or [], key=lambda s: (not s.get("named"),
                                                          -float(s.get("effect") or 0)))
    named = [s for s in rows if s.get("named")]
    lead = (f"Removing {', '.join(s['label'] for s in named)} alone rescues the run "
            f"(family-wise error ≤ {r.get('alpha')}, {r.get('test')})." if named else
            "No source of this step's context was shown to cause the failure"
            + (" (undecided: the budget ran out)." if r.get("truncated") else "."))
    return {"step": r.get("step"), "lead": lead,
            "rows": [{"label": s.get("label"), "text": s.get("text"), "named": s.get("named"),
                      "effect": _signed(s.get("effect")), "ci": _interval(s.get("ci")),
                      "rescue": (_signed(s.get("rescue")) + " "
                                 + _interval(s.get("rescue_ci"))).strip()}
                     for s in rows],
            "note": f"{r.get('rollouts_used')} rollouts; effect = P(fail) with the source kept "
                    f"minus removed over random contexts of the others, at "
                    f"{float(r.get('level') or 0):.0%}; coupled={r.get('coupled')}."}


def fixes_table(result: Any) -> dict[str, Any] | None:
    r = _dict(result)
    if r is None:
        return None
    u = r.get("unrepaired") or {}
    best = r.get("best")
    rows = []
    for i, f in enumerate(r.get("ranked") or [], 1):
        verdict = ("best, rescues" if f.get("label") == best and f.get("validated") else
                   "rescues" if f.get("validated") else
                   "dropped: clearly worse" if f.get("dropped_at") else "not shown to rescue")
        rows.append({"rank": i, "label": f.get("label"), "kind": f.get("kind"),
                     "best": f.get("label") == best,
                     "p_fail": f"{float(f['p_fail']):.2f} {_interval(f.get('ci'))}",
                     "rescue": f"{_signed(f.get('rescue'))} {_interval(f.get('rescue_ci'))}",
                     "verdict": verdict})
    return {"step": r.get("step"), "rows": rows,
            "unrepaired": f"{float(u.get('p_fail') or 0):.2f} {_interval(u.get('ci'))}",
            "lead": f"Each repair re-run from step {r.get('step')}; intervals hold together at "
                    f"{1 - float(r.get('alpha') or 0):.0%}.",
            "note": f"{r.get('rollouts_used')} rollouts"
                    + ("; stopped early: the best was clear." if r.get("stopped_early") else ".")}


def context_panels(what: Any = None, fixes: Any = None) -> Mapping[str, Any]:
    """The template variables both partials read."""
    return {"what": what_panel(what), "fixes": fixes_table(fixes)}
