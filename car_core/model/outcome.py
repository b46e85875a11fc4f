"""The outcome protocol: how CAR calls the user's score of a run.

``outcome(run)`` or ``outcome(run, rng)`` (a noisy judge draws from ``rng``) returns a float in
[0, 1] or a bool, 1 / True meaning the failure happened. ``OutcomeFn`` wraps it once and checks
every value it returns; ``scored`` is the one rule every recorder, replay and branch scores a run
by: the judge draws from the outcome stream of the noise the run was decided with, so scoring a
run again (a resumed estimate, a replay) gives it the value it had.

The outcome may be ``async def`` (a judge awaiting a model): where it returns an awaitable, CAR
awaits it, always on the one loop of ``car_core.model.awaiting`` (so a client the judge keeps
across calls stays on one loop), concurrently with the other branches' judges. On the async
executor (``ascore``) a sync outcome runs in a worker thread, so a judge that waits never holds
up the loop that drives the branches and may itself call ``asyncio.run``. What an outcome raises
or returns is judged the same way, sync or async, on every path.

An outcome may also say when a run's score is already fixed: a ``settled(run) -> bool``
attribute on the function, True when no continuation of the (partial) run can score differently
from the run as it stands (a rule decided by the first of two tool calls, say). An agent whose
``branch`` takes ``stop=`` then ends a branch at the first step where it holds, and the branch is
scored as it stands: the same value, without the model calls after it. ``settled`` must never
say True where a later step could still change the score, or every estimate is biased.

Before the first branch of any estimate, ``check_on_record`` scores the recorded run with the
outcome the estimate was given: an outcome that cannot see the recorded failure (or success)
would make every branch look alike and the estimate answer "no cause" with confidence, so it is
refused (``OutcomeMismatch``) before anything is spent.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, NoReturn

import numpy as np

from car_core import formatting as fmt
from car_core.errors import (
    RESUME_SAME_ID,
    InvalidInput,
    ModelUnavailable,
    OutcomeError,
    OutcomeMismatch,
    RunNotFailed,
)
from car_core.model.awaiting import awaited, run_to_end
from car_core.model.capabilities import positional_arity
from car_core.model.json_values import digest
from car_core.model.outages import is_outage, outage_hint
from car_core.model.seeding import Noise, Stream
from car_core.model.trajectory import FAILED_AT, Outcome, Trajectory, is_failure
from car_core.secrets import redact

# What an outcome may be, where the API takes one: ``outcome(run)`` or ``outcome(run, rng)``
# returning a float in [0, 1] or a bool (a bool is an int, which typing accepts as a float), or
# an awaitable of one (``async def outcome(run)``).
OutcomeLike = Callable[..., float] | Callable[..., Awaitable[float]]


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine (an ``async def``, a partial of one, an object
    whose ``__call__`` is one); a sync function that returns an awaitable is awaited all the
    same, this only spares it a worker thread on an event loop."""
    call = inspect.getattr_static(type(fn), "__call__", None)  # its class's method
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class OutcomeFn:
    """Wraps a user's outcome function: ``outcome(run)`` or ``outcome(run, rng)`` (a noisy
    judge draws from ``rng``), returning a float in [0, 1] or a bool."""

    def __init__(self, fn: OutcomeLike) -> None:
        if isinstance(fn, OutcomeFn):
            fn = fn.fn
        self.fn: Callable[..., Any]
        if not callable(fn):
            raise InvalidInput("outcome must be callable: outcome(run) -> float in [0, 1]",
                               hint="pass outcome=lambda run: ...")
        self.fn = fn
        self.takes_rng = positional_arity(fn) >= 2
        self.is_async = is_async_callable(fn)
        hook = getattr(fn, "settled", None)
        if hook is not None and not callable(hook):
            raise InvalidInput("outcome.settled must be callable: settled(run) -> bool",
                               hint="set outcome.settled = lambda run: ... or remove it")
        self._settled: Callable[[Trajectory], Any] | None = hook

    @property
    def name(self) -> str:
        """Which function this is, as ``module:qualified.name`` (a partial's function's, a
        callable object's class's): what a resumed attribution must be scored by again."""
        fn: Any = self.fn
        while isinstance(fn, functools.partial):
            fn = fn.func
        named = fn if hasattr(fn, "__qualname__") else type(fn)
        return f"{getattr(named, '__module__', '?')}:{getattr(named, '__qualname__', '?')}"

    @property
    def settles(self) -> bool:
        """Whether the outcome can say a partial run's score is already fixed."""
        return self._settled is not None

    def settled(self, run: Trajectory) -> bool:
        """True when ``run`` (possibly partial) scores the same whatever its later steps do."""
        if self._settled is None:
            return False
        try:
            said = self._settled(run)
            return bool(run_to_end(said) if inspect.isawaitable(said) else said)
        except Exception as exc:  # the user's code: wrap whatever it raises
            raise OutcomeError(f"the outcome's settled() raised {exc!r}{_on(run)}",
                               run_id=_run_id(run),
                               hint="fix outcome.settled; it is called on partial runs after "
                                    "each step of a branch") from redact.redacted(exc)

    def __call__(self, run: Trajectory, rng: np.random.Generator) -> float:
        """The checked value of ``run``; an awaitable the outcome returns is run to its end."""
        value = self._called(run, rng)
        if inspect.isawaitable(value):
            try:
                value = run_to_end(value)
            except Exception as exc:  # raised inside the user's coroutine
                self._raise_for(run, exc)
        return self._checked(run, value)

    async def acall(self, run: Trajectory, rng: np.random.Generator) -> float:
        """``self(run, rng)`` on an event loop, never blocking it: an async outcome is awaited
        on the outcome loop (``awaiting.awaited``), a sync one runs whole in a worker thread
        (so it may call ``asyncio.run`` itself, and an awaitable it returns is run to its end
        there, never left un-awaited when the branch is cancelled)."""
        if not self.is_async:
            return await asyncio.to_thread(self, run, rng)
        value = self._called(run, rng)
        if inspect.isawaitable(value):
            try:
                value = await awaited(value)
            except Exception as exc:  # raised inside the user's coroutine
                self._raise_for(run, exc)
        return self._checked(run, value)

    def _called(self, run: Trajectory, rng: np.random.Generator) -> Any:
        """What the user's function returns (an awaitable, for an async one), its raise
        wrapped."""
        try:
            return self.fn(run, rng) if self.takes_rng else self.fn(run)
        except Exception as exc:  # the user's code: wrap whatever it raises
            self._raise_for(run, exc)

    def _raise_for(self, run: Trajectory, exc: Exception) -> NoReturn:
        """Raise the CAR error for ``exc``, which the outcome raised while scoring ``run``
        (called inside the ``except`` that caught it, sync or awaited alike)."""
        if reads_run_as_state(exc, run):
            raise OutcomeError(f"the outcome function read the run as a dict ({exc!r}): "
                               "outcome(run) is handed the car.Trajectory, not the app's "
                               f"final state{_on(run)}", run_id=_run_id(run),
                               hint=OLD_FORM_HINT) from redact.redacted(exc)
        if is_outage(exc):  # an LLM judge's server down: every later score would fail
            raise ModelUnavailable(
                f"the outcome's server failed{_on(run)}: {redact.describe(exc)}",
                run_id=_run_id(run),
                hint=outage_hint(exc, "the server the outcome calls (an LLM judge's) is down "
                                      "or refusing; start it or wait",
                                 who="the server the outcome calls (an LLM judge's)")
                + f", then {RESUME_SAME_ID}") from redact.redacted(exc)
        raise OutcomeError(f"the outcome function raised {exc!r}{_on(run)}",
                           run_id=_run_id(run),
                           hint="fix the outcome function; it must score any branch, "
                                "including ones that end early") from redact.redacted(exc)

    @staticmethod
    def _checked(run: Trajectory, value: Any) -> float:
        if isinstance(value, (bool, np.bool_)):
            return 1.0 if value else 0.0
        if isinstance(value, (int, float, np.integer, np.floating)):
            v = float(value)
            if 0.0 <= v <= 1.0:
                return v
        raise OutcomeError(f"the outcome function returned {value!r}{_on(run)}",
                           run_id=_run_id(run),
                           hint="return a float in [0, 1] or a bool (1 / True = the failure "
                                "happened)")

    def score(self, run: Trajectory, noise: Noise | None = None) -> float:
        """The value of ``run``; a noisy judge draws from the outcome stream of ``noise`` (a
        branch's own), or of the noise a recorded run was recorded with when None."""
        noise = record_noise(run) if noise is None else noise
        return self(run, noise.rng(0, Stream.OUTCOME))

    async def ascore(self, run: Trajectory, noise: Noise | None = None) -> float:
        """``score`` on an event loop (see ``acall``): the same value, drawn the same way."""
        noise = record_noise(run) if noise is None else noise
        return await self.acall(run, noise.rng(0, Stream.OUTCOME))


