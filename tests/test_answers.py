"""Every surface says which of the three answers an attribution gives: the locus, no cause, or
undecided, and for undecided the step the search was testing and the command that continues
it (a resume with a larger budget, which re-uses every branch already run)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _estimator_helpers import TokenAgent

import car_core as car
from car_core.cli import kit
from car_core.model.budget import LEAST_HINT, MOST_MORE, larger_budget
from car_core.model.vocabulary import Answer
from car_core.report import render_attribution
from car_core.stats.sequential import below_now
from car_core.store import RunStore
from car_core.testing import synthetic as syn

# On the planted pivot (six steps, cause at step 2) with the default search: 22 rollouts leave
# step 2 a candidate the confirmation has not shown yet, twice as many decide it.
UNDECIDED_BUDGET = 22


@pytest.fixture
def undecided(pivot_model, pivot_run, store):
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          budget=UNDECIDED_BUDGET, store=store, attribution_id="u1")
    assert res.answer == Answer.UNDECIDED and res.candidate == 2 and res.truncated
    return res


@pytest.fixture
def no_cause():
    model = syn.no_cause()
    res = car.contrastive(model.failing_run(0), model.agent(), outcome=model.outcome)
    assert res.answer == Answer.NO_CAUSE
    return res


@pytest.fixture
def located(pivot_model, pivot_run):
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          budget=60)
    assert res.answer == Answer.LOCUS and res.locus == 2
    return res


def test_the_result_text_names_each_answer(located, no_cause, undecided) -> None:
    # each answer opens with its own plain sentence; the method's words are in explain()
    assert str(located).splitlines()[0].startswith("Step 2 (the agent chose ")
    assert " caused the failure: re-deciding it avoids the failure in " in str(located)
    assert "answer: locus: step 2, rescue +" in located.explain()
    assert located.continue_hint() is None and no_cause.continue_hint() is None
    head = str(no_cause).splitlines()[0]
    assert head.startswith("No single step caused the failure: re-deciding every step from "
                           "step 0 on is shown to lower P(fail) by less than 10% (")
    assert "answer: no cause: " in no_cause.explain()
    assert "no rise to follow" in no_cause.explain()
    text = str(undecided)
    assert text.splitlines()[0].startswith(
        "Undecided: the budget ran out before the answer was decided; the best candidate so "
        "far is step 2 (the agent chose ")
    assert ("undecided: the budget ran out before the answer was decided (rollout budget of 22 "
            f"reached); {undecided.candidate_text()}") in undecided.explain()
    assert undecided.candidate_text().startswith("the candidate is step 2: rescue so far ")
    assert text.splitlines()[-1] == (
        "to continue, resume with a larger budget: car.contrastive(run, agent, outcome=..., "
        "budget=car.Budget(rollouts=44), store=<the store>, attribution_id='u1')")


def test_a_rough_more_beyond_the_hint_says_the_hint_grows_less(undecided) -> None:
    """A trial read "about 422 more rollouts would decide it" beside a hint of 240 in all as
    two answers: the hint grows the budget by at most ``MOST_MORE`` caps a time, and the
    figure now says so where it goes past the hint."""
    far = replace(undecided, more_rollouts=422)
    hinted = far.larger_budget()["rollouts"]
    assert hinted < far.rollout_budget + 422
    assert (f"about 422 more rollouts would decide it (a rough figure: the resume the hint "
            f"names grows the budget to {hinted} first, and looks again)") in far.explain()
    near = replace(undecided, more_rollouts=10)
    assert near.larger_budget()["rollouts"] >= near.rollout_budget + 10
    assert "about 10 more rollouts would decide it\n" in near.explain()


def test_following_the_hint_decides_and_reuses_what_was_run(pivot_model, pivot_run, store,
                                                            undecided) -> None:
    resumed = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                              budget=car.Budget(rollouts=44), store=store,
                              attribution_id="u1")
    fresh = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                            budget=44)
    assert resumed.answer == Answer.LOCUS and resumed.locus == 2
    assert resumed.rollouts_used == fresh.rollouts_used  # the same branches, none re-run twice
    assert len(store.branches("u1")) == resumed.rollouts_used


def test_without_a_store_the_hint_says_to_run_again(pivot_model, pivot_run) -> None:
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          budget=UNDECIDED_BUDGET)
    assert res.continue_hint() == (
        "to continue, run it again with a larger budget: car.contrastive(run, agent, "
        "outcome=..., budget=car.Budget(rollouts=44)); pass store= and attribution_id= so "
        "the next one can resume")


def test_the_larger_budget_doubles_the_limit_that_tripped() -> None:
    given = {"rollouts": 256, "tokens": None, "cost": None, "wall_time": 60.0}
    assert larger_budget(given, "rollout budget of 256 reached", 256) == {
        "rollouts": 512, "wall_time": 60.0}
    assert larger_budget(given, "wall-time budget of 60s reached", 256) == {
        "rollouts": 256, "wall_time": 120.0}
    assert larger_budget({"rollouts": 90, "tokens": 1000}, "token budget of 1000 would be "
                         "exceeded", 90) == {"rollouts": 90, "tokens": 2000}
    assert larger_budget(None, None, 30) == {"rollouts": 60}  # the n·K cap it ran under
    # never below what could name a step: doubling one rollout gave two
    assert larger_budget({"rollouts": 1}, "rollout budget of 1 reached", 1) == {
        "rollouts": LEAST_HINT}


def test_the_larger_budget_takes_the_rollouts_the_estimate_says_would_decide() -> None:
    note = "rollout budget of 256 reached"
    assert larger_budget({"rollouts": 256}, note, 256, more=400) == {"rollouts": 656}
    assert larger_budget({"rollouts": 256}, note, 256, more=100) == {"rollouts": 512}
    assert larger_budget({"rollouts": 256}, note, 256, more=50_000) == {
        "rollouts": 256 + MOST_MORE * 256}  # a rough estimate far off is not taken whole
    # another limit that tripped is doubled, whatever the rollouts estimate says
    assert larger_budget({"rollouts": 256, "wall_time": 60.0}, "wall-time budget of 60s "
                         "reached", 256, more=400) == {"rollouts": 256, "wall_time": 120.0}


def test_an_undecided_result_resumes_with_the_rollouts_it_says_would_decide(undecided) -> None:
    sized = replace(undecided, more_rollouts=3 * undecided.rollout_budget)
    assert sized.larger_budget()["rollouts"] == 4 * undecided.rollout_budget
    assert f"budget=car.Budget(rollouts={4 * undecided.rollout_budget})" in sized.continue_hint()


def test_the_cli_verdict_names_each_answer(located, no_cause, undecided) -> None:
    assert kit.verdict(located).startswith("Step 2 (the agent chose ")
    assert " caused the failure: " in kit.verdict(located)
    assert kit.verdict(no_cause).startswith("No single step caused the failure: ")
    assert kit.verdict(undecided).startswith("Undecided: the budget ran out before the answer "
                                             "was decided; the best candidate so far is step 2")
    assert [kit.answer_cell(r) for r in (located, no_cause, undecided)] == [
        "locus 2", "no cause", "undecided, candidate 2"]


def test_a_rescue_whose_interval_reaches_below_zero_is_no_share_of_re_runs(undecided) -> None:
    """A user trial read "avoids the failure in 25% of re-runs (-6% to 86%) so far": a share
    of re-runs cannot be negative; the interval is the difference's, so the sentence says
    what re-deciding did to P(fail)."""
    from car_core.stats import Interval
    c = undecided.candidate
    wide = replace(undecided, steps=tuple(
        replace(s, effect=0.25, ci=Interval(-0.06, 0.86, 0.95), fail_held=1.0,
                fail_resampled=0.75, estimate="raw") if s.step == c else s
        for s in undecided.steps))
    said = kit.verdict(wide)
    assert "of re-runs" not in said
    # and its interval's ends as a rise and a drop: "(-33% to 100%)" beside "lowers by 27%"
    # read as a contradiction in another trial
    assert ("lowers P(fail) by 25% (between a 6% rise and an 86% drop), from 100% to 75% so "
            "far") in said


def test_an_undecided_candidate_that_shows_no_rescue_is_not_called_the_best(undecided) -> None:
    """A user trial read "the best candidate so far is step 0 ... raises P(fail) by 14%": the
    step the search was testing when the budget ran out, shown to help by nothing."""
    c = undecided.candidate
    worse = replace(undecided, steps=tuple(replace(s, effect=-0.14) if s.step == c else s
                                           for s in undecided.steps))
    said = kit.verdict(worse)
    assert "best candidate" not in said
    assert f"the search was testing step {c}" in said and "has shown no rescue so far" in said



def test_an_undecided_candidate_barely_tested_says_so_not_a_vacuous_interval(undecided) -> None:
    """A user trial's noisy judge ended undecided on "step 0 ... lowers P(fail) by 0% (-100%
    to 100%), from 50% to 50% so far": two pairs, an interval that says nothing. The sentence
    says the test had just begun, with how many pairs."""
    from car_core.stats import Interval
    c = undecided.candidate
    barely = replace(undecided, steps=tuple(
        replace(s, effect=0.0, ci=Interval(-1.0, 1.0, 0.95), fail_held=0.5,
                fail_resampled=0.5, n=2, estimate="raw") if s.step == c else s
        for s in undecided.steps))
    said = kit.verdict(barely)
    assert "-100%" not in said
    assert f"the search had just begun testing step {c}" in said
    assert "2 pair(s) of re-runs: nothing is measured yet" in said

def _car(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_car_attribute_prints_the_command_that_continues_and_it_decides(
        tmp_path, pivot_run) -> None:
    db = str(tmp_path / "car.db")
    with RunStore(db) as s:
        s.save(pivot_run)
    first = _car("attribute", pivot_run.id, "--agent", "car_core.synthetic:pivot", "--budget",
                 str(UNDECIDED_BUDGET), "--store", db, "--no-progress", cwd=tmp_path)
    assert first.returncode == 3, first.stderr
    assert "Undecided: the budget ran out" in first.stdout
    assert "the best candidate so far is step 2" in first.stdout
    lines = first.stderr.strip().splitlines()
    assert lines[0].startswith("undecided (attribution ") and "larger budget" in lines[0]
    aid = lines[0].split()[2].rstrip(");")
    command = lines[1].strip()
    assert command == (f"car attribute {pivot_run.id} --agent car_core.synthetic:pivot "
                       f"--store {db} --no-progress --budget 44 --resume {aid}")
    listed = _car("attributions", "--store", db, cwd=tmp_path)
    assert "undecided, candidate 2" in listed.stdout
    assert (f"{aid} is undecided, candidate 2; to continue, resume it with a larger budget: "
            f"car attribute {pivot_run.id} --agent MODULE:FACTORY --outcome MODULE:FUNCTION "
            f"--method contrastive --budget 44 --store {db} --resume {aid}") in listed.stdout
    again = _car(*shlex.split(command)[1:], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "Step 2 (synthetic:pivot chose " in again.stdout
    assert " caused the failure: " in again.stdout
    listed = _car("attributions", "--store", db, cwd=tmp_path)
    assert "locus 2" in listed.stdout and "to continue" not in listed.stdout


def test_the_report_verdict_names_each_answer(located, no_cause, undecided,
                                              pivot_run) -> None:
    html = render_attribution(undecided, run=pivot_run)
    assert "Answer: undecided" in html and "Undecided: the budget ran out" in html
    assert "The candidate is step 2: rescue so far" in html
    assert ("To continue, resume with a larger budget: car attribute "
            f"{pivot_run.id} --agent MODULE:FACTORY --outcome MODULE:FUNCTION --method "
            "contrastive --budget 44 --store STORE --resume u1") in html
    assert "Answer: no cause" in render_attribution(no_cause)
    html = render_attribution(located, run=pivot_run)
    assert "Answer: locus" in html and "Step 2 is where this run committed to failure" in html


def test_assert_locus_says_undecided_or_no_cause(undecided, no_cause) -> None:
    with pytest.raises(AssertionError, match="the attribution is undecided: the budget ran "
                                             "out") as info:
        car.assert_locus(undecided, step=2)
    assert "the candidate is step 2" in str(info.value)
    assert "budget=car.Budget(rollouts=44)" in str(info.value)
    with pytest.raises(AssertionError, match="but the answer is no cause: no step's rescue"):
        car.assert_locus(no_cause, step=2)


def test_a_truncated_shapley_result_says_so_everywhere(pivot_model, pivot_run, store) -> None:
    res = car.shapley(pivot_run, TokenAgent(pivot_model.agent()), outcome=pivot_model.outcome,
                      budget=car.Budget(rollouts=400, tokens=2000), store=store,
                      attribution_id="s1", mode="permutation")
    assert res.truncated and "token budget" in (res.budget_note or "")
    head = str(res).splitlines()[0]
    assert head.startswith("From what was measured before the budget ran out: ")
    assert (f": truncated ({res.budget_note}), the values are from what was measured"
            in res.explain())
    assert str(res).splitlines()[-1] == (
        "to continue, resume with a larger budget: car.shapley(run, agent, outcome=..., "
        "budget=car.Budget(rollouts=400, tokens=4000), mode='permutation', store=<the store>, "
        "attribution_id='s1')")
    assert kit.verdict(res).startswith("From what was measured before the budget ran out: ")
    assert kit.answer_cell(res) == "values (truncated)"
    html = render_attribution(res, run=pivot_run)
    assert "Answer: Shapley values (truncated)" in html and "To continue" in html


def test_no_cause_is_said_only_where_a_rescue_of_delta_is_ruled_out() -> None:
    """"No cause (every rescue shown ≤ Δ)": a gate of a few pairs that happened to agree once
    said "no cause" of a run whose step 2 rescues 0.15 (P(fail) 0.85 before it, 1 after; the
    branches share no noise, as a hosted model's do not): with 14 gate pairs all level by
    chance (0.85^14 ≈ 10% a seed) the answer was "no cause". Now such a seed is undecided,
    and says why; over 40 seeds at 16 rollouts a step none says "no cause" (before: 1 in 6
    in a user's trial). The planted no-cause world, whose arms share their noise, still gets
    "no cause" at the default budget: its gate pairs are level and show the rise below Δ."""
    model = syn.pivot(4, 2, 0.85)
    run = model.failing_run(0)
    answers = []
    for seed in range(40):
        res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16,
                              seed=seed, coupled=False, progress=False)
        answers.append(res.answer)
        if res.answer == Answer.UNDECIDED and res.candidate is None:
            assert "too few re-runs to rule out that it lowers P(fail) by 10% or more" in \
                res.reason
            assert str(res).startswith("Undecided: re-deciding every step from step 0 on "
                                       "showed no rise (")
            assert res.continue_hint() is not None  # a larger budget would tell
    assert Answer.NO_CAUSE not in answers
    assert any(a == Answer.UNDECIDED for a in answers)
    none = syn.no_cause()
    res = car.contrastive(none.failing_run(0), none.agent(), outcome=none.outcome,
                          progress=False)
    assert res.answer == Answer.NO_CAUSE and "shown to lower P(fail) by less than 10%" in \
        res.reason


def test_the_full_search_says_no_cause_only_where_every_interval_is_below_delta() -> None:
    """Every step tested (``search="full"``): "no cause" needs every step's rescue interval
    below Δ; one still reaching it leaves the answer undecided, naming the steps."""
    model = syn.pivot(4, 2, 0.85)
    res = car.contrastive(model.failing_run(0), model.agent(), outcome=model.outcome,
                          rollouts=8, search="full", seed=0, coupled=False, progress=False)
    assert res.answer != Answer.NO_CAUSE
    if res.answer == Answer.UNDECIDED:
        assert "still reaches 10%: too few re-runs to rule a cause out" in res.reason
    none = syn.no_cause()
    res = car.contrastive(none.failing_run(0), none.agent(), outcome=none.outcome,
                          search="full", rollouts=256, progress=False)
    if res.answer == Answer.NO_CAUSE:
        assert all(s.ci is not None and s.ci[1] < 0.1 for s in res.steps)
    else:
        assert res.answer == Answer.UNDECIDED and "still reaches 10%" in res.reason


def test_a_gate_that_sees_no_rise_goes_on_until_the_level_is_shown() -> None:
    """With no rise seen in its cap the gate goes on: a 4-step no-cause desk whose arms share
    their noise is "no cause" at the default budget (its cap of 28 level pairs alone can never
    show a rescue below 10% at 0.75α: 0.9^28 ≈ 5%), and one whose judge is a coin of its own
    spends the budget and stays undecided rather than guessing."""
    shared = syn.PlantedDesk(4, 2, 0.0, 0.2, "full", 10000)
    res = car.contrastive(shared.failing_run(), shared.agent(), outcome=shared.judge,
                          rollouts=32, seed=10000, progress=False)
    assert res.answer == Answer.NO_CAUSE and res.rollouts_used > 2 * 28
    coin = syn.no_cause()
    res = car.contrastive(coin.failing_run(0), coin.agent(), outcome=coin.outcome, rollouts=32,
                          seed=0, coupled=False, progress=False)
    assert res.answer in (Answer.UNDECIDED, Answer.LOCUS)
    if res.answer == Answer.UNDECIDED:
        assert res.rollouts_used >= 0.9 * res.rollout_budget


def test_the_reason_a_run_is_undecided_says_the_budget_once(undecided) -> None:
    """A triage row read "the budget ran out before the answer was decided (rollout budget of
    128 reached before the answer was decided)" (user trial: the per-run cap's note)."""
    capped = replace(undecided, budget_note="rollout budget of 128 reached before the answer "
                                            "was decided")
    assert capped.undecided_why() == ("the budget ran out before the answer was decided "
                                      "(rollout budget of 128 reached)")
    assert undecided.undecided_why() == ("the budget ran out before the answer was decided "
                                         f"({undecided.budget_note})")


def test_a_one_step_run_whose_step_rescues_nothing_is_told_no_cause() -> None:
    """A user trial's one-step run (the SDK's agents-as-tools synthesizer) whose step could
    not rescue was "undecided: the budget ran out" at any budget: the confirmation gave up
    and nothing ruled the step out. Its pairs are the gate's arms, so now they do."""
    model = syn.pivot(1, 0, 1.0)  # re-deciding the only step never helps
    run = model.failing_run(0)
    for seed in range(10):
        res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=256,
                              seed=seed, coupled=False, progress=False)
        assert res.answer == Answer.NO_CAUSE, res.reason
        assert "shown to lower P(fail) by less than 10%" in res.reason
    rescued = syn.pivot(1, 0, 0.7)  # rescue 0.3: still named
    res = car.contrastive(rescued.failing_run(0), rescued.agent(), outcome=rescued.outcome,
                          rollouts=96, seed=0, coupled=False, progress=False)
    assert res.answer == Answer.LOCUS and res.locus == 0


