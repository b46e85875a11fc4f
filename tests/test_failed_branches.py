"""Branches that raise, or come back with status ``error``, have no outcome: they are left out
of every estimate, counted and shown; past a share of the branches, or at the arm that holds
every recorded step, the estimate stops with ``BranchesFailed`` and stays resumable."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import numpy as np
import pytest
from car_adapters.pytest_plugin import one_line

import car_core as car
from car_core import cli
from car_core.engine.execution import Sequential, execute
from car_core.engine.tasks import (
    FAILED_SHARE,
    FAILED_SHARE_FROM,
    Failure,
    Task,
    check_failures,
    describe_error,
    errored_branch,
)
from car_core.errors import AgentError, BranchesFailed
from car_core.model.budget import BudgetMeter
from car_core.model.interventions import compile_plan
from car_core.model.seeding import Noise, Stream, branch_noise
from car_core.model.trajectory import ERROR_STEP
from car_core.model.vocabulary import Answer, RunStatus
from car_core.store import RunStore, StoreJournal
from car_core.testing import synthetic as syn

HOOK_STEP = 4  # the step whose tool call the hook guards; the planted cause is step 2


class Hook:
    """An app hook around the tool of step ``HOOK_STEP`` that raises on branches only (armed
    after the run is recorded): on a ``rate`` share of them, drawn from the step's own noise,
    so the retry of a branch meets the same hook again."""

    def __init__(self, model: syn.SyntheticSCM, rate: float = 1.0) -> None:
        self.model, self.rate, self.armed = model, rate, False

    def environment(self, history: car.History, action: Any, rng: np.random.Generator) -> Any:
        if self.armed and history.index == HOOK_STEP and rng.random() < self.rate:
            raise RuntimeError("audit hook unavailable on branches")
        return self.model.environment(history, action, rng)

    def agent(self) -> car.FunctionAgent:
        return car.FunctionAgent(policy=self.model.policy, environment=self.environment,
                                 is_final=lambda a: bool(a.get("final")),
                                 max_steps=self.model.n_steps, name=self.model.agent().name)


class Reporting:
    """An adapter's way of failing: the framework raised inside the branch and the adapter
    returns what it has with status ``error`` (as the OpenAI Agents adapter does)."""

    couples_noise = True  # the inner agent draws from CAR's noise

    def __init__(self, inner: car.FunctionAgent) -> None:
        self.inner, self.name = inner, inner.name

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.inner.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        try:
            return self.inner.branch(run, plan, noise)
        except AgentError as exc:  # the steps it finished, as an adapter's recorder has them
            at = exc.step or 0
            done = self.inner.branch(run, plan, noise, stop=lambda t: len(t.steps) >= at)
            return car.Trajectory.new(context=run.context, steps=list(done.steps),
                                      seed=noise.seed, agent=self.name, status=RunStatus.ERROR,
                                      error=str(exc))


class Swallowing(Reporting):
    """An adapter that does not say its branch crashed (status complete): the crash is scored
    as an outcome, the behaviour errored branches must never have."""

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        traj = super().branch(run, plan, noise)
        return traj if traj.status != RunStatus.ERROR else car.Trajectory.new(
            context=traj.context, steps=list(traj.steps), seed=traj.seed, agent=traj.agent)


WAYS = {"raises": lambda agent: agent, "returns error": Reporting}


def planted(rate: float = 1.0) -> tuple[syn.SyntheticSCM, car.Trajectory, Hook, Any]:
    """The pivot at step 2 of six, whose failure is carried out at the last step (as a refund
    is issued at the end): a branch that crashes before the end never fails. Counting crashes
    as outcomes would make every arm that runs step 4 live look rescued (H_0 .. H_4 = 0 where
    the hook always raises, H_5 = 1), so the latest rise, step 4, would be named."""
    model = syn.pivot(n_steps=6, at=2)
    run = model.failing_run(seed=0)
    hook = Hook(model, rate)
    hook.armed = True
    return model, run, hook, fails_at_the_end(model)


def fails_at_the_end(model: syn.SyntheticSCM) -> Any:
    def outcome(run: car.Trajectory, rng: np.random.Generator) -> float:
        if len(run.steps) < model.n_steps:
            return 0.0
        return model.outcome(run, rng)
    return outcome


def test_the_planted_world_is_a_trap_for_an_estimator_that_scores_crashes() -> None:
    model, run, hook, outcome = planted()
    assert model.locus == 2
    res = car.contrastive(run, Swallowing(hook.agent()), outcome=outcome, rollouts=16, seed=0)
    assert res.locus == HOOK_STEP  # the wrong step, named with confidence and no warning
    assert res.failures == ()


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("search", ["bisection", "full"])
def test_a_hook_that_raises_on_branches_stops_the_estimate_at_its_step(way: str,
                                                                       search: str) -> None:
    """Every branch that runs step 4 live crashes: no outcome for them, far more than the
    share an estimate may leave out, so it refuses and names the step, never step 4 as the
    cause."""
    _, run, hook, outcome = planted()
    with pytest.raises(BranchesFailed, match="audit hook unavailable") as info:
        car.contrastive(run, WAYS[way](hook.agent()), outcome=outcome, rollouts=16, seed=0,
                        search=search)
    err = info.value
    assert err.step == HOOK_STEP and err.first.step == HOOK_STEP
    assert all(f.attempts == 2 and f.step == HOOK_STEP for f in err.failures)
    # only arms that run step 4 live can meet the hook
    assert all(int(f.task.arm.removeprefix("hold<")) <= HOOK_STEP for f in err.failures)


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_hook_that_raises_on_a_few_branches_is_left_out_counted_and_shown(way: str) -> None:
    """The hook raises on 4% of the branches that run step 4 live: left out, the rest still
    name the planted step 2; the result lists the failures and its text says so. Independent
    arms spread the failures over the rollouts (coupled ones share a rollout's noise, so one
    unlucky draw fails every arm of that rollout); with this seed 8 of 106 branches fail."""
    _, run, hook, outcome = planted(rate=0.04)
    res = car.contrastive(run, WAYS[way](hook.agent()), outcome=outcome, rollouts=32, seed=0,
                          search="full", coupled=False)
    assert res.locus == 2
    ran = res.rollouts_used
    assert 1 <= len(res.failures) <= FAILED_SHARE * ran
    assert all(f["step"] == HOOK_STEP and f["attempts"] == 2 for f in res.failures)
    assert all("audit hook unavailable" in f["error"] for f in res.failures)
    assert f"{len(res.failures)} failed branch(es) left out" in str(res)
    # the arms are estimated from the branches that finished, not from the crashed ones
    assert sum(a.n for a in res.arms) == ran - len(res.failures)


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_few_failed_branches_do_not_end_the_search_as_if_the_budget_ran_out(way: str
                                                                             ) -> None:
    """The default search asks for rollouts index by index, and a failed branch leaves its arm
    no value at its index: read as a spent budget, that ended the search with "undecided: the
    budget ran out" and most of the budget unspent, which a larger budget did not change. Each
    failed branch now gets a stand-in (the arm on a fresh noise index), so with the hook
    raising on 6% of the branches that run step 4 live the search goes on and every seed names
    the planted step 2 (rescue 0.7, far above what 192 rollouts need). Before, 6 of these 8
    seeds ended early: undecided after about 30 rollouts, or stopped with the failed share
    judged on the few branches run by then (4 of 13)."""
    _, run, hook, outcome = planted(rate=0.06)
    failed = 0
    for seed in range(8):
        res = car.contrastive(run, WAYS[way](hook.agent()), outcome=outcome, rollouts=32,
                              seed=seed, coupled=False)
        failed += len(res.failures)
        assert res.locus == 2, str(res)
        assert res.answer == Answer.LOCUS
        assert len(res.failures) <= FAILED_SHARE * res.rollouts_used
    assert failed >= 3  # the hook did raise: the stand-ins were needed


class HeldArmBreaks:
    """An agent whose replay of the record itself breaks, on a ``rate`` share of the branches
    that hold every recorded step."""

    def __init__(self, model: syn.SyntheticSCM, rate: float) -> None:
        self.inner, self.rate = model.agent(), rate
        self.name = self.inner.name

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.inner.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        if not plan.interventions and noise.rng(99, Stream.ENVIRONMENT).random() < self.rate:
            raise RuntimeError("the checkpoint could not be restored")
        return self.inner.branch(run, plan, noise)


@pytest.mark.parametrize(("estimator", "rate"), [("contrastive", 0.2), ("shapley", 0.05)])
def test_any_failure_at_the_held_arm_stops_the_estimate(estimator: str, rate: float) -> None:
    """One failed branch of the held arm stops it: here 1 of the first 8 branches (too few for
    the share rule to judge) and 1 of 252 (a share far below a tenth)."""
    model = syn.pivot()
    run = model.failing_run(seed=0)
    agent = HeldArmBreaks(model, rate)
    with pytest.raises(BranchesFailed, match="holds every recorded step") as info:
        if estimator == "contrastive":
            car.contrastive(run, agent, outcome=model.outcome, rollouts=16, seed=0)
        else:
            car.shapley(run, agent, outcome=model.outcome, budget=400, seed=0)
    err = info.value
    assert err.first.held_arm and "checkpoint could not be restored" in str(err)
    assert len(err.failures) == 1 and err.step == len(run.steps)  # live from the end


def _failures(n: int) -> list[Failure]:
    run = syn.pivot().failing_run(seed=0)
    plan = compile_plan(run, car.do_resample(2))
    return [Failure(Task("hold<2", r, plan, branch_noise(0, r, "hold<2", True)), "boom", 2,
                    step=3) for r in range(n)]


def test_the_share_rule_allows_a_tenth_and_stops_early_only_when_clearly_above() -> None:
    assert FAILED_SHARE == 0.10 and FAILED_SHARE_FROM == 10
    check_failures(_failures(1), 10, run_id="r", final=True)  # exactly a tenth: allowed
    check_failures(_failures(3), 30, run_id="r", final=True)
    with pytest.raises(BranchesFailed, match="4 of 30 branches failed") as info:
        check_failures(_failures(4), 30, run_id="r", final=True)  # the end judges the share
    assert info.value.step == 3 and info.value.ran == 30
    assert "resume the attribution" in str(info.value)
    # while it runs: 4 of 30 (Wilson 95% interval [0.05, 0.30]) may still end within a tenth,
    # 9 of 30 ([0.17, 0.48]) cannot be, and fewer than ten branches are no share yet
    check_failures(_failures(4), 30, run_id="r")
    check_failures(_failures(5), 9, run_id="r")
    with pytest.raises(BranchesFailed, match="9 of 30"):
        check_failures(_failures(9), 30, run_id="r")
    with pytest.raises(BranchesFailed, match="run it again"):
        check_failures(_failures(4), 30, run_id="r", final=True, resumable=False)



class ClosedResourceError(Exception):
    """What anyio raises, with no message, on a stream whose other end is gone: an MCP
    session whose server process exited."""


def test_branches_failed_on_a_closed_server_connection_say_so() -> None:
    """A user trial killed its MCP server: the stop read "(first: ... ClosedResourceError: )"
    and "fix the agent (or the hook that raises on branches)". The error is an outage, so the
    hint says to bring the service up, and the empty message says it has none."""
    failures = [dataclasses.replace(f, error=describe_error(ClosedResourceError()),
                                    exception=ClosedResourceError()) for f in _failures(4)]
    with pytest.raises(BranchesFailed) as info:
        check_failures(failures, 30, run_id="r", final=True)
    assert "ClosedResourceError (no message)" in str(info.value)
    assert (info.value.hint or "").startswith("bring that service up")


def test_a_safe_tool_whose_world_changed_is_the_services_doing_not_the_agents() -> None:
    """A user trial killed its MCP server: branches whose lookup now errored where the
    record's identical call was answered were left out, "the tool answers differently where
    this estimate runs (a service down ...)", and the stop then said "fix the agent". The
    adapter marks such a branch with the tool's step (``ERROR_STEP``); its error is named at
    that step and its hint, and the stop's, say to bring the service up."""
    run = syn.pivot().failing_run(seed=0)
    said = ("safe tool 'lookup' ran live at step 1 and returned an error for arguments "
            "{\"id\":\"7\"} ('session gone'), where the record's identical call was answered")
    branch = dataclasses.replace(run, status=RunStatus.ERROR, error=said,
                                 meta={**run.meta, ERROR_STEP: 1})
    exc = errored_branch(branch, run.id)
    assert exc.step == 1 and (exc.hint or "").startswith("bring that service up")
    failures = [dataclasses.replace(f, error=describe_error(exc), exception=exc, step=1)
                for f in _failures(4)]
    with pytest.raises(BranchesFailed) as info:
        check_failures(failures, 30, run_id="r", final=True)
    assert (info.value.hint or "").startswith("bring that service up")

