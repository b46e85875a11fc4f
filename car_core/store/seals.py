"""Seals: digests over the stored rows that the step digests do not cover.

A ``runs`` row's seal covers its columns and header (outcome, lineage, status), an
``attributions`` row's seal the row as stored, so a value edited by hand is caught like an
edited step. A listing trusts a ``runs`` row read without its steps only when its seal checks
and every shown column has its type (``row_problem``).
"""

from __future__ import annotations

import math
from typing import Any

from car_core.errors import CorruptRun
from car_core.model.checks import is_real
from car_core.model.json_values import digest, loads
from car_core.store.failures import DAMAGE

ATTRIBUTION_SEALED = ("id", "run_id", "method", "status", "params", "result", "created_at",
                      "finished_at")
SEALED_COLUMNS = ("id", "parent_id", "attribution_id", "arm", "rollout", "branch_step", "agent",
                  "status", "outcome", "n_steps", "digest", "seed", "created_at")
SUMMARY_COLUMNS = ("id", "created_at", "agent", "status", "outcome", "n_steps", "parent_id",
                   "seed")
_LAST_DATE = 253402300800  # 10000-01-01: a created_at past it is not a date


def attribution_seal(row: dict[str, Any]) -> str:
    """A digest over an attribution row as stored, so an edited locus or status is caught."""
    def column(name: str) -> Any:
        value = row.get(name)
        if value is None or isinstance(value, str):
            return value
        return float(value)
    return digest({"attribution": {c: column(c) for c in ATTRIBUTION_SEALED}})


def run_seal(row: dict[str, Any], header: dict[str, Any]) -> str:
    """A digest over what the step digests do not cover: the run's row and header (outcome,
    lineage, status), so a hand-edited outcome is caught like a hand-edited step."""
    def column(name: str) -> Any:  # as SQLite gives it back (REAL and INTEGER affinity)
        value = row[name]
        if value is None or isinstance(value, str):
            return value
        return float(value) if name in ("outcome", "created_at") else int(value)

    return digest({"row": {c: column(c) for c in SEALED_COLUMNS}, "header": header})


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a ``runs`` row read without its steps (None: its seal checks and
    every shown column has its type): the columns a listing shows are trusted only so."""
    try:
        header = loads(row["header"] or "{}")
        if not isinstance(header, dict):
            return "its header is not an object"
        seal = header.pop("seal", None)
        if seal != run_seal(row, header):
            return "its row (outcome, agent, status, lineage …) was changed after saving"
    except DAMAGE as exc:
        return f"it does not parse ({type(exc).__name__})"
    for key in ("created_at", "outcome"):
        value = row[key]
        if value is not None and (not is_real(value)
                                  or not math.isfinite(value)):
            return f"its {key} {str(value)[:40]!r} is not a number"
    if row["created_at"] is not None and not 0 <= row["created_at"] < _LAST_DATE:
        return f"its created_at {row['created_at']!r} is not a date"
    for key in ("id", "agent", "status", "parent_id"):
        if row[key] is not None and not isinstance(row[key], str):
            return f"its {key} is not text"
    for key in ("n_steps", "seed"):
        if row[key] is not None and (isinstance(row[key], bool) or not isinstance(row[key], int)):
            return f"its {key} is not an integer"
    return None


def shown_id(value: Any) -> str:
    """A stored id as a listing names it (a damaged row's id may not be text)."""
    return value if isinstance(value, str) else repr(value)[:40]


def damaged_rows(damaged: list[tuple[str, str]], intact: int) -> CorruptRun:
    """One error for the damaged runs rows of a listing: the first by name, with how many."""
    run_id, wrong = damaged[0]
    more = f" ({len(damaged) - 1} more damaged row(s))" if len(damaged) > 1 else ""
    return CorruptRun.among_intact_rows(f"stored run {run_id} is damaged: {wrong}{more}; "
                                        f"{intact} other row(s) are intact")


__all__ = ["ATTRIBUTION_SEALED", "SEALED_COLUMNS", "SUMMARY_COLUMNS", "attribution_seal",
           "damaged_rows", "row_problem", "run_seal", "shown_id"]
