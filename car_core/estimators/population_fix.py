"""Whether a fix rescues a population of failed runs: each run branched with and without it.

For each run and each fix (a ``car.Fix``), the run is branched from its locus — read from a
triage, from the run's stored contrastive attribution, or found by attributing it now
(``car.triage`` over the runs that lack one) — or from step 0 for a fix that touches every
step (a system-prompt line, another model) or when ``from_step=0``. The arm *without* the fix
re-decides that step from the state it saw (``do_context(k, keep_all)``); the arm *with* it
applies the fix there. Rollout ``r`` of every arm of a run draws the same noise where the agent
takes CAR's seeds, each run from its own seed (derived from ``seed`` and the run's id), so
runs are independent and the arms of one run differ only by the fix. ``K = rollouts`` pairs
per run and fix; an errored branch drops its pair.

Statistics, over the ``N`` runs of the population and the ``C`` fixes, each family at
``alpha``:

* Pooled rescue ``θ = (1/N') Σ_i (P(fail | without) − P(fail | with))`` over the ``N'`` runs
  tested, estimated by the mean of each run's mean paired difference. Its interval is the
  stratified Hoeffding interval (``car_core.stats.pooled``) at level ``1 − alpha/C``: all
  ``C`` intervals cover their ``θ`` at once with probability ``≥ 1 − alpha``, at any sample
  size and for any outcome in [0, 1] (conservative where the pairs vary little).
* ``rescued``: the runs whose own rescue is shown positive by a betting test with an exact
  sign test at the end (``stats.sequential.positive_by_end``), each at ``alpha/(N·C)``: with
  probability ``≥ 1 − alpha`` no run is listed as rescued by a fix that does not rescue it.
  ``not_rescued`` is every other run (the untested ones included, each with its reason).

Several runs at once: ``runs_at_once`` runs are branched at a time (by default several for an
agent that waits on a model server, one after another for an in-process one). Each run draws
from its own seed and the result lists the runs in the order given, so it does not depend on
``runs_at_once``.

Budget: ``budget`` caps everything this call spends (the attributions that find loci, with
the same ``runs_at_once``, then the fixes' branches). A run is started only when what is left
pays for all its arms (``arms · K`` rollouts); the runs not reached are untested and the result
``truncated``. With several runs in flight each holds its rollouts until it finishes, and a
run the rest does not pay for waits for one (``car_core.estimators._population``), so the
rollouts spent never pass the total and the runs reached are those one after another would
reach; tokens and cost are divided among the runs that could start. A run whose arms a token,
cost or wall time cap stopped part-way is dropped (its pairs stopped for a reason that may
depend on the branches) and no run starts after it (those in flight finish and are kept).
With a ``store`` the fix is an attribution of its own (``car_core.store.fixes``), resumable
with the same ``fix_id``: the runs already measured are read back, drawing nothing.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from car_core import defaults
from car_core.engine.agent import Agent
from car_core.engine.execution import ExecutorLike
from car_core.engine.progress import run_started
from car_core.engine.tasks import check_failures
from car_core.errors import (
    BranchesFailed,
    InvalidInput,
    InvalidIntervention,
    ModelUnavailable,
    resume_population_words,
)
from car_core.estimators._arms import Branch, StepArms, check_rollouts
from car_core.estimators._population import (
    Purse,
    RunPool,
    Spent,
    per_run_progress,
    run_seed,
    runs_at_once_for,
)
from car_core.estimators.fixes import Fix, as_fix
from car_core.estimators.triage import RUN_ERRORS, _load_all, refusal_reason, refused_up_front
from car_core.estimators.triage import triage as attribute_all
from car_core.fix_results import (
    INTERVAL,
    RUN_TEST,
    RUN_TEST_GRADED,
    FixCost,
    FixEstimate,
    FixRun,
    PopulationFix,
)
from car_core.model.budget import Budget, as_budget, check_countable
from car_core.model.context_sources import keep_all
from car_core.model.interventions import do_context
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import Origin
from car_core.results import ContrastiveResult
from car_core.stats import check_level
from car_core.stats.pooled import pooled_mean
from car_core.stats.sequential import positive_by_end
from car_core.store import as_store
from car_core.triage_results import TriageResult

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import RunStore, StoreLike

FixProgress = Callable[[int, int, str], None]


READ_BACK, UNTESTED = "read back", "untested"  # ``how`` a run that drew nothing was settled


def progress_line(done: int, total: int, run_id: str, how: str | None = None) -> str:
    """What ``progress=True`` (and ``car fix`` on a terminal) prints after each run: a run
    read back from the store or left untested (no locus, no tool result to guard) says so."""
    return f"[{done}/{total}] run {run_id}" + (f" ({how})" if how else "")


def untimed(run_id: str, how: str | None = None) -> bool:
    """A run that drew nothing (read back, untested) does not set the pace: a trial's fix
    read "about 0 s left" with 24 runs to go after an untested first run."""
    return how is not None


def _takes_how(fn: Callable[..., Any]) -> bool:
    """Whether a progress callback takes ``how=`` (by name, or as ``**kwargs``): callbacks
    of ``(done, total, run_id)`` are called as before."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "how" or p.kind is p.VAR_KEYWORD for p in params)
