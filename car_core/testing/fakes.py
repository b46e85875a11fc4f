"""Fakes to test agent code with, as plain callables for ``car.FunctionAgent``.

``ScriptedPolicy`` decides from a script (actions fixed per step, or drawn from given
``Choice`` distributions with the engine's rng); ``DictEnvironment`` is a tool that answers by
looking the action up; ``CallCounter`` counts the calls a wrapped policy or environment
receives, and at which step (``count_calls`` wraps a ``FunctionAgent``'s both);
``SideEffectLedger`` counts the real calls of side-effect tools, so a test proves no branch ran
one; ``FakeClock`` is monotonic time that moves only when someone waits, for rate limits and
retries tested without real waiting.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from car_core.engine.agent import FunctionAgent
from car_core.errors import EnvironmentError_, InvalidInput, PolicyError
from car_core.model.json_values import JSON, canonical, check_json
from car_core.model.trajectory import History

__all__ = ["CallCounter", "Choice", "CountedAgent", "Counters", "DictEnvironment", "FakeClock",
           "ScriptedPolicy", "SideEffectLedger", "StepCounter", "action_key", "count_calls"]

_MISSING: Any = object()


@dataclass(frozen=True)
class Choice:
    """A distribution over actions: ``Choice([(action, p), ...])``, probabilities sum to 1."""

    options: tuple[tuple[JSON, float], ...]

    def __init__(self, options: Sequence[tuple[JSON, float]]) -> None:
        opts = tuple((a, float(p)) for a, p in options)
        if not opts or any(p < 0 for _, p in opts) or abs(sum(p for _, p in opts) - 1) > 1e-9:
            raise InvalidInput("Choice needs (action, probability) pairs that sum to 1",
                               hint="e.g. Choice([('yes', 0.3), ('no', 0.7)])")
        for a, _ in opts:
            check_json(a, "a Choice option")
        object.__setattr__(self, "options", opts)

    def draw(self, u: float) -> JSON:
        acc = 0.0
        for action, p in self.options:
            acc += p
            if u < acc:
                return action
        return self.options[-1][0]


class ScriptedPolicy:
    """``policy(history, rng)`` returning ``script[history.index]``; an entry that is a
    ``Choice`` is drawn with ``rng``. One uniform is drawn on every call, scripted or not, so
    the random streams of later steps do not depend on which steps were fixed."""

    def __init__(self, script: Sequence[Any] | Mapping[int, Any], *, after: Any = _MISSING
                 ) -> None:
        self.script = dict(script) if isinstance(script, Mapping) else dict(enumerate(script))
        self.after = after

    def __call__(self, history: History, rng: np.random.Generator) -> JSON:
        u = float(rng.random())
        entry = self.script.get(history.index, self.after)
        if entry is _MISSING:
            raise PolicyError(f"the script has no action for step {history.index}",
                              step=history.index,
                              hint="extend the script, or pass after=... for later steps")
        return entry.draw(u) if isinstance(entry, Choice) else entry


def action_key(action: JSON) -> str:
    """The lookup key of an action: a string as is, anything else as canonical JSON."""
    return action if isinstance(action, str) else canonical(action)


class DictEnvironment:
    """``environment(history, action, rng)`` answering ``table[key(action)]``; an answer that
    is a ``Choice`` is drawn with ``rng``."""

    def __init__(self, table: Mapping[str, Any], *, key: Callable[[JSON], str] = action_key,
                 default: Any = _MISSING) -> None:
        self.table = dict(table)
        self.key = key
        self.default = default

    def __call__(self, history: History, action: JSON, rng: np.random.Generator) -> JSON:
        u = float(rng.random())
        answer = self.table.get(self.key(action), self.default)
        if answer is _MISSING:
            raise EnvironmentError_(f"no answer for action key {self.key(action)!r}",
                                    step=history.index,
                                    hint="add the key to the table or pass default=...")
        return answer.draw(u) if isinstance(answer, Choice) else answer


def _step_of(*args: Any, **_: Any) -> int | None:
    index = getattr(args[0], "index", None) if args else None
    return index if isinstance(index, int) else None


class CallCounter:
    """Wraps a policy, an environment or a model call and counts its calls. ``steps`` lists the
    step each call was made for (``None`` when ``step_of`` cannot tell)."""

    def __init__(self, fn: Callable[..., Any],
                 step_of: Callable[..., int | None] = _step_of) -> None:
        self.fn = fn
        self.step_of = step_of
        self.steps: list[int | None] = []

    @property
    def calls(self) -> int:
        return len(self.steps)

    def reset(self) -> None:
        self.steps.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.steps.append(self.step_of(*args, **kwargs))
        return self.fn(*args, **kwargs)


class StepCounter(Protocol):
    """What the prefix check reads off a counter (``CallCounter``, ``Counters`` or one of an
    adapter's own): the step of every call since the last ``reset``, ``None`` where unknown."""

    @property
    def steps(self) -> Sequence[int | None]: ...

    def reset(self) -> None: ...


class Counters:
    """Several counters read as one (a policy counter and an environment counter)."""

    def __init__(self, *counters: CallCounter) -> None:
        self.counters = counters

    @property
    def steps(self) -> list[int | None]:
        return [s for c in self.counters for s in c.steps]

    @property
    def calls(self) -> int:
        return len(self.steps)

    def reset(self) -> None:
        for c in self.counters:
            c.reset()


@dataclass(frozen=True)
class CountedAgent:
    """A ``FunctionAgent`` whose policy and environment calls are counted."""

    agent: FunctionAgent
    policy: CallCounter
    environment: CallCounter | None

    @property
    def both(self) -> Counters:
        return Counters(*(c for c in (self.policy, self.environment) if c is not None))


def count_calls(agent: FunctionAgent) -> CountedAgent:
    """A copy of a ``FunctionAgent`` with its policy and environment wrapped in counters."""
    policy = CallCounter(agent.policy)
    env = CallCounter(agent.environment) if agent.environment is not None else None
    return CountedAgent(replace(agent, policy=policy, environment=env), policy, env)


class SideEffectLedger:
    """Counts the real calls of the tools with side effects (refunds, emails, writes), so a
    test can prove that no branch ran one.

    Wrap each such tool's function with ``ledger.wrap(name, fn)`` (or call
    ``ledger.note(name, arguments)`` from inside the tool), give the agent
    ``side_effect_tools=ledger.names`` (and its other tools as ``safe_tools``: an adapter
    refuses a tool left unclassified) and pass ``side_effects=ledger`` to
    ``run_conformance``: every check then asserts that no branch ran one for real.
    ``calls`` lists ``(name, arguments)`` of every real call; it is safe to use from branches
    that run in several threads at once.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset([names] if isinstance(names, str) else names)
        if not self.names:
            raise InvalidInput("a SideEffectLedger needs the names of the side-effect tools",
                               hint="SideEffectLedger(['issue_refund', ...])")
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def note(self, name: str, arguments: Any = None) -> None:
        """Count one real call of ``name`` (call it from the tool's body)."""
        if name not in self.names:
            raise InvalidInput(f"{name!r} is not one of the ledger's tools {sorted(self.names)}",
                               hint="add it to SideEffectLedger([...])")
        with self._lock:
            self.calls.append((name, arguments))

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` counted as tool ``name``: each call is noted, then ``fn`` runs."""
        @functools.wraps(fn)  # keeps the signature frameworks read tool schemas from
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.note(name, kwargs or (list(args) if args else None))
            return fn(*args, **kwargs)
        return counted

    def count(self, name: str | None = None) -> int:
        with self._lock:
            return sum(1 for n, _ in self.calls if name is None or n == name)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()


class FakeClock:
    """Monotonic time that only moves when someone waits: pass it as a ``RateLimiter``'s
    ``clock`` and its ``sleep`` / ``asleep`` as the waits; ``waits`` lists what was waited."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.waits.append(seconds)
            self.now += max(seconds, 0.0)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)  # let the other coroutines look at the new time
