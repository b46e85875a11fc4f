"""What ``car.fix_population`` returns: whether fixes rescue a population of failed runs.

A ``PopulationFix`` holds one ``FixEstimate`` per fix tried: its pooled rescue (the mean over
the runs of ``P(fail | without) − P(fail | with)``) with an interval stratified by run, the
runs whose own rescue is shown positive (``rescued``) and the rest (``not_rescued``), and one
``FixRun`` per run. ``FixCost`` sets what the branches cost against re-running every run from
the start. ``to_dict`` gives one JSON object whose keys ``candidates`` (each with ``rescue``,
``rescue_ci``, ``rescued``, ``not_rescued``) stay stable; the store keeps it as the population
fix's attribution row.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any

from car_core.errors import InvalidInput
from car_core.model.json_fields import Codec, Row, dump_fields, load_fields, nested
from car_core.stats import Interval

FIX_METHOD = "population-fix"  # the method of its attribution row
INTERVAL = ("stratified Hoeffding (runs weighted alike) at level 1 − alpha/C, Bonferroni "
            "over the C fixes")
RUN_TEST = ("betting test with an exact sign test at the end, each at alpha/(N·C): "
            "family-wise over every run and fix")
# the exact sign test runs on pass/fail outcomes only: graded scores get the anytime test
RUN_TEST_GRADED = ("betting test, anytime only (graded scores get no exact sign test), each at "
                   "alpha/(N·C): family-wise over every run and fix")
CSV_COLUMNS = ("fix", "kind", "run_id", "step", "n", "p_fail_without", "p_fail_with", "rescue",
               "rescued", "reason")


@dataclass(frozen=True)
class FixRun:
    """One run under one fix: the step branched from, the pairs of rollouts measured (``n``),
    P(fail) without and with the fix, their difference (``rescue``) and whether it is shown
    positive (``rescued``); ``reason`` says why a run was not tested."""

    run_id: str
    step: int | None = None
    n: int = 0
    p_fail_without: float | None = None
    p_fail_with: float | None = None
    rescue: float | None = None
    rescued: bool = False
    reason: str | None = None
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, {})

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> FixRun:
        return load_fields(cls, data, {})  # type: ignore[no-any-return]


def _ci(obj: Any, _: str) -> dict[str, Any]:
    ci: Interval | None = obj.rescue_ci
    return {"rescue_ci": None if ci is None else [float(ci[0]), float(ci[1])]}


def _load_ci(row: Row, _: str, level: Any) -> Interval | None:
    return Interval.of(row.get("rescue_ci"), float(level if level is not None else 0.95))


_ESTIMATE = {"rescue_ci": Codec(_ci, _load_ci),
             "per_run": nested(FixRun.from_dict, many=True, missing=())}
_ESTIMATE_KEYS = ("label", "kind", "from_step", "rescue", "rescue_ci", "rescued", "not_rescued")


@dataclass(frozen=True)
class FixEstimate:
    """One fix over the population. ``rescue`` is the pooled rescue over the ``runs_tested``
    runs, ``rescue_ci`` its interval (at the result's ``level``; None when no run was tested);
    ``rescued`` the runs whose own rescue is shown positive, ``not_rescued`` every other run
    of the population (``untested`` among them, each with its reason in ``per_run``)."""

    label: str
    kind: str
    from_step: str  # "locus", or the step every run was branched from
    rescue: float | None
    rescue_ci: Interval | None
    rescued: tuple[str, ...]
    not_rescued: tuple[str, ...]
    untested: tuple[str, ...]
    runs_tested: int
    p_fail_without: float | None
    p_fail_with: float | None
    per_run: tuple[FixRun, ...] = ()

    @property
    def shown(self) -> bool:
        """Whether the pooled rescue is shown positive (the interval's lower end above 0)."""
        return self.rescue_ci is not None and self.rescue_ci[0] > 0

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _ESTIMATE, _ESTIMATE_KEYS)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> FixEstimate:
        return load_fields(cls, data, _ESTIMATE, level)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FixCost:
    """What the branches cost: ``rollouts`` (every branch the result rests on, read back ones
    included), ``steps_live`` (steps decided on them: model calls), ``steps_rerun`` (the steps
    the same rollouts would decide re-run from the start: every step of each branch),
    ``tokens`` (the model usage their live steps reported) and ``locate_rollouts`` (the
    attributions this call ran to find loci)."""

    rollouts: int = 0
    steps_live: int = 0
    steps_rerun: int = 0
    locate_rollouts: int = 0
    tokens: int = 0

    @property
    def ratio(self) -> float | None:
        """Model calls of the fix per model call of the same rollouts from the start."""
        return self.steps_live / self.steps_rerun if self.steps_rerun else None

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, {}, ratio=self.ratio)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> FixCost:
        return load_fields(cls, data, {})  # type: ignore[no-any-return]


_RESULT = {"candidates": nested(FixEstimate.from_dict, many=True, missing=()),
           "cost": nested(FixCost.from_dict, missing=FixCost())}
_RESULT_KEYS = ("method", "fix_id", "summary", "candidates", "runs_total", "level", "alpha",
                "interval")