WITHOUT = "without the fix"


@dataclass(frozen=True)
class _Kept(Branch):
    live: int = 0
    length: int = 0


class _FixArms(StepArms):
    """The arms of one run; each branch also keeps how many steps it decided live."""

    def _keep(self, traj: Trajectory) -> Branch:
        b = super()._keep(traj)
        live = sum(1 for s in traj.steps if s.meta.get("origin") != Origin.HELD)
        return _Kept(b.value, b.action, live, len(traj.steps))


def _check(candidates: Iterable[Any] | Fix, from_step: int | str, alpha: float, rollouts: int,
           max_rollouts: int) -> list[Fix]:
    if not 0 < alpha < 1:
        raise InvalidInput(f"alpha={alpha!r} is outside (0, 1)", hint="use e.g. alpha=0.05")
    check_rollouts(rollouts, 2, max_rollouts, "max_rollouts=")
    if not (from_step == "locus" or (isinstance(from_step, int)
                                     and not isinstance(from_step, bool) and from_step >= 0)):
        raise InvalidInput(f"from_step={from_step!r}: branch from each run's locus or a step",
                           hint='pass from_step="locus" (the default) or from_step=0')
    if isinstance(candidates, (Fix, str)) or callable(candidates):
        candidates = [candidates]
    fixes = [as_fix(c) for c in candidates]
    if not fixes:
        raise InvalidInput("no fix to test", hint="pass candidates=[car.Fix.instruction(...)]")
    labels = [f.label for f in fixes]
    twice = [x for x in labels if labels.count(x) > 1]
    if twice:
        raise InvalidInput(f"two fixes are labelled {twice[0]!r}",
                           hint="give each fix its own label=")
    return fixes


def _branch_step(fix: Fix, from_step: int | str, locus: int | None) -> int | None:
    if fix.every_step:
        return 0
    return locus if from_step == "locus" else int(from_step)