def test_a_one_step_run_that_always_fails_is_told_no_cause_as_soon_as_its_pairs_show_it(
        ) -> None:
    """A trial resumed a run that began after its failure (a refund an approval let run):
    every re-run failed, and 96 rollouts said "undecided, raise the budget". Pairs that
    never disagree show the rescue below Δ = 0.1 at ``OUT_SHARE·α`` after 33 of them
    (``below_now``'s top bet gains log(1 + 0.97·0.1/0.9) a pair); the confirmation waited
    for futility against the least rise, 66 pairs. It now stops at 33: 66 rollouts."""
    model = syn.pivot(1, 0, 1.0)
    run = model.failing_run(0)
    zeros = np.zeros(40)
    need = next(i for i in range(1, 41) if below_now(zeros[:i], 0.1, 0.75 * 0.05))
    assert need == 33
    for seed in range(3):
        res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16,
                              budget=96, seed=seed, progress=False)
        assert res.answer == Answer.NO_CAUSE, res.reason
        assert res.rollouts_used == 2 * need


def test_a_one_step_run_at_the_indifference_level_is_rarely_told_no_cause() -> None:
    """"No cause" at rescue Δ = 0.1 is the claim's error: it may be made in at most
    ``OUT_SHARE·α`` = 3.75% of seeds; 200 seeds, three binomial standard errors over."""
    model = syn.pivot(1, 0, 0.9)
    run = model.failing_run(0)
    said = sum(car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=256,
                               seed=seed, coupled=False, progress=False).answer
               == Answer.NO_CAUSE for seed in range(200))
    level = 0.75 * 0.05
    assert said <= 200 * level + 3 * (200 * level * (1 - level)) ** 0.5