def record_noise(run: Trajectory) -> Noise:
    """The noise a recorded run is scored with: its seed's, or, for a run recorded without
    one (a hosted model, the OpenAI Agents SDK's recorder), a seed taken from its id. Every
    seedless run once drew from seed 0, so a judge taking ``rng`` drew the same number for
    each and was wrong on all of them or on none (a trial's judge, meant to flip 15% of
    verdicts, flipped 12 of 12 stored runs); the id keeps each run's own draw, and scoring the
    run again gives back its value."""
    if run.seed is not None:
        return Noise(run.seed)
    return Noise(int(digest(run.id)[:8], 16))


def _run_id(run: Trajectory) -> str:
    """The id a user can look up: a branch's parent run (branches are not listed by ``car
    runs``), the run itself otherwise."""
    return run.lineage.parent_id if run.lineage is not None else run.id


def _on(run: Trajectory) -> str:
    """Where a branch's score was asked for, so its error names the branch as a branch."""
    lin = run.lineage
    if lin is None:
        return ""
    where = (f"re-decided from step {lin.branch_step}" if lin.branch_step is not None
             else "every recorded step held")
    return f" on a branch of the run (branch {run.id}, {where}, rollout {lin.rollout})"


OLD_FORM_HINT = ("write a rule over the app's final state as outcome=lambda run: "
                 "rule(final_state(run)), with final_state from the app's adapter "
                 "(car_adapters.langgraph, car_adapters.llamaindex, car_adapters.openai_agents)")


