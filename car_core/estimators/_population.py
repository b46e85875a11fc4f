"""Several runs of a population at once, under one total budget (``car.triage``,
``car.fix_population``).

Runs are independent: each draws its branches from noise and a cap that depend on no other
run, so what it returns does not depend on which other runs ran beside it. ``RunPool`` runs up to
``runs_at_once`` of them on worker threads (a ``concurrent.futures`` pool; each run's branches
still go through its own executor), or inline, on the caller's thread, when it is 1.

``Purse`` keeps the total budget a hard cap with runs in flight. A run started *holds* its
caps (rollouts, tokens, cost) until it finishes; then it is charged what it spent and the rest
is freed. The next run starts when what is left (the total, less what finished runs spent and
what runs in flight hold) pays its own caps (its rollouts, and whatever ``per_run`` caps),
holding them; when it does not, it waits for a run in flight to finish, and with none in
flight it gets what is left. So every run gets the very caps it would get one run after
another — ``min(own, what the total leaves)``: runs in flight hold at least what they will
spend — and the result does not depend on ``runs_at_once``. A kind the total caps but the run
does not (tokens or cost with no ``per_run`` cap) is shared: what is left divided among the
runs that could start now (the free slots, at most the runs still to start), and with such a
total the pool waits for runs in the order they started, so the division is the same every
time for a given ``runs_at_once``. Wall time is a clock the runs share: each gets what is left
of it, undivided.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from car_core import defaults
from car_core.engine.agent import Agent
from car_core.engine.progress import Paced, PacedPrinter
from car_core.errors import InvalidInput
from car_core.estimators.contrastive import waits_on_server
from car_core.model.budget import HALT, Budget
from car_core.model.checks import is_whole

T = TypeVar("T")
A = TypeVar("A")


PAIR = 2  # rollouts a run needs to compare anything: fewer left and the total is spent


def run_seed(seed: int, run_id: str) -> int:
    """Each run's own root seed, from the population's ``seed`` and the run's id: runs
    branched on one seed share their noise (a noisy judge then erred on the same branches of
    every run), and the population's intervals need the runs independent."""
    h = hashlib.sha256(f"{seed}\0{run_id}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(h[:7], "big")


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
            if left <= 0 or (name == "rollouts" and left < PAIR):
                unit = " s" if name == "wall_time" else ""  # "of 10" said ten what?
                return rest, (f"the {self.what}'s total {name.replace('_', '-')} budget of "
                              f"{cap:g}{unit} is spent")
            rest[name] = left
        return rest, None

    @property
    def shares(self) -> bool:
        """Whether a kind may be divided among runs (the total caps tokens or cost)."""
        return self.total is not None and (self.total.tokens is not None
                                           or self.total.cost is not None)

    def free_rollouts(self) -> int | None:
        """The rollouts neither spent nor held (None: the total caps no rollouts)."""
        if self.total is None or self.total.rollouts is None:
            return None
        return self.total.rollouts - self.spent.rollouts - self.held.rollouts

    def cap(self, own: Budget, slots: int, alone: bool) -> tuple[Budget, str | None]:
        """The caps the next run may hold, its own being ``own``; or why it may not start
        now: the total is spent, or (unless it would run ``alone``) what is left does not
        pay its own caps while runs in flight hold some (the caller waits for one)."""
        if self.total is None:
            return own, None
        rest, why = self._rest()
        if why is not None:
            return own, why
        caps: dict[str, Any] = {}
        for name, left in rest.items():
            mine = getattr(own, name)
            if name == "wall_time":  # a clock the runs share: each may use all that is left
                caps[name] = left if mine is None else min(mine, left)
            elif mine is not None and mine <= left:
                caps[name] = mine
            elif mine is not None and alone:
                caps[name] = left  # as one run after another: what is left
            elif mine is not None:
                return own, "the runs in flight hold what is left"
            else:  # no cap of its own: a share of the rest, never more than the rest
                caps[name] = left / max(1, slots) if name == "cost" \
                    else math.ceil(left / max(1, slots))
        for name in ("rollouts", "tokens", "cost", "wall_time"):
            caps.setdefault(name, getattr(own, name))
        return Budget(**caps, prices=own.prices or self.total.prices), None

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
    same way every time), else whichever finishes first. Leaving it on an error or Ctrl-C
    (which reaches the caller's thread only) starts nothing more and stops the runs in flight
    before their next rollout (``budget.HALT``): each keeps its branches and stays open for a
    resume, as a run interrupted on the caller's thread does."""

    def __init__(self, size: int, ordered: bool) -> None:
        self.size, self.ordered = size, ordered
        self.threaded = size > 1
        self._pool = (ThreadPoolExecutor(size, thread_name_prefix="car-run")
                      if self.threaded else None)
        self._flying: dict[int, Future[T]] = {}  # started, in the order they started
        self.halt = threading.Event()

    def __enter__(self) -> RunPool[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            self.halt.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _halting(self, fn: Callable[[], T]) -> T:
        HALT.set(self.halt)  # in the run's own context: its meters stop when the pool halts
        return fn()

    @property
    def flying(self) -> int:
        return len(self._flying)

    @property
    def full(self) -> bool:
        return len(self._flying) >= self.size

    def submit(self, index: int, fn: Callable[[], T]) -> None:
        if self._pool is not None:
            context = contextvars.copy_context()
            self._flying[index] = self._pool.submit(context.run, self._halting, fn)
            return
        done: Future[T] = Future()
        done.set_result(fn())  # inline: an error is raised here, as without a pool
        self._flying[index] = done

    def admit(self, ask: Callable[[int, bool], tuple[A, str | None]], remaining: int,
              settle: Callable[[int, T], None]) -> tuple[A, str | None]:
        """Wait for a free slot, then ask ``ask(slots, alone)`` whether the next run may
        start (``slots``: the runs that could start now, at most the ``remaining`` ones;
        ``alone``: none in flight); while it may not and runs are in flight, wait for one
        (``settle`` takes it) and ask again."""
        while self.full:
            settle(*self.next_done())
        while True:
            got, why = ask(min(self.size - self.flying, remaining), not self._flying)
            if why is None or not self._flying:
                return got, why
            settle(*self.next_done())

    def next_done(self) -> tuple[int, T]:
        """The index and result of one run in flight (its error, raised)."""
        if self.ordered or len(self._flying) == 1:
            index = next(iter(self._flying))
        else:
            finished, _ = wait(self._flying.values(), return_when=FIRST_COMPLETED)
            index = min(i for i, f in self._flying.items() if f in finished)
        return index, self._flying.pop(index).result()


__all__ = ["Purse", "RunPool", "Spent", "runs_at_once_for"]


P = TypeVar("P", bound=Callable[..., None])


def per_run_progress(progress: P | bool | None, line: Callable[..., str], at_once: int = 1,
                     untimed: Callable[..., bool] | None = None) -> P | None:
    """The callback a population estimate calls after each run: ``progress`` itself, none for
    ``False`` / ``None``, and for ``True`` one that prints ``line(...)`` of the same arguments
    to stderr, as the CLI does (``progress=False`` had been called as a function, after the
    first run's attribution was spent), paced for ``at_once`` runs at a time (``Paced``)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return cast(P, PacedPrinter(Paced(line, at_once=at_once, untimed=untimed),
                                    lambda said: print(said, file=sys.stderr, flush=True)))
    if not callable(progress):
        raise InvalidInput(f"progress must be True, False or a function, got "
                           f"{type(progress).__name__}",
                           hint="pass progress=True for a line per run, or "
                                "progress=fn(done, total, row)")
    return progress

