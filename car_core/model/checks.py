"""The argument checks every public function repeats: a whole count and a real number, where a
bool is neither (``True`` is an ``int`` to Python, never a count to a user)."""

from __future__ import annotations

from typing import TypeGuard


def is_whole(x: object, least: int | None = None) -> TypeGuard[int]:
    """``x`` is an ``int`` (not a ``bool``), at least ``least`` when given."""
    return isinstance(x, int) and not isinstance(x, bool) and (least is None or x >= least)


def is_real(x: object) -> TypeGuard[int | float]:
    """``x`` is an ``int`` or ``float`` (not a ``bool``)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)
