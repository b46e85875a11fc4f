"""Sizes with bounds through the Python API, as the ``car`` command has them: ``car.intervene``,
``car.contrastive`` and ``car.shapley`` refuse a rollout count or budget past
``defaults.MAX_ROLLOUTS`` / ``MAX_BUDGET`` before any branch (``InvalidBudget`` naming the
bound and the keyword that raises it), and a resume never silently shrinks a finished result."""

from __future__ import annotations

from typing import Any

import pytest

import car_core as car
from car_core.errors import InvalidBudget, InvalidInput
from car_core.store import RunStore
from car_core.testing import synthetic as syn


class Counted:
    """The pivot agent, counting the branches it is asked to run: a refusal "before any
    branch" must leave the count at zero."""

    def __init__(self, model: syn.SyntheticSCM) -> None:
        self.inner = model.agent()
        self.branches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def branch(self, *args: Any, **kwargs: Any) -> Any:
        self.branches += 1
        return self.inner.branch(*args, **kwargs)


def estimates(model: syn.SyntheticSCM) -> dict[str, Any]:
    return {
        "intervene": lambda run, agent, **kw: car.intervene(
            run, agent, car.do_resample(0), outcome=model.outcome, **kw),
        "contrastive": lambda run, agent, **kw: car.contrastive(
            run, agent, outcome=model.outcome, **kw),
        "shapley": lambda run, agent, **kw: car.shapley(run, agent, outcome=model.outcome, **kw),
    }


@pytest.mark.parametrize(("name", "asked", "bound", "keyword"), [
    ("intervene", {"rollouts": 2**63}, "100,000", "max_rollouts=9223372036854775808"),
    ("contrastive", {"rollouts": 10**6}, "100,000", "max_rollouts=1000000"),
    # 90,000 per arm is within its bound, but over the pivot's 6 steps that is 540,000 in all
    ("contrastive", {"rollouts": 90_000, "max_budget": 500_000}, "500,000",
     "max_budget=540000"),
    ("contrastive", {"budget": 2**70}, "10,000,000", "max_budget=1180591620717411303424"),
    ("shapley", {"budget": 2**70}, "10,000,000", "max_budget=1180591620717411303424"),
])
def test_a_size_past_its_bound_is_refused_before_any_branch(pivot_model, pivot_run, tmp_path,
                                                            name, asked, bound, keyword):
    assert len(pivot_run.steps) == 6
    agent = Counted(pivot_model)
    agent.name = pivot_model.agent().name
    kwargs: dict[str, Any] = dict(asked)
    store = None
    if name != "intervene":
        store = kwargs["store"] = RunStore(tmp_path / "car.db")
    with pytest.raises(InvalidBudget, match=f"above the bound of {bound}") as err:
        estimates(pivot_model)[name](pivot_run, agent, **kwargs)
    assert keyword in str(err.value)
    assert agent.branches == 0
    if store is not None:
        assert store.attributions() == []
        store.close()


def test_a_bound_raised_knowingly_lets_the_size_run(pivot_model, pivot_run):
    agent = pivot_model.agent()
    with pytest.raises(InvalidBudget, match="max_rollouts=5"):
        car.intervene(pivot_run, agent, car.do_resample(0), outcome=pivot_model.outcome,
                      rollouts=5, max_rollouts=4)
    ran = car.intervene(pivot_run, agent, car.do_resample(0), outcome=pivot_model.outcome,
                        rollouts=5, max_rollouts=5)
    assert ran.n == 5
    # a huge count under a small cap is no slip: the cap is what runs
    capped = car.intervene(pivot_run, agent, car.do_resample(0), outcome=pivot_model.outcome,
                           rollouts=10**9, budget=3)
    assert capped.n == 3 and capped.truncated
    with pytest.raises(InvalidInput, match="max_budget=0"):
        car.shapley(pivot_run, agent, outcome=pivot_model.outcome, max_budget=0)


@pytest.mark.parametrize(("method", "first", "smaller"), [
    ("contrastive", {"rollouts": 16}, {"rollouts": 4}),
    ("shapley", {"budget": 200}, {"budget": 100}),
])
def test_a_resume_that_would_shrink_a_finished_result_is_refused_unless_replace(
        pivot_model, pivot_run, store, method, first, smaller):
    estimate = estimates(pivot_model)[method]
    agent = pivot_model.agent()
    done = estimate(pivot_run, agent, store=store, **first)
    aid, used = done.attribution_id, done.rollouts_used
    with pytest.raises(InvalidInput, match=f"already has a complete result from {used} "
                                           "rollouts") as err:
        estimate(pivot_run, agent, store=store, attribution_id=aid, **smaller)
    assert "replace=True" in str(err.value)
    kept = store.attribution(aid)  # the earlier result is kept, its row finished
    assert kept.result is not None and kept.result.rollouts_used == used
    assert str(kept.status) == "complete" and not store.holds(aid)
    again = estimate(pivot_run, agent, store=store, attribution_id=aid, **first)
    assert again.rollouts_used == used  # its own settings: the same result, no refusal
    replaced = estimate(pivot_run, agent, store=store, attribution_id=aid, replace=True,
                        **smaller)
    assert replaced.rollouts_used < used
    assert store.attribution(aid).result.rollouts_used == replaced.rollouts_used


@pytest.mark.parametrize(("name", "asked", "bound", "keyword"), [
    ("context", {"rollouts": 2**63}, "10,000,000", "max_budget=9223372036854775808"),
    ("repairs", {"rollouts": 2**63}, "100,000", "max_rollouts=9223372036854775808"),
    ("repairs", {"rollouts": 200_000, "max_rollouts": 150_000}, "150,000",
     "max_rollouts=200000"),
])
def test_a_step_estimate_past_its_bound_is_refused_before_any_branch(pivot_model, pivot_run,
                                                                     name, asked, bound,
                                                                     keyword):
    """car.context_attribution (``rollouts`` is its whole budget) and car.repairs (a cap per
    arm) have bounds too, raised with the keyword the hint names."""
    agent = Counted(pivot_model)
    agent.name = pivot_model.agent().name
    run = {"context": lambda **kw: car.context_attribution(
               pivot_run, agent, step=2, outcome=pivot_model.outcome, **kw),
           "repairs": lambda **kw: car.repairs(
               pivot_run, agent, step=2, candidates=[car.add_instruction(2, "Choose well.")],
               outcome=pivot_model.outcome, **kw)}[name]
    with pytest.raises(InvalidBudget, match=f"above the bound of {bound}") as err:
        run(**asked)
    assert keyword in str(err.value)
    assert agent.branches == 0
