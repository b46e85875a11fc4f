"""Fakes to test agent code with, and the contract every ``Agent`` implementation must keep.

The fakes are plain callables for ``car.FunctionAgent``: ``ScriptedPolicy`` (actions fixed per
step, or drawn from given distributions with the engine's rng), ``DictEnvironment`` (a tool
that answers by looking the action up) and ``CallCounter`` (counts the calls a wrapped policy or
environment receives, and at which step).

The conformance checks state the replay contract as executable tests, so an adapter proves it
in its own test suite with ``run_conformance(make_agent, context=..., outcome=...)``:

- replay with every step held gives back the recorded actions and observations;
- a held prefix is served from the record: no model call, no tool call before the branch step;
- branches carry their lineage, keep the record before the branch step, and are sealed;
- forced actions and observations are used as given;
- with the same noise an agent that couples its noise gives the same branch twice.

Each check raises ``ConformanceFailure`` (an ``AssertionError``) saying what broke.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._json import JSON, canonical, check_json
from .errors import ConformanceFailure, EnvironmentError_, InvalidInput, PolicyError
from .interventions import compile_plan, do_action, do_observation, do_resample
from .replay import action_match_rate, intervene, record
from .seeding import branch_noise
from .trajectory import History, Trajectory
from .vocabulary import Origin

_MISSING: Any = object()


# -- fakes ---------------------------------------------------------------------------------
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

    agent: Any
    policy: CallCounter
    environment: CallCounter | None

    @property
    def both(self) -> Counters:
        return Counters(*(c for c in (self.policy, self.environment) if c is not None))


def count_calls(agent: Any) -> CountedAgent:
    """A copy of a ``FunctionAgent`` with its policy and environment wrapped in counters."""
    policy = CallCounter(agent.policy)
    env = CallCounter(agent.environment) if agent.environment is not None else None
    return CountedAgent(replace(agent, policy=policy, environment=env), policy, env)


# -- the contract --------------------------------------------------------------------------
def _noise(seed: int, rollout: int = 0) -> Any:
    return branch_noise(seed, rollout, "conformance", coupled=True)


def _fail(check: str, message: str, run: Trajectory, step: int | None = None) -> None:
    raise ConformanceFailure(f"{check}: {message}", run_id=run.id, step=step,
                             hint="the agent must serve steps before the branch step from the "
                                  "record and apply the plan as given (see car_core.agent)")


def _same_steps(check: str, run: Trajectory, branch: Trajectory, upto: int) -> None:
    for k in range(upto):
        if k >= len(branch.steps):
            _fail(check, f"the branch has {len(branch.steps)} steps, the record {upto}", run, k)
        a, b = run.steps[k], branch.steps[k]
        if a.action != b.action:
            _fail(check, f"action {b.action!r} differs from the recorded {a.action!r}", run, k)
        if (a.observed, a.observation) != (b.observed, b.observation):
            _fail(check, f"observation {b.observation!r} differs from the recorded "
                         f"{a.observation!r}", run, k)


def check_replay_reproduces(agent: Any, run: Trajectory, *, seed: int = 0) -> Trajectory:
    """A branch with every step held gives back the record: same actions, observations, length,
    every step marked ``held``."""
    branch: Trajectory = agent.branch(run, compile_plan(run, []), _noise(seed))
    _same_steps("replay", run, branch, len(run.steps))
    if len(branch.steps) != len(run.steps):
        _fail("replay", f"the replay has {len(branch.steps)} steps, the record "
                        f"{len(run.steps)}", run)
    for s in branch.steps:
        if s.meta.get("origin") != Origin.HELD:
            _fail("replay", f"a replayed step is marked {s.meta.get('origin')!r}, not 'held'",
                  run, s.index)
    return branch


def check_prefix_makes_no_calls(agent: Any, run: Trajectory, counter: Any, *,
                                steps: Sequence[int] | None = None, seed: int = 0,
                                calls_per_step: int = 2) -> None:
    """Branching at ``k`` (default: every step) calls the model and tools only for steps
    ``>= k``. ``counter`` (a ``CallCounter`` or ``Counters``) must wrap the agent's model and
    tool calls; calls whose step it cannot tell must fit ``calls_per_step`` per live step."""
    for k in (range(len(run.steps)) if steps is None else steps):
        counter.reset()
        branch = agent.branch(run, compile_plan(run, do_resample(k)), _noise(seed))
        early = [s for s in counter.steps if s is not None and s < k]
        if early:
            _fail("prefix", f"branching at step {k} re-executed held step(s) {sorted(set(early))}",
                  run, k)
        unknown = sum(1 for s in counter.steps if s is None)
        live = sum(1 for s in branch.steps if s.index >= k)
        if unknown > calls_per_step * live:
            _fail("prefix", f"branching at step {k} made {unknown} calls for {live} live steps",
                  run, k)
        _same_steps("prefix", run, branch, k)


def check_branch_lineage(agent: Any, run: Trajectory, outcome: Any, *, step: int | None = None,
                         seed: int = 0) -> None:
    """Branches from ``car.intervene`` name their parent, interventions, branch step and
    rollout; steps before the branch step are the record's and marked held; digests verify."""
    k = len(run.steps) - 1 if step is None else step
    dist = intervene(run, agent, do_resample(k), outcome=outcome, rollouts=2, seed=seed,
                     progress=False)
    for r, branch in enumerate(dist.trajectories):
        lin = branch.lineage
        if lin is None or lin.parent_id != run.id:
            _fail("lineage", "a branch does not name the run it came from", run, k)
        assert lin is not None
        if lin.branch_step != k or lin.rollout != r or list(lin.interventions) != [
                {"kind": "resample", "step": k}]:
            _fail("lineage", f"lineage {lin.to_dict()} does not describe do_resample({k}), "
                             f"rollout {r}", run, k)
        branch.verify()
        _same_steps("lineage", run, branch, k)
        origins = [s.meta.get("origin") for s in branch.steps]
        if any(o != Origin.HELD for o in origins[:k]) or (len(origins) > k
                                                          and origins[k] != Origin.LIVE):
            _fail("lineage", f"step origins {origins} should be 'held' before step {k} and "
                             f"'live' at it", run, k)


