"""How a run ended, in one line and one status word, the same in ``car show``, ``car runs``
and the report (``car_core.model.endings`` says what counts as a stop)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from car_core.model.actions import is_chat_action
from car_core.model.endings import stopped_by, was_stopped
from car_core.model.vocabulary import RunStatus

STOPPED = "stopped"  # the status word of a run stopped by design


def status_word(status: str, error: str | None, meta: Mapping[str, Any] | None) -> str:
    """The run's status as a person reads it: ``stopped`` for a run stopped by design (stored
    ``complete``), else the stored status."""
    return STOPPED if was_stopped(status, error, meta) else str(status)


def ending_line(status: str, error: str | None, meta: Mapping[str, Any] | None,
                actions: Sequence[Any]) -> str | None:
    """One line saying how a run that did not simply finish ended ("stopped by output
    guardrail NAME after step 5: the reply was not delivered"), else None. ``actions``: its
    steps' actions, in order."""
    where = f"after step {len(actions) - 1}" if actions else "before any step"
    by = stopped_by(meta)
    if by is not None:
        if not actions:
            return f"stopped by {by} {where}"
        last = actions[-1]
        replied = is_chat_action(last) and not last.get("tool_calls")
        return (f"stopped by {by} {where}: "
                + ("the reply was not delivered" if replied else "the run went no further"))
    if was_stopped(status, error, meta):
        return f"stopped {where}: {error}"
    if str(status) == RunStatus.ERROR and error:
        return f"ended with an error {where}: {error}"
    return None


__all__ = ["STOPPED", "ending_line", "status_word"]
