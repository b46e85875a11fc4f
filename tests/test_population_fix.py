"""``car.fix_population`` against a planted population (``TwoModeDesk``: 14 runs that commit at
step 1, ``read_policy`` by ``intake``, and 10 at step 4, ``issue_refund`` by ``refunds``).

Planted truth. The instruction ``desk.fix`` makes the early mode's deciding step go wrong
with ``p_fixed = 0`` instead of ``p_bad = 0.3``; the late mode never reads it. Branched at
the locus, P(fail | without) = p_bad (the step re-decided) and P(fail | with) = p_fixed for an
early run, p_bad for a late one: each early run's rescue is 0.3, each late run's 0, and the
pooled rescue over 24 runs is 14 · 0.3 / 24 = 0.175. ``careful_policy`` (another "model",
from step 0) is the mirror: the pooled rescue is 10 · 0.3 / 24 = 0.125. Under shared noise
the arms of a run draw the same uniform at every step, so a late run's pairs under the
instruction are all 0 (never listed as rescued) and an early run's are 1 with probability 0.3.

Tolerances. The pooled interval's own coverage (≥ 1 − α jointly) is the check of the planted
value. ``rescued``: each run is tested at α/(N·C) = 0.05/48 with K = 64 pairs; the betting +
exact sign test needs about 10 up pairs of the ~19 expected, a power above 0.99 per run
(simulated: 0.995 at C = 3), so fewer than 12 of the 14 early runs shown rescued has
probability below 0.005.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from _estimator_helpers import Preflighted

import car_core as car
from car_core.engine.progress import Paced, PacedPrinter
from car_core.errors import InvalidInput, NothingToAttribute
from car_core.fix_results import CSV_COLUMNS, PopulationFix
from car_core.stats.pooled import hoeffding_half_width, pooled_mean
from car_core.store import RunStore
from car_core.store.fixes import load_fix
from car_core.store.triages import POPULATION
from car_core.testing.synthetic_population import TwoModeDesk
from car_core.triage_results import TriageResult

DESK = TwoModeDesk()
N_EARLY, N_LATE = 14, 10
K = 64


@pytest.fixture(scope="module")
def population() -> list[car.Trajectory]:
    return DESK.population(N_EARLY, N_LATE, seed=0, ids="popfix")


@pytest.fixture(scope="module")
def triaged(population: list[car.Trajectory]) -> TriageResult:
    return car.triage(population, DESK.agent(), outcome=DESK.outcome, rollouts=16)


def _modes(runs: list[car.Trajectory]) -> tuple[set[str], set[str]]:
    return ({r.id for r in runs if r.context["mode"] == "early"},
            {r.id for r in runs if r.context["mode"] == "late"})


def test_a_fix_of_one_mode_rescues_it_and_lists_the_other_mode_as_not_rescued(
        population, triaged):
    early, late = _modes(population)
    instruction = car.Fix.instruction(DESK.fix)
    careful = car.Fix.policy(DESK.careful_policy(), label="careful model")
    res = car.fix_population(population, DESK.agent(), outcome=DESK.outcome,
                             candidates=[instruction, careful], triage=triaged, rollouts=K)
    n = N_EARLY + N_LATE
    for label, planted, fixed, other, start in (
            (instruction.label, N_EARLY * 0.3 / n, early, late, "locus"),
            ("careful model", N_LATE * 0.3 / n, late, early, "0")):
        c = res.candidate(label)
        assert c.from_step == start and c.runs_tested == n and not c.untested
        assert c.rescue_ci[0] <= planted <= c.rescue_ci[1]
        assert c.rescue_ci[0] > 0 and c.shown
        assert c.rescue_ci.level == pytest.approx(1 - 0.05 / 2)  # Bonferroni over 2 fixes
        assert set(c.not_rescued) >= other  # the mode the fix does not touch
        assert set(c.rescued) <= fixed and len(c.rescued) >= len(fixed) - 2
        assert sorted(c.rescued + c.not_rescued) == sorted(r.id for r in population)
        for row in c.per_run:  # shared noise: an untouched run's pairs are all zero
            if row.run_id in other:
                assert row.rescue == 0.0 and row.p_fail_with == row.p_fail_without
            else:
                assert row.p_fail_with == 0.0  # p_fixed = 0: the fix never fails
    # the instruction branches each run at its locus, the policy at step 0
    steps = {r.run_id: r.step for r in res.candidate(instruction.label).per_run}
    assert {steps[i] for i in early} == {1} and {steps[i] for i in late} == {4}
    assert {r.step for r in res.candidate("careful model").per_run} == {0}
    # four arms a run (without and with, at the locus and at step 0), K rollouts each
    assert res.rollouts_used == n * 4 * K == res.cost.rollouts
    # steps decided per rollout index: an early run 2·5 + 2·6, a late one 2·2 + 2·6, against
    # 4·6 each re-run from the start: (14·22 + 10·16) / (24·24)
    assert res.cost.ratio == pytest.approx((14 * 22 + 10 * 16) / (24 * 24))
    assert str(res).startswith("The fix '")
    summary = res.summary()
    assert "run by run, " in summary and " shown rescued and " in summary
    # a difference of failure rates, said as a count per 100 re-runs (a user trial read
    # "53% more re-runs avoid the failure" as a relative rise)
    assert re.search(r"\d+ fewer of every 100 re-runs fail with it \[-?\d+ to -?\d+\], on "
                     r"average over the", summary), summary


def test_guard_and_context_edit_rescue_only_the_mode_that_reads_them(population, triaged):
    runs = population[:3] + population[-2:]
    early, late = _modes(runs)

    def with_fix(h: car.History) -> car.History:
        return car.History({**h.context, "instruction": DESK.fix}, h.steps, h.index)
    guard = car.Fix.guard({"ok": True, "note": DESK.fix})
    edit = car.Fix.context(with_fix, label="context edit")
    wrong = car.Fix.instruction("be nice", label="an instruction nobody reads")
    res = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, triage=triaged,
                             candidates=[guard, edit, wrong], rollouts=16)
    for c in (res.candidate(guard.label), res.candidate("context edit")):
        by = {r.run_id: r for r in c.per_run}
        assert all(by[i].p_fail_with == 0.0 for i in early)
        assert all(by[i].rescue == 0.0 for i in late) and set(c.not_rescued) >= late
    nobody = res.candidate("an instruction nobody reads")
    assert nobody.rescued == () and nobody.rescue == 0.0
    assert nobody.rescue_ci[0] <= 0.0 <= nobody.rescue_ci[1]


def test_a_guard_with_no_tool_result_before_the_step_leaves_the_run_untested(population):
    runs = population[:2]
    res = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, from_step=0,
                             candidates=[car.Fix.guard("x")], rollouts=4)
    c = res.candidates[0]
    assert set(c.untested) == set(c.not_rescued) == {r.id for r in runs}
    assert c.rescue is None and c.rescue_ci is None and res.rollouts_used == 0
    assert all("no tool result before step 0" in (r.reason or "") for r in c.per_run)
    assert "could not be tested" in res.summary()


def test_progress_marks_runs_that_drew_nothing_and_times_only_the_rest(population, tmp_path,
                                                                        capsys):
    """A trial's fix printed "[1/25] run … · 0 s so far, about 0 s left" for a run left
    untested, with 24 to go, and read-back runs unmarked: such runs now say what they were
    and do not set the pace (no time left is guessed from them)."""
    runs = population[:2]
    car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, from_step=0,
                       candidates=[car.Fix.guard("x")], rollouts=4, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" · ")[0] for line in lines] == [
        f"[{i + 1}/2] run {r.id} (untested)" for i, r in enumerate(runs)]
    assert not any("left" in line for line in lines)
    fix = car.Fix.instruction(DESK.fix, every_step=True)
    with RunStore(tmp_path / "car.db") as store:
        car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, candidates=[fix],
                           rollouts=4, store=store, fix_id="p1", progress=True)
        capsys.readouterr()
        told: list[tuple[Any, ...]] = []
        car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, candidates=[fix],
                           rollouts=4, store=store, fix_id="p1",
                           progress=lambda *a, **kw: told.append((*a, kw.get("how"))))
    assert told == [(i + 1, 2, r.id, "read back") for i, r in enumerate(runs)]


def test_a_fix_tells_its_printed_progress_when_each_run_began(population):
    """One at a time, a run is tested as it is submitted: told it began only after, every line
    of a trial's `car fix --runs-at-once 1` read "about 0 s left". The pace's clock counts
    branches, so each run's branches fall between its start and its end."""
    agent = Preflighted(DESK.agent(), {})
    lines: list[str] = []
    printer = PacedPrinter(Paced(lambda done, total, run_id, **kw: f"[{done}/{total}]",
                                 clock=lambda: agent.branches), lines.append)
    car.fix_population(population[:3], agent, outcome=DESK.outcome, rollouts=4,
                       candidates=[car.Fix.instruction(DESK.fix, every_step=True)],
                       runs_at_once=1, progress=printer)
    began, ended = printer.paced.began, printer.paced.ends
    assert len(lines) == 3 and len(began) == len(ended) == 3
    assert all(end > start for start, end in zip(began, ended, strict=True)), (began, ended)
    assert "about 0 s left" not in lines[0]


