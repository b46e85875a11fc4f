"""What ``car.triage`` returns: where a population of failed runs commits to failure.

A ``TriageResult`` holds one ``TriageGroup`` per place the runs committed (a step, the agent
and node that decided it, the tool it called, or the user's own label), each with its share
of the runs triaged and a simultaneous interval, plus one ``TriageRun`` per run saying what
its own attribution answered. It serialises to one JSON object (``to_dict``) whose keys
``groups`` (``label, step, agent, node, tool, share, share_ci, runs``), ``undecided`` and
``no_cause`` (run ids) stay stable; the store keeps it as the triage's attribution row.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from car_core.model.json_fields import Codec, Row, dump_fields, load_fields, nested
from car_core.stats import Interval


def _share_ci(obj: Any, _: str) -> dict[str, Any]:
    ci: Interval = obj.share_ci
    return {"share_ci": [float(ci[0]), float(ci[1])]}


def _load_share_ci(row: Row, _: str, level: Any) -> Interval:
    got = Interval.of(row["share_ci"], float(level if level is not None else 0.95))
    assert got is not None
    return got


_GROUP = {"share_ci": Codec(_share_ci, _load_share_ci)}


@dataclass(frozen=True)
class TriageGroup:
    """Runs that committed at the same place: ``label`` names it (the user's ``label=`` or
    the step, agent, node and tool it was grouped by); ``step``, ``agent``, ``node`` and
    ``tool`` are the locus's where every run of the group agrees, else None. ``share`` is the
    group's fraction of all runs triaged, ``share_ci`` its simultaneous interval (at the
    result's ``level``), ``runs`` the run ids behind it."""

    label: str
    step: int | None
    agent: str | None
    node: str | None
    tool: str | None
    share: float
    share_ci: Interval
    runs: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.runs)

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _GROUP, _GROUP_KEYS, n=self.n)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> TriageGroup:
        return load_fields(cls, data, _GROUP, level)  # type: ignore[no-any-return]


_GROUP_KEYS = ("label", "step", "agent", "node", "tool", "share", "share_ci", "n", "runs")


@dataclass(frozen=True)
class TriageRun:
    """One run of the population: what its attribution answered (``answer``: locus, no
    cause, undecided, or ``skipped`` when the total budget ran out before it), the locus,
    why there is none (``reason``), its group's label, the attribution that holds it and
    what it spent (``reused``: read back from the store, nothing spent now; a run an error
    stopped part-way counts what it spent before). ``resumable``: an error a resume can
    change stopped it (branches that failed), its branches kept: the same triage id resumes
    it."""

    run_id: str
    answer: str
    locus: int | None = None
    group: str | None = None
    reason: str | None = None
    attribution_id: str | None = None
    rollouts_used: int = 0
    tokens: int = 0
    cost: float = 0.0
    reused: bool = False
    resumable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, {})

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> TriageRun:
        return load_fields(cls, data, {})  # type: ignore[no-any-return]


TRIAGE_METHOD = "triage"  # the method of its attribution row
SKIPPED = "skipped"  # a run the total budget left unattributed: counted as undecided
NOT_FAILED = "not failed"  # a run given that did not fail: left out of every count
UNDECIDED = "undecided"  # as ``Answer.UNDECIDED`` says it
NOT_ATTRIBUTED = "not attributed: "  # a row's reason when an error stopped its attribution
_RESULT = {"groups": nested(TriageGroup.from_dict, many=True, missing=()),
           "per_run": nested(TriageRun.from_dict, many=True, missing=())}
_RESULT_KEYS = ("method", "triage_id", "summary", "groups", "undecided", "no_cause", "runs_total",
                "level", "alpha", "interval", "not_failed")
CSV_COLUMNS = ("label", "step", "agent", "node", "tool", "n", "share", "share_low",
               "share_high", "runs")


