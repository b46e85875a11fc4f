"""How numbers are written for people: the CLI, the HTML report and the results' ``str()``.

One set of helpers, each output style a parameter, so the same value reads the same way
wherever it is shown. A missing (None) or non-finite value is written as ``missing``.
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "—"


def num(x: Any, digits: int = 2, *, missing: str = MISSING) -> str:
    """``x`` with ``digits`` decimals."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return f"{float(x):.{digits}f}"


def interval(ci: Any, digits: int = 2, *, missing: str = MISSING) -> str:
    """``[low, high]`` of an interval (or of a stored ``[low, high]`` list)."""
    if not ci:
        return missing
    return f"[{num(ci[0], digits, missing=missing)}, {num(ci[1], digits, missing=missing)}]"


def pct(level: Any, decimals: int | None = None, *, missing: str = MISSING) -> str:
    """A fraction as a percentage: ``decimals`` places, or (None) none when it is whole and
    one otherwise."""
    if level is None:
        return missing
    p = float(level) * 100
    if decimals is None:
        decimals = 0 if abs(p - round(p)) < 1e-9 else 1
    return f"{p:.{decimals}f}%"
