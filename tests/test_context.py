"""Context attribution against planted worlds whose effects are known in closed form
(``car_core.testing.synthetic_context``), and the pieces it is built from."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

import car_core as car
from car_core.errors import InvalidInput
from car_core.estimators.context import (
    boschloo_greater,
    confirm_sizes,
    context_sources,
    fisher_greater,
    holm,
    lasso,
    screen_looks,
    sign_test,
)
from car_core.model.context_sources import ablate, before_run, split, state_of
from car_core.model.trajectory import History, Step
from car_core.testing.synthetic_context import (
    ContextWorld,
    injected,
    interaction,
    no_cause,
    poisoned_tool,
)

ALPHA = 0.05


def _attribute(world: ContextWorld, seed: int, rollouts: int) -> car.ContextAttribution:
    run = world.failing_run(seed)
    return car.context_attribution(run, world.agent(), step=world.decide_at,
                                   outcome=world.outcome, rollouts=rollouts, seed=seed)


def _sweep(world: ContextWorld, seeds: int, rollouts: int,
           check: Callable[[car.ContextAttribution], None] | None = None) -> tuple[int, int, int]:
    """Over ``seeds`` seeds: how often the first causal source was named, and how many of the
    screened intervals covered their analytic effect, of how many. Every named source's rescue
    interval must agree with its test (at or above zero, holding the estimate)."""
    named = covered = intervals = 0
    for seed in range(seeds):
        result = _attribute(world, seed, rollouts)
        assert result.rollouts_used <= rollouts
        if check is not None:
            check(result)
        named += world.causal[0] in {s.source.index for s in result.named}
        for s in result.named:  # the test showed the rescue positive: so does its interval
            assert s.rescue_ci is not None and s.rescue is not None
            assert 0.0 <= s.rescue_ci[0] <= s.rescue <= s.rescue_ci[1]
        for s in result.sources:
            intervals += 1
            covered += s.ci[0] <= world.effect(s.source.index) <= s.ci[1]
    return named, covered, intervals


# -- sources and ablations ---------------------------------------------------------------------
def test_chat_messages_split_into_sources_and_assistant_turns_are_not_sources() -> None:
    messages = [{"role": "system", "content": "be careful"},
                {"role": "user", "content": "refund please"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "function": {"name": "lookup"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "order found"}]
    sources = split(messages)
    assert [s.label for s in sources] == ["system prompt", "user message 1", "tool message 3"]
    edited = ablate(messages, sources, [1, 2])
    # messages keep their place with empty content: the tool call stays answered, the history
    # still opens with a user turn
    assert edited == [messages[0], {**messages[1], "content": ""}, messages[2],
                      {**messages[3], "content": ""}]
    assert messages[3]["content"] == "order found"  # the recorded state is not changed


def test_assistant_messages_the_run_began_from_are_sources() -> None:
    """A user trial's llm-as-judge loop failed on the outline its first round wrote, which the
    last round's run began from; ``car what`` listed 3 sources and not that one. A decision
    made before the run (``before_run``: the prefix its steps share) is a source when it says
    something; the run's own decisions are not."""
    earlier = [{"role": "user", "content": "write a story"},
               {"role": "assistant", "content": "Outline: the twist is the butler."},
               {"role": "user", "content": "judge: fine"}]
    own = {"role": "assistant", "content": "Draft 1"}
    run = car.Trajectory.new(context={"messages": earlier}, steps=[
        Step(index=0, action=own, state=list(earlier)),
        Step(index=1, action={"role": "assistant", "content": "Draft 2"},
             state=[*earlier, own, {"role": "user", "content": "longer"}])])
    assert before_run(run, 0) == before_run(run, 1) == 3
    sources = context_sources(run, 1)
    assert [s.label for s in sources] == ["user message 0",
                                          "assistant message 1 (before this run)",
                                          "user message 2", "user message 4"]
    edited = ablate(state_of(run, 1), sources, [1])
    assert edited[1] == {**earlier[1], "content": ""} and edited[3] == own
    assert [s.label for s in split(run.steps[1].state)] == [  # no run known: none of them
        "user message 0", "user message 2", "user message 4"]


def test_a_splitter_cuts_a_source_into_segments_that_are_removed_one_by_one() -> None:
    messages = [{"role": "user", "content": "Ship it. P.S. refund me."}]
    sources = split(messages, lambda text: re.split(r"(?<=\.)\s+", text))
    assert [s.text for s in sources] == ["Ship it.", "P.S.", "refund me."]
    assert ablate(messages, sources, [1])[0]["content"] == "Ship it.  refund me."


def test_a_splitter_whose_segments_are_not_in_the_text_is_refused() -> None:
    with pytest.raises(InvalidInput, match="not in the text"):
        split([{"role": "user", "content": "abc"}], lambda text: ["xyz", "abc"])


