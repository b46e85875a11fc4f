"""The outcome is checked on the record before any branch: an outcome that scores the recorded
run on the other side of the failure threshold from its stored outcome (so it cannot see the
failure, or sees one that was not there) is refused with ``OutcomeMismatch`` by every estimate,
before a branch runs, a rollout is charged or anything is stored; never answered "no cause"."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import car_core as car
from car_core.errors import NothingToAttribute, OutcomeError, OutcomeMismatch
from car_core.model.outcome import RECORD_SCORES, check_on_record
from car_core.store import RunStore
from car_core.testing import synthetic as syn


def blind(run: car.Trajectory) -> float:
    """An outcome that cannot see the failure: it reads a field the run does not have."""
    return 1.0 if (run.meta or {}).get("failed") else 0.0


def _counted(model: syn.SyntheticSCM) -> tuple[car.FunctionAgent, list[int]]:
    """The model's agent with a count of its policy calls: any branch makes at least one."""
    calls = [0]

    def policy(history: car.History, rng: Any) -> Any:
        calls[0] += 1
        return model.policy(history, rng)

    agent = model.agent()
    agent.policy = policy
    return agent, calls


ENTRIES = {
    "intervene": lambda run, agent, outcome, **kw: car.intervene(
        run, agent, car.do_resample(2), outcome=outcome, rollouts=8, progress=False, **kw),
    "contrastive": lambda run, agent, outcome, **kw: car.contrastive(
        run, agent, outcome=outcome, rollouts=8, progress=False, **kw),
    "shapley": lambda run, agent, outcome, **kw: car.shapley(
        run, agent, outcome=outcome, budget=64, progress=False, **kw),
    "context_attribution": lambda run, agent, outcome, **kw: car.context_attribution(
        run, agent, step=2, outcome=outcome, rollouts=8, **kw),
    "repairs": lambda run, agent, outcome, **kw: car.repairs(
        run, agent, step=2, candidates=[car.do_resample(2)], outcome=outcome, rollouts=4, **kw),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_blind_outcome_is_refused_before_any_branch(pivot_model, pivot_run, entry) -> None:
    agent, calls = _counted(pivot_model)
    with pytest.raises(OutcomeMismatch) as info:
        ENTRIES[entry](pivot_run, agent, blind)
    assert calls[0] == 0  # not one policy call: no branch ran
    err = info.value
    assert isinstance(err, OutcomeError) and err.run_id == pivot_run.id
    assert err.stored == 1.0 and err.scores == (0.0,) * RECORD_SCORES
    text = str(err)
    assert "stored as failed (1.00" in text and "as fine (0.00, 0.00, 0.00" in text, text
    assert "no branch was run" in text and "a car.Trajectory of 6 step(s)" in text, text
    # a judge with randomness of its own may have mislabelled the record: the hint says so
    assert "the stored score may have been its mislabel" in (err.hint or ""), err.hint


@pytest.mark.parametrize("entry", ["contrastive", "shapley"])
def test_a_refused_attribution_leaves_the_store_untouched(pivot_model, pivot_run, tmp_path,
                                                          entry) -> None:
    agent, calls = _counted(pivot_model)
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(OutcomeMismatch):
            ENTRIES[entry](pivot_run, agent, blind, store=store, attribution_id="a1")
        assert store.attribution_ids() == [] and not store.attribution_exists("a1")
        assert store.runs() == [] and not store.exists(pivot_run.id)  # not even the run
    assert calls[0] == 0


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_the_outcome_the_run_was_recorded_with_passes(pivot_model, pivot_run, entry) -> None:
    agent, calls = _counted(pivot_model)
    ENTRIES[entry](pivot_run, agent, pivot_model.outcome)
    assert calls[0] > 0


def test_the_reverse_a_fine_run_scored_as_failed_is_refused(pivot_model) -> None:
    fine = next(r for r in (car.record(pivot_model.agent(), context=None,
                                       outcome=pivot_model.outcome, seed=s) for s in range(50))
                if not r.failed)
    agent, calls = _counted(pivot_model)
    with pytest.raises(OutcomeMismatch) as info:
        car.intervene(fine, agent, car.do_resample(2), outcome=lambda run: True, rollouts=4)
    assert calls[0] == 0
    assert "as failed (1.00, 1.00, 1.00" in str(info.value)
    assert "stored as fine (0.00" in str(info.value)


def test_intervene_on_a_run_recorded_without_an_outcome_is_not_checked(pivot_model,
                                                                        pivot_run) -> None:
    """intervene asks what a change does to any run, failed or not: with nothing stored to
    compare with, it runs."""
    unscored = dataclasses.replace(pivot_run, outcome=None)
    dist = car.intervene(unscored, pivot_model.agent(), car.do_resample(2), outcome=blind,
                         rollouts=4, progress=False)
    assert dist.mean == 0.0  # ran, and the blind outcome saw nothing, as asked


ATTRIBUTIONS = sorted(set(ENTRIES) - {"intervene"})


@pytest.mark.parametrize("entry", ATTRIBUTIONS)
def test_an_attribution_of_a_run_stored_without_an_outcome_refuses_one_that_scores_it_fine(
        pivot_model, pivot_run, entry) -> None:
    """A recorder given no outcome stores none: an attribution then has nothing to compare
    with, but a run the outcome scores as fine has no failure to explain, so a blind outcome
    is refused before any branch instead of answered "no cause"."""
    unscored = dataclasses.replace(pivot_run, outcome=None)
    agent, calls = _counted(pivot_model)
    with pytest.raises(OutcomeMismatch) as info:
        ENTRIES[entry](unscored, agent, blind)
    assert calls[0] == 0
    text = str(info.value)
    assert "stored without an outcome" in text and "(0.00, 0.00, 0.00" in text, text
    assert "record with outcome=" in text, text


@pytest.mark.parametrize("entry", ATTRIBUTIONS)
def test_an_attribution_of_a_run_stored_without_an_outcome_runs_when_it_scores_failed(
        pivot_model, pivot_run, entry) -> None:
    agent, calls = _counted(pivot_model)
    ENTRIES[entry](dataclasses.replace(pivot_run, outcome=None), agent, pivot_model.outcome)
    assert calls[0] > 0


def test_an_attribution_of_a_run_that_did_not_fail_is_refused(pivot_model) -> None:
    fine = next(r for r in (car.record(pivot_model.agent(), context=None,
                                       outcome=pivot_model.outcome, seed=s) for s in range(50))
                if not r.failed)
    agent, calls = _counted(pivot_model)
    with pytest.raises(NothingToAttribute, match="the run did not fail"):
        car.contrastive(fine, agent, outcome=pivot_model.outcome, rollouts=8, progress=False)
    assert calls[0] == 0


def test_a_seeded_noisy_judge_gives_back_its_recorded_value_on_every_seed() -> None:
    # A judge that draws from the rng it is given reads the run's own outcome stream on the
    # record, as it did when the run was recorded: never refused, however often it errs.
    model = syn.noisy_pivot(flip=0.3)
    for seed in range(40):
        run = car.record(model.agent(), context=None, outcome=model.outcome, seed=seed)
        check_on_record(run, model.outcome)


def test_a_judge_with_its_own_randomness_is_rarely_refused() -> None:
    """A correct judge that errs with probability 0.2 on each call, from a generator of its
    own (an unseeded LLM judge), is refused only when all three scores err: P = 0.2^3 = 0.008 a
    run, so over 50 runs about 0.4 refusals are expected, and more than 3 has probability
    about 8e-4 (Poisson(0.4) tail); the generator is seeded, so the count is fixed."""
    model = syn.pivot()
    own = np.random.default_rng(2024)

    def judge(run: car.Trajectory) -> float:
        truth = model.outcome(run, np.random.default_rng(0))  # flip=0: the rng is unused
        return 1.0 - truth if own.random() < 0.2 else truth

    refused = 0
    for seed in range(50):
        run = car.record(model.agent(), context=None, outcome=model.outcome, seed=seed)
        try:
            check_on_record(run, judge)
        except OutcomeMismatch:
            refused += 1
    assert refused <= 3


def test_a_judge_that_errs_twice_then_sees_the_failure_is_not_refused(pivot_run) -> None:
    scores = iter([0.0, 0.2, 0.9])
    check_on_record(pivot_run, lambda run: next(scores))  # the third score agrees
    with pytest.raises(OutcomeMismatch) as info:
        check_on_record(pivot_run, lambda run: 0.49)  # 0.49 is fine: failed means >= 0.5
    assert info.value.scores == (0.49, 0.49, 0.49)


def test_an_outcome_that_raises_on_the_record_stops_before_any_branch(pivot_model,
                                                                      pivot_run) -> None:
    agent, calls = _counted(pivot_model)

    def broken(run: car.Trajectory) -> float:
        return float(run.meta["final_state"]["refunded"])

    with pytest.raises(OutcomeError, match="the outcome function raised KeyError"):
        car.contrastive(pivot_run, agent, outcome=broken, rollouts=8, progress=False)
    assert calls[0] == 0


def test_the_message_shows_what_the_outcome_received(pivot_model, pivot_run) -> None:
    state = {"messages": [{"role": "user", "content": "refund?"},
                          {"role": "tool", "content": "[{\"type\": \"text\"}]"}],
             "budget": 300}
    run = dataclasses.replace(pivot_run, meta={**pivot_run.meta, "final_state": state})
    with pytest.raises(OutcomeMismatch) as info:
        car.intervene(run, pivot_model.agent(), car.do_resample(2), outcome=blind, rollouts=4)
    text = str(info.value)
    assert ("run.meta['final_state'] is a dict with keys ['budget', 'messages'], its last "
            "message a dict with role 'tool'") in text, text
    assert "final_state(run)" in text  # what to do: score the app's own state



def test_a_final_state_that_lost_the_runs_tool_calls_is_named() -> None:
    """A user trial's supervisor app kept only each worker's last message (``output_mode=
    "last_message"``): the refund its outcome looked for was in ``run.steps`` but not in the
    final state, and the refusal told it to read ``final_state(run)``, which it did. The
    message names the tool calls the steps hold and the final state does not."""
    def call(k: int, name: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function",
             "function": {"name": name, "arguments": "{}"}}]}
    steps = [car.Step(index=k, action=call(k, name), observation=[], observed=True,
                      meta={"agent": agent})
             for k, (name, agent) in enumerate([("transfer_to_refunds", "supervisor"),
                                                ("issue_refund", "refunds")])]
    kept = {"messages": [{"role": "user", "content": "refund?"},
                         {"role": "assistant", "content": "Refunded."}]}
    run = car.Trajectory.new(context="refund?", steps=steps, outcome=car.Outcome(1.0),
                             meta={"final_state": kept})
    with pytest.raises(OutcomeMismatch) as info:
        check_on_record(run, lambda r: 0.0)
    text = str(info.value)
    assert ("run.steps hold 2 tool call(s) its final state's messages do not "
            "(transfer_to_refunds, issue_refund)") in text, text
    assert "output_mode" in text
    with_calls = dataclasses.replace(run, meta={"final_state": {
        "messages": [kept["messages"][0], call(0, "transfer_to_refunds"),
                     call(1, "issue_refund"), kept["messages"][1]]}})
    with pytest.raises(OutcomeMismatch) as info:
        check_on_record(with_calls, lambda r: 0.0)
    assert "tool call(s) its final state's messages do not" not in str(info.value)

