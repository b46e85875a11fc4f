"""One conformance check per duty of the ``Agent`` protocol (``car_core.engine.protocols``).

``run_conformance`` (``car_core.testing.conformance``) runs them all; each takes an agent and
a recorded run and raises ``ConformanceFailure`` saying what broke. The checks of the optional
capabilities are in ``car_core.testing.capability_checks``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np

from car_core.engine.agent import Agent
from car_core.engine.protocols import FrameworkStateAgent
from car_core.engine.replay import action_match_rate, intervene
from car_core.errors import InvalidInput, InvalidIntervention, SideEffectBlocked
from car_core.model.actions import is_chat_action, same_action
from car_core.model.capabilities import Capability, capabilities
from car_core.model.interventions import (
    compile_plan,
    do_action,
    do_context,
    do_observation,
    do_resample,
)
from car_core.model.json_values import JSON, canonical
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import Origin
from car_core.testing._conformance import fail as _fail
from car_core.testing._conformance import noise_for as _noise
from car_core.testing._conformance import same_steps as _same_steps
from car_core.testing._conformance import sign_flip_p as _sign_flip_p
from car_core.testing.fakes import SideEffectLedger, StepCounter

__all__ = ["check_branch_lineage", "check_forced_values", "check_held_state",
           "check_identity_edit", "check_no_side_effects", "check_prefix_makes_no_calls",
           "check_replay_reproduces", "check_same_noise_same_branch", "ledger_stays_empty"]


def check_replay_reproduces(agent: Agent, run: Trajectory, *, seed: int = 0) -> Trajectory:
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


def check_prefix_makes_no_calls(agent: Agent, run: Trajectory, counter: StepCounter, *,
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


def _differing(want: object, got: object) -> str:
    """What differs between two recorded states, in a few words: the top-level keys of two
    mappings, else both values."""
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        keys = sorted(str(key) for key in set(want) | set(got)
                      if canonical(want.get(key)) != canonical(got.get(key)))
        return f"key(s) {keys} differ"
    return f"{got!r} instead of {want!r}"


def check_held_state(agent: Agent, run: Trajectory, *, steps: Sequence[int] | None = None,
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
    read = (cast(FrameworkStateAgent, agent).framework_state
            if Capability.FRAMEWORK_STATE in capabilities(agent) else None)
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


def check_branch_lineage(agent: Agent, run: Trajectory, outcome: OutcomeLike, *,
                         step: int | None = None, seed: int = 0) -> None:
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


def check_forced_values(agent: Agent, run: Trajectory, *, seed: int = 0) -> None:
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


def check_same_noise_same_branch(agent: Agent, run: Trajectory, *, seed: int = 0) -> None:
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


def check_identity_edit(agent: Agent, run: Trajectory, outcome: OutcomeLike, *,
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
        same, resampled = (intervene(run, agent, arm, outcome=outcome, rollouts=rollouts,
                                     seed=seed + k, progress=False)
                           for arm in (do_context(k, _unchanged, "unchanged"), do_resample(k)))
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
def ledger_stays_empty(ledger: SideEffectLedger | None, check: str, run: Trajectory
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


def check_no_side_effects(agent: Agent, run: Trajectory, ledger: SideEffectLedger, *,
                          seed: int = 0) -> None:
    """Branch ``do_resample(k)`` at every step and count real side-effect calls: there must be
    none. A branch the agent stops with ``SideEffectBlocked`` kept the tool from running, which
    is allowed."""
    with ledger_stays_empty(ledger, "side-effects", run):
        for k in range(len(run.steps)):
            try:
                agent.branch(run, compile_plan(run, do_resample(k)), _noise(seed, k))
            except SideEffectBlocked:
                pass
