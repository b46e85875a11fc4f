"""The page of one population fix (``car.fix_population`` / ``car fix``) in the store index:
whether each fix rescues the failed runs, the answer first, then each fix run by run.

It follows the triage page's rules (``triage_page``): one self-contained file, no script, every
value escaped by the template (fix labels, run ids and reasons are user or agent text), bar
widths computed here from numbers, and links only where the caller says a run's page was
written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core import formatting as fmt
from car_core.fix_results import FixEstimate, FixRun, PopulationFix, sentence
from car_core.report import _ENV
from car_core.secrets.redact import redact


def _per100(x: float | None) -> str:
    """A difference of failure rates as re-runs per 100 (the CLI's wording), or — ."""
    return fmt.MISSING if x is None else f"{100 * x:.0f}"


def _run(r: FixRun, hrefs: Mapping[str, str]) -> dict[str, Any]:
    return {"id": r.run_id, "href": hrefs.get(r.run_id),
            "step": fmt.MISSING if r.step is None else str(r.step), "n": r.n,
            "without": fmt.pct(r.p_fail_without, 0), "with": fmt.pct(r.p_fail_with, 0),
            "rescue": _per100(r.rescue), "rescued": "yes" if r.rescued else "no",
            "reason": r.reason or ""}


def _fix(c: FixEstimate, runs_total: int, hrefs: Mapping[str, str]) -> dict[str, Any]:
    ci = c.rescue_ci
    return {"label": c.label, "kind": c.kind, "from_step": c.from_step,
            "sentence": sentence(c, runs_total), "shown": c.shown,
            "rescue": _per100(c.rescue),
            "low": _per100(ci[0]) if ci is not None else fmt.MISSING,
            "high": _per100(ci[1]) if ci is not None else fmt.MISSING,
            "tested": c.runs_tested, "rescued": len(c.rescued),
            "not_rescued": len(c.not_rescued), "untested": len(c.untested),
            "runs": [_run(r, hrefs) for r in c.per_run]}


def fix_view(r: PopulationFix, run_href: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the page shows of ``r``: the plain answer, a row per fix, each fix's runs, and
    how it was measured."""
    hrefs = run_href or {}
    cost = r.cost
    return {"summary": r.summary(), "fix_id": r.fix_id, "runs_total": r.runs_total,
            "fixes": [_fix(c, r.runs_total, hrefs) for c in r.candidates],
            "helps": any(c.shown for c in r.candidates),
            "each": fmt.pct(r.level, 1), "alpha": f"{r.alpha:g}", "interval": r.interval,
            "run_test": r.run_test, "rollouts": r.rollouts_used,
            "steps_live": cost.steps_live, "steps_rerun": cost.steps_rerun,
            "ratio": f"{cost.ratio:.2f}×" if cost.ratio is not None else "",
            "locate": cost.locate_rollouts, "tokens": cost.tokens,
            "truncated": r.truncated, "budget_note": r.budget_note or ""}


def render_fix(r: PopulationFix, *, run_href: Mapping[str, str] | None = None,
               home: str | None = None) -> str:
    """The HTML page of population fix ``r`` (secrets redacted); ``home`` is the relative link
    back to the index (our own file name, never user text)."""
    return redact(_ENV.get_template("fix.html.j2").render(f=fix_view(r, run_href), home=home))


def fix_row(r: PopulationFix | None, status: str, when: str, ts: float,
            href: str | None, ident: str) -> dict[str, Any]:
    """What the index lists of one population fix: the most rescuing fix's answer, its size,
    and the page's link (a fix without a result yet: its status, no page)."""
    if r is None:
        return {"id": ident, "href": None, "status": status, "when": when, "ts": ts,
                "runs": fmt.MISSING, "fixes": fmt.MISSING, "answer": "no result yet",
                "rollouts": fmt.MISSING}
    return {"id": ident, "href": href, "status": status, "when": when, "ts": ts,
            "runs": r.runs_total, "fixes": len(r.candidates), "answer": r.summary(),
            "rollouts": r.rollouts_used}


__all__ = ["fix_row", "fix_view", "render_fix"]
