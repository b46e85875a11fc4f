"""The tables' vocabulary and rows: column names, one row per step with the rescue beside the
failure rates of the very sample it was computed from, why a step was not tested, and the
method named as it was computed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from car_core.formatting.numbers import (
    MISSING,
    effect,
    effect_interval,
    interval,
    level,
    num,
    prob,
)

STEP, RESCUE, INTERVAL, HELD, REDRAWN, PAIRS, TESTED = (
    "step", "rescue", "interval", "P(fail) held", "P(fail) re-drawn", "n", "tested")
STEP_COLUMNS = (STEP, RESCUE, INTERVAL, HELD, REDRAWN, PAIRS, TESTED)
PLAYER, PHI = "player", "phi"
SHAPLEY_COLUMNS = (PLAYER, PHI, INTERVAL, PAIRS)
ACTION = "what it did"

# the default view: what each step did and what re-deciding it changed; the sample sizes are
# in ``explain``
PLAIN_COLUMNS = (STEP, ACTION, RESCUE, INTERVAL, HELD, REDRAWN, "")
PLAIN_SHAPLEY_COLUMNS = (PLAYER, ACTION, PHI, INTERVAL)
LOCUS_MARK = "<- locus"
NOT_TESTED, SIGNIFICANT, NOT_SIGNIFICANT = "not tested", "significant", "not significant"
NOT_RULED_OUT = "not ruled out"
RULED_OUT = "ruled out"  # a later step's rescue shown below the indifference level Δ


def _is_contrastive(r: Any) -> bool:
    return hasattr(r, "locus")


def method(r: Any) -> str:
    """How the intervals of ``r`` were computed, in the words of the computation."""
    if not _is_contrastive(r):
        return f"{r.mode} mode, intervals at {level(r.level)}"
    family = level(1 - float(r.alpha))
    correction = str(r.correction)
    if correction.lower() in ("bonferroni", "holm"):
        name = correction.capitalize()
        return (f"{name} over {r.tests} test(s), each interval at {level(r.level)}, "
                f"family-wise {family}")
    if not r.tests:
        return f"no step was tested, family-wise {family}"
    if "betting" in correction:  # the search's confirmation (estimators/search.py)
        # paired when the arms were measured to share their noise, else on the two rates
        pairing = "paired" if r.coupled else "unpaired"
        # the exact sign test runs on pass/fail pairs only: graded scores get the anytime test
        test = ("betting test with an exact sign test at the end"
                if "exact sign test at the end" in correction and "no exact" not in correction
                else "betting test, anytime only (graded scores get no exact sign test)")
        return (f"{pairing} {test}, alpha spent over {r.tests} confirmation(s), "
                f"family-wise {family}")
    return f"{correction}, {r.tests} test(s), intervals at {level(r.level)}, family-wise {family}"


@dataclass(frozen=True)


class StepRow:
    """A step's cells, as every table shows them (``STEP_COLUMNS``); ``mark`` is the locus mark
    or the test's outcome."""

    step: str
    rescue: str
    interval: str
    held: str
    redrawn: str
    n: str
    tested: str
    mark: str
    is_locus: bool

    def cells(self) -> list[str]:
        return [self.step, self.rescue, self.interval, self.held, self.redrawn, self.n,
                self.mark]


def shown_sample(s: Any) -> tuple[float | None, float | None, int]:
    """P(fail | held), P(fail | re-drawn) and n of the sample the step's rescue and interval
    were computed from: the pairs of a re-estimate, else the pairs the test ran on. ``s`` is
    a ``StepEffect`` or its stored dict (the report reads those)."""
    def get(name: str, default: Any = None) -> Any:
        return s.get(name, default) if isinstance(s, Mapping) else getattr(s, name, default)
    if get("estimate", "raw") == "refit":
        return get("refit_held"), get("refit_resampled"), int(get("refit_n", 0) or 0)
    return get("fail_held"), get("fail_resampled"), int(get("n", 0) or 0)