def reads_run_as_state(exc: BaseException, run: Trajectory) -> bool:
    """Whether ``exc`` came from reading the trajectory as a dict (``run["messages"]``,
    ``run.get(...)``, ``"k" in run``, ``run.items()``): an outcome written for the old
    ``outcome(final_state)`` form."""
    if isinstance(exc, AttributeError):
        return getattr(exc, "obj", None) is run and exc.name in _DICT_READS
    if isinstance(exc, TypeError):
        return f"{type(run).__name__!r}" in str(exc) and (
            "subscriptable" in str(exc) or "not iterable" in str(exc))
    return False


_DICT_READS = frozenset({"get", "keys", "items", "values", "__getitem__", "__contains__"})


def scored(run: Trajectory, outcome: Callable[..., Any], noise: Noise | None = None
           ) -> Trajectory:
    """``run`` with its outcome set by ``outcome`` (see ``OutcomeFn.score``)."""
    fn = outcome if isinstance(outcome, OutcomeFn) else OutcomeFn(outcome)
    return replace(run, outcome=Outcome(fn.score(run, noise)))


async def ascored(run: Trajectory, outcome: Callable[..., Any], noise: Noise | None = None
                  ) -> Trajectory:
    """``scored`` on an event loop: the same value, without blocking the loop
    (``OutcomeFn.acall``)."""
    fn = outcome if isinstance(outcome, OutcomeFn) else OutcomeFn(outcome)
    return replace(run, outcome=Outcome(await fn.ascore(run, noise)))