def test_a_function_agents_history_splits_into_context_items_and_tool_results() -> None:
    history = History({"ticket": "late", "docs": ["a", "b"]},
                      (Step(0, "lookup", "found", True),), 1)
    sources = split(history)
    assert [s.label for s in sources] == ["ticket", "docs[0]", "docs[1]",
                                         "tool result at step 0"]
    edited = ablate(history, sources, [1, 3])
    assert edited.context == {"ticket": "late", "docs": ["b"]}
    assert edited.steps[0].observation is None and edited.index == 1


# -- the tests it is built from ----------------------------------------------------------------
def test_exact_tests_match_their_closed_forms() -> None:
    assert sign_test(3, 0) == pytest.approx(1 / 8)
    assert sign_test(0, 0) == 1.0
    # Fisher, 3/3 failed vs 0/3: the only table at least as extreme, 1 / C(6, 3)
    assert fisher_greater(3, 3, 0, 3) == pytest.approx(1 / 20)
    assert fisher_greater(0, 3, 3, 3) == pytest.approx(1.0)


def test_boschloo_matches_its_closed_form_and_is_never_less_powerful_than_fisher() -> None:
    # 3/3 failed vs 0/3: the only table at least as extreme has probability π³(1 − π)³ under a
    # common rate π, largest at π = 1/2: 1/64 (Fisher conditions on the margin: 1/20)
    assert boschloo_greater(3, 3, 0, 3) == pytest.approx(1 / 64, rel=1e-6)
    for table in [(7, 10, 2, 10), (12, 16, 5, 16), (5, 8, 4, 9), (0, 6, 3, 6)]:
        assert boschloo_greater(*table) <= fisher_greater(*table) + 1e-9


def test_boschloo_keeps_its_size_at_every_common_failure_rate() -> None:
    # exact size: the probability, under a common rate π, of every table it rejects at α
    from math import comb
    n = 10

    def pmf(k: int, pi: float) -> float:
        return comb(n, k) * pi ** k * (1 - pi) ** (n - k)

    rejected = [(i, j) for i in range(n + 1) for j in range(n + 1)
                if boschloo_greater(i, n, j, n) <= ALPHA]
    for pi in (0.1, 0.3, 0.5, 0.7, 0.9):
        assert sum(pmf(i, pi) * pmf(j, pi) for i, j in rejected) <= ALPHA + 1e-9


def test_the_screen_looks_from_a_quarter_to_half_of_the_rollouts() -> None:
    assert screen_looks(64) == [8, 10, 12, 14, 16]  # pairs: 16 rollouts first, 32 at most
    assert screen_looks(8) == [2]
    assert screen_looks(128)[0] == 16 and screen_looks(128)[-1] == 32


def test_the_confirmation_splits_its_rollouts_in_neyman_proportion_when_unpaired() -> None:
    assert confirm_sizes(40, 1, paired=False) == (20, 20)
    full, each = confirm_sizes(40, 2, paired=False)
    assert full + 2 * each <= 40 and each == 11 and full == 18  # 18 / 11 ≈ √2
    assert confirm_sizes(40, 3, paired=True) == (10, 10)  # pairs need equal arms


def test_holm_steps_down() -> None:
    assert holm([0.01, 0.04, 0.2], 0.05) == [True, False, False]  # 0.04 > 0.05 / 2
    assert holm([0.01, 0.02, 0.04], 0.05) == [True, True, True]


def test_lasso_recovers_a_sparse_sign_design() -> None:
    import numpy as np
    x = np.where(np.random.default_rng(0).random((64, 8)) < 0.5, 1.0, -1.0)
    y = 0.8 * x[:, 2]
    beta = lasso(x, y, penalty=0.05)
    assert beta[2] == pytest.approx(0.75, abs=1e-6)  # shrunk by exactly the penalty
    assert np.count_nonzero(beta) == 1


# -- planted worlds ------------------------------------------------------------------------------
# Seeds are fixed, so each test is deterministic; the thresholds are the targets themselves,
# and the measured rates sit well above them (1.00 named, 0.93–0.96 coverage): if the
# true naming rate were 0.99, P(fewer than 95 of 100 seeds) = P(Bin(100, 0.01) > 5) ≈ 0.0006.
SEEDS = 100


@pytest.mark.parametrize("world", [injected(10), poisoned_tool(10)], ids=["injected", "tool"])
def test_the_causal_source_is_named_in_95_percent_of_seeds_at_m10_within_64_rollouts(
        world: ContextWorld) -> None:
    named, covered, intervals = _sweep(world, SEEDS, 64)
    assert named >= 0.95 * SEEDS
    # every source's interval at nominal 95% covers its analytic Banzhaf effect ≥ 90% of the time
    assert covered >= 0.90 * intervals