@dataclass(frozen=True)
class PopulationFix:
    """Whether each fix rescues the population (module docstring). ``level`` is each pooled
    interval's own level (``1 − alpha/C``); ``rollouts_used`` what this call spent (the
    fixes' branches and the attributions it ran to find loci)."""

    fix_id: str | None
    runs_total: int
    candidates: tuple[FixEstimate, ...]
    alpha: float
    level: float
    interval: str
    run_test: str
    rollouts_used: int
    cost: FixCost
    truncated: bool = False
    budget_note: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def attribution_id(self) -> str | None:
        return self.fix_id

    def candidate(self, label: str) -> FixEstimate:
        """The estimate of the fix labelled ``label``."""
        for c in self.candidates:
            if c.label == label:
                return c
        raise InvalidInput(f"no fix labelled {label!r} was tried",
                           hint=f"one of {[c.label for c in self.candidates]}")

    def summary(self) -> str:
        """The answer for the most rescuing fix, in one sentence."""
        if not self.candidates:
            return "no fix was tried"
        best = max(self.candidates, key=lambda c: (c.rescue_ci[0] if c.rescue_ci else -2.0))
        said = sentence(best, self.runs_total)
        low = best.rescue_ci[0] if best.rescue_ci else None
        close = [c for c in self.candidates if c is not best and c.rescue_ci is not None
                 and low is not None and c.rescue_ci[1] >= low and c.shown]
        if not close:
            return said
        others = ", ".join(f"'{c.label}' {_pct(c.rescue or 0.0)} [{_pct(c.rescue_ci[0])}, "
                           f"{_pct(c.rescue_ci[1])}]" for c in close if c.rescue_ci)
        return f"{said} Not told apart from {others}: the intervals overlap."

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _RESULT, _RESULT_KEYS, method=FIX_METHOD,
                           summary=self.summary())

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_csv(self) -> str:
        """One row per fix and run (``CSV_COLUMNS``)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for c in self.candidates:
            for r in c.per_run:
                w.writerow([c.label, c.kind, r.run_id, _cell(r.step), r.n,
                            _num(r.p_fail_without), _num(r.p_fail_with), _num(r.rescue),
                            "yes" if r.rescued else "no", _cell(r.reason)])
        return buf.getvalue()

    @classmethod
    def from_dict(cls, data: Row) -> PopulationFix:
        return load_fields(cls, data, _RESULT, float(data["level"]))  # type: ignore[no-any-return]

    def __str__(self) -> str:
        lines = [self.summary()]  # the most rescuing fix; then each other fix, likewise
        for c in self.candidates:
            line = sentence(c, self.runs_total)
            if line != lines[0]:
                lines.append("  " + line)
        cost = self.cost
        if cost.ratio is not None:
            lines.append(f"  cost: {cost.rollouts} rollouts deciding {cost.steps_live} steps; "
                         f"re-run from the start they would decide {cost.steps_rerun} "
                         f"({cost.ratio:.2f}×)"
                         + (f", plus {cost.locate_rollouts} rollouts to find the loci"
                            if cost.locate_rollouts else ""))
        return "\n".join(lines)


def sentence(c: FixEstimate, runs_total: int) -> str:
    """One fix's answer in plain words: how many fewer of every 100 re-runs fail with it, on
    average over the runs (the pooled rescue, with its interval), then how many runs it is
    shown to rescue one by one and which it is not. The pooled rescue is a difference of
    failure rates, not a share of runs: said as a count per 100 re-runs, so 18% is not read
    as "18% of runs", nor "53% more" as a relative rise."""
    missed = _ids(c.not_rescued)
    if c.rescue is None or c.rescue_ci is None:
        why = next((r.reason for r in c.per_run if r.reason), None)
        return (f"The fix '{c.label}' could not be tested on any of the {runs_total} runs"
                + (f" (the first: {why.removeprefix('not tested: ')})" if why else "") + ".")
    part = (f"over the {runs_total} failed runs" if c.runs_tested == runs_total
            else f"over the {c.runs_tested} failed runs it was tested on ({runs_total} in all)")
    # counts per 100 re-runs, not percentages: "53% more re-runs" read as a relative rise
    fewer = (f"{_per100(c.rescue)} fewer of every 100 re-runs fail with it "
             f"[{_per100(c.rescue_ci[0])} to {_per100(c.rescue_ci[1])}]")
    more = f"{fewer}, on average {part}"
    if not c.shown:
        return f"The fix '{c.label}' is not shown to rescue the failed runs: {more}."
    if not c.not_rescued:
        return f"The fix '{c.label}' helps: {more}; every run is shown rescued."
    untested = sum(1 for r in c.not_rescued if r in c.untested)
    def are(n: int) -> str:
        return f"{n} {'is' if n == 1 else 'are'}"
    return (f"The fix '{c.label}' helps on average: {more}; run by run, "
            f"{are(len(c.rescued))} shown rescued and {are(len(c.not_rescued))} not shown to "
            f"be ({missed}" + (f"; {untested} of them untested" if untested else "")
            + "): too few re-runs each to tell, or not helped.")


def _ids(ids: tuple[str, ...], most: int = 4) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _per100(x: float) -> str:
    return f"{100 * x:.0f}"


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def _cell(v: object) -> str:
    return "" if v is None else str(v)


__all__ = ["CSV_COLUMNS", "FIX_METHOD", "FixCost", "FixEstimate", "FixRun", "PopulationFix",
           "sentence"]
