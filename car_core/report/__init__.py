"""The attribution report: one self-contained HTML file (no CDN, no script, inline SVG plots).

Everything an agent wrote (actions, observations, contexts, tool output) is hostile input: a
transcript may carry HTML and script from a prompt injection. Every value reaches the page
through a Jinja2 template with autoescaping on, nothing is marked safe, and the page carries a
Content-Security-Policy that forbids scripts, so even a missed escape could not run anything,
and forbids a ``<base>`` (relative links re-pointed) and form targets. ``frame-ancestors`` is not
in it: a policy in a ``<meta>`` element cannot carry it (browsers ignore it there and log an
error), and a file opened from disk has no HTTP header to carry it instead.

``render_attribution(result, run=None, branches=None)`` takes a contrastive or Shapley result
(the object or its ``to_dict()``); ``render_run(run)`` draws a run on its own. Here the page
is assembled; its pieces are the verdict (``verdicts``), the run's timeline and diffs
(``timeline``), the values' text (``values``), the plots and the context panels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import jinja2

from car_core import formatting as fmt
from car_core.assertions import agent_of
from car_core.errors import InvalidInput
from car_core.model.trajectory import Trajectory
from car_core.report.alternatives import alternatives_tables
from car_core.report.context import context_panels
from car_core.report.plots import arms_plot, rescue_plot, shapley_plot
from car_core.report.timeline import _costs, _decided_from, _diff, _diff_lines, _timeline
from car_core.report.values import (
    _as_dict,
    _as_run,
    _ci,
    _fmt,
    _pct,
    _step_cells,
    compact,
    seconds,
    show,
)
from car_core.report.verdicts import _arm_outcomes, _contrastive_verdict, _shapley_verdict
from car_core.results import result_from_dict
from car_core.secrets.redact import redact, redact_json

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("car_core.report", "templates"),
    autoescape=True,  # unconditional: every variable is escaped, whatever the template's name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render_attribution(result: Any, run: Any = None,
                       branches: Iterable[Mapping[str, Any]] | None = None,
                       choice: str | None = None, home: str | None = None,
                       what: Any = None, fixes: Any = None) -> str:
    """The full HTML report of a contrastive or Shapley attribution (secrets redacted);
    ``choice`` says which stored attribution the page shows and how to pick another, ``home``
    is the relative link back to the index that lists it (our own file name, never agent
    text); ``what`` and ``fixes`` (a context attribution, a repair ranking) add their panels."""
    r = redact_json(_as_dict(result))
    method = r.get("method")
    if method not in ("contrastive", "shapley"):
        raise InvalidInput(f"unknown attribution method {method!r}",
                           hint="render the to_dict() of car.contrastive or car.shapley")
    traj = _as_run(run)
    ctx: dict[str, Any] = {"r": r, "method": method, "fmt": _fmt, "ci": _ci, "pct": _pct,
                           "cells": _step_cells, "run": _run_summary(traj), "timeline": [],
                           "locus_view": None,
                           "diff": [], "rescue": {}, "arms": {}, "shapley": {},
                           "arm_outcomes": _arm_outcomes(branches), "steps": [],
                           "values": [], "efficiency": None, "choice": choice,
                           "alternatives": [],
                           "costs": {}, "seconds": seconds, "home": home,
                           **context_panels(what, fixes)}
    locus = r.get("locus") if method == "contrastive" else None
    if traj is not None:
        ctx["timeline"] = _timeline(traj, locus)
        ctx["costs"] = _costs(ctx["timeline"])
    if method == "contrastive":
        ctx["verdict"] = _contrastive_verdict(r, traj)
        ctx["steps"] = r.get("steps") or []
        ctx["rescue"] = rescue_plot(ctx["steps"], locus, r)
        ctx["alternatives"] = alternatives_tables(r)
        ctx["arms"] = arms_plot(r.get("arms") or [], len(traj.steps) if traj else None)
        if locus is not None and traj is not None and 0 <= locus < len(traj.steps):
            ctx["locus_view"] = _decided_from(traj, locus)
        example = r.get("example_branch")
        if example:
            factual = traj if traj is not None else None
            ctx["diff"] = _diff(factual, example) if factual is not None else \
                [{"tag": "insert", "left": "", "right": line}
                 for line in _diff_lines(example, marked=True)]
    else:
        ctx["verdict"] = _shapley_verdict(r)
        ctx["values"] = r.get("values") or []
        ctx["shapley"] = shapley_plot(ctx["values"])
        vf, ve = r.get("v_full") or {}, r.get("v_empty") or {}
        if vf and ve:
            ctx["efficiency"] = {"total": r.get("total"), "v_full": vf, "v_empty": ve,
                                 "target": (vf.get("mean") or 0) - (ve.get("mean") or 0),
                                 "gap": r.get("efficiency_gap")}
    _plain_first(ctx, r, traj)
    return redact(_ENV.get_template("report.html.j2").render(**ctx))


def _plain_first(ctx: dict[str, Any], r: dict[str, Any], traj: Trajectory | None) -> None:
    """The report opens with the plain sentence every surface opens with
    (``formatting.answer``); the method's words (test, level, sample sizes, pairing) go to
    "How this was measured", complete (``explain``)."""
    typed = result_from_dict(r)
    if not typed.actions and traj is not None:  # stored before results kept them
        typed = replace(typed, actions=fmt.step_actions(traj))
    step = getattr(typed, "locus", None)
    if step is None:
        step = getattr(typed, "candidate", None)
    who = agent_of(traj, step) if traj is not None and step is not None else None
    verdict = ctx["verdict"]
    verdict["measured"] = verdict.pop("detail", "")
    if r.get("method") == "contrastive":  # the Shapley verdict is in plain words already
        verdict["plain"] = fmt.answer(typed, who)
    ctx["explain"] = typed.explain(who)


def render_run(run: Any, home: str | None = None, what: Any = None, fixes: Any = None) -> str:
    """A run on its own: header and timeline (used when no attribution exists yet), with the
    ``what`` and ``fixes`` panels when given."""
    traj = _as_run(run)
    if traj is None:
        raise InvalidInput("render_run needs a run", hint="pass a car.Trajectory")
    timeline = _timeline(traj, None)
    return redact(_ENV.get_template("report.html.j2").render(
        r={}, method="run", fmt=_fmt, ci=_ci, pct=_pct, cells=_step_cells, run=_run_summary(traj),
        timeline=timeline, costs=_costs(timeline), seconds=seconds, home=home,
        locus_view=None, diff=[],
        rescue={}, arms={},
        shapley={}, arm_outcomes=[], steps=[], values=[], efficiency=None, choice=None,
        alternatives=[],
        **context_panels(what, fixes),
        verdict={"found": False, "answer": "", "note": "", "headline": f"Run {traj.id}",
                 "detail": "No attribution yet: run `car attribute` to find the step that "
                           "caused the failure.", "action": ""}))


def _run_summary(run: Trajectory | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"id": run.id, "agent": run.agent, "status": run.status, "seed": run.seed,
            "n_steps": len(run.steps),
            "outcome": _fmt(run.outcome.value) if run.outcome else "—",
            "failed": run.failed, "context": show(run.context),
            "test": str((run.meta or {}).get("test") or ""),
            # how a run stopped by design ended: its last reply must not read as delivered
            "ending": fmt.ending_line(run.status, run.error, run.meta,
                                      [s.action for s in run.steps])}


__all__ = ["compact", "render_attribution", "render_run", "show"]