def test_the_pooled_interval_covers_over_seeds_on_a_cheap_planted_world(population):
    # 4 early and 4 late runs, the fix from step 0 (no locus needed), K = 8: the planted
    # rescue is 4 · 0.3 / 8 = 0.15. The interval's coverage is >= 0.95; over R = 120 seeds
    # the observed rate falls below 0.95 − 3·sqrt(0.05·0.95/R) ≈ 0.89 with probability
    # < 0.002 if it holds.
    runs = population[:4] + population[-4:]
    fix = car.Fix.instruction(DESK.fix, every_step=True)
    planted, reps, covered = 4 * 0.3 / 8, 120, 0
    widths = set()
    for seed in range(reps):
        c = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, candidates=[fix],
                               rollouts=8, seed=seed).candidates[0]
        covered += c.rescue_ci[0] <= planted <= c.rescue_ci[1]
        widths.add(round(c.rescue_ci[1] - c.rescue_ci[0], 9))
    assert covered / reps >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / reps)
    # every interval has the Hoeffding width for 8 runs of 8 pairs (none clipped here)
    assert widths == {round(2 * hoeffding_half_width([8] * 8, 0.95), 9)}


def test_the_stratified_interval_covers_unequal_runs_at_its_level():
    # pure statistics: N = 12 runs with different rescues and pair counts, pairs in
    # {-1, 0, 1}; 3000 repetitions: coverage below 0.95 − 3·sqrt(0.0475/3000) ≈ 0.938 has
    # probability < 0.002 if the interval holds its level
    rng = np.random.default_rng(7)
    ups = rng.uniform(0, 0.6, 12)
    downs = rng.uniform(0, 0.3, 12)
    sizes = rng.integers(3, 20, 12)
    theta = float(np.mean(ups - downs))
    reps, covered = 3000, 0
    for _ in range(reps):
        d = []
        for up, down, k in zip(ups, downs, sizes, strict=True):
            u = rng.random(k)
            d.append(list(np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))))
        est, ci = pooled_mean(d, 0.95)
        assert ci[0] <= est <= ci[1]
        covered += ci[0] <= theta <= ci[1]
    assert covered / reps >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / reps)