# How many times the recorded run is scored before an outcome that puts it on the other side of
# the failure threshold is refused, and the first entry of the noise key the second and later
# scores draw from (a key no run or branch uses: 0 is the record's, 1 and 2 are branches').
RECORD_SCORES = 3
RESCORE_KEY = 3


def check_on_record(run: Trajectory, outcome: OutcomeLike, *, attributing: bool = False
                    ) -> None:
    """Refuse an outcome that does not see what the recorded run's stored outcome says, and,
    for an attribution (``attributing``), a run the outcome does not score as failed.

    Failed means a value ``>= FAILED_AT`` (0.5), as everywhere (``trajectory.is_failure``).
    The run is scored by the rule recorders use (``scored``: a judge taking ``rng`` draws from
    the run's own outcome stream, so the outcome the run was recorded with gives back its
    value). When that score falls on the wrong side of the threshold, the run is scored twice
    more (a judge taking ``rng`` draws from two fresh streams; one with randomness of its own
    draws again) and the run is refused only when every score is on the wrong side. So a
    correct judge that errs independently with probability ``e`` on each call is refused with
    probability ``e**3`` (0.008 at ``e = 0.2``), while a blind outcome, or a seeded one reading
    the wrong thing, is refused every time.

    The wrong side is the other side from ``run.outcome`` (``OutcomeMismatch``). An attribution
    explains a failure, so there it is also the fine side: a run stored as fine, or stored
    without an outcome (a recorder given none), that the outcome scores as fine has no failure
    to explain, and answering "no cause" for it would hide an outcome that cannot see the
    failure (``OutcomeMismatch`` when nothing was stored to compare with, else
    ``RunNotFailed``, a ``NothingToAttribute``). ``intervene`` asks what a change does to any
    run, failed or not: it checks only against a stored outcome. Nothing is charged to any
    budget; the outcome may be called up to three times."""
    stored = None if run.outcome is None else float(run.outcome.value)
    if stored is None and not attributing:
        return
    fn = outcome if isinstance(outcome, OutcomeFn) else OutcomeFn(outcome)
    seed = record_noise(run).seed
    scores: list[float] = []
    for i in range(RECORD_SCORES):
        value = fn.score(run, Noise(seed) if i == 0 else Noise(seed, (RESCORE_KEY, i)))
        agrees = is_failure(value) == is_failure(stored) if stored is not None else True
        if agrees and (not attributing or is_failure(value)):
            return
        scores.append(value)
    shown = ", ".join(fmt.num(v) for v in scores)
    if stored is not None and is_failure(scores[0]) != is_failure(stored):
        raise OutcomeMismatch(
            f"the outcome scores the recorded run as {_side(scores[0])} ({shown} on "
            f"{len(scores)} scores) but it is stored as {_side(stored)} ({fmt.num(stored)}; "
            f"failed means >= {FAILED_AT:g}), so it cannot see what the record saw and no "
            f"branch was run. The outcome received {received(run)}",
            run_id=run.id, stored=stored, scores=tuple(scores),
            hint=_SEE_THE_FAILURE + _OR_A_MISLABEL)
    if stored is None:
        raise OutcomeMismatch(
            f"the run was stored without an outcome and the outcome scores it as fine ({shown} "
            f"on {len(scores)} scores; failed means >= {FAILED_AT:g}), so there is no failure "
            "to attribute and no branch was run: either the outcome cannot see the failure or "
            f"the run did not fail. The outcome received {received(run)}",
            run_id=run.id, stored=None, scores=tuple(scores),
            hint=_SEE_THE_FAILURE + " (record with outcome= to store the run's score, so this "
                                    "check can compare with it)")
    raise RunNotFailed(
        f"the run did not fail: it is stored as fine ({fmt.num(stored)}) and the outcome "
        f"scores it as fine ({shown}), so there is no failure to attribute",
        run_id=run.id, hint="attribute a failed run (car runs lists each run's outcome), or "
                            "use car.intervene to ask what a change would do to this one")


