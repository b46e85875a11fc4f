"""Triage: where a population of failed runs commits to failure.

Each run gets its own contrastive attribution (``car.contrastive``), ``runs_at_once`` runs at a
time (by default several for an agent that waits on a model server, one after another for an
in-process one), each with its executor's own concurrency over its branches. Every
attribution draws from its own root seed (``run_seed``: the triage's ``seed`` and the run's id;
one seed for all made a noisy judge err on the same branches of every run) under the cap it
would get one run after another (Budgets), and the result lists the runs in the order given,
so it does not depend on ``runs_at_once``. The loci are then grouped (by step, the agent and
node that decided it and the tool it called, or by the user's ``label(run, result) -> str``),
and each group's share of the runs gets a simultaneous interval.

Intervals. The ``N`` runs triaged fall into ``G`` categories: the groups, plus the undecided
runs and the runs with no cause when there are any. Each share gets a Wilson score interval at
level ``1 − α/G`` (Bonferroni over the ``G`` categories), so with probability ``>= 1 − α``
every interval covers its category's share at once. The categories are those observed; a
place no run committed at is not listed (its share's upper bound is not reported). An
undecided run may commit at any place, so a group's interval runs from the lower end for the
runs decided there to the upper end for those plus every undecided run (``share_interval``):
it covers the share of the failures that commit there, not only of those the budget decided.

Budgets. ``per_run`` caps each attribution (rollouts, tokens, cost, wall time; its rollouts
default to ``n·rollouts`` for an ``n``-step run, as ``car.contrastive``'s); ``budget`` caps the
whole triage: what it leaves (less what this call spent) caps each run's attribution too, and
once any part of it is spent the remaining runs are not attributed (``skipped``, counted as
undecided, the result ``truncated``). With several runs in flight, each holds its caps until
it finishes and the next run starts only when what is left after the others' holds pays its
own caps, else waits for one (``car_core.estimators._population``): the rollouts spent never
pass the total, and each run gets the caps it would get one run after another. Tokens and
cost with no ``per_run`` cap of their own are divided among the runs that could start; wall
time is a clock they share. A run an error stopped part-way (branches that failed) is charged
what it spent before the error, as a finished run is.

Resumable: with a ``store``, each run's attribution has an id derived from the triage id and
the run id, so the same ``triage_id`` reads back the attributions that finished (spending
nothing), resumes the interrupted ones, and resumes an undecided one only when the cap that
stopped it (rollouts, wall time, tokens or cost) is now larger, or gone. A resumed
attribution's ``rollouts_used`` also counts the branches it read back from its journal, so the
total is charged for them: a resume spends no more than its budget, maybe less. So the
result's ``rollouts_used`` (the rows' sum) is what the attributions of this call used, read-back
branches included; ``rollouts_now`` counts the branches this call ran (failed ones included),
and ``rollouts_in_all`` adds those earlier passes ran (the branches their attributions keep in
the store; a failed branch is kept nowhere, so an earlier pass's are not counted).
Runs in flight write to the store through connections of their own (a ``RunStore`` per run
on the same file; a SQLite connection belongs to the thread that opened it).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from car_core import defaults
from car_core.engine.agent import Agent, check_agent
from car_core.engine.execution import ExecutorLike
from car_core.engine.progress import run_started
from car_core.errors import (
    AgentError,
    AgentMismatch,
    AttributionBusy,
    AttributionNotFound,
    BranchesFailed,
    CarError,
    InvalidInput,
    ModelUnavailable,
    NothingToAttribute,
    OutcomeError,
    OutcomeMismatch,
    RunError,
    RunNotFailed,
    resumable,
    resume_population_words,
)
from car_core.estimators._population import (
    Purse,
    RunPool,
    Spent,
    per_run_progress,
    run_seed,
    runs_at_once_for,
)
from car_core.estimators._session import check_run_has_steps, spent_before
from car_core.estimators.contrastive import rollout_budget
from car_core.estimators.settings import ContrastiveSettings
from car_core.model.budget import Budget, as_budget, check_countable, tripped_limit
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import Trajectory, is_failure
from car_core.model.vocabulary import Answer, AttributionStatus
from car_core.results import ContrastiveResult
from car_core.secrets import redact
from car_core.stats import Interval, wilson
from car_core.store import as_store
from car_core.triage_results import (
    NOT_ATTRIBUTED,
    NOT_FAILED,
    SKIPPED,
    TriageGroup,
    TriageResult,
    TriageRun,
)

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import RunStore, StoreLike

Label = Callable[[Trajectory, ContrastiveResult], str]
TriageProgress = Callable[[int, int, TriageRun], None]


def progress_line(done: int, total: int, row: TriageRun) -> str:
    """What ``progress=True`` (and ``car triage`` on a terminal) prints after each run."""
    what = f"locus {row.locus}" if row.locus is not None else row.answer
    spent = "" if row.reused or not row.rollouts_used else f", {row.rollouts_used} rollouts"
    return (f"[{done}/{total}] run {row.run_id}: {what}{spent}"
            + (" (read back)" if row.reused else ""))


def untimed(row: TriageRun) -> bool:
    """Whether a run's line took no time to reach: read back, or never attributed (refused,
    not failed): the pace leaves it out (``Paced``)."""
    return row.reused or not row.rollouts_used


FIELDS = ("step", "agent", "node", "tool")
INTERVAL = ("Wilson score at level 1 − alpha/G (Bonferroni over the G categories); runs "
            "without a verdict counted out of the lower end and into the upper")
# a run's own trouble (another agent recorded it, its agent broke): that run is reported
# undecided with the error as its reason, or, where it did not fail (``RunNotFailed``), apart
# from the population; anything else stops the triage
RUN_ERRORS = (OutcomeError, AgentMismatch, RunError, AgentError, NothingToAttribute,
              AttributionBusy)


def tool_of(action: Any) -> str | None:
    """The tool an action called: the first chat tool call's name, a ``{"name", "arguments"}``
    call's, or a ``{"tool": ...}`` action's; None for a reply or anything else."""
    if not isinstance(action, Mapping):
        return None
    calls = action.get("tool_calls")
    if isinstance(calls, Sequence) and not isinstance(calls, str) and calls:
        first = calls[0] if isinstance(calls[0], Mapping) else {}
        fn = first.get("function")
        name = (fn if isinstance(fn, Mapping) else first).get("name")
        return str(name) if name is not None else None
    if action.get("name") is not None and any(k in action for k in ("arguments", "args",
                                                                    "input")):
        return str(action["name"])
    tool = action.get("tool")
    return str(tool) if isinstance(tool, str) else None


def locus_fields(run: Trajectory, step: int) -> dict[str, Any]:
    """Where a run committed: the step, the agent and node that decided it, the tool called."""
    s = run.steps[step]
    agent, node = s.meta.get("agent"), s.meta.get("node")
    return {"step": step, "agent": str(agent) if agent else None,
            "node": str(node) if node else None, "tool": tool_of(s.action)}


def _default_label(values: Mapping[str, Any], by: Sequence[str]) -> str:
    """The group's label from its fields; a node named as its agent is said once (an app
    built with ``create_agent`` read "agent model, node model, tool issue_refund")."""
    words = {"step": "step {}", "agent": "agent {}", "node": "node {}", "tool": "tool {}"}
    said = [f for f in by if values.get(f) is not None]
    if {"agent", "node"} <= set(said) and values["node"] == values["agent"]:
        said.remove("node")
    return ", ".join(words[f].format(values[f]) for f in said) or "(nothing recorded)"


def _check(by: Sequence[str], label: Label | None, alpha: float) -> tuple[str, ...]:
    if label is not None and not callable(label):
        raise InvalidInput(f"label={label!r} is not callable",
                           hint="pass a function (run, result) -> str, or None")
    if label is not None:
        # it is called once every run is attributed: a trial's two-argument mistake came up
        # after the whole budget was spent, as an internal error
        try:
            signature = inspect.signature(label)
        except (TypeError, ValueError):  # a builtin: it is called and its error said then
            signature = None
        try:
            if signature is not None:
                signature.bind(None, None)
        except TypeError:
            raise InvalidInput(f"label {getattr(label, '__name__', label)!r} does not take "
                               f"(run, result): its signature is {signature}",
                               hint="pass a function label(run, result) -> str") from None
    chosen = tuple(by)
    unknown = [f for f in chosen if f not in FIELDS]
    if unknown or not chosen:
        raise InvalidInput(f"by={chosen!r}: group by some of {FIELDS}",
                           hint='e.g. by=("agent",) or by=("step", "tool")')
    if not 0 < alpha < 1:
        raise InvalidInput(f"alpha={alpha!r} is outside (0, 1)", hint="use e.g. alpha=0.05")
    return chosen


def _load_all(runs: Iterable[Trajectory | str], store: RunStore | None) -> list[Trajectory]:
    loaded: list[Trajectory] = []
    for r in runs:
        if isinstance(r, Trajectory):
            loaded.append(r)
        elif isinstance(r, str) and store is not None:
            loaded.append(store.load(r))
        else:
            raise InvalidInput(f"{r!r} is neither a car.Trajectory nor a run id with a store",
                               hint="pass runs, or run ids with store=")
    ids = [r.id for r in loaded]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise InvalidInput(f"run {twice} is in the population twice",
                           hint="pass each run once")
    if not loaded:
        raise NothingToAttribute("the population is empty: no run to triage",
                                 hint="record failing runs first, or loosen the filters")
    return loaded


PER_RUN = "per run"  # the triage params' "seeds": each run from run_seed(seed, run id)


def triage(runs: Iterable[Trajectory | str], agent: Agent, *, outcome: OutcomeLike,
           rollouts: int = defaults.ROLLOUTS, alpha: float = defaults.ALPHA, seed: int = 0,
           search: str = "auto", budget: Budget | None = None,
           per_run: Budget | int | None = None, label: Label | None = None,
           by: Sequence[str] = FIELDS, store: StoreLike | None = None,
           triage_id: str | None = None, executor: ExecutorLike = None,
           progress: TriageProgress | bool | None = None, force_agent: bool = False,
           early_stop: bool = True, runs_at_once: int | None = None) -> TriageResult:
    """Attribute every run of ``runs`` (trajectories, or run ids in ``store``) with
    ``car.contrastive`` under ``per_run`` and the total ``budget``, then group the loci by
    ``by`` (or ``label``) with simultaneous intervals (module docstring). ``alpha`` is each
    attribution's family-wise error rate and the intervals' joint one. With ``store``, the
    attributions and the triage itself are stored, resumable with the same ``triage_id``.
    ``runs_at_once``: runs attributed at once (None: chosen for the agent; the agent's
    ``branch`` is then called from several threads). ``progress(done, total, row)`` is called
    after each run, on the caller's thread (``True``: a line per run on stderr).
    ``early_stop`` (the default here, unlike ``car.contrastive``'s): each attribution stops
    once its locus is decided, as a triage needs where each run commits, not how much its
    rescue is. A model server that is down
    (``ModelUnavailable``) stops the triage, as it stops an attribution: every run after it
    would hit it too, and the runs attributed so far are kept for the same ``triage_id``."""
    chosen_by = _check(by, label, alpha)
    store = as_store(store)
    at_once = runs_at_once_for(runs_at_once, agent)
    each_run = per_run_progress(progress, progress_line, at_once, untimed)
    settings = ContrastiveSettings(rollouts=rollouts, alpha=alpha, seed=seed, search=search,
                                   early_stop=early_stop)
    total = budget if budget is None else as_budget(budget, "budget")
    each = as_budget(per_run, "per_run")
    population = _load_all(runs, store)
    for run in population:  # a money cap no price counts: refused before anything is stored
        check_countable(total, run)
        check_countable(each, run)
    tid = triage_id or (uuid.uuid4().hex[:16] if store is not None else None)
    params: dict[str, Any] = {
        "rollouts": rollouts, "alpha": alpha, "seed": seed, "search": search,
        "early_stop": early_stop,
        "budget": total.to_dict() if total else None, "per_run": each.to_dict() if each else None,
        "by": list(chosen_by), "agent": agent.name,
        "label": getattr(label, "__qualname__", repr(label)) if label else None,
        "runs": [r.id for r in population], "seeds": PER_RUN}
    per_run_seeds = True
    if store is not None and tid is not None:
        from car_core.store.triages import begin_triage
        # a triage begun before runs had seeds of their own resumes on its root seed, so its
        # interrupted attributions keep theirs (a resume on another seed is refused)
        per_run_seeds = begin_triage(store, tid, params).get("seeds") == PER_RUN
        if not per_run_seeds:
            params["seeds"] = "root"
    try:
        # every run's shape refused (or the whole triage stopped) before any run's first branch
        refused = {i: _refusal(population[i], exc, None)
                   for i, exc in refused_up_front(population, agent, force_agent).items()}
        purse = Purse(total)
        aids = [a for a in (_attribution_id(store, tid, r) for r in population) if a]
        kept_before = _branches_kept(store, aids)
        rows: list[TriageRun | None] = [None] * len(population)
        results: dict[int, ContrastiveResult] = {}
        holds: dict[int, Spent] = {}
        ran: set[int] = set()  # the runs attributed now (not read back, not skipped)
        note: str | None = None
        done = 0

        def settled(i: int, got: tuple[TriageRun, ContrastiveResult | None]) -> None:
            nonlocal done
            row, one = got
            if i in holds:
                purse.settle(holds.pop(i), row.rollouts_used, row.tokens, row.cost)
            if one is not None and one.locus is not None:
                results[i] = one
            rows[i] = row
            done += 1
            if each_run is not None:
                each_run(done, len(population), row)

        with RunPool[tuple[TriageRun, ContrastiveResult | None]](
                at_once, ordered=purse.shares) as pool:
            for i, run in enumerate(population):
                if i in refused:
                    settled(i, (refused[i], None))
                    continue
                # this run's own cap (n·K rollouts unless per_run says otherwise), within what
                # the total leaves
                own = cap = rollout_budget(len(run.steps), rollouts, each)[0]
                if note is None:
                    cap, note = pool.admit(partial(purse.cap, own), len(population) - i, settled)
                if note is not None:
                    settled(i, (TriageRun(run.id, SKIPPED, reason=f"{NOT_ATTRIBUTED}{note}"), None))
                    continue
                mine = replace(settings, budget=cap,
                               seed=run_seed(seed, run.id) if per_run_seeds else seed)
                aid = _attribution_id(store, tid, run)
                stored = _finished(store, aid, mine, len(run.steps)) if aid else None
                if stored is not None:
                    settled(i, (_row(run.id, stored, aid, reused=True), stored))
                    continue
                holds[i] = purse.hold(cap)
                ran.add(i)
                run_started(each_run)  # before: one at a time, submit runs it
                pool.submit(i, _job(run, agent, outcome, mine, store, aid, executor, force_agent,
                                    own_store=pool.threaded))
            while pool.flying:
                settled(*pool.next_done())
        # everything in the order of the runs given, whichever finished first
        finished = [r for r in rows if r is not None]
        assert len(finished) == len(population)
        located = {population[i].id: (population[i], results[i]) for i in sorted(results)}
        spent = Spent()
        for i in sorted(ran):
            spent.add(finished[i].rollouts_used, finished[i].tokens, finished[i].cost)
        # what this call ran, and every pass's: a resumed run's rollouts_used counts the
        # branches it read back from its journal (they were paid for by an earlier pass), so
        # the sum of the rows is neither; the branches the store keeps tell both
        kept = _branches_kept(store, aids)
        now = sum(_ran_now(finished[i], kept, kept_before) for i in sorted(ran)) \
            if store is not None else spent.rollouts
        result = replace(
            _summarised(located, finished, chosen_by, label, alpha, tid, spent, note, params),
            rollouts_now=now,
            rollouts_in_all=sum(kept_before.values()) + now if store is not None else now)
        if store is not None and tid is not None:
            from car_core.store.triages import finish_triage
            finish_triage(store, tid, result, params)
        return result
    except ModelUnavailable as exc:  # the triage resumes, not the run's own attribution
        if store is not None and tid is not None:
            exc.resume_as(resume_population_words("car.triage", "triage_id", tid,
                                                  "car triage"))
        raise
    finally:  # the lease that says it runs now: a resume or a listing may go on
        if store is not None and tid is not None:
            store.release_attribution(tid)


def group_results(results: Iterable[tuple[Trajectory, ContrastiveResult]], *,
                  alpha: float = defaults.ALPHA, by: Sequence[str] = FIELDS,
                  label: Label | None = None,
                  unattributed: Mapping[str, str] | None = None,
                  not_failed: Mapping[str, str] | None = None) -> TriageResult:
    """Group attributions that already finished (each run with its ``car.contrastive``
    result) exactly as ``car.triage`` groups its own, with the same simultaneous intervals,
    spending nothing: for populations attributed elsewhere, such as the failing tests of a
    pytest session. ``unattributed`` maps the id of a run that got no attribution to why; it
    counts as undecided; ``not_failed`` maps the id of one that did not fail (a test that failed
    on something else) to why, listed apart and out of every count. ``rollouts_used``,
    ``tokens`` and ``cost`` add up the results'."""
    chosen_by = _check(by, label, alpha)
    rows: list[TriageRun] = []
    located: dict[str, tuple[Trajectory, ContrastiveResult]] = {}
    spent = Spent()
    for run, res in results:
        if not isinstance(res, ContrastiveResult):
            raise InvalidInput(f"run {run.id}: a {type(res).__name__} has no locus to group",
                               run_id=run.id, hint="group contrastive attributions only")
        if run.id in located or any(r.run_id == run.id for r in rows):
            raise InvalidInput(f"run {run.id} is in the population twice",
                               hint="pass each run once")
        rows.append(_row(run.id, res, res.attribution_id, reused=False))
        spent.rollouts += res.rollouts_used
        spent.tokens += res.tokens
        spent.cost += res.cost
        if res.locus is not None:
            located[run.id] = (run, res)
    for run_id, why in (unattributed or {}).items():
        rows.append(TriageRun(run_id, str(Answer.UNDECIDED), reason=f"{NOT_ATTRIBUTED}{why}"))
    for run_id, why in (not_failed or {}).items():
        rows.append(TriageRun(run_id, NOT_FAILED, reason=why))
    if not rows:
        raise NothingToAttribute("the population is empty: no result to group",
                                 hint="pass (run, result) pairs of finished attributions")
    return _summarised(located, rows, chosen_by, label, alpha, None, spent, None,
                       {"alpha": alpha, "by": list(chosen_by), "runs": [r.run_id for r in rows]})


def share_interval(k: int, undecided: int, n: int, level: float) -> Interval:
    """The interval of a group's share of the failures: ``k`` of ``n`` runs commit there, and
    each of the ``undecided`` runs may or may not. Its lower end is Wilson's for ``k``, its
    upper end Wilson's for ``k + undecided``: whatever the undecided runs' true places, the
    count that would have been seen lies between, and both ends move with the count, so the
    interval covers at least as often as Wilson's on the full count. An interval on ``k``
    alone is about "decided into this group under this budget": a trial's triage read "2 of
    28 commit at step 1 (7%, 1%–28%)" with 24 undecided, where the true share was 54%."""
    return Interval(wilson(k / n, n, level)[0], wilson((k + undecided) / n, n, level)[1],
                    level)


def _summarised(located: Mapping[str, tuple[Trajectory, ContrastiveResult]],
                rows: list[TriageRun], by: tuple[str, ...], label: Label | None, alpha: float,
                tid: str | None, spent: Spent, note: str | None, params: dict[str, Any]
                ) -> TriageResult:
    """The result from every run's row: the groups with their simultaneous intervals, the
    undecided and no-cause runs, what was spent."""
    groups, rows = _grouped(located, rows, by, label)
    undecided = tuple(r.run_id for r in rows if r.answer in (Answer.UNDECIDED, SKIPPED))
    no_cause = tuple(r.run_id for r in rows if r.answer == Answer.NO_CAUSE)
    not_failed = tuple(r.run_id for r in rows if r.answer == NOT_FAILED)
    g = max(1, len(groups) + bool(undecided) + bool(no_cause))
    level = 1 - alpha / g
    n = len(rows) - len(not_failed)  # the failed runs: groups come only from them
    return TriageResult(
        triage_id=tid, runs_total=n,
        groups=tuple(TriageGroup(label=lab, **fields, share=len(ids) / n,
                                 share_ci=share_interval(len(ids), len(undecided), n, level),
                                 runs=tuple(ids)) for lab, fields, ids in groups),
        undecided=undecided, no_cause=no_cause, per_run=tuple(rows), alpha=float(alpha),
        level=level, interval=INTERVAL, by=by, rollouts_used=spent.rollouts,
        tokens=spent.tokens, cost=round(spent.cost, 6), truncated=note is not None,
        budget_note=note, params=params, not_failed=not_failed)


def _grouped(located: Mapping[str, tuple[Trajectory, ContrastiveResult]],
             rows: list[TriageRun], by: Sequence[str], label: Label | None
             ) -> tuple[list[tuple[str, dict[str, Any], list[str]]], list[TriageRun]]:
    """The groups (label, the fields every run of it agrees on, run ids), most runs first,
    and the per-run rows with their group's label."""
    members: dict[str, list[str]] = {}
    values: dict[str, list[dict[str, Any]]] = {}
    for run_id, (run, res) in located.items():
        assert res.locus is not None
        fields = locus_fields(run, res.locus)
        if label is not None:
            try:
                name = label(run, res)
            except Exception as exc:  # the user's code: say whose, and that nothing is lost
                raise InvalidInput(
                    f"the label function raised {exc!r} on run {run_id}", run_id=run_id,
                    hint="fix it, then run the same triage again (the same triage_id; on the "
                         "command line `car triage ... --resume ID`): every attribution is "
                         "stored and read back, nothing re-runs"
                ) from redact.redacted(exc)
            if not isinstance(name, str):
                raise InvalidInput(f"label returned {name!r} for run {run_id}, not a str",
                                   run_id=run_id, hint="return a short text naming the group")
        else:
            name = _default_label(fields, by)
        members.setdefault(name, []).append(run_id)
        values.setdefault(name, []).append(fields)
    groups = []
    for name, ids in sorted(members.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        seen = values[name]
        agreed = {f: seen[0][f] if all(v[f] == seen[0][f] for v in seen) else None
                  for f in FIELDS}
        groups.append((name, agreed, ids))
    label_of = {i: name for name, _, ids in groups for i in ids}
    return groups, [replace(r, group=label_of.get(r.run_id)) for r in rows]


def _branches_kept(store: RunStore | None, aids: Sequence[str]) -> dict[str, int]:
    """The branches the store keeps of each attribution (every pass's, each once)."""
    if store is None or not aids:
        return {}
    marks = ",".join("?" * len(aids))
    return {str(a): int(n) for a, n in store.db.execute(
        f"SELECT attribution_id, count(*) FROM runs WHERE parent_id IS NOT NULL "
        f"AND attribution_id IN ({marks}) GROUP BY attribution_id", list(aids)).fetchall()}


def _ran_now(row: TriageRun, kept: Mapping[str, int], before: Mapping[str, int]) -> int:
    """The branches a run's attribution ran in this call: those it added to the store, or,
    where more, what it used less every branch kept before (a failed branch is charged as a
    rollout and kept nowhere). Exact unless branches failed on a resume that also left some
    read-back ones unused; then a lower bound."""
    aid = row.attribution_id
    if aid is None:
        return row.rollouts_used
    was = before.get(aid, 0)
    return max(kept.get(aid, 0) - was, row.rollouts_used - was)


def _attribution_id(store: RunStore | None, tid: str | None, run: Trajectory) -> str | None:
    if store is None or tid is None:
        return None
    from car_core.store.triages import triage_attribution_id
    return triage_attribution_id(tid, run.id)


def _job(run: Trajectory, agent: Agent, outcome: OutcomeLike, settings: ContrastiveSettings,
         store: RunStore | None, aid: str | None, executor: ExecutorLike, force_agent: bool,
         own_store: bool) -> Callable[[], tuple[TriageRun, ContrastiveResult | None]]:
    """One run's attribution, run or resumed, as a call for the pool; ``own_store``: on a
    worker thread, through a connection of its own to the same file."""
    def attribute() -> tuple[TriageRun, ContrastiveResult | None]:
        if store is not None and own_store:
            from car_core.store.runs import RunStore
            with RunStore(store.path) as mine:
                return _attributed(run, agent, outcome, settings, mine, aid, executor,
                                   force_agent)
        return _attributed(run, agent, outcome, settings, store, aid, executor, force_agent)
    return attribute


def refused_up_front(population: Sequence[Trajectory], agent: Agent, force_agent: bool
                     ) -> dict[int, CarError]:
    """The runs the agent refuses up front (``check_agent``: another agent recorded it, a
    shape its ``preflight`` cannot branch), each with its error; checked for every run before
    any run's first branch, so a refusal that stops the whole population (any error but a
    run's own trouble, ``RUN_ERRORS``) costs no branch and leaves no attribution of another
    run interrupted. Writes nothing and calls no model."""
    refused: dict[int, CarError] = {}
    for i, run in enumerate(population):
        try:
            check_run_has_steps(run)
            check_agent(run, agent, force=force_agent)
        except RUN_ERRORS as exc:
            if exc.context.get("every_run"):  # where CAR was called, not this run: stop
                raise
            refused[i] = exc
    return refused


def _refusal(run: Trajectory, exc: CarError, stored: str | None) -> TriageRun:
    """The row of a run not attributed because of its own trouble (``RUN_ERRORS``), charged
    what its attribution spent before the error (branches that failed part-way: a user
    trial's triage charged them nothing and stored 55 branches under a total of 30)."""
    if isinstance(exc, RunNotFailed):  # not part of the population: apart, not undecided
        return TriageRun(run.id, NOT_FAILED, reason=str(exc), attribution_id=stored)
    rollouts, tokens, cost = spent_before(exc)
    return TriageRun(run.id, str(Answer.UNDECIDED),
                     reason=f"{NOT_ATTRIBUTED}{refusal_reason(exc)}",
                     attribution_id=stored, rollouts_used=rollouts, tokens=tokens, cost=cost,
                     resumable=stored is not None and resumable(exc))


def refusal_reason(exc: CarError) -> str:
    """A refused run's reason as its row says it (a population fix's rows too). A stored
    failure the outcome scores as fine is said in two lines' worth, the likelier cause in a
    population first: the error's hint (a thousand characters on making an outcome see a
    failure) led a trial's triage page with advice its outcome did not need, for three runs
    its noisy judge had mislabelled."""
    if isinstance(exc, BranchesFailed) and exc.first is not None:
        return _failed_words(exc)
    scores, stored = exc.context.get("scores"), exc.context.get("stored")
    if not isinstance(exc, OutcomeMismatch) or not scores or stored is None \
            or not is_failure(stored):
        return str(exc)
    shown = ", ".join(f"{v:.2f}" for v in scores)
    return (f"the outcome scores the recorded run as fine ({shown}) but it is stored as failed "
            f"({stored:.2f}): a judge with randomness of its own may have mislabelled it when it "
            "was recorded (a mislabel does not come back: nothing to attribute in this run), or "
            "the outcome cannot see the failure (then it refuses every run so: "
            f"`car attribute {exc.run_id}` says how to make it see one)")


def _failed_words(exc: BranchesFailed) -> str:
    """Branches that failed, in a row: the cause first, then which branch and what to do. A
    summary clips the first reason, and the cause came last, after the share rule and the
    branch's name: a trial's summary read "... (first: the…)"."""
    first = exc.first
    cause = (first.exception.message if isinstance(first.exception, CarError)
             else first.error)
    cause = " ".join(str(cause).removeprefix("the branch ended with status error: ").split())
    which = ("one re-running the record with every step held (the replay itself breaks)"
             if first.held_arm else f"the first {first.task.plan.words()}")
    return (f"branches failed, {which}, because {cause} ({len(exc.failures)} of {exc.ran} "
            "failed)" + (f". {exc.hint}" if exc.hint else ""))


def _attributed(run: Trajectory, agent: Agent, outcome: OutcomeLike,
                settings: ContrastiveSettings, store: RunStore | None, aid: str | None,
                executor: ExecutorLike, force_agent: bool
                ) -> tuple[TriageRun, ContrastiveResult | None]:
    try:
        result = settings.run(run, agent, outcome, executor=executor, progress=False,
                              store=store, attribution_id=aid, force_agent=force_agent)
    except RUN_ERRORS as exc:  # the id only where a row was stored (a refusal stores none)
        if isinstance(exc, ModelUnavailable):  # every later run would hit it: stop, resumable
            raise
        stored = aid if aid is not None and store is not None \
            and store.attribution_exists(aid) else None
        return _refusal(run, exc, stored), None
    return _row(run.id, result, aid, reused=False), result


def _finished(store: RunStore | None, aid: str, settings: ContrastiveSettings, n_steps: int
              ) -> ContrastiveResult | None:
    """The run's attribution read back from the store when it finished: a truncated one
    only while the cap that stopped it (``budget_note``: rollouts, wall time, tokens or cost)
    is not larger now. A user trial's runs the triage's clock cut short were read back, still
    undecided, by a resume with a larger ``--max-seconds``."""
    if store is None:
        return None
    try:
        a = store.attribution(aid)
    except AttributionNotFound:
        return None
    res = a.result
    if not isinstance(res, ContrastiveResult) or a.status == AttributionStatus.RUNNING:
        return None
    if a.status == AttributionStatus.COMPLETE:
        return res
    limit = tripped_limit(res.budget_note)
    if limit == "rollouts":
        cap = rollout_budget(n_steps, settings.rollouts, settings.budget)[1]
        return res if cap <= (res.rollout_budget or res.rollouts_used) else None
    now = getattr(as_budget(settings.budget), limit, None)  # None: no cap now
    then = (a.params.get("budget") or {}).get(limit)
    return res if now is not None and then is not None and now <= then else None


def _row(run_id: str, r: ContrastiveResult, aid: str | None, reused: bool) -> TriageRun:
    reason = None
    if r.answer == Answer.UNDECIDED:
        reason = r.undecided_why()
    elif r.answer == Answer.NO_CAUSE:
        reason = r.reason
    return TriageRun(run_id, str(r.answer), locus=r.locus, reason=reason, attribution_id=aid,
                     rollouts_used=r.rollouts_used, tokens=r.tokens, cost=r.cost, reused=reused)


__all__ = ["FIELDS", "INTERVAL", "group_results", "locus_fields", "tool_of", "triage"]
