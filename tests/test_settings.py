"""Estimator settings as objects: one budget rule, the same estimate as the keyword call, and
the settings a resume takes from the attribution it continues."""

from __future__ import annotations

import pytest

import car_core as car
from car_core.errors import InvalidBudget, InvalidInput, NothingToAttribute
from car_core.testing import synthetic as syn


@pytest.fixture(scope="module")
def pivot() -> tuple[syn.SyntheticSCM, car.Trajectory]:
    model = syn.pivot(n_steps=4, at=1, p_bad=0.5)
    return model, model.failing_run()


@pytest.mark.parametrize(("budget", "cap"), [(None, 4 * 8), (20, 20), (500, 500),
                                              (car.Budget(tokens=10**6), 4 * 8)])
def test_the_budget_rule_is_the_estimators(pivot: tuple[syn.SyntheticSCM, car.Trajectory],
                                           budget: car.Budget | int | None, cap: int) -> None:
    model, run = pivot
    settings = car.ContrastiveSettings(rollouts=8, budget=budget)
    assert settings.budget_for(len(run.steps)) == cap
    result = settings.run(run, model.agent(), model.outcome)
    assert result.rollout_budget == cap and result.rollouts_used <= cap


@pytest.mark.parametrize("budget", [None, car.Budget(tokens=10**6)])
def test_no_steps_have_no_budget_rather_than_a_zero_one(budget: car.Budget | None) -> None:
    """n·K of a run with no steps is no budget to refuse (``rollouts=0``, which nobody gave):
    the run has nothing to attribute, which is what the rule says."""
    with pytest.raises(NothingToAttribute, match="no steps"):
        car.ContrastiveSettings(rollouts=8, budget=budget).budget_for(0)
    assert car.ContrastiveSettings(rollouts=8, budget=50).budget_for(0) == 50  # a cap given


def test_run_is_the_keyword_call(pivot: tuple[syn.SyntheticSCM, car.Trajectory]) -> None:
    model, run = pivot
    by_object = car.ContrastiveSettings(rollouts=16, seed=3).run(run, model.agent(),
                                                                 model.outcome)
    by_keywords = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16, seed=3)
    assert by_object.locus == by_keywords.locus
    assert by_object.rollouts_used == by_keywords.rollouts_used
    assert [s.effect for s in by_object.steps] == [s.effect for s in by_keywords.steps]
    sh = car.ShapleySettings(budget=256, seed=1).run(run, model.agent(), model.outcome)
    kw = car.shapley(run, model.agent(), outcome=model.outcome, budget=256, seed=1)
    assert [v.estimate for v in sh.values] == [v.estimate for v in kw.values]
    assert car.ShapleySettings(budget=256).budget_for(len(run.steps)) == 256 >= sh.rollouts_used


def test_bad_settings_are_refused_when_made() -> None:
    with pytest.raises(InvalidInput, match="rollouts=0"):
        car.ContrastiveSettings(rollouts=0)
    with pytest.raises(InvalidInput, match="alpha=1.5"):
        car.ContrastiveSettings(alpha=1.5)
    with pytest.raises(InvalidInput, match="search='linear'"):
        car.ContrastiveSettings(search="linear")
    with pytest.raises(InvalidBudget):
        car.ShapleySettings(budget=True)
    with pytest.raises(InvalidInput, match="mode='sampled'"):
        car.ShapleySettings(mode="sampled")


def test_a_resume_takes_what_it_leaves_out_from_the_attribution() -> None:
    stored = {"rollouts": 16, "alpha": 0.1, "seed": 7, "budget": {"rollouts": 4 * 16}}
    s = car.ContrastiveSettings.resumed(stored, 4)
    # the stored cap was only what K implied for 4 steps: no cap the user gave
    assert (s.rollouts, s.alpha, s.seed, s.budget) == (16, 0.1, 7, None)
    assert s.budget_for(4) == 64
    bigger = car.ContrastiveSettings.resumed(stored, 4, rollouts=32)
    assert bigger.budget_for(4) == 128  # a larger K may spend more
    capped = car.ContrastiveSettings.resumed({**stored, "budget": {"rollouts": 40}}, 4)
    assert capped.budget_for(4) == 40  # a cap below n·K was the user's: kept
    # and so was one above it: a trial's resume of an attribution the pytest plugin began with
    # a budget of 256 (K = 16, 2 steps) went on under 32 and said "budget ran out"
    raised = car.ContrastiveSettings.resumed({**stored, "budget": {"rollouts": 256}}, 4)
    assert raised.budget_for(4) == 256
    assert car.ContrastiveSettings.resumed(stored, 4, budget=300).budget_for(4) == 300
    fresh = car.ContrastiveSettings.resumed({}, 4)
    assert fresh == car.ContrastiveSettings()
    sh = car.ShapleySettings.resumed({"budget": {"rollouts": 900}, "level": 0.9, "seed": 2}, 4)
    assert (sh.budget, sh.level, sh.seed) == (900, 0.9, 2)
    assert car.ShapleySettings.resumed({}, 4, level=0.8) == car.ShapleySettings(level=0.8)