def test_an_arm_that_loses_a_clear_share_of_its_branches_stops_the_estimate() -> None:
    """Failures of one arm's paths bias that arm's mean however few the whole estimate ran: a
    user trial's re-decided step lost 40% of its branches (the failing ones) within a 10%
    share overall, and a rescue of 0.6 read 1.0. 6 of an arm's 15 (Wilson 95% interval
    [0.20, 0.64]) stop it; 2 of 15 ([0.04, 0.38]) do not, nor does a small arm."""
    six = _failures(6)
    check_failures(six, 100, run_id="r", final=True)  # the whole estimate's share: 6%
    with pytest.raises(BranchesFailed, match="6 of the 15 branches re-deciding from step 2 "
                       "on failed") as info:
        check_failures(six, 100, run_id="r", final=True, ran_by_arm={"hold<2": 15})
    # the branch is named by what it does, not by its arm's internal key
    assert "hold<" not in str(info.value)
    assert ("(first: the branch re-deciding from step 2 on (stopped at step 3): boom)"
            in str(info.value))
    with pytest.raises(BranchesFailed, match="re-deciding from step 2 on"):  # while it runs
        check_failures(six, 100, run_id="r", ran_by_arm={"hold<2": 15})
    check_failures(_failures(2), 100, run_id="r", final=True, ran_by_arm={"hold<2": 15})
    check_failures(_failures(3), 100, run_id="r", final=True, ran_by_arm={"hold<2": 9})