@pytest.mark.parametrize(("m", "rollouts"), [(4, 64), (30, 128)])
def test_small_and_large_contexts_are_recovered(m: int, rollouts: int) -> None:
    world = injected(m, at=m // 2)
    seeds = 40
    named = sum(world.causal[0] in {s.source.index for s in _attribute(world, s, rollouts).named}
                for s in range(seeds))
    assert named >= 0.95 * seeds


def test_an_interaction_of_two_names_both_and_halves_their_banzhaf_effect() -> None:
    world = interaction(10)
    both = covered = intervals = 0
    for seed in range(60):
        result = _attribute(world, seed, 64)
        both += set(world.causal) <= {s.source.index for s in result.named}
        for s in result.sources:
            intervals += 1
            covered += s.ci[0] <= world.effect(s.source.index) <= s.ci[1]
    assert world.effect(world.causal[0]) == pytest.approx(world.d / 2)
    assert both >= 0.9 * 60  # measured 0.97: two must pass Holm, so a little below one alone
    assert covered >= 0.90 * intervals


def test_the_cause_is_named_in_95_percent_of_seeds_when_the_policy_draws_its_own_noise() -> None:
    # No shared noise and a judge that flips 10% of outcomes: P(fail) is 0.82 with the injected
    # message and 0.18 without. Measured: 293 of these 300 seeds, 0.978 over seeds 0–599. The
    # bar is the target itself, 95%: at a true rate of 0.978, P(Bin(300, 0.022) > 15) ≈ 0.001,
    # at 0.97 still 0.02; a mechanism at 0.91 (the fixed half-and-half split with Fisher's
    # test) would pass with probability 0.007.
    # The screen's intervals, which its stopping rule looks at, still cover (measured 0.944).
    world = injected(10, shared_noise=False, flip=0.1)
    seeds = 300

    def unpaired(result: car.ContextAttribution) -> None:
        assert result.test == "Boschloo's exact test"
    named, covered, intervals = _sweep(world, seeds, 64, unpaired)
    assert named >= 0.95 * seeds
    assert covered >= 0.90 * intervals


def test_a_clear_screen_stops_early_and_hands_its_rollouts_to_the_confirmation() -> None:
    world = injected(10)
    stopped = 0
    for seed in range(20):
        result = _attribute(world, seed, 64)
        assert result.rollouts_used == 64 and [s.source.index for s in result.named] == [3]
        stopped += result.sources[0].pairs < screen_looks(64)[-1]
    assert stopped >= 10  # measured: 19 of these 20 seeds stop before half the budget


@pytest.mark.parametrize("shared", [True, False], ids=["shared-noise", "own-noise"])
def test_no_false_source_in_more_than_alpha_of_seeds_on_a_no_cause_world(shared: bool) -> None:
    # FWER ≤ α means the count of seeds with a false source is at most Bin(600, α): its 99th
    # percentile is 43 (P(more) = 0.008), so a procedure at its level passes; one at 2α
    # (mean 60) passes with probability 0.01. Measured here: 24 of 600 own noise (3.6% of
    # 1,000 seeds), 0 shared.
    world = no_cause(10, p=0.5, flip=0.1, shared_noise=shared)
    seeds = 600
    false = sum(bool(_attribute(world, s, 64).named) for s in range(seeds))
    assert false <= 43


def test_the_result_says_what_it_found_and_round_trips_to_json() -> None:
    import json
    result = _attribute(injected(10), 0, 64)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["answer"] == "named" and data["named"] == [3]
    named = result.named[0]
    assert named.rescue_ci is not None and named.rescue is not None
    assert named.rescue_ci[0] <= named.rescue <= named.rescue_ci[1]
    assert "user message 3" in str(result) and "P.S." in str(result)


def test_a_step_outside_the_run_is_refused_before_any_branch() -> None:
    world = injected(4)
    run = world.failing_run(0)
    with pytest.raises(InvalidInput, match="not a step"):
        car.context_attribution(run, world.agent(), step=5, outcome=world.outcome)


def test_a_budget_of_another_kind_keeps_the_rollout_cap_and_the_confirmation() -> None:
    world = injected(10)
    run = world.failing_run(0)
    result = car.context_attribution(run, world.agent(), step=0, outcome=world.outcome,
                                     rollouts=64, seed=0, budget=car.Budget(wall_time=3600))
    assert result.rollouts_used <= 64 and [s.source.index for s in result.named] == [3]


def test_a_rollout_budget_too_small_to_screen_is_a_budget_error() -> None:
    from car_core.errors import BudgetExhausted
    world = injected(10)
    with pytest.raises(BudgetExhausted, match="fewer than two"):
        car.context_attribution(world.failing_run(0), world.agent(), step=0,
                                outcome=world.outcome, rollouts=64, budget=3)


def test_an_or_of_two_names_neither_alone_and_shows_half_the_gap_in_each_effect() -> None:
    # Either source suffices, so removing one alone rescues nothing: naming one would be a
    # false source. Each screened effect is d/2 = 0.4 analytically; one seed's estimate is a
    # mean of 16 paired differences in [-1, 1] (sd ≤ 1/4), so the mean over 40 seeds has sd
    # ≤ 0.04 and 3 of them (0.12) is the tolerance.
    world = ContextWorld(m=10, causal=(2, 6), rule="one")
    seeds = 40
    results = [_attribute(world, s, 64) for s in range(seeds)]
    assert sum(bool(r.named) for r in results) <= ALPHA * seeds
    mean = sum(r.sources[2].effect for r in results) / seeds
    assert world.rescue(2) == 0.0 and abs(mean - world.effect(2)) <= 0.12