def check_forced_values(agent: Any, run: Trajectory, *, seed: int = 0) -> None:
    """``do_action`` puts the given action at its step; ``do_observation`` keeps the recorded
    action and returns the given observation."""
    k = len(run.steps) - 1
    # Force an action the step did not take when the run offers one (another step's action):
    # forcing the recorded one would pass an agent that ignores forced actions altogether.
    forced = next((s.action for s in run.steps if s.action != run.steps[k].action),
                  run.steps[k].action)
    branch = agent.branch(run, compile_plan(run, do_action(k, forced)), _noise(seed))
    if len(branch.steps) <= k or branch.steps[k].action != forced:
        _fail("forced", "do_action did not put the forced action at its step", run, k)
    observed = [s.index for s in run.steps if s.observed]
    if observed:
        j = observed[-1]
        marker = {"car-conformance": "forced observation"}
        branch = agent.branch(run, compile_plan(run, do_observation(j, marker)), _noise(seed))
        if len(branch.steps) <= j or branch.steps[j].observation != marker:
            _fail("forced", "do_observation did not replace the observation", run, j)
        if branch.steps[j].action != run.steps[j].action:
            _fail("forced", "do_observation changed the recorded action", run, j)


def check_same_noise_same_branch(agent: Any, run: Trajectory, *, seed: int = 0) -> None:
    """An agent that couples its noise gives the same branch for the same noise, and the
    recorded action when it re-decides a recorded state with the record's noise."""
    if not getattr(agent, "couples_noise", False):
        return
    plan = compile_plan(run, do_resample(0)) if run.steps else compile_plan(run, [])
    a = agent.branch(run, plan, _noise(seed, 7))
    b = agent.branch(run, plan, _noise(seed, 7))
    if [(s.action, s.observation) for s in a.steps] != [(s.action, s.observation)
                                                       for s in b.steps]:
        _fail("noise", "two branches with the same noise differ", run)
    match = action_match_rate(run, agent, replays=1)
    if match.rate != 1.0:
        _fail("noise", f"re-deciding the recorded states matched {match.per_step}", run)


CHECKS = ("replay", "prefix", "lineage", "forced", "noise")


def run_conformance(agent_factory: Callable[[], Any], *, context: JSON, outcome: Any,
                    seed: int = 0) -> list[str]:
    """Record a run with a fresh agent and put it through every check, each with a fresh agent.

    ``agent_factory()`` returns an agent, or ``(agent, counter)`` where the counter wraps the
    agent's model and tool calls (then the prefix rule is checked too). Returns the names of
    the checks that ran; the first failure raises ``ConformanceFailure``.
    """
    def make() -> tuple[Any, Any]:
        made = agent_factory()
        return made if isinstance(made, tuple) else (made, None)

    agent, _ = make()
    run = record(agent, context=context, outcome=outcome, seed=seed)
    if not run.steps:
        raise InvalidInput("the recorded run has no steps, so there is nothing to check",
                           hint="give the agent a context it acts on")
    ran = []
    check_replay_reproduces(make()[0], run, seed=seed)
    ran.append("replay")
    agent, counter = make()
    if counter is not None:
        check_prefix_makes_no_calls(agent, run, counter, seed=seed)
        ran.append("prefix")
    check_branch_lineage(make()[0], run, outcome, seed=seed)
    ran.append("lineage")
    check_forced_values(make()[0], run, seed=seed)
    ran.append("forced")
    check_same_noise_same_branch(make()[0], run, seed=seed)
    ran.append("noise")
    return ran


__all__ = [
    "CHECKS", "CallCounter", "Choice", "CountedAgent", "Counters", "DictEnvironment",
    "ScriptedPolicy", "action_key", "check_branch_lineage", "check_forced_values",
    "check_prefix_makes_no_calls", "check_replay_reproduces", "check_same_noise_same_branch",
    "count_calls", "run_conformance",
]