def fix_population(runs: Iterable[Trajectory | str], agent: Agent, *, outcome: OutcomeLike,
                   candidates: Iterable[Any] | Fix, store: StoreLike | None = None,
                   triage: TriageResult | str | None = None,
                   from_step: int | str = "locus",
                   rollouts: int = defaults.POPULATION_FIX_ROLLOUTS,
                   alpha: float = defaults.ALPHA, seed: int = 0,
                   budget: Budget | int | None = None,
                   locate_rollouts: int = defaults.ROLLOUTS, fix_id: str | None = None,
                   executor: ExecutorLike = None, progress: FixProgress | bool | None = None,
                   force_agent: bool = False,
                   max_rollouts: int = defaults.MAX_ROLLOUTS,
                   runs_at_once: int | None = None) -> PopulationFix:
    """Test each of ``candidates`` (``car.Fix`` values) on every run of ``runs`` (trajectories,
    or run ids in ``store``) with ``rollouts`` pairs per run and fix; see the module docstring
    for the branching, the intervals and the budget. ``triage``: a ``car.triage``
    result (or its id in ``store``) whose loci to use; runs it left without one are untested
    for the fixes that need a locus. Without it, loci come from each run's stored contrastive
    attribution, else from attributing the run now (``locate_rollouts`` per step, stored as a
    triage when a store is given). ``runs_at_once``: runs branched at once (None: chosen for
    the agent). ``progress(done, total, run_id)`` after each run tested, read back or left
    untested, on the caller's thread (not for runs the budget never reached; ``True``: a line
    per run on stderr); a callback that takes ``how=`` is told ``"read back"`` or
    ``"untested"`` for a run that drew nothing (None for one tested)."""
    fixes = _check(candidates, from_step, alpha, rollouts, max_rollouts)
    store = as_store(store)
    at_once = runs_at_once_for(runs_at_once, agent)
    each_run = per_run_progress(progress, progress_line, at_once, untimed)
    told_how = each_run is not None and _takes_how(each_run)
    total = as_budget(budget, "budget")
    population = _load_all(runs, store)
    for run in population:  # a money cap no price counts: refused before anything is stored
        check_countable(total, run)
    n_runs, n_fix = len(population), len(fixes)
    level = 1 - alpha / n_fix
    check_level(level)
    run_alpha = alpha / (n_runs * n_fix)
    fid = fix_id or (uuid.uuid4().hex[:16] if store is not None else None)
    params: dict[str, Any] = {
        "candidates": [f.to_dict() for f in fixes], "rollouts": rollouts, "alpha": alpha,
        "seed": seed, "from_step": from_step, "agent": agent.name,
        "budget": total.to_dict() if total else None, "locate_rollouts": locate_rollouts,
        "runs": [r.id for r in population]}
    done: dict[str, dict[str, Any]] = {}
    if store is not None and fid is not None:
        from car_core.store.fixes import begin_fix
        done = begin_fix(store, fid, params)
    try:
        # every run's shape refused (or the whole fix stopped) before any branch, loci's included
        refused = {population[i].id: f"not tested: {refusal_reason(exc)}"
                   for i, exc in refused_up_front(population, agent, force_agent).items()}
        purse = Purse(total, "population fix")
        loci, why = _loci([r for r in population if r.id not in refused], fixes, from_step, done,
                          triage, store, agent, outcome, locate_rollouts, alpha, seed, total,
                          executor, force_agent, fid, purse.spent, at_once)
        why.update(refused)
        locate_spent = purse.spent.rollouts
        records: dict[str, dict[str, Any]] = {}
        holds: dict[int, Spent] = {}
        note: str | None = None
        finished = 0

        def settled(i: int, rec: dict[str, Any]) -> None:
            nonlocal note, finished
            if i in holds:
                purse.settle(holds.pop(i), int(rec.get("rollouts", 0)), int(rec.get("tokens", 0)),
                             float(rec.get("cost", 0.0)))
            if rec.get("tripped"):
                note = note or str(rec["tripped"])
            elif rec:
                records[population[i].id] = rec
                if store is not None and fid is not None and rec.get("measured"):
                    from car_core.store.fixes import save_fix_run
                    save_fix_run(store, fid, rec)
            if each_run is not None and rec:  # not of the runs the budget never reached
                finished += 1
                how = (READ_BACK if rec.get("reused") else
                       None if rec.get("measured") else UNTESTED)
                if told_how:
                    cast(Callable[..., None], each_run)(finished, n_runs, population[i].id,
                                                        how=how)
                else:
                    each_run(finished, n_runs, population[i].id)

        with RunPool[dict[str, Any]](at_once, ordered=purse.shares) as pool:
            for i, run in enumerate(population):
                if run.id in done:
                    settled(i, {**done[run.id], "reused": True})
                    continue
                if note is not None:
                    settled(i, {})
                    continue
                steps = {f.label: None if run.id in refused
                         else _branch_step(f, from_step, loci.get(run.id)) for f in fixes}
                rec, arms = _plan(run, fixes, steps, why.get(run.id))
                if not arms:
                    settled(i, rec)
                    continue
                cap, why_not = pool.admit(partial(_may_hold, purse, len(arms) * rollouts,
                                                  run.id), n_runs - i, settled)
                note = note or why_not  # a run that finished meanwhile may have tripped
                if note is not None:
                    settled(i, {})
                    continue
                holds[i] = purse.hold(cap)
                run_started(each_run)  # before: one at a time, submit runs it
                pool.submit(i, _job(run, agent, outcome, rec, arms, rollouts,
                                    run_seed(seed, run.id), cap, executor, force_agent))
            while pool.flying:
                settled(*pool.next_done())
        measured = [records[r.id] for r in population if r.id in records]  # in the runs' order
        estimates = tuple(_estimate(f, population, records, from_step, level, run_alpha, note)
                          for f in fixes)
        cost = FixCost(rollouts=sum(int(r.get("rollouts", 0)) for r in measured),
                       steps_live=sum(int(r.get("steps_live", 0)) for r in measured),
                       steps_rerun=sum(int(r.get("steps_rerun", 0)) for r in measured),
                       locate_rollouts=locate_spent,
                       tokens=sum(int(r.get("tokens", 0)) for r in measured))
        result = PopulationFix(fix_id=fid, runs_total=n_runs, candidates=estimates,
                               alpha=float(alpha), level=level, interval=INTERVAL,
                               run_test=RUN_TEST_GRADED if _graded(measured) else RUN_TEST,
                               rollouts_used=purse.spent.rollouts, cost=cost,
                               truncated=note is not None, budget_note=note, params=params)
        if store is not None and fid is not None:
            from car_core.store.fixes import finish_fix
            finish_fix(store, fid, result, params)
        return result
    except ModelUnavailable as exc:  # the population resumes, not one run's attribution
        if store is not None and fid is not None:
            exc.resume_as(resume_population_words("car.fix_population", "fix_id", fid,
                                                  "car fix"))
        raise
    finally:  # the lease that says it runs now: a resume or a listing may go on
        if store is not None and fid is not None:
            store.release_attribution(fid)