def test_stored_resumable_listed_and_exported(population, triaged, tmp_path):
    runs = population[:3] + population[-3:]
    fix = car.Fix.instruction(DESK.fix)
    told: list[tuple[int, int, str]] = []
    with RunStore(tmp_path / "car.db") as store:
        # 40 rollouts pay for two runs (2 arms · 8 pairs each): the rest are left untested
        first = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, candidates=[fix],
                                   triage=triaged, rollouts=8, store=store, fix_id="f1",
                                   budget=40, progress=lambda *a: told.append(a))
        assert first.truncated and first.rollouts_used == 32
        assert store.attribution("f1").status == "truncated"
        tested = {r.run_id for r in first.candidates[0].per_run if r.n}
        assert tested == {runs[0].id, runs[1].id}
        # progress tells of the runs tested, not of those the budget never reached
        assert told == [(1, len(runs), runs[0].id), (2, len(runs), runs[1].id)]
        # resumed without the triage: the runs measured are read back, the others located by
        # attributing them (stored as a triage of their own) and tested
        second = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome,
                                    candidates=[fix], rollouts=8, store=store, fix_id="f1")
        assert not second.truncated and second.cost.locate_rollouts > 0
        assert store.attribution("f1-loci").method == "triage"
        rows = {r.run_id: r for r in second.candidates[0].per_run}
        assert all(rows[i].reused for i in tested) and all(r.n == 8 for r in rows.values())
        assert second.rollouts_used == second.cost.locate_rollouts + 4 * 2 * 8
        # a third time: nothing is spent
        third = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome,
                                   candidates=[fix], rollouts=8, store=store, fix_id="f1")
        assert third.rollouts_used == 0
        assert all(r.reused for r in third.candidates[0].per_run)
        keys = ("rescue", "rescue_ci", "rescued", "not_rescued")
        assert ([{k: c[k] for k in keys} for c in third.to_dict()["candidates"]]
                == [{k: c[k] for k in keys} for c in second.to_dict()["candidates"]])
        row = store.attribution("f1")
        assert (row.method, row.run_id, row.status) == ("population-fix", POPULATION,
                                                         "complete")
        assert "f1" in store.attribution_ids()
        assert load_fix(store, "f1").to_dict() == third.to_dict()
        assert PopulationFix.from_dict(third.to_dict()).to_dict() == third.to_dict()
        # another fix of the runs located above reads their stored attributions' loci
        again = car.fix_population(runs[2:], DESK.agent(), outcome=DESK.outcome,
                                   candidates=[fix], rollouts=8, store=store, fix_id="f2")
        assert again.cost.locate_rollouts == 0 and again.rollouts_used == 4 * 2 * 8
        # other settings under the same id are refused, not mixed in, naming both values
        with pytest.raises(InvalidInput, match="was run with rollouts=8, not 16"):
            car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, candidates=[fix],
                               rollouts=16, store=store, fix_id="f1")
    lines = third.to_csv().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS) and len(lines) == 1 + len(runs)