@dataclass(frozen=True)
class TriageResult:
    """Where a population of failed runs commits to failure, with intervals (see the module
    docstring). ``undecided`` and ``no_cause`` are the run ids whose attribution gave that
    answer (``per_run`` says why for each); ``groups + undecided + no_cause`` is every failed
    run (``runs_total``). ``not_failed``: runs given that did not fail, left out of every
    count. ``interval`` names how ``share_ci`` was built."""

    triage_id: str | None
    runs_total: int
    groups: tuple[TriageGroup, ...]
    undecided: tuple[str, ...]
    no_cause: tuple[str, ...]
    per_run: tuple[TriageRun, ...]
    alpha: float
    level: float  # each share's own level: 1 − alpha/G over the G categories
    interval: str
    by: tuple[str, ...]
    rollouts_used: int
    tokens: int
    cost: float
    truncated: bool
    budget_note: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    not_failed: tuple[str, ...] = ()
    # branches this call ran, and every pass of the triage ran (None: not counted, as by
    # ``group_results`` or a result stored before they were): ``rollouts_used`` counts a
    # resumed attribution's branches read back from its journal too
    rollouts_now: int | None = None
    rollouts_in_all: int | None = None

    @property
    def attribution_id(self) -> str | None:
        return self.triage_id

    def continue_hint(self) -> str | None:
        """How to finish a triage the total budget stopped; None when every run was reached."""
        if not self.truncated:
            return None
        return ("to continue, run car.triage(...) again with the same triage_id= and store= "
                f"(triage {self.triage_id}): finished runs are read back, not re-run")

    def summary(self) -> str:
        """The answer in one sentence a non-statistician can act on."""
        left = (f"; {len(self.not_failed)} run(s) given did not fail and were left out"
                if self.not_failed else "")
        # counts of none are left out: "the only place, 0 undecided, 0 with no cause" after
        # "8 of 8 failed run(s) commit at step 3" read as a puzzle (a trial)
        rest = [f"{len(self.groups)} places in all"] if len(self.groups) > 1 else []
        rest += [self._unplaced()] if self.undecided else []
        rest += [f"{len(self.no_cause)} with no cause"] if self.no_cause else []
        if not self.groups:
            return (f"none of the {self.runs_total} failed run(s) was traced to a step: "
                    f"{', '.join(rest) or 'none was attributed'}{left}")
        top = self.groups[0]
        tail = f"; {', '.join(rest)}" if rest else ""
        either = ", the undecided counted either way" if self.undecided else ""
        return (f"{top.n} of {self.runs_total} failed run(s) commit at {top.label} "
                f"({_pct(top.share)}, {_pct(top.share_ci[0])}–{_pct(top.share_ci[1])} at "
                f"{_pct(1 - self.alpha)} jointly{either}){tail}{left}")

    def _unplaced(self) -> str:
        """The undecided runs in words: those an error stopped (a shape refused, branches that
        failed) are not "undecided", which reads as "a larger budget would tell"."""
        n = len(self.undecided)
        stopped = [r for r in self.per_run if r.answer == UNDECIDED
                   and (r.reason or "").startswith(NOT_ATTRIBUTED)]
        if not stopped:
            return f"{n} undecided"
        why = " ".join((stopped[0].reason or "").removeprefix(NOT_ATTRIBUTED).split())
        why = why if len(why) <= 160 else why[:159] + "…"
        if len(stopped) == n:
            return f"{n} could not be attributed (the first: {why})"
        return (f"{n} undecided, {len(stopped)} of them because they could not be attributed "
                f"(the first: {why})")

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _RESULT, _RESULT_KEYS, method=TRIAGE_METHOD,
                           summary=self.summary())

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_csv(self) -> str:
        """One row per group (``CSV_COLUMNS``), then one for the undecided and one for the
        no-cause runs, and one, with no share, for the runs given that did not fail; run ids
        joined by spaces."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for g in self.groups:
            w.writerow([g.label, _cell(g.step), _cell(g.agent), _cell(g.node), _cell(g.tool),
                        g.n, f"{g.share:.6g}", f"{g.share_ci[0]:.6g}", f"{g.share_ci[1]:.6g}",
                        " ".join(g.runs)])
        for name, ids in (("(undecided)", self.undecided), ("(no cause)", self.no_cause)):
            if ids:
                w.writerow([name, "", "", "", "", len(ids),
                            f"{len(ids) / self.runs_total:.6g}", "", "", " ".join(ids)])
        if self.not_failed:  # no share: not part of the population
            w.writerow(["(not failed)", "", "", "", "", len(self.not_failed), "", "", "",
                        " ".join(self.not_failed)])
        return buf.getvalue()

    @classmethod
    def from_dict(cls, data: Row) -> TriageResult:
        return load_fields(cls, data, _RESULT, float(data["level"]))  # type: ignore[no-any-return]

    def split_hint(self, spelling: Literal["python", "cli", "both"] = "python") -> str | None:
        """When groups differ only by step (the same agent and tool at step 2 of some runs and
        step 3 of longer ones), how to count them as one decision: a trial's two failure modes
        read as "3 places in all". It says they may be two mistakes as well: another trial's
        two real modes (a credit made first, or after a lookup) read "are one decision", and
        following it hid both. ``spelling``: the grouping as ``by=`` (Python), ``--by``
        (the command) or both (the page). None when no two groups are so."""
        seen: dict[tuple[str | None, str | None], list[TriageGroup]] = {}
        for g in self.groups:
            if g.step is not None and (g.agent is not None or g.tool is not None):
                seen.setdefault((g.agent, g.tool), []).append(g)
        split = next((gs for gs in seen.values() if len(gs) > 1), None)
        if split is None or "step" not in self.by:
            return None
        steps = " and ".join(str(g.step) for g in sorted(split, key=lambda g: g.step or 0))
        who = ", ".join(p for p in (f"agent {split[0].agent}" if split[0].agent else "",
                                     f"tool {split[0].tool}" if split[0].tool else "") if p)
        by = tuple(f for f in self.by if f != "step")
        flag = f"--by {','.join(by)}"
        how = {"python": f"by={by!r}", "cli": flag, "both": f"by={by!r} ({flag})"}[spelling]
        return (f"steps {steps} ({who}) may be one decision, made at a different step in runs "
                f"of different lengths, or two different mistakes; if one, pass {how} to count "
                "them together")

    def __str__(self) -> str:
        lines = [self.summary()]
        for g in self.groups:
            lines.append(f"  {g.label}: {g.n} run(s), {_pct(g.share)} "
                         f"[{_pct(g.share_ci[0])}, {_pct(g.share_ci[1])}]")
        if (hint := self.split_hint()) is not None:
            lines.append(f"  ({hint})")
        for r in self.per_run:
            if r.locus is None:
                lines.append(f"  run {r.run_id}: {r.answer}" + (f" ({r.reason})" if r.reason
                                                               else ""))
        return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _cell(v: object) -> str:
    return "" if v is None else str(v)


__all__ = ["CSV_COLUMNS", "NOT_FAILED", "SKIPPED", "TRIAGE_METHOD", "TriageGroup", "TriageResult",
           "TriageRun"]
