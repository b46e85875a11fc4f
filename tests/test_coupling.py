"""Results say whether branches were coupled and why; an agent's ``seed_check`` can veto it."""

from __future__ import annotations

from dataclasses import dataclass

import car_core as car
from car_core.model.seeding import coupling
from car_core.testing import synthetic as syn


@dataclass
class Checked(car.FunctionAgent):
    """A FunctionAgent whose backend, it says, ignores the seed (``verdict``)."""

    verdict: str | None = None
    checks: int = 0

    def seed_check(self, run: car.Trajectory) -> str | None:
        self.checks += 1
        return self.verdict


def _agent(verdict: str | None) -> Checked:
    base = syn.pivot().agent()
    return Checked(policy=base.policy, environment=base.environment, is_final=base.is_final,
                   max_steps=base.max_steps, name=base.name, verdict=verdict)


def test_coupling_reasons() -> None:
    plain = car.FunctionAgent(policy=lambda h, rng: 0, max_steps=1)
    assert coupling(plain, None, True) == (
        True, "the agent was handed CAR's noise streams (not a claim that it drew from them)")
    assert coupling(plain, None, False)[0] is False
    assert "not requested" in coupling(plain, None, False)[1]
    uncoupled = car.FunctionAgent(policy=lambda h, rng: 0, max_steps=1, couples_noise=False)
    assert coupling(uncoupled, None, True) == (
        False, "the agent's randomness does not come from CAR's noise streams")


def test_a_seed_check_veto_reaches_every_result(pivot_model: syn.SyntheticSCM,
                                                pivot_run: car.Trajectory) -> None:
    outcome = pivot_model.outcome
    agent = _agent("measured: the server ignores the request seed")
    dist = car.intervene(pivot_run, agent, car.do_resample(0), outcome=outcome, rollouts=4)
    res = car.contrastive(pivot_run, agent, outcome=outcome, rollouts=4)
    sh = car.shapley(pivot_run, agent, outcome=outcome, budget=40, mode="permutation")
    for r in (dist, res, sh):
        assert r.coupled is False and r.to_dict()["coupling"].endswith("ignores the request seed")
    assert "coupling: unpaired: " in res.explain()
    assert "noise handed out: measured: the server ignores" in res.explain()
    honest = _agent(None)
    res = car.contrastive(pivot_run, honest, outcome=outcome, rollouts=4)
    assert res.coupling and res.coupling.startswith("measured")
    # ``coupled`` is what the rollouts showed, not what the check said
    assert res.coupled == (res.coupling_ci is not None and res.coupling_ci[0] > 0)
    assert honest.checks == 1


def test_coupling_is_measured_from_the_pairs_not_taken_from_a_flag() -> None:
    """Arms that copy each other rollout by rollout measure 1; independent ones 0 within the
    noise (4000 pairs at rates 0.5: SD of the agreement 0.008, of the estimate 0.016, so 0.07
    is > 4 SD); an arm that never varies says nothing."""
    import numpy as np

    from car_core.stats import coupling_of
    rng = np.random.default_rng(0)
    a = (rng.random(4000) < 0.5).astype(float)
    b = (rng.random(4000) < 0.5).astype(float)
    same = coupling_of([(a.tolist(), a.tolist())])
    assert same.estimate == 1.0 and same.shared
    free = coupling_of([(a.tolist(), b.tolist())])
    assert free.estimate is not None and abs(free.estimate) <= 0.07 and not free.shared
    assert coupling_of([([1.0] * 50, b[:50].tolist())]).estimate is None


def test_results_report_the_measured_coupling(pivot_model: syn.SyntheticSCM) -> None:
    """A noisy pivot (the judge gives both arms variance) through the engine: the coupling is
    measured and reported with the pairs it came from; the same agent without CAR's noise is
    not measured as shared (a 2.5% chance per run; this seed is fixed)."""
    model = syn.noisy_pivot()
    run = model.failing_run(0)
    shared = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=32)
    assert shared.coupling_measured is not None and shared.coupling_pairs > 0
    loose = model.agent()
    loose.couples_noise = False
    free = car.contrastive(run, loose, outcome=model.outcome, rollouts=32)
    assert free.coupling == "the agent's randomness does not come from CAR's noise streams"
    assert not free.coupled and free.coupling_pairs > 0
    data = shared.to_dict()
    assert type(shared).from_dict(data).coupling_ci == shared.coupling_ci