def test_loci_from_a_stored_triage_by_its_id(population, tmp_path):
    runs = population[:2] + population[-2:]
    with RunStore(tmp_path / "car.db") as store:
        tri = car.triage(runs[:3], DESK.agent(), outcome=DESK.outcome, rollouts=16,
                         store=store, triage_id="t1")
        res = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, triage="t1",
                                 store=store, candidates=[car.Fix.instruction(DESK.fix)],
                                 rollouts=8)
    rows = {r.run_id: r for r in res.candidates[0].per_run}
    assert res.cost.locate_rollouts == 0
    assert all(rows[r.run_id].step == r.locus for r in tri.per_run)
    # the run the triage did not include is untested, and says so
    assert rows[runs[3].id].n == 0 and "did not include it" in (rows[runs[3].id].reason or "")
    assert runs[3].id in res.candidates[0].not_rescued


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"candidates": []}, "no fix to test"),
    ({"candidates": [car.add_instruction(1, "x")]}, "same in every run"),
    ({"candidates": [car.do_resample(1)]}, "same in every run"),
    ({"candidates": [car.Fix.instruction("a"), car.Fix.instruction("a")]}, "two fixes"),
    ({"alpha": 1.5}, "alpha"),
    ({"from_step": "middle"}, "from_step"),
    ({"rollouts": 1}, "at least 2"),
    ({"triage": "some-triage-id"}, "triage id with a store"),
])
def test_bad_input_is_refused_before_any_branch(population, kwargs, match):
    args = {"candidates": [car.Fix.instruction(DESK.fix)], **kwargs}
    with pytest.raises(InvalidInput, match=match) as info:
        car.fix_population(population[:2], DESK.agent(), outcome=DESK.outcome, **args)
    assert info.value.hint


