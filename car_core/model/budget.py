"""Budgets in rollouts, tokens, money and wall time, checked before any rollout starts.

A ``BudgetMeter`` is asked ``check()`` before each rollout: it answers with the reason the budget
tripped, or None. Tokens and money are only known after a rollout, so the meter forecasts the
next rollout's spend from the mean so far and refuses when the forecast would overrun. When a
budget trips the estimator keeps what it measured and reports ``truncated=True``.

A meter made where ``HALT`` holds an event (a run a population estimate started on a worker
thread) raises ``Interrupted`` before the next rollout once the event is set: Ctrl-C reaches
the caller's thread only, and the runs in flight stop as a run on that thread would.
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from car_core.errors import InvalidBudget
from car_core.model.checks import is_whole
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import SPENDING_ORIGINS


@dataclass(frozen=True)
class Budget:
    """Caps on one estimate. ``None`` means no cap of that kind."""

    rollouts: int | None = None
    tokens: int | None = None
    cost: float | None = None
    wall_time: float | None = None
    prices: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("rollouts", "tokens", "cost", "wall_time"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InvalidBudget(f"budget {name}={value} cannot pay for anything",
                                    hint=f"give {name} a positive value, or None for no cap")

    def to_dict(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "tokens": self.tokens, "cost": self.cost,
                "wall_time": self.wall_time}


def as_budget(budget: Budget | int | None, what: str = "budget") -> Budget | None:
    """Accept a ``car.Budget`` or a plain rollout count."""
    if budget is None or isinstance(budget, Budget):
        return budget
    if not is_whole(budget):
        raise InvalidBudget(f"{what}={budget!r} is neither a rollout count nor a car.Budget",
                            hint="pass an int (rollouts) or car.Budget(rollouts=..., tokens=...)")
    return Budget(rollouts=budget)


def usage_of(run: Trajectory, prices: dict[str, tuple[float, float]] | None = None
             ) -> tuple[int, float]:
    """Tokens and money spent by the live steps of a branch (held steps cost nothing).

    Steps report ``meta["usage"] = {"prompt_tokens", "completion_tokens"}``, ``meta["model"]``
    and optionally ``meta["cost"]``; ``prices`` maps a model name to (input, output) price per
    million tokens and is used when a step reports no cost of its own.
    """
    tokens, cost = 0, 0.0
    for step in run.steps:
        if step.meta.get("origin") not in SPENDING_ORIGINS:
            continue
        usage = step.meta.get("usage") or {}
        p, c = int(usage.get("prompt_tokens", 0) or 0), int(usage.get("completion_tokens", 0) or 0)
        tokens += p + c
        if "cost" in step.meta:
            cost += float(step.meta["cost"])
        elif prices and step.meta.get("model") in prices:
            pin, pout = prices[step.meta["model"]]
            cost += (p * pin + c * pout) / 1e6
    return tokens, cost


class Interrupted(KeyboardInterrupt):
    """The estimate that started this run was interrupted: the run stops before its next
    rollout as Ctrl-C stops one on the caller's thread, its branches kept and its attribution
    left for a resume (``errors.RESUMABLE`` holds ``KeyboardInterrupt``)."""


# set by the pool that runs a population's runs on worker threads (``_population.RunPool``)
HALT: ContextVar[threading.Event | None] = ContextVar("car_halt", default=None)


def check_countable(budget: Budget | None, run: Trajectory) -> None:
    """Refuse, before any branch, a money cap the run shows could never trip: a step's cost
    is its ``meta["cost"]`` or its tokens at ``prices[meta["model"]]``, so where the recorded
    steps name the models they called, none reports a cost and no price names one of those
    models, every branch costs 0 (a trial's ``--max-cost`` without ``--price`` ran to its
    rollout cap, the user believing the spend was capped). A run whose steps name no model
    says nothing either way (an agent may price its own branches), and is let through."""
    if budget is None or budget.cost is None:
        return
    steps = [step.meta for step in run.steps]
    models = sorted({str(meta["model"]) for meta in steps if meta.get("model")})
    if not models or any("cost" in meta for meta in steps) \
            or any(m in budget.prices for m in models):
        return
    named = ", ".join(repr(m) for m in models)
    raise InvalidBudget(
        f"budget cost={budget.cost:g} cannot be counted: no step of run {run.id} reports a "
        f"cost, and no price is given for the model{'s' if len(models) > 1 else ''} it "
        f"called ({named})",
        hint=f"give the price per million input and output tokens, car.Budget(cost=..., "
             f"prices={{{models[0]!r}: (IN, OUT)}}) (car attribute: --price "
             f"{models[0]}=IN:OUT), or leave the money cap out")


class BudgetMeter:
    """Counts what an estimate spends and says, before each rollout, whether it may start."""

    def __init__(self, budget: Budget | None) -> None:
        self.budget = budget or Budget()
        self.halt = HALT.get()  # read where the meter is made: the run's own thread
        self.rollouts = 0
        self.reserved = 0
        self.tokens = 0
        self.cost = 0.0
        self.started = time.monotonic()
        self.tripped: str | None = None

    def check(self, extra: int = 1) -> str | None:
        """The reason ``extra`` more rollouts may not start, or None if they may; raises
        ``Interrupted`` once the population this run belongs to was interrupted."""
        if self.halt is not None and self.halt.is_set():
            raise Interrupted("the population estimate this run belongs to was interrupted")
        b = self.budget
        reason = None
        if b.rollouts is not None and self.rollouts + self.reserved + extra > b.rollouts:
            reason = f"rollout budget of {b.rollouts} reached"
        elif b.wall_time is not None and time.monotonic() - self.started >= b.wall_time:
            shown = f"{b.wall_time:.0f}" if b.wall_time >= 100 else f"{b.wall_time:.3g}"
            reason = f"wall-time budget of {shown}s reached"
        elif self.rollouts:
            per_tokens = self.tokens / self.rollouts
            per_cost = self.cost / self.rollouts
            ahead = self.reserved + extra  # rollouts in flight spend too
            if b.tokens is not None and self.tokens + ahead * per_tokens > b.tokens:
                reason = f"token budget of {b.tokens} would be exceeded"
            elif b.cost is not None and self.cost + ahead * per_cost > b.cost:
                reason = f"cost budget of {b.cost:g} would be exceeded"
        if reason:
            self.tripped = reason
        return reason

    def reserve(self) -> bool:
        """Claim one rollout if the budget allows; concurrent executors call this before
        starting a task, so tasks in flight count against the cap."""
        if self.check() is not None:
            return False
        self.reserved += 1
        return True

    def remaining_rollouts(self) -> int | None:
        if self.budget.rollouts is None:
            return None
        return max(0, self.budget.rollouts - self.rollouts - self.reserved)

    def charge(self, run: Trajectory) -> None:
        """Account for a finished rollout (reserved or not)."""
        self.reserved = max(0, self.reserved - 1)
        self.rollouts += 1
        tokens, cost = usage_of(run, self.budget.prices)
        self.tokens += tokens
        self.cost += cost

    def used(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "tokens": self.tokens, "cost": round(self.cost, 6),
                "wall_time": round(time.monotonic() - self.started, 3)}


MOST_MORE = 4  # the most a hint's rollout budget grows by, in caps: "about N more" is rough
# the fewest rollouts a hint suggests: at α = 0.05 the first confirmation's sign test needs five
# pairs up (2⁻⁵ ≤ 0.9·0.9·0.05), ten rollouts, after at least one gate pair; doubling a budget
# of one rollout suggested two, with which no step can be named
LEAST_HINT = 16


def tripped_limit(note: str | None) -> str:
    """The cap a ``BudgetMeter.tripped`` note names: ``"wall_time"``, ``"tokens"``,
    ``"cost"``, else ``"rollouts"`` (a ``Budget`` field's name)."""
    text = note or ""
    return ("wall_time" if "wall-time" in text else "tokens" if "token budget" in text
            else "cost" if "cost budget" in text else "rollouts")


def larger_budget(given: dict[str, Any] | None, note: str | None, rollouts: int | None,
                  more: int | None = None) -> dict[str, Any]:
    """The budget to resume with: the one given, with the limit that stopped the estimate (the
    rollout cap unless the note names another) doubled — or, for the rollout cap, raised by
    ``more`` (the result's "about N more rollouts would decide it") where that is larger, up
    to ``MOST_MORE`` caps more. One resume sized to decide beats several doublings: each
    resume is another look at the data (``search``'s error-control note), and on the
    simulator's weak-rescue rows where N passed the cap, resuming with the cap plus N decided
    1.2–2.4 times as many seeds as doubling. A resume runs the search again under it and reads
    back each stored branch the search asks for; a larger budget can send the search another
    way, so some stored branches may not be asked for again (docs/measured.md measures the
    share). A rollout budget is never suggested below ``LEAST_HINT``."""
    out = {k: v for k, v in (given or {}).items() if v is not None}
    limit = tripped_limit(note)
    base = out.get(limit, rollouts if limit == "rollouts" else None)
    if base and limit == "rollouts":
        grown = int(base) + min(max(int(base), more or 0), MOST_MORE * int(base))
        out[limit] = max(grown, LEAST_HINT)
    elif base:
        out[limit] = int(base) * 2 if limit == "tokens" else float(base) * 2
    return out


def budget_call(budget: dict[str, Any]) -> str:
    """``car.Budget(...)`` spelled out, for a hint the user can paste."""
    args = ", ".join(f"{k}={budget[k]:g}" if isinstance(budget[k], float) else f"{k}={budget[k]}"
                     for k in ("rollouts", "tokens", "cost", "wall_time") if k in budget)
    return f"car.Budget({args})"


def check_bound(value: int, bound: int, what: str, raise_with: str) -> None:
    """Refuse, before anything runs, a size above a bound the user has not raised: ``what``
    names the size (the flag or keyword that asked for it), ``raise_with`` how to raise the
    bound knowingly (a flag, ``--max-rollouts``, or a keyword, ``max_rollouts=``)."""
    if value > bound:
        joiner = "" if raise_with.endswith("=") else " "
        raise InvalidBudget(f"{what} asks for {value:,} rollouts, above the bound of {bound:,} "
                            "that guards against a slip running for days",
                            hint=f"ask for fewer, or raise the bound knowingly with "
                                 f"{raise_with}{joiner}{value}")
