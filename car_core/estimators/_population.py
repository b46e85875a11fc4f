"""Several runs of a population at once, under one total budget (``car.triage``,
``car.fix_population``).

Runs are independent: each draws its branches from its own seed and its own cap, so what it
returns does not depend on which other runs ran beside it. ``RunPool`` runs up to
``runs_at_once`` of them on worker threads (a ``concurrent.futures`` pool; each run's branches
still go through its own executor), or inline, on the caller's thread, when it is 1.

``Purse`` keeps the total budget a hard cap with runs in flight: a run started *holds* its
caps (rollouts, tokens, cost) until it finishes, then is charged what it spent and the rest is
freed. What a run may hold is what the total leaves after what finished runs spent and what
runs in flight hold, divided among the runs that could start now (the free slots, at most the
runs still to start); wall time is a clock every run shares, so each run gets what is left of
it, undivided. With one run at a time this is exactly "what the total leaves caps the next
run".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from car_core import defaults
from car_core.engine.agent import Agent
from car_core.errors import InvalidInput
from car_core.estimators.contrastive import waits_on_server
from car_core.model.budget import Budget
from car_core.model.checks import is_whole

T = TypeVar("T")


def runs_at_once_for(given: Any, agent: Agent) -> int:
    """``given`` when it is a whole number >= 1; None: ``defaults.RUNS_AT_ONCE`` for an agent
    whose branches wait on a model server (``waits_on_server``, as the search's wave), else 1
    (an in-process agent gains nothing from threads)."""
    if given is None:
        return defaults.RUNS_AT_ONCE if waits_on_server(agent) else 1
    if not is_whole(given, 1):
        raise InvalidInput(f"runs_at_once={given!r}: need a whole number >= 1",
                           hint="pass runs_at_once=4 to attribute four runs at once, 1 for "
                                "one after another, or None to choose for the agent")
    return given


@dataclass
class Spent:
    """Rollouts, tokens and money: spent, or held by the runs in flight."""

    rollouts: int = 0
    tokens: int = 0
    cost: float = 0.0

    def add(self, rollouts: int, tokens: int, cost: float, sign: int = 1) -> None:
        self.rollouts += sign * rollouts
        self.tokens += sign * tokens
        self.cost += sign * cost


class Purse:
    """The total budget of a population estimate, shared by the runs in flight (module
    docstring). ``what`` names the estimate in the reason a budget ran out."""

    def __init__(self, total: Budget | None, what: str = "triage") -> None:
        self.total, self.what = total, what
        self.spent, self.held = Spent(), Spent()
        self.started = time.monotonic()

    def _rest(self) -> tuple[dict[str, float], str | None]:
        """Each capped kind's rest after what was spent and what is held, or why none is."""
        assert self.total is not None
        rest: dict[str, float] = {}
        for name in ("rollouts", "tokens", "cost", "wall_time"):
            cap = getattr(self.total, name)
            if cap is None:
                continue
            used = (time.monotonic() - self.started if name == "wall_time"
                    else getattr(self.spent, name) + getattr(self.held, name))
            left = cap - used
            if left <= 0 or (name == "rollouts" and left < 1):
                return rest, (f"the {self.what}'s total {name.replace('_', '-')} budget of "
                              f"{cap:g} is spent")
            rest[name] = left
        return rest, None

    def free_rollouts(self) -> int | None:
        """The rollouts neither spent nor held (None: the total caps no rollouts)."""
        if self.total is None or self.total.rollouts is None:
            return None
        return self.total.rollouts - self.spent.rollouts - self.held.rollouts

    def share(self, slots: int) -> tuple[Budget | None, str | None]:
        """The caps the next run may hold, ``slots`` runs being able to start now; or why
        nothing is left (spent, or held by runs in flight: the caller waits for one)."""
        if self.total is None:
            return None, None
        rest, why = self._rest()
        if why is not None:
            return None, why
        n = max(1, slots)
        caps: dict[str, Any] = {}
        for name, left in rest.items():
            if name == "wall_time":
                caps[name] = left  # a clock the runs share: each gets all that is left
            elif name == "cost":
                caps[name] = left / n
            else:  # a whole number: never more than the rest, however the rest is divided
                caps[name] = math.ceil(left / n)
        return Budget(**caps, prices=self.total.prices), None

    def hold(self, cap: Budget | None) -> Spent:
        """Hold ``cap``'s rollouts, tokens and cost (the kinds the total caps) for a run."""
        held = Spent()
        if self.total is not None and cap is not None:
            for name in ("rollouts", "tokens", "cost"):
                if getattr(self.total, name) is not None and getattr(cap, name) is not None:
                    setattr(held, name, getattr(cap, name))
        self.held.add(held.rollouts, held.tokens, held.cost)
        return held

    def settle(self, held: Spent, rollouts: int, tokens: int, cost: float) -> None:
        """A run finished: free what it held, charge what it spent."""
        self.held.add(held.rollouts, held.tokens, held.cost, sign=-1)
        self.spent.add(rollouts, tokens, cost)


class RunPool(Generic[T]):
    """Up to ``size`` runs at once on worker threads; inline on the caller's thread when
    ``size`` is 1. ``next_done`` waits for a run: the earliest started when ``ordered`` (what
    each run may hold then depends on nothing but the order, so a total budget is divided the
    same way every time), else whichever finishes first."""

    def __init__(self, size: int, ordered: bool) -> None:
        self.size, self.ordered = size, ordered
        self.threaded = size > 1
        self._pool = (ThreadPoolExecutor(size, thread_name_prefix="car-run")
                      if self.threaded else None)
        self._flying: dict[int, Future[T]] = {}  # started, in the order they started

    def __enter__(self) -> RunPool[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        # on an error, start nothing more; the runs in flight finish (their journals kept)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def flying(self) -> int:
        return len(self._flying)

    @property
    def full(self) -> bool:
        return len(self._flying) >= self.size

    def submit(self, index: int, fn: Callable[[], T]) -> None:
        if self._pool is not None:
            self._flying[index] = self._pool.submit(fn)
            return
        done: Future[T] = Future()
        done.set_result(fn())  # inline: an error is raised here, as without a pool
        self._flying[index] = done

    def next_done(self) -> tuple[int, T]:
        """The index and result of one run in flight (its error, raised)."""
        if self.ordered or len(self._flying) == 1:
            index = next(iter(self._flying))
        else:
            finished, _ = wait(self._flying.values(), return_when=FIRST_COMPLETED)
            index = min(i for i, f in self._flying.items() if f in finished)
        return index, self._flying.pop(index).result()


__all__ = ["Purse", "RunPool", "Spent", "runs_at_once_for"]