def test_an_empty_population_or_run_ids_without_a_store_are_refused(population):
    with pytest.raises(InvalidInput, match="empty") as info:
        car.Fix.instruction(" ")
    assert info.value.hint
    fix = car.Fix.instruction(DESK.fix)
    with pytest.raises(NothingToAttribute):
        car.fix_population([], DESK.agent(), outcome=DESK.outcome, candidates=[fix])
    with pytest.raises(InvalidInput, match="store"):
        car.fix_population([population[0].id], DESK.agent(), outcome=DESK.outcome,
                           candidates=[fix])


def test_a_fix_that_cannot_run_leaves_the_others_tested(population, triaged):
    """One candidate whose arm cannot run at all (its model's server refuses the key: an
    error every branch would hit again) is untested on every run with its reason, and the
    other candidate is measured on every run as if it were alone: a bad candidate once left
    every fix of every run untested."""
    from car_core.errors import ModelUnavailable

    def refused(history, rng):
        raise ModelUnavailable("the careful model's server refused the key")

    runs, instruction, alone, both = _beside_a_bad_fix(
        population, triaged, car.Fix.policy(refused, label="careful"))
    bad = both.candidate("careful")
    assert bad.runs_tested == 0 and sorted(bad.untested) == sorted(r.id for r in runs)
    assert all("refused the key" in row.reason for row in bad.per_run)
    assert (f"The fix 'careful' could not be tested on any of the {len(runs)} runs (the first: "
            "the careful model's server refused the key") in str(both)
    _measured_as_alone(runs, instruction, alone, both)


def test_a_fix_whose_branches_often_fail_keeps_the_others_measurements(population, triaged):
    """A candidate whose model raises on half its branches (a flaky server, no outage) stops
    its run's batch with ``BranchesFailed`` only after every arm ran, the run's budget spent:
    a user trial's runs then left every other fix untested, its branches thrown away. The
    others' branches are kept: the instruction is measured on every run, as alone."""
    careful = DESK.careful_policy()

    def flaky(history, rng):
        if rng.random() < 0.5:
            raise RuntimeError("503 from the careful model's server")
        return careful(history, rng)

    runs, instruction, alone, both = _beside_a_bad_fix(
        population, triaged, car.Fix.policy(flaky, label="flaky"))
    assert both.candidate("flaky").runs_tested == 0
    _measured_as_alone(runs, instruction, alone, both)


def _beside_a_bad_fix(population: Any, triaged: Any, bad: Any) -> tuple[Any, Any, Any, Any]:
    """Four runs, the desk's instruction tested alone and beside ``bad``, on one seed."""
    runs = population[:2] + population[-2:]
    instruction = car.Fix.instruction(DESK.fix)
    alone = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome,
                               candidates=[instruction], triage=triaged, rollouts=16, seed=3)
    both = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome,
                              candidates=[instruction, bad], triage=triaged, rollouts=16, seed=3)
    return runs, instruction, alone, both


def _measured_as_alone(runs: Any, instruction: Any, alone: Any, both: Any) -> None:
    """The instruction tested on every run beside the bad fix, on the same branches as alone
    (an arm's noise is its own): the same rates, run by run."""
    good = both.candidate(instruction.label)
    assert good.runs_tested == len(runs) and not good.untested
    assert [(r.p_fail_with, r.p_fail_without) for r in good.per_run] == [
        (r.p_fail_with, r.p_fail_without) for r in alone.candidate(instruction.label).per_run]


def _estimate(label: str, rescue: float, lo: float, hi: float, rescued: int, runs: int
              ) -> Any:
    from car_core.fix_results import FixEstimate
    from car_core.stats import Interval
    ids = tuple(f"r{i}" for i in range(runs))
    return FixEstimate(label, "system prompt", "locus", rescue, Interval(lo, hi, 0.975),
                       ids[:rescued], ids[rescued:], (), runs, 0.9, 0.9 - rescue)


