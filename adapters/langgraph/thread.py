"""Scoring an imported thread: ``outcome(run)`` as everywhere; the old ``outcome(final_state)``
still accepted here, and only here, for a while.

The two forms cannot be told apart by signature (both take one argument), so they are told apart
by use: the outcome function receives a ``ThreadRun``, a ``car.Trajectory`` that also answers
dict-style reads (``state["messages"]``, ``.get``, ``in``, iteration, ``.keys/.items/.values``)
from the run's stored final state, ``run.meta["final_state"]`` (JSON: messages as OpenAI-style
dicts). A ``Trajectory`` has none of those, so a function that uses them was written for the
old form: it still gets that stored state, with a ``DeprecationWarning`` saying how to write it
now; a function written for ``outcome(run)`` never triggers one. Everywhere else
(``car.intervene``, ``car.contrastive``, ``car attribute --outcome``, the pytest plugin) the old
form is refused with an ``OutcomeError`` that says the same.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

from car_core.contract import OutcomeFn, Trajectory

_OLD_FORM = ("attribute_thread now calls outcome(run) with the trajectory, as car.intervene does, "
             "and the old outcome(final_state) form will be refused here as it is everywhere "
             "else: write it as outcome=lambda run: rule(final_state(run)) with final_state "
             "from car_adapters.langgraph (the app's message objects), or read "
             "run.meta['final_state'] (the stored JSON this form is given now)")


class ThreadRun(Trajectory):
    """A trajectory that also reads as its final graph state, with a deprecation warning."""

    @classmethod
    def of(cls, run: Trajectory) -> ThreadRun:
        return cls(**{f.name: getattr(run, f.name) for f in fields(Trajectory)})

    def _state(self) -> dict[str, Any]:
        warnings.warn(_OLD_FORM, DeprecationWarning, stacklevel=3)
        state = self.meta.get("final_state")
        return state if isinstance(state, dict) else {}

    def __getitem__(self, key: str) -> Any:
        return self._state()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._state().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._state()

    def __iter__(self) -> Iterator[str]:
        return iter(self._state())

    def keys(self) -> Any:
        return self._state().keys()

    def items(self) -> Any:
        return self._state().items()

    def values(self) -> Any:
        return self._state().values()


def thread_outcome(outcome: Callable[..., Any]) -> Callable[..., Any]:
    """``outcome`` as a car outcome function over trajectories (see the module docstring); a
    noisy judge ``outcome(run, rng)`` keeps its rng."""
    if OutcomeFn(outcome).takes_rng:
        def judged(run: Trajectory, rng: Any) -> Any:
            return outcome(ThreadRun.of(run), rng)
        return judged

    def score(run: Trajectory) -> Any:
        return outcome(ThreadRun.of(run))
    return score