def test_a_stopped_attribution_keeps_its_branches_and_resumes_once_the_hook_is_fixed(
        tmp_path: Any) -> None:
    _, run, hook, outcome = planted()
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(BranchesFailed):
            car.contrastive(run, hook.agent(), outcome=outcome, rollouts=16, seed=0,
                            store=store, attribution_id="a1", search="full")
        kept = store.branches("a1")
        assert kept and store.attribution("a1").status == "running"
        # the crashed branches (every arm that runs step 4 live) were never stored as outcomes
        assert {b["arm"] for b in kept} <= {"hold<5", "hold<6"}
        hook.armed = False  # the hook is fixed
        res = car.contrastive(run, hook.agent(), outcome=outcome, rollouts=16, seed=0,
                              store=store, attribution_id="a1", search="full")
        assert res.locus == 2 and res.failures == ()
        assert store.attribution("a1").status == "complete"
        assert len(store.branches("a1")) == res.rollouts_used  # the kept ones reused


def test_a_stored_branch_with_status_error_is_read_back_as_a_failure(tmp_path: Any) -> None:
    """A journal written when errored branches were scored: its error rows are failures."""
    model = syn.pivot()
    run = model.failing_run(seed=0)
    plan = compile_plan(run, car.do_resample(2))
    tasks = [Task("hold<2", r, plan, branch_noise(0, r, "hold<2", True)) for r in range(3)]
    with RunStore(tmp_path / "car.db") as store:
        store.save(run)
        aid = store.begin_attribution(run.id, "test", {})
        journal = StoreJournal(store, aid)
        crashed = car.Trajectory.new(context=run.context, steps=run.held_prefix(2), seed=1,
                                     status=RunStatus.ERROR, error="KeyError('x')",
                                     outcome=car.Outcome(0.0),
                                     lineage=car.Lineage(parent_id=run.id, arm="hold<2",
                                                         rollout=1))
        journal.write(tasks[1], crashed)
        out = car.engine.agent.OutcomeFn(model.outcome)
        from car_core.engine.execution import brancher
        results = execute(tasks, brancher(run, model.agent(), out), BudgetMeter(None),
                          executor=Sequential(), journal=journal, progress=False)
    assert [t.rollout for t, _ in results] == [0, 2]
    (failure,) = results.failures
    assert failure.task.rollout == 1 and "KeyError" in failure.error and failure.step == 2


