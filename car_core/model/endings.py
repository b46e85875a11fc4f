"""How a run ended, beyond its status: a run the app stopped by design.

An app can stop a run on purpose (a guardrail's tripwire): the run is stored ``complete``,
since a designed stop is an outcome to score and not a crash, with ``error`` saying why. Its
last reply may then read as delivered though the user never got it, so every view says it was
stopped. An adapter names what stopped it in ``meta[STOP_META]``
(``{"kind": "input" | "output", "guardrail": name}``); a complete run with only an ``error``
counts as stopped too, by something unnamed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core.model.vocabulary import RunStatus

STOP_META = "tripwire"  # meta naming the guardrail that stopped a run, set by its adapter


def stopped_by(meta: Mapping[str, Any] | None) -> str | None:
    """What stopped a run, as ``meta`` names it ("output guardrail NAME"), else None."""
    trip = (meta or {}).get(STOP_META)
    if not isinstance(trip, Mapping) or not isinstance(trip.get("guardrail"), str):
        return None
    kind = trip.get("kind")
    return f"{kind} guardrail {trip['guardrail']}" if isinstance(kind, str) and kind else (
        f"guardrail {trip['guardrail']}")


def was_stopped(status: str, error: str | None, meta: Mapping[str, Any] | None) -> bool:
    """Whether a run was stopped by design: a guardrail named in ``meta``, or a run stored
    complete that still carries an ``error``."""
    return stopped_by(meta) is not None or (str(status) == RunStatus.COMPLETE and bool(error))


__all__ = ["STOP_META", "stopped_by", "was_stopped"]