def _may_hold(purse: Purse, need: int, run_id: str, slots: int, alone: bool
              ) -> tuple[Budget, str | None]:
    """What run ``run_id`` may hold (its ``need`` rollouts whole), or why it may not start."""
    free = purse.free_rollouts()
    if free is not None and free < need:
        return Budget(rollouts=need), (f"the total rollout budget cannot pay for run "
                                       f"{run_id}'s {need} rollouts")
    return purse.cap(Budget(rollouts=need), slots, alone)


def _loci(population: Sequence[Trajectory], fixes: Sequence[Fix], from_step: int | str,
          done: dict[str, Any], given: TriageResult | str | None, store: RunStore | None,
          agent: Agent, outcome: OutcomeLike, rollouts: int, alpha: float, seed: int,
          total: Budget | None, executor: ExecutorLike, force_agent: bool, fid: str | None,
          spent: Spent, runs_at_once: int) -> tuple[dict[str, int], dict[str, str]]:
    """Each run's locus where a fix needs one, and why a run has none."""
    if from_step != "locus" or all(f.every_step for f in fixes):
        return {}, {}
    wanted = [r for r in population if r.id not in done]
    loci: dict[str, int] = {}
    why: dict[str, str] = {}
    if given is not None:
        tri = _triage_of(given, store)
        rows = {row.run_id: row for row in tri.per_run}
        for r in wanted:
            row = rows.get(r.id)
            if row is not None and row.locus is not None:
                loci[r.id] = row.locus
            else:
                why[r.id] = (f"the triage has no locus for it ({row.answer}"
                             + (f": {row.reason})" if row.reason else ")") if row is not None
                             else "the triage did not include it")
        return loci, why
    if store is not None:
        for r in wanted:
            k = _stored_locus(store, r.id)
            if k is not None:
                loci[r.id] = k
    missing = [r for r in wanted if r.id not in loci]
    if missing:
        tri = attribute_all(missing, agent, outcome=outcome, rollouts=rollouts, alpha=alpha,
                            seed=seed, budget=total, store=store,
                            triage_id=f"{fid}-loci" if store is not None else None,
                            executor=executor, force_agent=force_agent,
                            runs_at_once=runs_at_once)
        spent.add(tri.rollouts_used, tri.tokens, tri.cost)
        for row in tri.per_run:
            if row.locus is not None:
                loci[row.run_id] = row.locus
            else:
                why[row.run_id] = f"its attribution found no locus ({row.answer}" + (
                    f": {row.reason})" if row.reason else ")")
    return loci, why


def _triage_of(given: TriageResult | str, store: RunStore | None) -> TriageResult:
    if isinstance(given, TriageResult):
        return given
    if isinstance(given, str) and store is not None:
        from car_core.store.triages import load_triage
        return load_triage(store, given)
    raise InvalidInput(f"triage={given!r} is neither a triage result nor a triage id "
                       "with a store", hint="pass car.triage(...)'s result, or its id and store=")


def _stored_locus(store: RunStore, run_id: str) -> int | None:
    """The locus of the run's latest finished contrastive attribution, if it found one."""
    for a in reversed(store.attributions(run_id)):
        res = a.result
        if isinstance(res, ContrastiveResult) and res.locus is not None:
            return int(res.locus)
    return None


