"""How results are said to people: one vocabulary and one number format for every surface.

The plain-text ``str()`` of a result, the ``car`` command's tables and verdicts, the pytest
plugin's headline and summary, the demo's printout and the HTML report all build their words
here, so the same attribution reads the same way wherever it is shown:

- probabilities with three decimals (``prob``), effects (rescue, φ) signed (``effect``) and
  their intervals likewise (``effect_interval``); a missing (None) or non-finite value is
  written as ``missing``;
- confidence levels as percentages (``level``: ``"95%"``, never ``0.9500``);
- the same column names (``STEP_COLUMNS``, ``SHAPLEY_COLUMNS``) and the same locus mark;
- the method named as it was computed (``method``);
- the rescue shown beside the failure rates of the very sample it and its interval were
  computed from (``step_row``), with one line saying so when the test decided on other pairs
  (``sample_note``).

The generic helpers (``num``, ``interval``, ``pct``) take their style as parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MISSING = "—"
PROB_DIGITS = 3  # every probability and effect a person reads

# -- one vocabulary --------------------------------------------------------------------------
STEP, RESCUE, INTERVAL, HELD, REDRAWN, PAIRS, TESTED = (
    "step", "rescue", "interval", "P(fail) held", "P(fail) re-drawn", "n", "tested")
STEP_COLUMNS = (STEP, RESCUE, INTERVAL, HELD, REDRAWN, PAIRS, TESTED)
PLAYER, PHI = "player", "phi"
SHAPLEY_COLUMNS = (PLAYER, PHI, INTERVAL, PAIRS)
LOCUS_MARK = "<- locus"
NOT_TESTED, SIGNIFICANT, NOT_SIGNIFICANT = "not tested", "significant", "not significant"


# -- numbers ---------------------------------------------------------------------------------
def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def num(x: Any, digits: int = 2, *, missing: str = MISSING, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals (``sign``: always with its sign)."""
    if _missing(x):
        return missing
    return f"{float(x):+.{digits}f}" if sign else f"{float(x):.{digits}f}"


def interval(ci: Any, digits: int = 2, *, missing: str = MISSING, sign: bool = False) -> str:
    """``[low, high]`` of an interval (or of a stored ``[low, high]`` list)."""
    if not ci:
        return missing
    return (f"[{num(ci[0], digits, missing=missing, sign=sign)}, "
            f"{num(ci[1], digits, missing=missing, sign=sign)}]")


def pct(level: Any, decimals: int | None = None, *, missing: str = MISSING) -> str:
    """A fraction as a percentage: ``decimals`` places, or (None) none when it is whole and
    one otherwise."""
    if level is None:
        return missing
    p = float(level) * 100
    if decimals is None:
        decimals = 0 if abs(p - round(p)) < 1e-9 else 1
    return f"{p:.{decimals}f}%"


def prob(x: Any, *, missing: str = MISSING) -> str:
    """A probability (a failure rate): ``0.312``."""
    return num(x, PROB_DIGITS, missing=missing)


def effect(x: Any, *, missing: str = MISSING) -> str:
    """A difference of probabilities (a rescue, a Shapley value), signed: ``+0.417``."""
    return num(x, PROB_DIGITS, missing=missing, sign=True)


def effect_interval(ci: Any, *, missing: str = MISSING) -> str:
    """The interval of an effect: ``[+0.200, +0.600]``."""
    return interval(ci, PROB_DIGITS, missing=missing, sign=True)


def prob_interval(ci: Any, *, missing: str = MISSING) -> str:
    """The interval of a probability: ``[0.180, 0.490]``."""
    return interval(ci, PROB_DIGITS, missing=missing)


def level(x: Any, *, missing: str = MISSING) -> str:
    """A confidence level: ``95%`` (``99.5%`` when it is not whole)."""
    return pct(x, None, missing=missing)


def failure_rate(mean: Any, ci: Any, lvl: Any, n: int, *, missing: str = MISSING) -> str:
    """One estimated failure rate with everything it rests on: ``P(fail) 0.312 [0.180,
    0.490] at 95%, n=32``."""
    return (f"P(fail) {prob(mean, missing=missing)} {prob_interval(ci, missing=missing)} at "
            f"{level(lvl, missing=missing)}, n={n}")


# -- what was computed -------------------------------------------------------------------------
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
        return (f"{pairing} betting test with an exact sign test at the end, alpha spent over "
                f"{r.tests} confirmation(s), family-wise {family}")
    return f"{correction}, {r.tests} test(s), intervals at {level(r.level)}, family-wise {family}"


# -- one row per step ----------------------------------------------------------------------------
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
    tested = ((SIGNIFICANT if s.significant else NOT_SIGNIFICANT) if s.tested
              else NOT_TESTED)
    return StepRow(str(s.step), effect(s.effect, missing=missing),
                   effect_interval(s.ci, missing=missing), prob(held, missing=missing),
                   prob(redrawn, missing=missing), str(n), tested,
                   LOCUS_MARK if is_locus else tested, is_locus)


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