@pytest.mark.parametrize("way", sorted(WAYS))
def test_intervene_leaves_errored_branches_out_and_lists_them(way: str) -> None:
    """Resampling from step 3 runs step 4 live on every branch; the hook crashes 4% of them
    (this seed: 2 of 60). They are listed with their step, and no crash is among the scored
    branches (a crash never reaches the last step, so it would score 0, a rescue)."""
    _, run, hook, outcome = planted(rate=0.04)
    dist = car.intervene(run, WAYS[way](hook.agent()), car.do_resample(3), outcome=outcome,
                         rollouts=60, seed=0)
    assert 1 <= len(dist.failures) <= FAILED_SHARE * 60
    assert all(f["step"] == HOOK_STEP for f in dist.failures)
    assert dist.n == 60 - len(dist.failures)
    assert all(t.status != RunStatus.ERROR and len(t.steps) == 6 for t in dist.trajectories)


HOOKED_APP = '''
from car_core.testing import synthetic as syn

MODEL = syn.pivot(n_steps=6, at=2)


def environment(history, action, rng):
    if history.index == 4 and rng.random() < RATE:  # an audit hook that is down on branches
        raise RuntimeError("audit hook unavailable on branches")
    return MODEL.environment(history, action, rng)


def make():
    import car_core as car
    return car.FunctionAgent(policy=MODEL.policy, environment=environment,
                             is_final=lambda a: bool(a.get("final")), max_steps=6,
                             name=MODEL.agent().name)


def outcome(run, rng):
    return MODEL.outcome(run, rng) if len(run.steps) == 6 else 0.0
'''


