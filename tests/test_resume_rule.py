"""The one resume rule, from the API: a resume may change the caps (how far the estimate may
go) and then gives exactly the result a fresh attribution with those caps gives, reusing the
branches it stored; it may not change the error rate the result claims (alpha, level), the
seed, the coupling or the run. The command follows the same rule (tests/test_cli.py)."""

from __future__ import annotations

from typing import Any

import pytest
from _estimator_helpers import counted

import car_core as car
from car_core.errors import InvalidInput
from car_core.model.vocabulary import Answer
from car_core.testing import synthetic as syn


def without_id(result: Any) -> dict[str, Any]:
    """The result less what names it: its attribution id, and the example branch's own id
    and creation time (a branch run again gets new ones; its steps and outcome are kept)."""
    data = result.to_dict()
    data.pop("attribution_id")
    example = data.get("example_branch")
    if example:
        example = {k: v for k, v in example.items() if k not in ("id", "created_at")}
        if example.get("lineage"):
            example["lineage"] = {**example["lineage"], "attribution_id": None}
        data["example_branch"] = example
    return data


def test_a_larger_contrastive_cap_continues_the_attribution_as_a_fresh_one_would(store):
    model = syn.noisy_pivot()
    run = model.failing_run(0)
    small = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=2, seed=0,
                            store=store, attribution_id="grow", progress=False)
    assert small.truncated  # K=2 cannot decide this noisy pivot: there is something to continue
    kept = {(b["arm"], b["rollout"]) for b in store.branches("grow")}
    agent, counter = counted(model)
    grown = car.contrastive(run, agent, outcome=model.outcome, rollouts=16, seed=0,
                            store=store, attribution_id="grow", progress=False)
    fresh = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16, seed=0,
                            progress=False)
    assert grown.attribution_id == "grow" and not grown.truncated
    assert without_id(grown) == without_id(fresh)  # the same estimate, figures and params
    after = {(b["arm"], b["rollout"]) for b in store.branches("grow")}
    assert kept < after  # the stored branches were kept and the new ones added
    # each branch decides its live steps once; the reused ones decided nothing this time
    live_decisions = counter.counters[0].calls
    assert 0 < len(after - kept) <= live_decisions
    stored = store.attribution("grow")
    assert stored.status == "complete" and stored.result.to_dict() == grown.to_dict()


def test_a_larger_shapley_budget_continues_the_attribution_as_a_fresh_one_would(store):
    model = syn.and_game()
    run = model.failing_run(0)
    car.shapley(run, model.agent(), outcome=model.outcome, budget=160, mode="exact", seed=0,
                store=store, attribution_id="grow", progress=False)
    kept = len(store.branches("grow"))
    grown = car.shapley(run, model.agent(), outcome=model.outcome, budget=320, mode="exact",
                        seed=0, store=store, attribution_id="grow", progress=False)
    fresh = car.shapley(run, model.agent(), outcome=model.outcome, budget=320, mode="exact",
                        seed=0, progress=False)
    assert without_id(grown) == without_id(fresh)
    assert kept < len(store.branches("grow")) == grown.rollouts_used


@pytest.mark.parametrize("change", [{"alpha": 0.1}, {"seed": 1}])
def test_a_contrastive_resume_may_not_change_alpha_or_seed(store, change):
    model = syn.pivot()
    run = model.failing_run(0)
    first = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4,
                            store=store, attribution_id="a1", progress=False)
    key = next(iter(change))
    with pytest.raises(InvalidInput, match=f"started with {key}="):
        car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4, store=store,
                        attribution_id="a1", progress=False, **change)
    assert store.attribution("a1").result.to_dict() == first.to_dict()  # untouched


def test_a_shapley_resume_may_not_change_the_level(store):
    model = syn.and_game()
    run = model.failing_run(0)
    car.shapley(run, model.agent(), outcome=model.outcome, budget=160, store=store,
                attribution_id="s1", progress=False)
    before = len(store.branches("s1"))
    with pytest.raises(InvalidInput, match="started with level=0.95, not 0.9"):
        car.shapley(run, model.agent(), outcome=model.outcome, budget=320, level=0.9,
                    store=store, attribution_id="s1", progress=False)
    assert len(store.branches("s1")) == before  # refused before any branch ran



def test_a_resume_on_an_agents_own_noise_reads_stored_branches_back_and_draws_within_its_cap(
        store):
    """Where the agent draws its own randomness (a hosted model, an unseeded judge) a branch
    cannot be drawn again as it was: a resume reads each stored one back instead of running it,
    and the branches it does run fit the larger cap. The larger budget can send the search
    another way, so not every stored branch is asked for again (the README gives the share)."""
    # the desk's own stream also feeds the check of the judge on the record before any branch
    desk = syn.PlantedDesk(4, 2, 0.3, 0.1, "none", seed=3)
    run = desk.failing_run()
    first = car.contrastive(run, desk.agent(), outcome=desk.judge, rollouts=32, seed=0,
                            store=store, attribution_id="own", progress=False)
    assert first.answer == Answer.UNDECIDED  # desk seed 3 leaves something to continue
    kept = {(b["arm"], b["rollout"]): b["outcome"] for b in store.branches("own")}
    assert len(kept) == first.rollouts_used
    budget = first.larger_budget()
    grown = car.contrastive(run, desk.agent(), outcome=desk.judge, rollouts=32, seed=0,
                            store=store, attribution_id="own", progress=False,
                            budget=car.Budget(**budget))
    after = {(b["arm"], b["rollout"]): b["outcome"] for b in store.branches("own")}
    assert {key: after[key] for key in kept} == kept  # read back, not drawn again
    assert 0 < len(after) - len(kept) <= grown.rollouts_used <= budget["rollouts"]
    measured = {arm.hold_before: arm.n for arm in grown.arms}
    stored = {arm: sum(1 for (a, _r) in after if a == f"hold<{arm}") for arm in measured}
    assert all(measured[arm] <= stored[arm] for arm in measured)


def always_fails(run: car.Trajectory) -> float:
    return 1.0


def test_a_resume_may_not_change_the_outcome_that_scores_its_branches(store):
    """A trial resumed an interrupted attribution with another ``--outcome``: the stored
    branches were read back as the first outcome scored them, the new ones scored by the
    second, and the answer ("undecided") matched neither a fresh run of the first (a locus)
    nor of the second ("no cause"). The outcome is part of what a branch is."""
    model = syn.pivot()
    run = model.failing_run(0)
    first = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4,
                            store=store, attribution_id="o1", progress=False)
    before = len(store.branches("o1"))
    with pytest.raises(InvalidInput, match=r"started with outcome='car_core\.testing\.synthetic"
                                           r":SyntheticSCM\.outcome', not '.*always_fails'"):
        car.contrastive(run, model.agent(), outcome=always_fails, rollouts=8, store=store,
                        attribution_id="o1", progress=False)
    assert len(store.branches("o1")) == before
    assert store.attribution("o1").result.to_dict() == first.to_dict()
    again = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=8, store=store,
                            attribution_id="o1", progress=False)
    assert again.attribution_id == "o1"