# -- one sentence per answer -------------------------------------------------------------------
def decided_by(who: str | None) -> str:
    return f" (decided by {who})" if who else ""


def locus_name(r: Any, who: str | None = None) -> str:
    """The locus as every surface names it: ``step 4 (decided by account_agent, its 1st
    decision)``. ``who`` decided it (the caller has the run); without it, the agent named in
    the result's ``locus_label`` (``car_core.trajectory.step_label``)."""
    k = r.locus
    label = str(getattr(r, "locus_label", None) or "")
    found = re.fullmatch(rf"(.+), step {k} \(its (\w+) decision\)", label)
    nth = found[2] if found else None
    who = who or (found[1] if found else None)
    if not who:
        return f"step {k}"
    return f"step {k} (decided by {who}" + (f", its {nth} decision" if nth else "") + ")"


def coupling_note(r: Any) -> str:
    """How much the branches shared their noise: ``coupled`` is what the pairs showed, the
    reason says what noise CAR handed out, and the measurement comes with its interval."""
    note = f"coupled={r.coupled}" + (f" (noise handed out: {r.coupling})"
                                     if r.coupling and not r.coupled else "")
    if r.coupling_measured is not None:
        note += (f"; coupling measured {num(r.coupling_measured, 2, missing='-')} "
                 f"{interval(r.coupling_ci, 2, missing='-')} from {r.coupling_pairs} pairs")
    return note


def _field(v: Any, name: str) -> Any:
    return v.get(name) if isinstance(v, dict) else getattr(v, name, None)


def shapley_leaders(values: Sequence[Any]) -> tuple[str, list[Any]]:
    """Who carries the largest Shapley share, honestly (values as objects or their dicts):
    ``("one", [top])`` when the top value's interval lies above every other's, ``("equal",
    tied)`` when several share the top value to the digits shown, ``("overlap", contenders)``
    when others' intervals reach the top's, so the data cannot rank them. Contenders come
    largest first; the order among equal values is the steps' order and means nothing."""
    ranked = sorted((v for v in values if _field(v, "estimate") is not None),
                    key=lambda v: -float(_field(v, "estimate")))
    if not ranked:
        return "one", []
    top = ranked[0]
    shown = effect(_field(top, "estimate"))
    same = [v for v in ranked if effect(_field(v, "estimate")) == shown]
    if len(same) > 1:
        return "equal", same
    top_lo = (_field(top, "ci") or (_field(top, "estimate"),))[0]
    overlap = [v for v in ranked[1:]
               if (_field(v, "ci") or (_field(v, "estimate"),) * 2)[1] >= top_lo]
    return ("overlap", [top, *overlap]) if overlap else ("one", [top])


def headline(r: Any, who: str | None = None) -> str:
    """The answer of ``r`` in one line: the locus (``who`` decided it), no cause (and why),
    undecided (and the candidate), or for Shapley the largest value."""
    if not _is_contrastive(r):
        cut = (f"truncated ({r.budget_note}), the values are from what was measured: "
               if r.truncated else "")
        kind, leaders = shapley_leaders(r.values)
        if not leaders:
            return f"{cut}no step could be valued ({r.reason or 'nothing measured'})"
        v = leaders[0]
        sums = (f"at {level(r.level)}; sum {effect(r.total)}, efficiency gap "
                f"{effect(r.efficiency_gap)}")
        names = [u.label or f"step {u.step}" for u in leaders]
        if kind == "equal":
            return (f"{cut}{', '.join(names[:-1])} and {names[-1]} tie for the largest Shapley "
                    f"value, phi {effect(v.estimate)} each, {sums}")
        if kind == "overlap":
            rest = ", ".join(f"{n} phi {effect(u.estimate)} {effect_interval(u.ci)}"
                             for n, u in zip(names[1:], leaders[1:], strict=True))
            return (f"{cut}largest Shapley value: {names[0]} phi {effect(v.estimate)} "
                    f"{effect_interval(v.ci)}, not told apart from {rest} (the intervals "
                    f"overlap), {sums}")
        return (f"{cut}largest Shapley value: {names[0]}{decided_by(who)} "
                f"phi {effect(v.estimate)} {effect_interval(v.ci)} {sums}")
    if str(r.answer) == "undecided":
        by = f"; step {r.candidate} was decided by {who}" if who and r.candidate is not None \
            else ""
        return f"undecided: {r.undecided_why()}; {r.candidate_text()}{by}"
    if r.locus is None:
        return f"no cause: {r.reason or 'no step rescue interval lies above zero'}"
    s = next((e for e in r.steps if e.step == r.locus), None)
    return (f"locus: {locus_name(r, who)}, rescue "
            f"{effect(s.effect if s else None)} {effect_interval(s.ci if s else None)} at "
            f"{level(r.level)} ({method(r)})")