def test_the_command_shows_the_failed_branches_or_stops_on_them(tmp_path: Any) -> None:
    _, run, _, _ = planted()
    db = str(tmp_path / "car.db")
    with RunStore(db) as store:
        store.save(run)
    (tmp_path / "hooked.py").write_text("RATE = 1.0\n" + HOOKED_APP, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(tmp_path), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = cli.main(["attribute", run.id, "--agent", "hooked:make", "--outcome",
                         "hooked:outcome", "--store", db, "--no-progress"])
    assert code == 5  # the agent's fault, as for any AgentError
    text = err.getvalue()
    assert "car: error: " in text and "branches failed, more than the 10%" in text
    assert "audit hook unavailable on branches" in text and "Resume with:" in text
    # a result with a few failed branches prints them under its verdict
    _, run, hook, outcome = planted(rate=0.04)
    res = car.contrastive(run, hook.agent(), outcome=outcome, rollouts=32, seed=0,
                          search="full", coupled=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli._print_result(res, 1.0, db)
    assert (f"{len(res.failures)} failed branch(es) left out of the estimate (first: arm "
            f"{res.failures[0]['arm']}") in out.getvalue()


def test_shapley_whose_pilot_lost_a_whole_coalition_stops_with_the_typed_error() -> None:
    """Step 0 draws A or B; after B the tool always raises. In exact mode a coalition whose
    pilot branches all drew B has no finished branch: its spread was a division by zero
    (seed 2 raised ZeroDivisionError). Half the branches fail, far above the share an
    estimate may leave out, so every seed stops with ``BranchesFailed`` naming the error."""
    def policy(h: car.History, rng: np.random.Generator) -> str:
        return ("A" if rng.random() < 0.5 else "B") if h.index == 0 else "x"

    def environment(h: car.History, action: Any, rng: np.random.Generator) -> str:
        if h.index == 0 and action == "B":
            raise RuntimeError("tool down after B")
        return "ok"

    agent = car.FunctionAgent(policy=policy, environment=environment,
                              is_final=lambda a: a == "x", max_steps=3)

    def outcome(run: car.Trajectory) -> bool:
        return bool(run.steps[0].action == "A")

    run = car.record(agent, context={}, outcome=outcome, seed=1)
    assert [s.action for s in run.steps] == ["A", "x"]
    for seed in range(6):
        with pytest.raises(BranchesFailed, match="tool down after B"):
            car.shapley(run, agent, outcome=outcome, budget=40, seed=seed, mode="exact")


def test_shapley_units_keep_the_draws_that_led_to_a_failed_visit() -> None:
    """Step 0 draws A (0.9) or B; after B the refund tool does not exist, so a branch that
    forces the recorded refund after a re-drawn B raises. Permutation units share each
    rollout's noise, so the units with a failed visit were exactly those where step 0 drew B:
    dropping them left only A, and step 0 got φ = 0 with the interval [0, 0]. Each failed visit
    now gets a stand-in and every unit is kept. The truth, each v(S) over the branches that
    finish: v(∅) = v({2}) = 0.45, v({0}) = v({0,2}) = 0.5, every coalition holding step 1 = 1,
    so φ = (0.025, 0.525, 0) and Σφ = 0.55. Over 100 units Σφ has standard error
    sqrt(0.45·0.55/100) = 0.05; we allow 4 of them."""
    def policy(h: car.History, rng: np.random.Generator) -> str:
        if h.index == 0:
            return "B" if rng.random() < 0.1 else "A"
        if h.index == 1:
            if h.steps[0].action == "B":
                return "escalate"
            return "refund" if rng.random() < 0.5 else "deny"
        return "x"

    def environment(h: car.History, action: Any, rng: np.random.Generator) -> str:
        if h.index == 1 and h.steps[0].action == "B" and action in ("refund", "deny"):
            raise RuntimeError("no refund tool on the escalation path")
        return "ok"

    agent = car.FunctionAgent(policy=policy, environment=environment,
                              is_final=lambda a: a == "x", max_steps=3)

    def outcome(run: car.Trajectory) -> bool:
        return bool(run.steps[1].action == "refund")

    run = next(r for r in (car.record(agent, context=None, outcome=outcome, seed=s)
                           for s in range(100)) if [st.action for st in r.steps]
               == ["A", "refund", "x"])
    covered = 0
    for seed in range(5):
        sh = car.shapley(run, agent, outcome=outcome, budget=600, seed=seed,
                         mode="permutation")
        assert sh.failures and len(sh.failures) <= FAILED_SHARE * sh.rollouts_used
        step0 = sh.values[0]
        assert step0.ci is not None and step0.ci[1] > step0.ci[0]  # never certain of it
        covered += step0.ci[0] <= 0.025 <= step0.ci[1]
        assert abs(sum(v.estimate or 0.0 for v in sh.values) - 0.55) <= 4 * 0.05
    assert covered >= 3


class OwnDraws:
    """A hosted model that ignores CAR's seed (``couples_noise=False``): step 0 refunds with
    probability 1/2 (the failure), and after a refund the server answers step 1 with a 503 in
    ``error_rate`` of the calls — errors on the failing path only."""

    def __init__(self, error_rate: float) -> None:
        self.rng, self.error_rate = np.random.default_rng(7), error_rate
        self.armed = False

    def policy(self, history: car.History, rng: np.random.Generator) -> Any:
        if history.index == 0:
            return {"refund": bool(self.rng.random() < 0.5)}
        if self.armed and history.steps[0].action["refund"] \
                and self.rng.random() < self.error_rate:
            raise RuntimeError("503 Service Unavailable")
        return {"reply": "done", "final": True}

    def agent(self) -> car.FunctionAgent:
        return car.FunctionAgent(policy=self.policy, is_final=lambda a: bool(a.get("final")),
                                 max_steps=2, name="own-draws", couples_noise=False)


def refunded(run: car.Trajectory) -> float:
    return float(run.steps[0].action["refund"])


def test_a_branch_whose_draws_are_its_own_is_not_retried_into_a_biased_estimate() -> None:
    """Retried with a fresh draw, a branch that raised favours the paths that do not raise: with
    503s on 40% of the failing path, P(fail) under re-deciding step 0 read about 0.37 where it is
    0.5, with only the 4% that failed twice counted. Not retried, each error counts, and the
    share (about 20%) stops the estimate."""
    model = OwnDraws(error_rate=0.4)
    agent = model.agent()
    run = next(r for r in (agent.start({}, Noise(s)) for s in range(50)) if refunded(r))
    model.armed = True
    with pytest.raises(BranchesFailed, match="more than the 10%") as info:
        car.intervene(run, agent, car.do_resample(0), outcome=refunded, rollouts=400,
                      executor=Sequential(), progress=False)
    share = len(info.value.failures) / info.value.ran
    assert abs(share - 0.2) <= 4 * np.sqrt(0.2 * 0.8 / 400)  # each error counted once
    assert all(f.attempts == 1 for f in info.value.failures)


def test_a_hosted_agent_handed_cars_noise_without_a_seed_check_is_not_retried() -> None:
    """An agent over a model server (``prefers_concurrency``) that says it draws from CAR's
    noise but measures nothing: its model may ignore the seed, so a retry is a fresh draw. A
    user trial's OpenAI Agents branches that raised were retried into the paths that do not,
    and a rescue of 0.6 read 1.0."""
    model = OwnDraws(error_rate=0.4)
    base = model.agent()

    @dataclasses.dataclass
    class Hosted(car.FunctionAgent):
        prefers_concurrency: bool = True

    agent = Hosted(policy=base.policy, is_final=base.is_final, max_steps=2, name=base.name,
                   couples_noise=True)
    run = next(r for r in (agent.start({}, Noise(s)) for s in range(50)) if refunded(r))
    model.armed = True
    with pytest.raises(BranchesFailed, match="more than the 10%") as info:
        car.intervene(run, agent, car.do_resample(0), outcome=refunded, rollouts=400,
                      executor=Sequential(), progress=False)
    assert all(f.attempts == 1 for f in info.value.failures)


def test_a_branch_that_replays_its_draws_is_retried_on_the_same_path() -> None:
    """An agent that draws from CAR's noise re-runs the same path when retried: a hook that
    fails once per branch leaves nothing out and P(fail) where it is."""
    model = syn.pivot(n_steps=4, at=1, p_bad=0.5)
    once: set[int] = set()

    def environment(history: car.History, action: Any, rng: np.random.Generator) -> Any:
        key = int(rng.integers(1 << 62))  # the branch's own draw: the same on its retry
        if history.index == 2 and key not in once:
            once.add(key)
            raise RuntimeError("timeout")
        return model.environment(history, action, rng)

    agent = car.FunctionAgent(policy=model.policy, environment=environment,
                              is_final=lambda a: bool(a.get("final")), max_steps=4,
                              name=model.agent().name)
    run = model.failing_run(0)
    dist = car.intervene(run, agent, car.do_resample(1), outcome=model.outcome, rollouts=200,
                         executor=Sequential(), progress=False)
    assert not dist.failures and len(once) >= 150
    assert abs(dist.mean - model.arm(1)) <= 4 * np.sqrt(0.25 / 200)


class InternalServerError(Exception):
    """What the openai client raises on a 5xx (matched by name, as every client's is)."""

    status_code = 503


def test_an_llm_judge_whose_server_goes_down_stops_the_estimate_resumably(tmp_path) -> None:
    """A user trial's LLM judge answered 503 mid-attribution: the error read "fix the outcome
    function" (bad input, no resume) though every later score would have failed the same way
    and the stored branches resumed fine. It is an outage: ``ModelUnavailable``, resumable,
    and the resume with the judge back answers."""
    model = syn.pivot(n_steps=4, at=1, p_bad=0.3)
    run = model.failing_run(0)
    judge = {"calls": 0, "down_after": 40}

    def outcome(traj: car.Trajectory, rng: np.random.Generator) -> float:
        judge["calls"] += 1
        if judge["calls"] > judge["down_after"]:
            raise InternalServerError("judge unavailable")
        return model.outcome(traj, rng)

    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(car.errors.ModelUnavailable, match="outcome's server failed") as info:
            car.contrastive(run, model.agent(), outcome=outcome, rollouts=32, store=store,
                            attribution_id="judge-down", executor=Sequential(), progress=False)
        assert "--resume" in (info.value.hint or "")
        # the stop names the attribution a resume takes (a pytest trial's line did not)
        assert info.value.context["attribution_id"] == "judge-down"
        assert "--resume judge-down" in one_line(info.value)
        kept = store.attribution("judge-down")
        assert kept.result is None and len(store.children(run.id)) > 0
        judge["down_after"] = 10**9
        res = car.contrastive(run, model.agent(), outcome=outcome, rollouts=32, store=store,
                              attribution_id="judge-down", executor=Sequential(),
                              progress=False)
    assert res.locus == 1


def test_a_resumable_stop_from_python_names_its_attribution_and_how_to_resume_it(
        tmp_path) -> None:
    """From Python the stop said "resume the attribution with the same attribution_id (`car
    attribute ... --resume ID`)" and named neither the id (only ``context``) nor the Python
    spelling. Its message names both: ``attribution_id="<id>"`` to the same call, and the
    command's ``--resume <id>``."""
    model = syn.pivot(n_steps=4, at=1, p_bad=0.3)
    run = model.failing_run(0)

    calls = [0]

    def outcome(traj: car.Trajectory, rng: np.random.Generator) -> float:
        calls[0] += 1
        if calls[0] > 20:  # down after the attribution began (its row kept for the resume)
            raise InternalServerError("judge unavailable")
        return model.outcome(traj, rng)

    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(car.errors.ModelUnavailable) as info:
            car.contrastive(run, model.agent(), outcome=outcome, rollouts=8, store=store,
                            executor=Sequential(), progress=False)
    aid = info.value.context["attribution_id"]
    said = str(info.value)
    assert f'attribution_id="{aid}"' in said and f"--resume {aid}" in said
    assert "--resume ID" not in said and info.value.hint is not None
    assert f"--resume {aid}" in info.value.hint


def test_an_async_clients_stale_loop_error_is_tried_once_more_whatever_the_draws() -> None:
    """A user who recorded with ``run_sync`` and attributes in the same process has an HTTP
    pool whose first connection on CAR's loop fails ("bound to a different event loop"), once,
    whatever the branch's path. With no retry (draws of its own) that one error stopped an
    estimate of two branches; it is tried once more, and only it."""
    failed_once: list[bool] = []

    def policy(history: car.History, rng: np.random.Generator) -> Any:
        if not failed_once:
            failed_once.append(True)
            raise RuntimeError("<asyncio.locks.Event object> is bound to a different event loop")
        return {"reply": "done", "final": True}

    agent = car.FunctionAgent(policy=policy, is_final=lambda a: bool(a.get("final")),
                              max_steps=2, name="stale-loop", couples_noise=False)
    failed_once.append(True)  # the recording's call is fine
    run = agent.start({}, Noise(0))
    failed_once.clear()
    dist = car.intervene(run, agent, car.do_resample(0), outcome=lambda r: 1.0, rollouts=2,
                         executor=Sequential(), progress=False)
    assert not dist.failures and dist.n == 2


def test_a_branch_whose_tool_raised_names_the_step_that_called_it() -> None:
    """A branch that ended with an error after its last step called a tool and got no result
    stopped in that step, not the next (a user trial's error in a tool of step 1 read
    "stopped at step 2"); one that ended after a finished step stopped in the next."""
    from car_core.engine.tasks import errored_branch
    from car_core.model.trajectory import Step

    called = Step(0, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "pay", "arguments": "{}"}}]},
        None, False)
    answered = Step(0, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "pay", "arguments": "{}"}}]},
        [{"role": "tool", "tool_call_id": "c", "content": "ok"}], True)
    for steps, where in (([called], 0), ([answered], 1), ([], 0)):
        traj = car.Trajectory.new(context="c", steps=steps, status=RunStatus.ERROR,
                                  error="boom")
        assert errored_branch(traj, None).step == where


