"""The Shapley estimator against games with closed-form values (car_core.testing.synthetic)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from _estimator_helpers import TokenAgent, counted

import car_core as car
from car_core.errors import BranchesFailed, InvalidBudget, InvalidInput, NothingToAttribute
from car_core.testing import synthetic as syn

RESULT_KEYS = {"method", "run_id", "attribution_id", "mode", "values", "total", "v_full",
               "v_empty", "efficiency_gap", "level", "rollouts_used", "budget", "truncated",
               "budget_note", "seed", "coupled", "coupling", "tokens", "cost", "reason", "params",
               "failures", "coupling_measured", "coupling_ci", "coupling_pairs", "actions",
               "summary"}


def tolerance(n: int) -> float:
    """Permutation mode. For these monotone games every antithetic unit gives φ_i in [0, 1] —
    under common random numbers holding one more bad step can only raise the outcome — so its
    SD is at most 1/2 (Popoviciu) and the mean of n units has SD <= 1/(2√n). Four SDs: a miss
    has probability < 1e-4 under the normal approximation."""
    return 4 * 0.5 / math.sqrt(n)


def exact_tolerance(model, budget: int, groups=None) -> list[float]:
    """Exact mode, per player. With the slopes at their limits (first order), φ̂_i =
    Σ_S c_{i,S}(ȳ_S − β_S x̄_S) + Σ_f B_f q̂_f with B_f = Σ_{S: first free f} c_{i,S} β_S, where x
    is "the first free step f drew its factual (bad) choice again": in these games that is the
    same as holding f, so β_S = v(S ∪ f) − v(S with f good) and the residual variance of
    y − βx is v(S)(1 − v(S)) − β² q(1 − q), q = bad_prob[f]. Every coalition gets at least the
    pilot's floor(budget·PILOT_SHARE / 2^p) rollouts, so each q̂_f pools at least (its
    coalitions) × pilot. The two parts are correlated: their SDs add (Minkowski). Four SDs: a
    miss has probability < 1e-4 under the normal approximation."""
    from car_core.estimators.shapley import PILOT_SHARE, _coefficients

    groups = groups or [(k,) for k in range(model.n_steps)]
    p = len(groups)
    pilot = max(2, int(budget * PILOT_SHARE) // 2 ** p)
    held = {m: {k for i, g in enumerate(groups) if m >> i & 1 for k in g} for m in range(1 << p)}
    v = {m: model.value(h) for m, h in held.items()}
    first = {m: min((k for k in range(model.n_steps) if k not in h), default=None)
             for m, h in held.items()}
    tols = []
    for c in _coefficients(p):
        own, pooled, size = 0.0, {}, {}
        for m, f in first.items():
            var_y = v[m] * (1 - v[m])
            if f is None:
                own += c[m] ** 2 * var_y / pilot
                continue
            q = model.bad_prob[f]
            hi = model.value(held[m] | {f})
            beta = hi - (v[m] - q * hi) / (1 - q)
            own += c[m] ** 2 * (var_y - beta ** 2 * q * (1 - q)) / pilot
            pooled[f] = pooled.get(f, 0.0) + c[m] * beta
            size[f] = size.get(f, 0) + 1
        shared = sum(b ** 2 * model.bad_prob[f] * (1 - model.bad_prob[f]) / (size[f] * pilot)
                     for f, b in pooled.items())
        tols.append(4 * (math.sqrt(max(own, 0.0)) + math.sqrt(shared)))
    return tols


def within(sh, truth, budget, model=None, groups=None):
    tols = (exact_tolerance(model, budget, groups) if sh.mode == "exact"
            else [tolerance(v.n) for v in sh.values])
    for value, t, tol in zip(sh.values, truth, tols, strict=True):
        assert abs(value.estimate - t) <= tol, (value, t, tol)


def estimate(model, seed=0, **kwargs):
    run = model.failing_run(seed)
    return car.shapley(run, model.agent(), outcome=model.outcome, seed=seed, **kwargs)


@pytest.mark.parametrize("factory", [syn.and_game, syn.or_game, syn.three_way])
@pytest.mark.parametrize("mode", ["exact", "permutation"])
def test_values_match_the_analytic_game(factory, mode):
    model = factory()
    sh = estimate(model, 1, budget=2000, mode=mode)
    assert sh.mode == mode and sh.rollouts_used <= 2000
    within(sh, model.shapley(), 2000, model)


def test_and_game_reproduces_the_published_check():
    """The AND of steps 0 and 1, each bad w.p. 0.3 when resampled: exact φ = (0.455, 0.455, 0)
    and Σφ = 1 − 0.3² = 0.91."""
    model = syn.and_game()
    assert model.shapley() == pytest.approx((0.455, 0.455, 0.0))
    sh = estimate(model, 0, budget=2000)
    assert sh.mode == "exact" and sh.coupled is False  # 3 players: 8 coalitions
    assert [v.step for v in sh.values] == [0, 1, 2]
    within(sh, model.shapley(), 2000, model)
    for value, truth in zip(sh.values, model.shapley(), strict=True):
        assert value.ci[0] <= truth <= value.ci[1]
    # Σφ = v̂(N) − v̂(∅); v̂(N) = 1 exactly (noise-free judge), v̂(∅) has SD <= 1/(2√n).
    assert sh.v_full.mean == 1.0
    assert abs(sh.total - 0.91) <= 4 * 0.5 / math.sqrt(sh.v_empty.n)


def test_total_is_the_estimated_v_full_minus_v_empty_and_covers_the_analytic_total():
    model = syn.three_way()
    sh = estimate(model, 0, budget=600, mode="permutation")
    # Σφ = v̂(N) − v̂(∅) by construction (contributions telescope within a unit): what can be
    # wrong is the total itself. Everything held reproduces the recorded failure (v(N) = 1,
    # noise-free judge), so the total's error is v̂(∅)'s: within 4.5 standard errors
    # sqrt(v(∅)(1 − v(∅))/n) of the analytic v(N) − v(∅) = 1 − 0.4³.
    assert sh.efficiency_gap == pytest.approx(0.0, abs=1e-9)
    assert sh.v_full.mean == 1.0
    v0 = model.value(())
    analytic = model.value(range(model.n_steps)) - v0
    assert abs(sh.total - analytic) <= 4.5 * (v0 * (1 - v0) / sh.v_empty.n) ** 0.5
    assert sh.v_empty.ci[0] <= v0 <= sh.v_empty.ci[1]


@pytest.mark.parametrize("players", [[0], np.array([0])])  # numpy indices work too
def test_candidate_players_group_the_rest(players):
    model = syn.and_game()
    sh = estimate(model, 0, budget=2000, players=players)
    assert sh.params["players"] == [0] and isinstance(sh.params["players"][0], int)
    assert [v.step for v in sh.values] == [0, None]
    assert sh.values[1].label == "other steps (1, 2)"
    # Two players {0} and {1, 2}: v(∅)=0.09, v({0})=v({1,2})=0.3, v(N)=1, so each gets 0.455.
    within(sh, (0.455, 0.455), 2000, model, [(0,), (1, 2)])


@pytest.mark.slow
@pytest.mark.parametrize("mode,budget", [("exact", 80), ("permutation", 60)])
def test_intervals_cover_over_many_seeds(mode, budget):
    """Coverage of the 95% intervals of φ_0 and φ_1 on the AND game over 200 seeds at a small
    budget (10 rollouts per coalition, 10 antithetic units): the test asks >= 90% (Monte-Carlo
    SE at 200 seeds is ~1.5%)."""
    model = syn.and_game()
    run, agent, truth = model.failing_run(0), model.agent(), model.shapley()
    hits = [0, 0]
    for seed in range(200):
        sh = car.shapley(run, agent, outcome=model.outcome, budget=budget, seed=seed, mode=mode)
        for i in (0, 1):
            lo, hi = sh.values[i].ci
            hits[i] += lo <= truth[i] <= hi
    assert min(hits) / 200 >= 0.90


@pytest.mark.parametrize("budget", [16, 50, 333, car.Budget(rollouts=100)])
def test_budget_is_never_exceeded(budget):
    sh = estimate(syn.and_game(), 0, budget=budget)
    cap = budget if isinstance(budget, int) else budget.rollouts
    assert sh.rollouts_used <= cap and sh.budget == cap


@pytest.mark.parametrize("factory", [syn.and_game, syn.or_game])
@pytest.mark.parametrize("budget", [64, 333, 400, 1001])
def test_exact_mode_spends_the_whole_budget_and_no_more(factory, budget):
    sh = estimate(factory(), 0, budget=budget, mode="exact")
    assert sh.rollouts_used == budget and not sh.truncated


def test_allocation_is_neyman_given_the_rollouts_already_run():
    """Two players, four coalitions; one was over-sampled. Against every integer allocation
    that keeps what each coalition has and spends ``cap``: the targets spend exactly ``cap``
    and Σ_i var(φ_i) is within rounding of the least."""
    from itertools import product

    from car_core.estimators.shapley import _coefficients, _neyman, _spread

    coef = _coefficients(2)
    ys = {0: {r: float(r % 3 == 0) for r in range(4)}, 1: {r: float(r % 2) for r in range(4)},
          2: {r: 1.0 for r in range(20)}, 3: {r: float(r == 0) for r in range(4)}}
    a = {m: sum(c[m] ** 2 for c in coef) * _spread(v) for m, v in ys.items()}
    have = {m: len(v) for m, v in ys.items()}
    for cap in (32, 45, 60):
        target = _neyman(coef, ys, cap)
        assert sum(target.values()) == cap
        assert all(target[m] >= have[m] for m in ys) and target[2] == have[2]
        best = min(sum(a[m] / n for m, n in zip(ys, ns, strict=True))
                   for ns in product(*(range(have[m], cap + 1) for m in ys))
                   if sum(ns) == cap)
        assert sum(a[m] / target[m] for m in ys) <= best * 1.01
    assert _neyman(coef, ys, 20) == have  # nothing to add: it cannot un-run rollouts


def test_token_budget_truncates_and_keeps_what_was_measured():
    model = syn.three_way()
    run = model.failing_run(0)
    sh = car.shapley(run, TokenAgent(model.agent()), outcome=model.outcome,
                     budget=car.Budget(rollouts=1000, tokens=2000), mode="permutation")
    assert sh.truncated and "token budget" in sh.budget_note
    assert 0 < sh.rollouts_used < 1000
    assert sh.tokens <= 2000 + 5 * 10  # at most one rollout's live steps past the forecast
    assert all(v.n >= 2 and v.ci is not None for v in sh.values)


def test_failed_branches_stop_the_estimate_not_read_as_a_budget_trip(pivot_model, pivot_run):
    """A policy that raises at step 4 fails every branch that decides step 4 live (all but
    v(N)'s): the estimate stops on the failures, naming the first and its step, and never
    reads them as a budget trip."""
    base = pivot_model.agent()

    def policy(history, rng):
        if history.index == 4:
            raise RuntimeError("tool server down")
        return base.policy(history, rng)

    agent = car.FunctionAgent(policy=policy, environment=base.environment,
                              is_final=base.is_final, max_steps=base.max_steps, name=base.name)
    with pytest.raises(BranchesFailed, match="tool server down") as info:
        car.shapley(pivot_run, agent, outcome=pivot_model.outcome, budget=48)
    err = info.value
    assert err.step == 4 and "budget" not in str(err)
    # exactly the coalitions without step 4 decide it live, so exactly they fail
    assert err.failures and all("4" not in f.task.arm[2:].split(",") for f in err.failures)


def test_budget_below_two_units_is_refused(pivot_model, pivot_run):
    with pytest.raises(InvalidBudget, match="budget"):
        car.shapley(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome, budget=5)
    with pytest.raises(InvalidBudget):
        car.shapley(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome, budget=0)


@pytest.mark.parametrize("kwargs,match", [({"level": 1.0}, "level"), ({"level": 0}, "level"),
                                          ({"mode": "sampling"}, "mode"),
                                          ({"players": []}, "players"),
                                          ({"players": [9]}, "player"),
                                          ({"players": [1, 1]}, "distinct")])
def test_bad_arguments(pivot_model, pivot_run, kwargs, match):
    with pytest.raises(InvalidInput, match=match):
        car.shapley(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome, **kwargs)


def test_run_without_steps(pivot_model):
    with pytest.raises(NothingToAttribute):
        car.shapley(car.Trajectory.new(context=None, steps=[]), pivot_model.agent(),
                    outcome=pivot_model.outcome)


def test_outcome_that_never_varies_says_why():
    model = syn.no_cause(n_steps=3, base_rate=1.0)
    sh = estimate(model, 0, budget=200)
    assert "never varied" in sh.reason
    assert all(v.estimate == pytest.approx(0.0, abs=1e-12) for v in sh.values)


def test_result_schema_and_text(pivot_model, pivot_run):
    sh = car.shapley(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome, budget=300)
    data = json.loads(sh.to_json())
    assert set(data) == RESULT_KEYS and data["method"] == "shapley"
    assert data["mode"] == "permutation"  # 2^6 = 64 coalitions x 10 replicates exceed 300
    assert set(data["values"][0]) == {"step", "label", "estimate", "ci", "ci_level", "n"}
    assert set(data["v_full"]) == {"mean", "ci", "ci_level", "n"}
    assert data["params"]["budget"]["rollouts"] == 300
    assert sh.table() == data["values"]
    assert "step 2" in str(sh) and "sum =" in sh.explain()


def test_store_resume_runs_no_branch_twice(store):
    model = syn.and_game()
    agent, counter = counted(model)
    run = model.failing_run(0)
    first = car.shapley(run, agent, outcome=model.outcome, budget=160, store=store,
                        attribution_id="s1")
    assert store.attribution("s1").result == first
    calls = counter.calls
    again = car.shapley(run, agent, outcome=model.outcome, budget=160, store=store,
                        attribution_id="s1")
    assert counter.calls == calls
    assert again.to_dict() == first.to_dict()


def test_held_prefix_is_served_from_the_record(store):
    """v(S) for S ∋ 0 starts at S's first free step: step 0 is decided live only in branches of
    coalitions without player 0 (counted from the branches the store kept)."""
    model = syn.and_game()
    agent, counter = counted(model)
    run = model.failing_run(0)
    sh = car.shapley(run, agent, outcome=model.outcome, budget=80, mode="exact", store=store)
    branches = list(store.branches(sh.attribution_id))
    assert len(branches) == sh.rollouts_used
    without_0 = sum(1 for b in branches if "0" not in b["arm"][2:].split(","))
    assert 0 < without_0 < len(branches)
    assert counter.counters[0].steps.count(0) == without_0


def test_html_report_renders_the_result(pivot_model, pivot_run):
    sh = car.shapley(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome, budget=200)
    html = sh.to_html()
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert "step 2" in html


def test_control_variate_pools_the_first_resampled_steps_repeat():
    """Two players. Coalitions ∅ and {1} both resample step 0 first; where their outcome is
    exactly the repeat indicator (slope 1), each v̂ is the pooled repeat rate q̂_0 over both
    coalitions' rollouts, and φ is the exact combination of those values. A coalition whose
    control never varied keeps its plain mean."""
    from car_core.estimators.shapley import Samples, _coefficients, exact_values

    x_empty = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]   # 2 of 6 repeats
    x_one = [1.0, 1.0, 0.0, 1.0]               # 3 of 4 repeats
    y = {0: dict(enumerate(x_empty)), 2: dict(enumerate(x_one)),
         1: dict(enumerate([1.0, 0.0, 1.0, 1.0])), 3: dict(enumerate([1.0] * 4))}
    repeat = {0: dict(enumerate(x_empty)), 2: dict(enumerate(x_one)),
              1: dict(enumerate([0.0] * 4))}   # step 1 never repeated in coalition {0}
    samples = Samples(y, repeat, {0: 0, 2: 0, 1: 1})
    q0 = 5 / 10
    v = {0: q0, 2: q0, 1: 0.75, 3: 1.0}
    coef = _coefficients(2)
    got = exact_values(coef, samples, 0.95)
    for c, (est, half) in zip(coef, got, strict=True):
        assert est == pytest.approx(sum(c[m] * v[m] for m in v))
        assert half > 0


def test_the_headline_never_crowns_one_of_two_steps_the_data_cannot_rank():
    """Steps 0 and 1 of the AND game carry the same planted share (0.455 each), so no surface
    may name one of them as the largest: the headline names both (tied, or not told apart when
    their estimates differ within their intervals). The report reads the same rule."""
    from car_core import formatting as fmt

    sh = estimate(syn.and_game(), 0, budget=2000)
    line = fmt.headline(sh)
    kind, leaders = fmt.shapley_leaders(sh.values)
    assert kind in ("equal", "overlap") and {v.step for v in leaders} >= {0, 1}
    assert "step 0" in line and "step 1" in line
    tied = replace(sh, values=[replace(v, estimate=0.25) if v.step in (0, 1) else v
                               for v in sh.values])
    assert " tie for the largest Shapley value" in fmt.headline(tied)