# -- the command line ---------------------------------------------------------------------------

def car_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


BLIND_OUTCOME = textwrap.dedent('''
    def blind(run):
        return (run.meta or {}).get("failed", False)
''')


@pytest.mark.parametrize("command", ["attribute", "intervene"])
def test_the_cli_refuses_a_blind_outcome_in_one_line_without_a_resume(
        tmp_path, pivot_run, command) -> None:
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    (tmp_path / "blind_outcome.py").write_text(BLIND_OUTCOME)
    extra = ["--do", "resample:2"] if command == "intervene" else []
    proc = car_cli(command, pivot_run.id, "--agent", "car_core.synthetic:pivot",
                   "--outcome", "blind_outcome:blind", *extra, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr  # a usage error: the outcome given is wrong
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and "Resume" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("car: error: the outcome scores the "
                                                   "recorded run as fine"), proc.stderr
    assert "stored as failed (1.00" in lines[0]
    with RunStore(tmp_path / "car.db") as s:
        assert s.attribution_ids() == []  # nothing begun, so nothing to resume


def test_an_outcome_that_raises_on_a_branch_names_the_run_and_the_branch(pivot_model,
                                                                          pivot_run) -> None:
    """The error's run id is one ``car runs`` lists (the parent), and the text says the score
    was asked for on a branch, from which step."""
    def raises_on_branches(run: car.Trajectory, rng: Any) -> float:
        if run.lineage is not None:
            raise KeyError("verdict")
        return pivot_model.outcome(run, rng)

    with pytest.raises(OutcomeError) as info:
        car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                      outcome=raises_on_branches, rollouts=2, progress=False,
                      executor="sequential")
    err = info.value
    assert err.run_id == pivot_run.id
    assert "on a branch of the run" in str(err) and "re-decided from step 2" in str(err)


def test_an_outcome_error_on_the_all_held_arm_says_so_in_words() -> None:
    """A user trial read "re-decided from step None, arm hold<5": the branch that holds every
    recorded step has no step it re-decided, and the arm's name is internal."""
    from car_core.model.outcome import _on
    from car_core.model.trajectory import Lineage
    run = car.Trajectory.new(context=None, steps=[])
    held = dataclasses.replace(run, lineage=Lineage(parent_id="p1", branch_step=None,
                                                    arm="hold<5", rollout=3))
    assert _on(held) == (f" on a branch of the run (branch {run.id}, every recorded step "
                         "held, rollout 3)")
    redone = dataclasses.replace(held, lineage=dataclasses.replace(held.lineage, branch_step=2))
    assert "re-decided from step 2, rollout 3" in _on(redone) and "hold<5" not in _on(redone)