def _plan(run: Trajectory, fixes: Sequence[Fix], steps: dict[str, int | None],
          no_locus: str | None) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """One run's arms: every fix's, and one without a fix per step branched from; the
    record says why a fix has none."""
    rec: dict[str, Any] = {"run_id": run.id, "steps": {}, "reasons": {}, "values": {}}
    arms: dict[str, list[Any]] = {}
    for f in fixes:
        step = steps[f.label]
        if step is None:
            rec["reasons"][f.label] = no_locus or "no locus to branch from"
            continue
        if step >= len(run.steps):
            rec["reasons"][f.label] = f"the run has {len(run.steps)} steps, none at {step}"
            continue
        try:
            arms[f.label] = list(f.at(run, step).interventions)
        except (InvalidInput, InvalidIntervention) as exc:
            rec["reasons"][f.label] = f"the fix does not apply: {exc}"
            continue
        rec["steps"][f.label] = step
        arms.setdefault(f"{WITHOUT}@{step}", [do_context(step, keep_all, label=WITHOUT)])
    return rec, arms


def _job(run: Trajectory, agent: Agent, outcome: OutcomeLike, rec: dict[str, Any],
         arms: dict[str, list[Any]], k: int, seed: int, cap: Budget, executor: ExecutorLike,
         force_agent: bool) -> Callable[[], dict[str, Any]]:
    """One run's arms, ``k`` rollouts each, as a call for the pool. Returns what it measured
    (arm -> outcome per rollout, None where a branch errored) and what it cost, or the
    reason it was not tested. A fix whose own arm cannot run (a policy of the wrong kind for
    this agent) is left untested with its reason and the others are measured without it: one
    bad candidate once left every fix of the run untested."""
    def measure() -> dict[str, Any]:
        left, live, spent = dict(rec), dict(arms), {"rollouts": 0, "tokens": 0, "cost": 0.0}
        budget: Budget | None = cap
        while True:
            names = sorted(live)
            b = None
            if budget is None:
                return {**left, **spent, "steps": {}, "reasons": {
                    **left["reasons"], **{label: "not tested: the run's budget went on a fix "
                                          "that could not run" for label in left["steps"]}}}
            try:
                b = _FixArms(run, agent, outcome, step=min(left["steps"].values()), seed=seed,
                             budget=budget, executor=executor, force_agent=force_agent)
                got = b.run_arms([(a, r, live[a]) for r in range(k) for a in names])
                b.finish()
            except RUN_ERRORS as exc:
                if b is not None:
                    _add(spent, b.meter)
                bad = _fix_that_raised(exc, left["steps"])
                if bad is None and isinstance(exc, ModelUnavailable):
                    raise  # the agent's own model is down: every run would hit it, resumable
                if bad is None or len(left["steps"]) < 2 or b is None:
                    return {**left, **spent, "steps": {}, "reasons": {
                        **left["reasons"],
                        **{label: f"not tested: {refusal_reason(exc)}"
                           for label in left["steps"]}}}
                left = _without(left, bad, f"not tested: {refusal_reason(exc)}")
                live = {a: ivs for a, ivs in live.items()
                        if a in left["steps"] or a.startswith(WITHOUT)
                        and int(a.rsplit("@", 1)[1]) in left["steps"].values()}
                kept_now = _salvaged(b, live, k)
                if kept_now is not None:  # the other fixes' branches all ran: keep them
                    return _measured(left, spent, kept_now, sorted(live), k)
                budget = _less(cap, spent)
                continue
            break
        meter = b.meter
        _add(spent, meter)
        if meter.tripped:
            return {**left, **spent, "tripped": meter.tripped}
        return _measured(left, spent, got, names, k)
    return measure


def _measured(left: dict[str, Any], spent: dict[str, Any], got: Mapping[tuple[str, int], Any],
              names: list[str], k: int) -> dict[str, Any]:
    kept = [v for v in got.values() if isinstance(v, _Kept)]
    return {**left, **spent, "measured": True,
            "values": {a: [_value(got.get((a, r))) for r in range(k)] for a in names},
            "steps_live": sum(v.live for v in kept),
            "steps_rerun": sum(v.length for v in kept)}


def _salvaged(b: _FixArms, live: Mapping[str, Any], k: int
              ) -> dict[tuple[str, int], Any] | None:
    """The branches of the arms still ``live`` from a batch a bad fix's arm stopped, when each
    of their ``k`` rollouts ran (finished or failed) and their own failures pass the failed
    share; else None (they are run again). A user trial's six runs lost every other fix's
    measurements to one fix whose branches raised, its budget already spent."""
    if b.meter.tripped:
        return None
    keys = {(a, r) for a in live for r in range(k)}
    failed = [f for f in b.failures if (f.task.arm, f.task.rollout) in keys]
    if keys - set(b.finished) - {(f.task.arm, f.task.rollout) for f in failed}:
        return None
    try:
        check_failures(failed, len(keys), run_id=b.run.id, final=True, resumable=False)
    except BranchesFailed:
        return None
    return {key: v for key, v in b.finished.items() if key in keys}


