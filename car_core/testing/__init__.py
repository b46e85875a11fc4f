"""Fakes to test agent code with, and the contract every ``Agent`` implementation must keep.

The fakes are plain callables for ``car.FunctionAgent``: ``ScriptedPolicy`` (actions fixed per
step, or drawn from given distributions with the engine's rng), ``DictEnvironment`` (a tool
that answers by looking the action up) and ``CallCounter`` (counts the calls a wrapped policy or
environment receives, and at which step). ``FakeClock`` is monotonic time that moves only when
someone waits, for rate limits and retries tested without real waiting.

The conformance checks state the replay contract as executable tests, so an adapter proves it
in its own test suite with ``run_conformance(make_agent, context=..., outcome=...)``:

- replay with every step held gives back the recorded actions and observations;
- a held prefix is served from the record: no model call, no tool call before the branch step;
- a branch from step ``k`` starts from the state step ``k`` was recorded deciding from: the
  held tool results, the messages, and, for an agent with the optional
  ``framework_state(run, k)`` hook, the framework's own state (a workflow store, graph
  channels, a run context) as the branch itself recorded it;
- branches carry their lineage, keep the record before the branch step, and are sealed;
- forced actions and observations are used as given;
- with the same noise an agent that couples its noise gives the same branch twice;
- a ``do_context`` whose edit changes nothing is ``do_resample`` at that step: the branch decides
  the step again from the recorded state, with the same action under the same noise when the
  agent couples its noise, and the same outcome distribution (a paired sign-flip test whose false
  alarm rate is ``alpha``, 1e-3 per step tested by default: at most 2e-3 for the two steps
  ``run_conformance`` tests);
- no side-effect tool runs on any branch, counted by a ``SideEffectLedger`` the test wires into
  its real tools;
- one check per optional capability the agent offers (``car_core.model.capabilities``, the checks in
  ``car_core.testing.capability_checks``): ``abranch`` gives ``branch``'s outcomes under the same
  noise
  (``async``), ``stop`` is honoured (``stop``), ``couples_noise`` is what the branches show
  (``coupling``) and the fingerprint is the same in a fresh interpreter (``fingerprint``, or
  ``fingerprint-in-process`` when the factory cannot be sent to one).

Each check raises ``ConformanceFailure`` (an ``AssertionError``) saying what broke.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from car_core.engine.replay import action_match_rate, intervene, record
from car_core.errors import (
    EnvironmentError_,
    InvalidInput,
    InvalidIntervention,
    PolicyError,
    SideEffectBlocked,
)
from car_core.model.actions import is_chat_action, same_action
from car_core.model.capabilities import Capability, capabilities
from car_core.model.interventions import (
    compile_plan,
    do_action,
    do_context,
    do_observation,
    do_resample,
)
from car_core.model.json_values import JSON, canonical, check_json
from car_core.model.trajectory import History, Trajectory
from car_core.model.vocabulary import Origin
from car_core.testing._conformance import fail as _fail
from car_core.testing._conformance import noise_for as _noise
from car_core.testing._conformance import same_steps as _same_steps
from car_core.testing._conformance import sign_flip_p as _sign_flip_p
from car_core.testing.capability_checks import (
    check_async_branch,
    check_coupling_measured,
    check_fingerprint_stable,
    check_stop_honoured,
)

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


# -- the contract --------------------------------------------------------------------------
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


def _differing(want: Any, got: Any) -> str:
    """What differs between two recorded states, in a few words: the top-level keys of two
    mappings, else both values."""
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        keys = sorted(str(key) for key in set(want) | set(got)
                      if canonical(want.get(key)) != canonical(got.get(key)))
        return f"key(s) {keys} differ"
    return f"{got!r} instead of {want!r}"


def check_held_state(agent: Any, run: Trajectory, *, steps: Sequence[int] | None = None,
                     seed: int = 0) -> None:
    """A branch from step ``k`` (default: every step) decides step ``k`` from the state the
    record decided it from: the held steps' actions and tool results, the messages step ``k``
    saw (``Step.state``, where the agent records one) and, when the agent has the optional
    ``framework_state(run, k)`` hook, the framework state step ``k`` decided from. The hook
    reads that state off a trajectory (where the agent's recorder put it), and the check reads
    it off both the record and the branch, so a branch that starts from anything else (a
    workflow's initial state instead of what the held steps wrote) fails here. The branch
    forces the recorded actions from step ``k`` on, so it needs no model decision and makes
    no side-effect call the record cannot answer."""
    read = agent.framework_state if Capability.FRAMEWORK_STATE in capabilities(agent) else None
    for k in (range(len(run.steps)) if steps is None else steps):
        forced = [do_action(j, run.steps[j].action) for j in range(k, len(run.steps))]
        branch: Trajectory = agent.branch(run, compile_plan(run, forced), _noise(seed, k))
        _same_steps("state", run, branch, k)
        if len(branch.steps) <= k:
            _fail("state", f"the branch from step {k} has no step {k} ({len(branch.steps)} "
                           "steps)", run, k)
        want = run.steps[k].state
        if want is not None and canonical(branch.steps[k].state) != canonical(want):
            _fail("state", f"the branch decided step {k} from other messages than the record: "
                           f"{_differing(want, branch.steps[k].state)}", run, k)
        if callable(read):
            want_fw, got_fw = read(run, k), read(branch, k)
            if canonical(got_fw) != canonical(want_fw):
                _fail("state", f"the branch decided step {k} from another framework state than "
                               f"the record: {_differing(want_fw, got_fw)}", run, k,
                      hint="restore the framework state as of step k (record it at each "
                           "step, or rebuild it from the held steps) before the branch decides")


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


def _observed(observation: JSON, chat: bool) -> JSON:
    """An observation as it was given: for a chat step, the text of each tool result."""
    if chat and isinstance(observation, list) and all(isinstance(m, Mapping)
                                                      for m in observation):
        return [m.get("content") for m in observation]
    return observation


def check_forced_values(agent: Any, run: Trajectory, *, seed: int = 0) -> None:
    """``do_action`` puts the given action at its step; ``do_observation`` keeps the recorded
    action and returns the given observation, at the latest observed step where the agent does
    not refuse it by name (a tool whose result cannot be forced without losing what it wrote to
    the app's state is refused with ``InvalidIntervention``; refusing every one fails)."""
    k = len(run.steps) - 1
    # Force an action the step did not take when the run offers one (another step's action):
    # forcing the recorded one would pass an agent that ignores forced actions altogether.
    forced = next((s.action for s in run.steps if not same_action(s.action,
                                                                  run.steps[k].action)),
                  run.steps[k].action)
    branch = agent.branch(run, compile_plan(run, do_action(k, forced)), _noise(seed))
    if len(branch.steps) <= k or not same_action(branch.steps[k].action, forced):
        _fail("forced", "do_action did not put the forced action at its step", run, k)
    observed = [s.index for s in run.steps if s.observed]
    refused: list[str] = []
    for j in reversed(observed):
        marker: JSON = {"car-conformance": "forced observation"}
        action = run.steps[j].action
        calls = action.get("tool_calls") if is_chat_action(action) else None
        # a chat step takes one tool result per call: each carries the marker as its text
        given = [canonical(marker)] * len(calls) if calls else marker
        try:
            branch = agent.branch(run, compile_plan(run, do_observation(j, given)), _noise(seed))
        except InvalidIntervention as exc:
            refused.append(f"step {j}: {exc}")
            continue
        if len(branch.steps) <= j or _observed(branch.steps[j].observation, bool(calls)
                                               ) != given:
            _fail("forced", "do_observation did not replace the observation", run, j)
        if not same_action(branch.steps[j].action, run.steps[j].action):
            _fail("forced", "do_observation changed the recorded action", run, j)
        return
    if refused:
        _fail("forced", "do_observation was refused at every observed step "
                        f"({'; '.join(refused)[:300]})", run, observed[-1])


def check_same_noise_same_branch(agent: Any, run: Trajectory, *, seed: int = 0) -> None:
    """An agent that couples its noise gives the same branch for the same noise, and the
    recorded action when it re-decides a recorded state with the record's noise."""
    if Capability.COUPLES_NOISE not in capabilities(agent):
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


def _unchanged(state: Any) -> Any:
    """The identity edit: gives back what it was given."""
    return state


def check_identity_edit(agent: Any, run: Trajectory, outcome: Any, *,
                        steps: Sequence[int] | None = None, rollouts: int = 32,
                        alpha: float = 1e-3, seed: int = 0) -> None:
    """``do_context(k, edit)`` with an edit that changes nothing must be ``do_resample(k)``.

    At each step ``k`` tested (default: the first and the last), ``rollouts`` branches of each
    arm run with the same seeds (so rollout ``r`` of both arms shares its noise when the agent
    couples noise). Checked exactly: every identity branch decides step ``k`` again (an agent
    whose edited branch ends at the held prefix fails here) from the recorded state, and, when
    the agent couples its noise, with the action the resampled branch took under the same
    noise. Checked statistically: the paired outcome differences pass a two-sided sign-flip
    test at level ``alpha``, so a correct agent fails with probability at most ``alpha`` per
    step tested (the test's seed is fixed, so a given agent and seed pass or fail every time).
    """
    if not 0 < alpha < 1:
        raise InvalidInput(f"alpha={alpha!r}", hint="pass a false-alarm rate in (0, 1)")
    n = len(run.steps)
    ks = sorted({0, n - 1}) if steps is None else list(steps)
    coupled = Capability.COUPLES_NOISE in capabilities(agent)
    for k in ks:
        kw = {"outcome": outcome, "rollouts": rollouts, "seed": seed + k, "progress": False}
        same = intervene(run, agent, do_context(k, _unchanged, "unchanged"), **kw)
        resampled = intervene(run, agent, do_resample(k), **kw)
        by_rollout = {t.lineage.rollout: t for t in resampled.trajectories
                      if t.lineage is not None}
        diffs = []
        for t in same.trajectories:
            if len(t.steps) <= k or t.steps[k].meta.get("origin") != "edited":
                _fail("identity", f"a do_context branch with an edit that changes nothing has "
                                  f"no step {k} decided again (it has {len(t.steps)} steps)",
                      run, k)
            recorded = run.steps[k].state
            if recorded is not None and t.steps[k].state != recorded:
                _fail("identity", f"an edit that changes nothing changed the state step {k} "
                                  "decided from", run, k)
            r = t.lineage.rollout if t.lineage is not None else None
            other = by_rollout.get(r)
            if other is None or t.outcome is None or other.outcome is None:
                continue
            if coupled and len(other.steps) > k and not same_action(t.steps[k].action,
                                                                    other.steps[k].action):
                _fail("identity", f"under the same noise (rollout {r}) the unchanged edit "
                                  f"decided {t.steps[k].action!r}, do_resample "
                                  f"{other.steps[k].action!r}", run, k)
            diffs.append(t.outcome.value - other.outcome.value)
        if not diffs:
            _fail("identity", "no rollout of both arms finished, so nothing was compared", run, k)
        p = _sign_flip_p(diffs, np.random.default_rng([seed, k, 0x1d]))
        if p < alpha:
            _fail("identity", f"P(fail) is {same.mean:.3f} under the unchanged edit and "
                              f"{resampled.mean:.3f} under do_resample over {len(diffs)} paired "
                              f"rollouts (sign-flip p = {p:.2g} < alpha = {alpha:g})", run, k)


@contextmanager
def _ledger_stays_empty(ledger: SideEffectLedger | None, check: str, run: Trajectory
                        ) -> Iterator[None]:
    """Fail when the branches of ``check`` ran a side-effect tool for real."""
    if ledger is not None:
        ledger.reset()
    yield
    if ledger is not None and ledger.calls:
        names = sorted({n for n, _ in ledger.calls})
        _fail("side-effects", f"the {check} check's branches ran side-effect tool(s) {names} "
                              f"for real ({len(ledger.calls)} call(s))", run,
              hint="a branch must answer side-effect calls from the record or a simulator "
                   "(or stop with SideEffectBlocked), never run the tool")


def check_no_side_effects(agent: Any, run: Trajectory, ledger: SideEffectLedger, *,
                          seed: int = 0) -> None:
    """Branch ``do_resample(k)`` at every step and count real side-effect calls: there must be
    none. A branch the agent stops with ``SideEffectBlocked`` kept the tool from running, which
    is allowed."""
    with _ledger_stays_empty(ledger, "side-effects", run):
        for k in range(len(run.steps)):
            try:
                agent.branch(run, compile_plan(run, do_resample(k)), _noise(seed, k))
            except SideEffectBlocked:
                pass


# The check of each optional capability, by the name run_conformance lists it under.
_CHECK_OF = {Capability.ASYNC_BRANCH: "async", Capability.STOP: "stop",
             Capability.COUPLES_NOISE: "coupling", Capability.FINGERPRINT: "fingerprint"}
CAPABILITY_CHECKS = tuple(_CHECK_OF.values())
CHECKS = ("replay", "prefix", "state", "lineage", "forced", "noise", "identity", "async",
          "stop", "coupling", "fingerprint", "fingerprint-in-process", "side-effects")


def run_conformance(agent_factory: Callable[[], Any], *, context: JSON = _MISSING,
                    outcome: Any, seed: int = 0, run: Trajectory | None = None,
                    side_effects: SideEffectLedger | None = None,
                    identity_rollouts: int = 32, alpha: float = 1e-3,
                    skip: Collection[str] = ()) -> list[str]:
    """Record a run with a fresh agent and put it through every check, each with a fresh agent.

    ``agent_factory()`` returns an agent, or ``(agent, counter)`` where the counter wraps the
    agent's model and tool calls (then the prefix rule is checked too). ``run``: a run recorded
    beforehand (with the framework's recorder, as users record) instead of one recorded from
    ``context``. ``side_effects``: a ``SideEffectLedger`` wired into the real side-effect tools
    of the agents the factory builds; the recorded run must have called one for real (else the
    check would prove nothing), and no branch of any check may (give the agent simulators for
    calls the record cannot answer).
    ``identity_rollouts`` and ``alpha`` size the identity check (see ``check_identity_edit``).
    ``skip``: capability checks not to run (of ``CAPABILITY_CHECKS``), for an agent whose
    documented limit makes one fail; say why where you pass it.
    The ``state`` check (``check_held_state``) runs for agents with a ``framework_state`` hook,
    the capability checks for agents that offer each (``stop`` needs a run of two steps).
    Returns the names of the checks that ran; the first failure raises ``ConformanceFailure``.
    """
    unknown = set(skip) - set(CAPABILITY_CHECKS)
    if unknown:
        raise InvalidInput(f"skip={sorted(unknown)}: only capability checks may be skipped",
                           hint=f"skip some of {list(CAPABILITY_CHECKS)}")

    def make() -> tuple[Any, Any]:
        made = agent_factory()
        return made if isinstance(made, tuple) else (made, None)

    if run is None:
        if context is _MISSING:
            raise InvalidInput("run_conformance needs context= (to record a run) or run=",
                               hint="pass the context the agent starts from")
        if side_effects is not None:
            side_effects.reset()
        run = record(make()[0], context=context, outcome=outcome, seed=seed)
    if not run.steps:
        raise InvalidInput("the recorded run has no steps, so there is nothing to check",
                           hint="give the agent a context it acts on")
    if side_effects is not None and not side_effects.calls:
        raise InvalidInput(f"the ledger saw no call of {sorted(side_effects.names)} while the "
                           "run was recorded, so counting them on branches would prove nothing",
                           hint="wrap the real tools with ledger.wrap(name, fn) and record a "
                                "run that calls one")
    ran = []

    def checked(name: str, fn: Callable[[], Any]) -> None:
        assert run is not None
        with _ledger_stays_empty(side_effects, name, run):
            fn()
        ran.append(name)

    checked("replay", lambda: check_replay_reproduces(make()[0], run, seed=seed))
    agent, counter = make()
    if counter is not None:
        checked("prefix", lambda: check_prefix_makes_no_calls(agent, run, counter, seed=seed))
    if Capability.FRAMEWORK_STATE in capabilities(agent):
        checked("state", lambda: check_held_state(make()[0], run, seed=seed))
    checked("lineage", lambda: check_branch_lineage(make()[0], run, outcome, seed=seed))
    checked("forced", lambda: check_forced_values(make()[0], run, seed=seed))
    checked("noise", lambda: check_same_noise_same_branch(make()[0], run, seed=seed))
    checked("identity", lambda: check_identity_edit(make()[0], run, outcome, seed=seed,
                                                    rollouts=identity_rollouts, alpha=alpha))
    caps = {c for c in capabilities(agent) if _CHECK_OF.get(c) not in skip}
    if Capability.ASYNC_BRANCH in caps:
        checked("async", lambda: check_async_branch(make()[0], run, outcome, seed=seed,
                                                    alpha=alpha))
    if Capability.STOP in caps and len(run.steps) >= 2:
        checked("stop", lambda: check_stop_honoured(make()[0], run, seed=seed))
    if Capability.COUPLES_NOISE in caps:
        checked("coupling", lambda: check_coupling_measured(make()[0], run, outcome, seed=seed))
    if Capability.FINGERPRINT in caps:
        crossed: list[bool] = []
        checked("fingerprint", lambda: crossed.append(check_fingerprint_stable(agent_factory,
                                                                               run)))
        if not crossed[0]:  # said as it is: the other interpreter could not be used
            ran[-1] = "fingerprint-in-process"
    if side_effects is not None:
        check_no_side_effects(make()[0], run, side_effects, seed=seed)
        ran.append("side-effects")
    return ran


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


__all__ = [
    "CAPABILITY_CHECKS", "CHECKS", "CallCounter", "Choice", "CountedAgent", "Counters",
    "DictEnvironment", "FakeClock",
    "ScriptedPolicy", "SideEffectLedger", "action_key", "check_branch_lineage",
    "check_async_branch", "check_coupling_measured", "check_fingerprint_stable",
    "check_forced_values", "check_held_state", "check_identity_edit", "check_no_side_effects",
    "check_prefix_makes_no_calls", "check_replay_reproduces", "check_same_noise_same_branch",
    "check_stop_honoured",
    "count_calls", "run_conformance",
]