def test_the_sentence_says_what_a_pooled_rescue_and_the_runs_shown_mean():
    """"Works" beside "1 run shown rescued, 17 not" read as a contradiction: the sentence says
    the fix helps on average, and that a run not shown rescued may be one too few re-runs
    could not tell."""
    from car_core.fix_results import sentence
    said = sentence(_estimate("check the window", 0.29, 0.16, 0.43, 1, 18), 18)
    assert said.startswith("The fix 'check the window' helps on average: 29 fewer of every 100 "
                           "re-runs fail with it [16 to 43], on average over the 18 failed "
                           "runs; run by run, 1 is shown rescued and 17 are not shown to be (")
    assert said.endswith("): too few re-runs each to tell, or not helped.")


def test_the_summary_says_when_the_best_fix_is_not_told_apart_from_another():
    """The summary names the fix whose interval reaches highest; another whose interval
    reaches the best one's lower end is named beside it, as Shapley's leaders are."""
    from car_core.fix_results import FixCost, PopulationFix

    def population(*candidates: Any) -> PopulationFix:
        return PopulationFix(None, 18, candidates, 0.05, 0.975, "stratified Hoeffding",
                             "betting", 0, FixCost())

    best = _estimate("policy", 0.29, 0.16, 0.43, 1, 18)
    close = _estimate("instruction", 0.27, 0.13, 0.40, 2, 18)
    far = _estimate("be polite", -0.04, -0.18, 0.09, 0, 18)
    assert population(close, best, far).summary().endswith(
        " Not told apart from 'instruction' 27% [13%, 40%]: the intervals overlap.")
    assert population(best, far).summary() == population(best).summary()
    assert "told apart" not in population(best, far).summary()


def test_every_run_is_preflighted_before_any_branch_or_locus(population, triaged):
    """As a triage: the agent's preflight sees every run before the first branch (the loci's
    attributions included), a shape that stops the fix raised with none run, a run's own
    trouble left untested with why while the others are measured."""
    from _estimator_helpers import Preflighted

    from car_core.errors import AdapterError
    runs = population[:2] + population[-2:]
    fix = car.Fix.instruction(DESK.fix)
    stops = Preflighted(DESK.agent(), {runs[3].id: InvalidInput("a shape CAR cannot fork")})
    with pytest.raises(InvalidInput, match="cannot fork"):
        car.fix_population(runs, stops, outcome=DESK.outcome, candidates=[fix], rollouts=8,
                           triage=triaged, runs_at_once=1)
    assert stops.branches == 0
    one = Preflighted(DESK.agent(), {runs[1].id: AdapterError("its checkpoint is gone")})
    res = car.fix_population(runs, one, outcome=DESK.outcome, candidates=[fix], rollouts=8,
                             triage=triaged)
    rows = {r.run_id: r for r in res.candidates[0].per_run}
    assert rows[runs[1].id].n == 0 and "its checkpoint is gone" in rows[runs[1].id].reason
    assert runs[1].id in res.candidates[0].untested
    assert all(rows[r.id].n == 8 for r in runs if r.id != runs[1].id)


def test_the_run_test_says_graded_scores_get_no_exact_sign_test(population, triaged):
    """The exact sign test at the end runs on pass/fail pairs only (``positive_by_end``): a
    result over a graded judge said it ran. Pass/fail keeps the sentence."""
    def graded(run: car.Trajectory) -> float:
        return 0.9 if DESK.outcome(run) else 0.1

    runs = population[:4]
    fix = car.Fix.instruction(DESK.fix)
    plain = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, candidates=[fix],
                               triage=triaged, rollouts=8)
    assert "exact sign test at the end" in plain.run_test
    scored = car.fix_population(runs, DESK.agent(), outcome=graded, candidates=[fix],
                                triage=triaged, rollouts=8)
    assert "anytime only" in scored.run_test and "exact sign test at the end" not in \
        scored.run_test