def _desk(coupling: str) -> tuple[syn.PlantedDesk, car.Trajectory]:
    desk = syn.PlantedDesk(4, at=2, rescue=0.5, flip=0.1, coupling=coupling)
    return desk, car.record(desk.agent(), context=None, outcome=desk.judge, seed=0)


def test_intervene_measures_coupling_from_twins_not_from_the_agents_claim() -> None:
    """Both desks are plain FunctionAgents that claim CAR's noise; only the first uses it.
    A twin on the same noise repeats its branch exactly (measured 1, shared) at ``full``; at
    ``none`` the branch and its twin are independent draws at rate 0.5 (after the pivot
    resampled, P(fail) = 0.5·0.9 + 0.5·0.1), and 16 such pairs look shared only when their
    agreement's Wilson lower end clears independence: a 2.5% chance, fixed by the seed."""
    for level, shared in (("full", True), ("none", False)):
        desk, run = _desk(level)
        dist = car.intervene(run, desk.agent(), car.do_resample(2), outcome=desk.judge,
                             rollouts=16, twins=16, progress=False)
        assert dist.coupled is shared and dist.coupling_pairs == 16
        assert dist.rollouts_used == 32 and dist.n == 16  # twins are spent, not averaged
        # handed, not claimed: an agent that ignores the streams is told apart by the measure
        assert dist.coupling == ("the agent was handed CAR's noise streams (not a claim that "
                                 "it drew from them)")
        if shared:
            assert dist.coupling_measured == 1.0
        assert dist.to_dict()["coupling_pairs"] == 16
    plain = car.intervene(run, desk.agent(), car.do_resample(2), outcome=desk.judge,
                          rollouts=16, progress=False)
    assert plain.coupling_measured is None and not plain.coupled and plain.rollouts_used == 16


def test_shapley_reports_the_coupling_its_pairs_show() -> None:
    """Permutation units put every coalition on one rollout index: at ``full`` a coalition
    that resamples the pivot repeats ``v(∅)``'s outcome and one that holds it ``v(N)``'s, so the
    pairs agree beyond chance (on a failed run about 0.3, its interval clear of 0); at
    ``none`` (the agent still claims CAR's noise) they agree by chance only, and exact mode
    hands out no shared noise at all. About 650 pairs pool here; their 95% interval's
    half-width is about 0.21 (1.96 SD), so 0.3 is about 2.8 SD. Each desk's run is a failed
    one: an attribution refuses a run that did not fail."""
    desk = syn.PlantedDesk(4, at=2, rescue=0.5, flip=0.1, coupling="full")
    run = desk.failing_run()
    sh = car.shapley(run, desk.agent(), outcome=desk.judge, budget=400, mode="permutation")
    # shown shared: the agreement's interval lies above independence (0), as it must at full
    assert sh.coupled and sh.coupling_measured is not None and sh.coupling_ci is not None
    assert sh.coupling_ci.low > 0
    loose_desk = syn.PlantedDesk(4, at=2, rescue=0.5, flip=0.1, coupling="none")
    loose_run = loose_desk.failing_run()
    loose = car.shapley(loose_run, loose_desk.agent(), outcome=loose_desk.judge, budget=400,
                        mode="permutation")
    assert not loose.coupled and loose.coupling_pairs > 0
    assert loose.coupling_measured is not None and abs(loose.coupling_measured) < 0.3
    assert ("unpaired: branches were not shown to share randomness (measured coupling"
            in loose.explain())
    exact = car.shapley(run, desk.agent(), outcome=desk.judge, budget=400, mode="exact")
    assert not exact.coupled
    assert type(sh).from_dict(sh.to_dict()).coupling_ci == sh.coupling_ci