def _fix_that_raised(exc: BaseException, fixes: dict[str, int]) -> str | None:
    """The fix whose arm raised ``exc`` (the task it names, or every failure a
    ``BranchesFailed`` lists), when it is one fix's and not the arm without a fix."""
    tasks = [getattr(exc, "task", None)] if getattr(exc, "task", None) is not None else \
        [getattr(f, "task", None) for f in getattr(exc, "failures", ()) or ()]
    arms = {getattr(t, "arm", None) for t in tasks}
    return next(iter(arms)) if len(arms) == 1 and next(iter(arms)) in fixes else None


def _without(rec: dict[str, Any], fix: str, reason: str) -> dict[str, Any]:
    steps = {label: k for label, k in rec["steps"].items() if label != fix}
    return {**rec, "steps": steps, "reasons": {**rec["reasons"], fix: reason}}


def _add(spent: dict[str, Any], meter: Any) -> None:
    spent["rollouts"] += meter.rollouts
    spent["tokens"] += meter.tokens
    spent["cost"] += meter.cost


def _less(cap: Budget, spent: dict[str, Any]) -> Budget | None:
    """What is left of the run's ``cap`` after ``spent`` (None: nothing)."""
    left: dict[str, Any] = {}
    for name in ("rollouts", "tokens", "cost"):
        given = getattr(cap, name)
        if given is not None:
            if given - spent[name] <= 0:
                return None
            left[name] = given - spent[name]
    return replace(cap, **left)


def _value(b: Branch | None) -> float | None:
    return None if b is None else float(b.value)


def _estimate(fix: Fix, population: Sequence[Trajectory], records: dict[str, dict[str, Any]],
              from_step: int | str, level: float, run_alpha: float, note: str | None
              ) -> FixEstimate:
    rows: list[FixRun] = []
    diffs: list[list[float]] = []
    for run in population:
        rec = records.get(run.id)
        if rec is None:
            rows.append(FixRun(run.id, reason=f"not tested: {note or 'the budget ran out'}"))
            continue
        step = rec.get("steps", {}).get(fix.label)
        if step is None:
            rows.append(FixRun(run.id, reason=rec.get("reasons", {}).get(fix.label)
                               or "not tested", reused=bool(rec.get("reused"))))
            continue
        base = rec["values"][f"{WITHOUT}@{step}"]
        mine = rec["values"][fix.label]
        pairs = [(x, y) for x, y in zip(base, mine, strict=True)
                 if x is not None and y is not None]
        if not pairs:
            rows.append(FixRun(run.id, step, reason="every branch errored",
                               reused=bool(rec.get("reused"))))
            continue
        d = [x - y for x, y in pairs]
        n = len(d)
        p0, p1 = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
        diffs.append(d)
        rows.append(FixRun(run.id, step, n, p0, p1, p0 - p1,
                           bool(positive_by_end(d, run_alpha)), reused=bool(rec.get("reused"))))
    tested = [r for r in rows if r.n]
    est, ci = pooled_mean(diffs, level) if diffs else (None, None)
    return FixEstimate(
        label=fix.label, kind=fix.kind,
        from_step="0" if fix.every_step else str(from_step),
        rescue=est, rescue_ci=ci,
        rescued=tuple(r.run_id for r in rows if r.rescued),
        not_rescued=tuple(r.run_id for r in rows if not r.rescued),
        untested=tuple(r.run_id for r in rows if not r.n), runs_tested=len(tested),
        p_fail_without=(sum(r.p_fail_without or 0.0 for r in tested) / len(tested)
                        if tested else None),
        p_fail_with=(sum(r.p_fail_with or 0.0 for r in tested) / len(tested)
                     if tested else None),
        per_run=tuple(rows))


__all__ = ["WITHOUT", "fix_population", "run_seed"]


def _graded(records: list[dict[str, Any]]) -> bool:
    """Whether any branch scored other than 0 or 1: then no run's test had the exact sign test
    at the end (``positive_by_end`` runs it on pass/fail pairs only), and the result says so."""
    return any(v not in (0.0, 1.0) for r in records for vs in (r.get("values") or {}).values()
               for v in vs if v is not None)