def step_row(r: Any, s: Any, *, missing: str = MISSING) -> StepRow:
    """The row of step ``s`` of contrastive result ``r``."""
    held, redrawn, n = shown_sample(s)
    is_locus = s.step == r.locus
    untested = None if s.tested else untested_mark(r, int(s.step))
    if redrawn is None and untested == NOT_RULED_OUT:
        # a later step not ruled out whose own arm ran: its failure rate, as the sentence
        # says it ("re-deciding step 3 left P(fail) at 100%" beside a "—": two trials)
        arm = next((a for a in _get(r, "arms", ()) or () if _get(a, "hold_before") == s.step),
                   None)
        redrawn = _get(arm, "mean") if arm is not None else None
    # a later step whose arms ran but could not be shown below Δ was measured: "not tested"
    # beside the plain table's "not ruled out" and the sentence's "too few re-runs" read as
    # three answers (a user trial)
    tested = (RULED_OUT if _get(s, "ruled_out", False)  # shown below Δ: said as the mark says
              else (SIGNIFICANT if s.significant else NOT_SIGNIFICANT) if s.tested
              else NOT_RULED_OUT if untested == NOT_RULED_OUT else NOT_TESTED)
    mark = (LOCUS_MARK if is_locus else "ruled out" if _get(s, "ruled_out", False) else
            ("shown to help" if s.significant else "not shown to help") if s.tested
            else str(untested))
    return StepRow(str(s.step), effect(s.effect, missing=missing),
                   effect_interval(s.ci, missing=missing), prob(held, missing=missing),
                   prob(redrawn, missing=missing), str(n), tested, mark, is_locus)


def plain_cells(r: Any, row: StepRow) -> list[str]:
    """The cells of ``row`` in the default view (``PLAIN_COLUMNS``)."""
    actions = tuple(_get(r, "actions", ()) or ())
    k = int(row.step)
    did = actions[k] if 0 <= k < len(actions) else MISSING
    return [row.step, did, row.rescue, row.interval, row.held, row.redrawn, row.mark]


def sample_note(r: Any) -> str | None:
    """One line for each re-estimated step: the test decided on other pairs than the ones the
    rescue, its interval and the failure rates beside it come from (so the two may differ)."""
    notes = []
    for s in getattr(r, "steps", ()):
        if getattr(s, "estimate", "raw") != "refit" or not s.tested:
            continue
        pooled = int(getattr(s, "refit_pooled", 0) or 0)
        sample = (f"{s.refit_n - pooled} fresh pair(s) drawn after it and {pooled} of the "
                  f"test's (all but the one its stop was decided on)" if pooled
                  else f"{s.refit_n} fresh pair(s) drawn after it")
        notes.append(f"step {s.step}: the test decided on {s.n} pair(s) (rescue "
                     f"{effect(s.effect_raw)}: {prob(s.fail_held)} held, "
                     f"{prob(s.fail_resampled)} re-drawn); the row shows the re-estimate on "
                     f"{sample}, the sample its interval is about")
    return "\n".join(notes) or None


def coupling_note(r: Any) -> str:
    """How much the branches shared their noise: ``coupled`` is what the pairs showed, the
    reason says what noise CAR handed out, and the measurement comes with its interval."""
    note = f"coupled={r.coupled}" + (f" (noise handed out: {r.coupling})"
                                     if r.coupling and not r.coupled else "")
    if r.coupling_measured is not None:
        note += (f"; coupling measured {num(r.coupling_measured, 2, missing='-')} "
                 f"{interval(r.coupling_ci, 2, missing='-')} from {r.coupling_pairs} pairs")
    return note


def _get(r: Any, name: str, default: Any = None) -> Any:
    return r.get(name, default) if isinstance(r, Mapping) else getattr(r, name, default)


def _arms(r: Any) -> dict[int, Any]:
    return {int(_get(a, "hold_before")): a for a in _get(r, "arms", ()) or ()}


def untested_mark(r: Any, k: int) -> str:
    """Why step ``k`` was not tested, in the table's last column. Undecided, the search may
    have run arms on either side of a step it never tested (the gate, the bisection), so the
    mark says where the step stands against the candidate, not that it was never reached."""
    if str(_get(r, "answer")) == "undecided":
        c = _get(r, "candidate")
        if c is None:
            return "not tested"
        return "before the candidate" if k < int(c) else "not tested yet"
    locus = _get(r, "locus")
    if locus is None:
        return "not needed"
    if k < locus:
        return "before the locus"
    if k in (_get(r, "not_ruled_out", ()) or ()):
        return NOT_RULED_OUT
    n = len(_get(r, "steps", ()) or ())
    after = [j for j in _arms(r) if locus < j <= k and j < n]
    return "followed from it" if after else "after the locus"
