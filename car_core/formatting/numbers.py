"""Numbers as every surface writes them: probabilities with three decimals, effects signed,
intervals beside them, levels as percentages, and a missing (None or non-finite) value as
``missing``. The generic helpers (``num``, ``interval``, ``pct``) take their style as
parameters."""

from __future__ import annotations

import math
from typing import Any

MISSING = "—"
PROB_DIGITS = 3  # every probability and effect a person reads


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
    """The interval of an effect: ``[+0.200, +0.600]``; a lower end above zero that rounds to
    it reads ``>0`` (``[>0, +0.291]``), not ``+0.000``, which reads as zero included."""
    said = interval(ci, PROB_DIGITS, missing=missing, sign=True)
    if ci and not _missing(ci[0]) and 0 < float(ci[0]) and said.startswith("[+0.000,"):
        said = "[>0," + said.removeprefix("[+0.000,")
    return said


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


def percent(x: Any) -> str:
    """A probability or an effect as a whole percentage a person reads: ``41%``."""
    return MISSING if _missing(x) else f"{round(float(x) * 100):d}%"


def percent_interval(ci: Any, *, effect: bool = False) -> str:
    """``(24%–55%)``; with a negative end ``(-5% to 30%)``, where a dash would misread. An
    ``effect``'s lower end that is above zero but rounds to it reads ``>0%``: a step shown to
    rescue ("caused the failure") beside "(0%–29%)" read as not shown at all."""
    if not ci or _missing(ci[0]) or _missing(ci[1]):
        return "(interval not measured)"
    lo, hi = percent(ci[0]), percent(ci[1])
    if effect and lo == "0%" and float(ci[0]) > 0:
        lo = ">0%"
    return f"({lo}–{hi})" if not lo.startswith("-") else f"({lo} to {hi})"


def steps_span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}–{last}"
