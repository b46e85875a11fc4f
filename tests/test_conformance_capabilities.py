"""One conformance check per optional capability: a faithful framework-free agent passes each,
and an agent planted with the one mistake a check is about fails it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import car_core as car
from car_core.engine.agent import drive
from car_core.errors import ConformanceFailure, InvalidInput, InvalidIntervention
from car_core.model.capabilities import Capability, capabilities
from car_core.model.interventions import Plan, compile_plan
from car_core.model.seeding import Noise
from car_core.testing import (
    Choice,
    DictEnvironment,
    ScriptedPolicy,
    check_async_branch,
    check_coupling_measured,
    check_fingerprint_stable,
    check_forced_values,
    check_stop_honoured,
    run_conformance,
)
from car_core.testing import synthetic as syn

TOOLS = ("refund", "escalate", "close", "reply")


def policy() -> ScriptedPolicy:
    coin = Choice([("refund", 0.5), ("escalate", 0.5)])
    return ScriptedPolicy({0: coin, 1: coin, 2: Choice([("close", 0.5), ("reply", 0.5)]),
                           3: "done"}, after="done")


def environment() -> DictEnvironment:
    return DictEnvironment({t: Choice([("ok", 0.7), ("late", 0.3)]) for t in TOOLS})


def refunded(run: car.Trajectory) -> bool:
    return any(s.action == "refund" for s in run.steps)


def desk(cls: type[car.FunctionAgent] = car.FunctionAgent, **kw: Any) -> car.FunctionAgent:
    return cls(policy=policy(), environment=environment(), is_final=lambda a: a == "done",
               max_steps=6, name="desk", **kw)


@pytest.fixture(scope="module")
def run() -> car.Trajectory:
    """The first recorded run that refunds at step 0 (a failing run, as attributions get)."""
    runs = (car.record(desk(), context="ticket", outcome=refunded, seed=s) for s in range(50))
    return next(r for r in runs if r.steps[0].action == "refund")


# -- async branch ---------------------------------------------------------------------------
class AsyncDesk(car.FunctionAgent):
    async def abranch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        return self.branch(run, plan, noise)


class AsyncDeskOnOtherNoise(car.FunctionAgent):
    """Planted: its coroutine draws from another seed than the noise it is given."""

    async def abranch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        return self.branch(run, plan, Noise(noise.seed + 1, noise.key))


class AsyncDeskThatNeverRefunds(car.FunctionAgent):
    """Planted: its coroutine ignores the plan and escalates at every step."""

    async def abranch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        escalate = [car.do_action(j, "escalate") for j in range(len(run.steps))]
        return self.branch(run, compile_plan(run, escalate), noise)


def test_async_branch_that_is_branch_as_a_coroutine_passes(run: car.Trajectory) -> None:
    agent = desk(AsyncDesk)
    assert Capability.ASYNC_BRANCH in capabilities(agent)
    check_async_branch(agent, run, refunded)


def test_async_branch_on_other_noise_fails(run: car.Trajectory) -> None:
    with pytest.raises(ConformanceFailure, match="async: under the same noise"):
        check_async_branch(desk(AsyncDeskOnOtherNoise), run, refunded)


def test_an_uncoupled_async_branch_with_another_law_fails_the_paired_test(
        run: car.Trajectory) -> None:
    # couples_noise=False: only the outcome laws are compared. The recorded run refunds at
    # step 0, so do_resample(3) holds a refund (outcome 1, 8 pairs) and do_resample(0)
    # refunds with probability 3/4; the planted coroutine never refunds (outcome 0), so about
    # 14 of 16 paired differences are -1 and none +1: sign-flip p ~ 2^-13 < alpha = 1e-3
    agent = desk(AsyncDeskThatNeverRefunds, couples_noise=False)
    with pytest.raises(ConformanceFailure, match="async: P\\(fail\\) differs"):
        check_async_branch(agent, run, refunded)
    check_async_branch(desk(AsyncDesk, couples_noise=False), run, refunded)


# -- stop ------------------------------------------------------------------------------------
class DeafToStop(car.FunctionAgent):
    """Planted: takes ``stop`` (so it claims the capability) and ignores it."""

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise,
               stop: Any = None) -> car.Trajectory:
        return drive(self, run, plan, noise)


class StopsAfterOneStep(car.FunctionAgent):
    """Planted: asks ``stop``, but ends every branch after its first step whatever it says."""

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise,
               stop: Any = None) -> car.Trajectory:
        def early(partial: car.Trajectory) -> bool:
            return bool(stop is not None and stop(partial)) or len(partial.steps) >= 1
        return drive(self, run, plan, noise, stop=early)


def test_stop_is_honoured_by_function_agent(run: car.Trajectory) -> None:
    assert check_stop_honoured(desk(), run) is True


def test_an_agent_that_ignores_stop_fails(run: car.Trajectory) -> None:
    with pytest.raises(ConformanceFailure, match="stop: a branch from step 0 given stop= never "
                                                 "called it"):
        check_stop_honoured(desk(DeafToStop), run)


def test_an_agent_that_stops_before_stop_holds_fails(run: car.Trajectory) -> None:
    with pytest.raises(ConformanceFailure, match="a stop that never holds cut the branch"):
        check_stop_honoured(desk(StopsAfterOneStep), run)


# -- coupling --------------------------------------------------------------------------------
class OwnRandomness:
    """Planted: a policy that draws from its own generator and ignores the rng it is given, as
    a hosted model ignores its seed."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(11)
        self.inner = policy()

    def __call__(self, history: car.History, rng: np.random.Generator) -> Any:
        return self.inner(history, self.rng)


