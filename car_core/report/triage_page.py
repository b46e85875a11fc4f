"""The page of one triage (``car.triage``) in the store index: where a population of failed
runs commits to failure, the answer first.

It follows the report's rules (``car_core.report``): one self-contained file, no script, the
same Content-Security-Policy, every value escaped by the template (labels, agents, tools,
run ids and reasons are agent or user text). The share bars are drawn with widths this module
computes from numbers, never from text. Links go only where the caller says a page was
written (``run_href``, ``attribution_href``: ids to relative file names ``pages.page_name``
made), so a run that is not in the index is named without a link.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core import formatting as fmt
from car_core.report import _ENV
from car_core.secrets.redact import redact
from car_core.triage_results import SKIPPED, TriageResult

_FIELDS = ("step", "agent", "node", "tool")


def _width(x: float) -> str:
    """A share as a CSS percentage for a bar, clamped to [0, 100]."""
    return f"{100 * min(1.0, max(0.0, float(x))):.1f}%"


def triage_view(r: TriageResult, run_href: Mapping[str, str] | None = None,
                attribution_href: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the page shows of ``r``: the plain answer, a row per group with its bar, the runs
    behind each group, the runs without a locus and why, and how it was measured."""
    runs, attrs = run_href or {}, attribution_href or {}
    rows = {row.run_id: row for row in r.per_run}

    def link(run_id: str) -> dict[str, Any]:
        row = rows.get(run_id)
        aid = row.attribution_id if row is not None else None
        return {"id": run_id, "href": runs.get(run_id),
                "attribution": aid, "attribution_href": attrs.get(aid) if aid else None,
                "locus": row.locus if row is not None else None,
                "answer": row.answer if row is not None else fmt.MISSING,
                "reason": (row.reason or "") if row is not None else ""}

    groups = [{"label": g.label, "n": g.n,
               "where": [(f, fmt.MISSING if getattr(g, f) is None else str(getattr(g, f)))
                         for f in _FIELDS],
               "share": fmt.pct(g.share, 0), "low": fmt.pct(g.share_ci[0], 0),
               "high": fmt.pct(g.share_ci[1], 0),
               "bar": _width(g.share), "ci_left": _width(g.share_ci[0]),
               "ci_width": _width(g.share_ci[1] - g.share_ci[0]),
               "runs": [link(i) for i in g.runs]} for g in r.groups]
    others = []
    for name, ids in (("undecided", r.undecided), ("no cause", r.no_cause)):
        if ids:
            share = len(ids) / r.runs_total
            others.append({"name": name, "n": len(ids), "share": fmt.pct(share, 0),
                           "bar": _width(share),
                           "runs": [link(i) for i in ids]})
    skipped = sum(1 for row in r.per_run if row.answer == SKIPPED)
    return {"summary": r.summary(), "split": r.split_hint("both") or "",
            "triage_id": r.triage_id, "runs_total": r.runs_total,
            "joint": fmt.pct(1 - r.alpha, 0), "each": fmt.pct(r.level, 1),
            "groups": groups, "others": others, "interval": r.interval,
            "not_failed": [link(i) for i in r.not_failed],
            "by": ", ".join(r.by), "alpha": f"{r.alpha:g}",
            "categories": len(r.groups) + len(others),
            # every pass's rollouts where counted; tokens and cost are the last pass's
            "rollouts": r.rollouts_in_all if r.rollouts_in_all is not None else r.rollouts_used,
            "in_all": r.rollouts_in_all is not None, "tokens": r.tokens,
            "cost": f"{r.cost:g}" if r.cost else "",  # no price given: unknown, not free
            "truncated": r.truncated, "budget_note": r.budget_note or "",
            "continue": r.continue_hint() or "", "skipped": skipped}


def render_triage(r: TriageResult, *, run_href: Mapping[str, str] | None = None,
                  attribution_href: Mapping[str, str] | None = None,
                  home: str | None = None) -> str:
    """The HTML page of triage ``r`` (secrets redacted); ``home`` is the relative link back to
    the index (our own file name, never agent text)."""
    return redact(_ENV.get_template("triage.html.j2").render(
        t=triage_view(r, run_href, attribution_href), home=home))


def triage_row(r: TriageResult | None, status: str, when: str, ts: float,
               href: str | None, ident: str) -> dict[str, Any]:
    """What the index lists of one triage: its answer, size, and the page's link (one
    without a result yet: its status, no page)."""
    if r is None:
        return {"id": ident, "href": None, "status": status, "when": when, "ts": ts,
                "runs": fmt.MISSING, "groups": fmt.MISSING, "top": "no result yet",
                "undecided": fmt.MISSING, "no_cause": fmt.MISSING, "rollouts": fmt.MISSING}
    top = r.groups[0] if r.groups else None
    return {"id": ident, "href": href, "status": status, "when": when,
            "ts": ts, "runs": r.runs_total, "groups": len(r.groups),
            "top": (f"{top.label}: {fmt.pct(top.share, 0)} [{fmt.pct(top.share_ci[0], 0)}, "
                    f"{fmt.pct(top.share_ci[1], 0)}]") if top else fmt.MISSING,
            "undecided": len(r.undecided), "no_cause": len(r.no_cause),
            "rollouts": r.rollouts_in_all if r.rollouts_in_all is not None
            else r.rollouts_used}


__all__ = ["render_triage", "triage_row", "triage_view"]