_SEE_THE_FAILURE = (
    "make the outcome score the run as the app does: for a framework app, apply the app's own "
    "rule to its final state as the app held it, outcome=lambda run: rule(final_state(run)) "
    "with final_state from the app's adapter (car_adapters.langgraph, car_adapters.llamaindex, "
    "car_adapters.openai_agents), not to run.meta['final_state'], which is JSON (messages as "
    "OpenAI-style dicts); or pass the outcome the run was recorded with")


_OR_A_MISLABEL = (
    ". If the outcome is already the one the run was recorded with and it draws randomness of "
    "its own (an LLM judge that ignores the rng CAR passes), the stored score may have been its "
    "mislabel: a mislabel does not reproduce, so there is nothing to attribute in this run; "
    "attribute another one, or pass the judge the rng (outcome(run, rng)) so that its score of "
    "the record gives back the stored one")


def _side(value: float) -> str:
    return "failed" if is_failure(value) else "fine"


def received(run: Trajectory) -> str:
    """What an outcome is handed for ``run``, in words: its type, steps and final state."""
    text = f"a car.Trajectory of {len(run.steps)} step(s)"
    meta = run.meta if isinstance(run.meta, dict) else {}
    if "final_state" not in meta:
        return text + " with no run.meta['final_state']"
    state = meta["final_state"]
    if not isinstance(state, dict):
        return text + f"; run.meta['final_state'] is a {type(state).__name__}"
    keys = sorted(map(str, state))
    shown = ", ".join(map(repr, keys[:8])) + (", …" if len(keys) > 8 else "")
    text += f"; run.meta['final_state'] is a dict with keys [{shown}]"
    messages = state.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        kind = type(last).__name__
        if isinstance(last, dict):
            role = last.get("role", last.get("type"))
            if role is not None:
                kind += f" with role {str(role)!r}"
        text += f", its last message a {kind}"
    if isinstance(messages, list):
        lost = _calls_not_kept(run, messages)
        if lost:
            text += (f"; run.steps hold {len(lost)} tool call(s) its final state's messages do "
                     f"not ({', '.join(lost[:5])}{', …' if len(lost) > 5 else ''}): an app "
                     "that keeps only each agent's last message (a supervisor's "
                     "output_mode=\"last_message\") leaves them out of the final state, so "
                     "read them from run.steps, or build the app with "
                     "output_mode=\"full_history\"")
    return text


def _calls_not_kept(run: Trajectory, messages: list[Any]) -> list[str]:
    """The names of the tool calls in ``run.steps`` whose ids no message of the final state
    carries (a tool call or a tool result of that id): what an outcome over the final state
    cannot see. A user trial's supervisor app kept only each worker's last message, and the
    refusal told it to read the final state, which it did."""
    kept: set[str] = set()
    for m in messages:
        if isinstance(m, dict):
            kept.update(str(c.get("id")) for c in m.get("tool_calls") or ()
                        if isinstance(c, dict))
            if m.get("tool_call_id") is not None:
                kept.add(str(m["tool_call_id"]))
    lost = []
    for step in run.steps:
        calls = step.action.get("tool_calls") if isinstance(step.action, dict) else None
        for c in calls if isinstance(calls, list) else ():
            if isinstance(c, dict) and c.get("id") is not None and str(c["id"]) not in kept:
                fn = c.get("function")
                lost.append(str((fn if isinstance(fn, dict) else c).get("name", "?")))
    return lost