def test_coupling_claim_that_the_branches_show_passes(run: car.Trajectory) -> None:
    check_coupling_measured(desk(), run, refunded)


def test_coupling_claimed_but_not_shared_fails(run: car.Trajectory) -> None:
    agent = car.FunctionAgent(policy=OwnRandomness(), environment=environment(),
                              is_final=lambda a: a == "done", max_steps=6, name="desk")
    assert Capability.COUPLES_NOISE in capabilities(agent)
    with pytest.raises(ConformanceFailure, match="says couples_noise=True, but"):
        check_coupling_measured(agent, run, refunded, rollouts=16)


def test_no_coupling_claimed_means_nothing_to_check(run: car.Trajectory) -> None:
    agent = car.FunctionAgent(policy=OwnRandomness(), environment=environment(),
                              is_final=lambda a: a == "done", max_steps=6, name="desk",
                              couples_noise=False)
    assert Capability.COUPLES_NOISE not in capabilities(agent)
    check_coupling_measured(agent, run, refunded)


# -- fingerprint -----------------------------------------------------------------------------
class NamedDesk(car.FunctionAgent):
    def fingerprint(self) -> Any:
        return {"tools": list(TOOLS)}


class HashedDesk(car.FunctionAgent):
    """Planted: names its tools by ``hash()``, which another interpreter seeds differently."""

    def fingerprint(self) -> Any:
        return {"tools": [hash(t) for t in TOOLS]}


class ReprDesk(car.FunctionAgent):
    """Planted: puts its policy's ``repr()`` (with a memory address) in the fingerprint."""

    def fingerprint(self) -> Any:
        return {"policy": repr(self.policy)}


def named_desk() -> car.FunctionAgent:
    return desk(NamedDesk)


def hashed_desk() -> car.FunctionAgent:
    return desk(HashedDesk)


def test_a_stable_fingerprint_passes_in_a_fresh_interpreter() -> None:
    assert check_fingerprint_stable(named_desk) is True


def test_a_fingerprint_that_changes_with_the_process_fails() -> None:
    # hash() of a str is salted per interpreter; the child gets PYTHONHASHSEED=random, so the
    # four hashes agree with this process's only by a 2**-64-scale coincidence
    with pytest.raises(ConformanceFailure, match="in this process and .* in a fresh interpreter"):
        check_fingerprint_stable(hashed_desk)


def test_a_fingerprint_with_a_memory_address_fails_before_any_process_starts() -> None:
    with pytest.raises(ConformanceFailure, match="names a memory address"):
        check_fingerprint_stable(lambda: desk(ReprDesk))


def test_a_factory_that_cannot_be_sent_is_checked_in_this_process_only() -> None:
    import threading
    lock = threading.Lock()  # a closure over a lock pickles neither by reference nor by value
    assert check_fingerprint_stable(lambda: (desk(NamedDesk), lock)) is False


# -- the suite ---------------------------------------------------------------------------------
def test_run_conformance_runs_the_check_of_each_capability_offered() -> None:
    ran = run_conformance(named_desk, context="ticket", outcome=refunded, seed=3,
                          identity_rollouts=8)
    assert ran == ["replay", "lineage", "forced", "noise", "identity", "stop", "coupling",
                   "fingerprint"]
    ran = run_conformance(lambda: desk(AsyncDesk), context="ticket", outcome=refunded, seed=3,
                          identity_rollouts=8)
    assert ran == ["replay", "lineage", "forced", "noise", "identity", "async", "stop",
                   "coupling"]


def test_a_capability_check_can_be_skipped_by_name_and_only_such_a_check() -> None:
    ran = run_conformance(lambda: desk(DeafToStop), context="ticket", outcome=refunded, seed=3,
                          identity_rollouts=8, skip=["stop"])
    assert "stop" not in ran and "coupling" in ran
    with pytest.raises(InvalidInput, match="only capability checks may be skipped"):
        run_conformance(named_desk, context="ticket", outcome=refunded, skip=["replay"])


def test_run_conformance_fails_on_the_planted_capability_mistake() -> None:
    with pytest.raises(ConformanceFailure, match="^stop:"):
        run_conformance(lambda: desk(DeafToStop), context="ticket", outcome=refunded, seed=3,
                        identity_rollouts=8)


class RefusesForcedObservations:
    """A ``FunctionAgent`` that refuses, by name, a forced observation at the steps in
    ``refused``, as an adapter does for a tool whose result cannot be forced without losing
    what it wrote to the app's state."""

    def __init__(self, inner: car.FunctionAgent, refused: set[int]) -> None:
        self.inner, self.refused, self.name = inner, refused, inner.name

    def start(self, context: Any, noise: Noise) -> car.Trajectory:
        return self.inner.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        for k in plan.forced_observations:
            if k in self.refused:
                raise InvalidIntervention(f"step {k}'s tool wrote the app's state",
                                          run_id=run.id, step=k)
        return self.inner.branch(run, plan, noise)

    def redecide(self, run: car.Trajectory, k: int, noise: Noise) -> Any:
        return self.inner.redecide(run, k, noise)


def test_the_forced_check_uses_the_latest_observation_the_agent_does_not_refuse() -> None:
    """A named refusal at the last observed step sends the check to an earlier one, where the
    forced observation must still be served; an agent that refuses every one fails it."""
    model = syn.pivot()
    run = model.failing_run(seed=0)
    observed = [s.index for s in run.steps if s.observed]
    assert len(observed) >= 2
    check_forced_values(RefusesForcedObservations(model.agent(), {observed[-1]}), run)
    with pytest.raises(ConformanceFailure, match="refused at every observed step"):
        check_forced_values(RefusesForcedObservations(model.agent(), set(observed)), run)