class EndsInError(Reporting):
    """An app whose last act raises after the final reply (an output guardrail with a bug):
    every branch comes back with all its steps, the reply last, and status ``error``."""

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        done = self.inner.branch(run, plan, noise)
        return dataclasses.replace(done, status=RunStatus.ERROR,
                                   error="KeyError('policy_table')")


def test_a_branch_that_failed_after_its_last_step_names_that_step_not_the_next() -> None:
    """A user trial's output guardrail raised after the final reply of a run of steps 0-5,
    and the stop read "stopped at step 6 ... [step 6]", a step no branch ever took. It names
    the last step the branch finished and says the error came after it."""
    from car_core.engine.tasks import errored_branch
    from car_core.model.trajectory import Step

    model = syn.pivot(n_steps=6, at=2)
    run = model.failing_run(seed=0)
    with pytest.raises(BranchesFailed, match="policy_table") as info:
        car.contrastive(run, EndsInError(model.agent()), outcome=model.outcome, rollouts=8,
                        seed=0, executor=Sequential(), progress=False)
    err = info.value
    assert err.step == 5 and err.first.step == 5
    assert "step 6" not in str(err)
    assert "failed after step 5, its last" in str(err)
    reply = Step(0, {"role": "assistant", "content": "done", "tool_calls": []}, None, False)
    traj = car.Trajectory.new(context="c", steps=[reply], status=RunStatus.ERROR, error="x")
    assert errored_branch(traj, None).step == 0
