"""The point of commitment: the latest step whose resampling rescues the run.

Arms. ``H_j`` holds steps ``< j`` as recorded and runs steps ``>= j`` live (``do_resample(j)``;
``H_n`` holds every step and only re-draws the outcome). The rescue of step ``k`` is
``mean(H_{k+1}) − mean(H_k)``: the factual arm of step ``k`` is ``H_{k+1}``, estimated from
rollouts rather than taken from the one observed outcome, and neighbouring steps share arms.
Rollout ``r`` of every arm draws noise ``(seed, r)`` when CAR can hand the agent shared noise
(``coupled=True`` and an agent that draws from CAR's streams); whether the arms then really
share it is measured from the rollouts (``stats.coupling_of``: agreement of index-paired arms
beyond what independent arms with the same rates give), never taken from that flag: a hosted
model that ignores its seed or a judge with its own randomness share less. The result reports
the measurement (``coupling_measured``, ``coupling_ci``, ``coupling_pairs``), and ``coupled``
says whether it showed sharing; paired statistics are used only where it did.

Budget. ``rollouts=K`` keeps the paper's meaning: the estimate may spend up to ``n·K``
rollouts (``budget=`` overrides it); where they go is the search's choice.

Search ``"bisection"`` (the default): the locus is the latest rise of ``H``, found by a search
over the ``H`` curve (a bisection placed by a few shared rollouts where noise is measured
shared, a probabilistic bisection over the arms' outcomes where it is not), then confirmed on
fresh rollouts by an anytime-valid betting test that may look after every batch and stops as
soon as the rescue is shown, and, for pass/fail outcomes whose budget runs out first, by an
exact sign test that spends the rest of the level. A candidate that does not confirm is given
up on a futility bound and the search resumes while the budget lasts (``given_up``), the
confirmations sharing α between them. Once the locus is decided the rescue is re-estimated
with fresh pairs, as many as make its interval as tight as the paper's fixed-``K`` one (unless
``early_stop``), pooled with the test's own pairs less the one that made it stop, since the
mean of a sequence stopped at its first crossing is biased up by that pair (``effect``,
inside ``ci`` by construction; ``effect_raw`` keeps the stopped mean, ``estimate`` says
which, ``refit_pooled`` how many of the test's pairs the re-estimate holds). ``search.py``
has the details and the proof that FWER ``<= α``: each confirmation tests its step on
rollouts independent of everything that chose it.

Rounds (``wave``). Each look of the search waits for the rollouts it asked for, so with an
agent that waits on a model server the wall time is the number of looks times a branch's
latency, whatever the executor. ``wave=W`` makes every look ask for about ``W`` rollouts at
once (navigation looks at ``W/2`` pairs, the confirmation after ``W/2`` pairs at least, the
first bisection probes drawn together), so a concurrent executor fills its slots; it spends
a few more rollouts (the part of a round drawn past where the search could have stopped).
The default is ``defaults.CONCURRENCY`` for an agent that says it waits on a server
(``prefers_concurrency``) and 0 (the smallest looks) for any other: it is chosen from the
agent, never from the executor, so a seed gives the same result on every executor.

Search ``"full"`` tests every step: each of the ``m`` tested steps gets ``α/m`` (Bonferroni),
split over its ``L`` looks at the data in shares proportional to the square of the information
fraction (``stats.look_levels``); every interval is built at its look's level, so with
probability ``>= 1 − α`` all of them cover at once, hence FWER ``<= α``. A test looks at its
pairs at ``K'/4``, ``K'/2`` and ``K'`` (``K' = n·K/(n+1)`` rollouts per arm), stops once its
interval excludes zero, and stops for futility at an interim look of at least four pairs when
its estimate is ``<= 0``. Use it when later steps may rescue the run by less than the latest
rise: bisection assumes one commitment point (or the latest one dominating).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from car_core import defaults
from car_core import formatting as fmt
from car_core.engine.agent import Agent, caveats_of
from car_core.engine.execution import ExecutorLike, Progress
from car_core.errors import InvalidInput, NothingToAttribute
from car_core.estimators import search as search_
from car_core.estimators._session import Session, check_run_has_steps, releasing
from car_core.estimators.alternatives import (
    ActionKey,
    check_action_key,
    key_name,
    with_alternatives,
)
from car_core.estimators.bounds import check_contrastive_size, contrastive_planned
from car_core.estimators.hold_arms import Arms, Comparison, EngineArms
from car_core.estimators.later import INDIFFERENCE
from car_core.model.budget import Budget, as_budget
from car_core.model.capabilities import Capability, capabilities
from car_core.model.checks import is_real, is_whole
from car_core.model.context_sources import decisions_before
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import BEGAN_FROM, Trajectory, step_label
from car_core.model.vocabulary import Answer
from car_core.results import ArmEstimate, ContrastiveResult, StepEffect
from car_core.stats import (
    Coupling,
    Interval,
    coupling_of,
    look_levels,
    looks,
    wilson,
)

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import StoreLike

SEARCHES = ("auto", "full", "bisection")
# how the search's confirmations decided (``fmt.method`` words them): the exact sign test at the
# end runs only on pairs in {-1, 0, 1}, so graded scores are decided by the anytime test alone
BETTING_EXACT = ("betting test of each searched step (alpha spent over confirmations), "
                 "exact sign test at the end")
BETTING_ANYTIME = ("betting test of each searched step (alpha spent over confirmations), "
                   "anytime test only (graded scores: no exact sign test at the end)")
MIN_FUTILITY_PAIRS = 4  # fewer pairs than this say too little to give up on a step


def rollout_budget(n_steps: int, rollouts: int, budget: Budget | int | None
                   ) -> tuple[Budget, int]:
    """The budget an estimate of an ``n_steps`` run spends under, and its rollout cap: the
    rollouts ``budget`` allows, else ``n_steps · rollouts`` (the paper's ``K`` per step). The
    one rule: ``ContrastiveSettings.budget_for`` and the ``car`` command read it here. A run
    with no steps has no ``n·K`` (a zero budget nobody gave): it has nothing to attribute."""
    given = as_budget(budget, "budget")
    if given is not None and given.rollouts is not None:
        return given, given.rollouts
    if n_steps < 1:
        raise NothingToAttribute("the run has no steps, so no step can be blamed",
                                 hint="record a run in which the agent took at least one step")
    cap = n_steps * rollouts
    return (Budget(rollouts=cap) if given is None else replace(given, rollouts=cap)), cap


def waits_on_server(agent: Agent) -> bool:
    """Whether the agent's branches wait on a model server: it says so
    (``prefers_concurrency``), or it branches as a coroutine without saying it does not (the
    agents ``execution.default_executor`` runs concurrently)."""
    caps = capabilities(agent)
    return Capability.CONCURRENCY in caps or (
        Capability.ASYNC_BRANCH in caps and getattr(agent, "prefers_concurrency", None)
        is not False)


def search_wave(wave: int | None, agent: Agent) -> int:
    """The rollouts each look of the search asks for at once (docs/contrastive-search.md, rounds):
    ``wave`` when given, else ``defaults.CONCURRENCY`` for an agent that waits on a server and
    0 (the smallest looks) for any other. Never the executor's: results for a seed do not
    depend on it."""
    if wave is not None:
        return wave
    return defaults.CONCURRENCY if waits_on_server(agent) else 0


def _check_indifference(delta: Any) -> None:
    if not is_real(delta) or not 0 < delta < 1:
        raise InvalidInput(f"indifference={delta!r}",
                           hint="the least rescue a later step must show to move the point of "
                                "commitment: a number between 0 and 1, such as 0.1")


def _check_wave(wave: Any) -> None:
    if wave is not None and (not is_whole(wave, 0)):
        raise InvalidInput(f"wave={wave!r}: need a whole number of rollouts >= 0, or None",
                           hint="leave wave=None (chosen from the agent), or pass e.g. wave=16 "
                                "(0 keeps the smallest looks)")


def _check(rollouts: Any, alpha: Any, search: Any) -> None:
    if not is_whole(rollouts, 1):
        raise InvalidInput(f"rollouts={rollouts!r}: need at least one rollout per arm",
                           hint="pass rollouts=K with K >= 1 (32–64 is typical)")
    if not is_real(alpha) or not 0 < alpha < 1:
        raise InvalidInput(f"alpha={alpha!r} is outside (0, 1)", hint="use e.g. alpha=0.05")
    if search not in SEARCHES:
        raise InvalidInput(f"search={search!r} is not one of {SEARCHES}",
                           hint='use "auto", "full" or "bisection"')


def _futile(c: Comparison, size: int, cap: int) -> bool:
    """Stop an interim look whose estimate is not even on the positive side."""
    return size < cap and size >= MIN_FUTILITY_PAIRS and c.diff.estimate <= 0


def _full(arms: Arms, n: int, cap: int, alpha: float
          ) -> tuple[dict[int, Comparison], int, float, Coupling]:
    sizes = looks(cap)
    levels = look_levels(sizes, alpha, n)
    tests: dict[int, Comparison] = {}
    open_steps = list(range(n))
    measured = Coupling(None, None, 0)
    for i, (s, level) in enumerate(zip(sizes, levels, strict=False)):
        if not open_steps or arms.session.tripped:
            break
        arms.fill({j: range(s) for k in open_steps for j in (k, k + 1)})
        if i == 0:
            measured = _first_look_coupling(arms, n)
        still_open = []
        for k in open_steps:
            c = arms.compare(k + 1, k, range(s), level, paired=measured.shared)
            if c is None:
                continue
            tests[k] = c
            if not (c.diff.excludes_zero or _futile(c, s, cap)):
                still_open.append(k)
        open_steps = still_open
    return tests, n, levels[-1], measured


def _searched(arms: Arms, n: int, cap: int, alpha: float, k: int, refit: bool, wave: int = 0,
              delta: float = INDIFFERENCE) -> tuple[dict[int, StepEffect], search_.Decision]:
    d = search_.search(EngineArms(arms, cap), n, cap, alpha, refit=refit, k=k, wave=wave,
                       delta=delta)
    if d.candidate is None or d.interval is None:
        return {}, d
    effects = {e.candidate: _decided_step(e) for e in (*d.earlier, d)
               if e.candidate is not None and e.interval is not None}
    for later in d.later.steps if d.later is not None else ():
        if later.verdict == "ruled out":  # on pairs, or on H_j alone (its failure rate)
            effects[later.step] = StepEffect(
                step=later.step, effect=later.mean, tested=True,
                n=later.pairs or later.rollouts, ruled_out=True,
                fail_resampled=later.fail if not later.pairs else None)
    return effects, d


def _decided_step(d: search_.Decision) -> StepEffect:
    """The row of a step the search confirmed (or was confirming)."""
    assert d.candidate is not None and d.interval is not None
    effect = d.estimate if d.estimate is not None else d.raw
    return StepEffect(step=d.candidate, effect=effect,
                      ci=Interval.of(d.interval.ci, d.interval.level),
                      tested=True, significant=d.significant,
                      fail_held=d.fail_held, fail_resampled=d.fail_resampled, n=d.pairs,
                      effect_raw=d.raw, estimate="refit" if d.refit is not None else "raw",
                      refit_n=d.refit_pairs, refit_held=d.refit_held,
                      refit_resampled=d.refit_resampled, refit_pooled=d.refit_pooled)


def _first_look_coupling(arms: Arms, n: int) -> Coupling:
    """Coupling measured on the first look of ``search="full"``: ``H_n`` against ``H_0`` and
    every neighbouring pair of arms, by rollout index."""
    pairs = []
    for hi, lo in [(n, 0), *((k + 1, k) for k in range(n))]:
        a, b = arms.values.get(hi, {}), arms.values.get(lo, {})
        common = sorted(r for r in a if r in b)
        pairs.append(([a[r] for r in common], [b[r] for r in common]))
    return coupling_of(pairs)


@releasing
def contrastive(run: Trajectory, agent: Agent, *, outcome: OutcomeLike,
                rollouts: int = defaults.ROLLOUTS, alpha: float = defaults.ALPHA, seed: int = 0,
                coupled: bool = True, budget: Budget | int | None = None, search: str = "auto",
                executor: ExecutorLike = None, progress: Progress = None,
                store: StoreLike | None = None, attribution_id: str | None = None,
                force_agent: bool = False, early_stop: bool = False,
                wave: int | None = None, indifference: float = INDIFFERENCE,
                max_rollouts: int = defaults.MAX_ROLLOUTS,
                max_budget: int = defaults.MAX_BUDGET, replace: bool = False,
                action_key: ActionKey | None = None) -> ContrastiveResult:
    """Find the point of commitment of ``run``: the latest step whose rescue interval lies
    above zero, with family-wise error ``<= alpha`` (see the module docstring for the arms,
    the error control and the search). The estimate may spend up to ``n·rollouts`` rollouts
    (the paper's ``K`` per step) unless ``budget`` (a ``car.Budget`` or a rollout count) says
    otherwise; the search decides where they go and stops as soon as the answer is decided.
    The budget is checked before each rollout — when it trips, the result keeps what was
    measured and says ``truncated``. An agent other than the one that recorded ``run``
    is refused unless ``force_agent``. ``early_stop``: stop once the answer is decided,
    rather than spend what is left re-estimating the locus's rescue (what a re-estimate would
    keep back goes to ruling the later steps out). ``coupled`` decides whether CAR
    hands branches shared noise; whether they share it is measured (``coupling_measured``).
    ``wave``: rollouts each look of the search asks for at once (docs/contrastive-search.md,
    rounds); None chooses from the agent: 16 when it waits on a model server, else the
    smallest looks. ``indifference`` (Δ): before a step is named, every later step is shown to
    rescue less than Δ or reported in ``not_ruled_out``; a later step shown to matter is the
    locus instead, and the earlier one stays listed as significant (docs/contrastive-search.md,
    several causes).

    Refused before anything runs: more than ``max_rollouts`` in one arm or ``max_budget`` in
    all (``defaults.MAX_ROLLOUTS``, ``MAX_BUDGET``; raise them knowingly), and a resume
    (``attribution_id=``) of a finished attribution with settings that allow fewer rollouts
    than it was run with, which would replace its result, unless ``replace``.

    Each tested step lists what the agent did instead (``StepEffect.alternatives``), read from
    the branches already run: grouped by tool calls and their arguments or a reply's text,
    or by ``action_key(action) -> str`` (``estimators/alternatives.py``)."""
    check_run_has_steps(run)
    _check(rollouts, alpha, search)
    _check_wave(wave)
    _check_indifference(indifference)
    key = check_action_key(action_key, run)
    n = len(run.steps)
    chosen = search if search != "auto" else "bisection"
    given = as_budget(budget, "budget")
    budget, cap = rollout_budget(n, rollouts, budget)
    check_contrastive_size(n, rollouts, cap, budgeted=given is not None and given.rollouts
                           is not None, max_rollouts=max_rollouts, max_budget=max_budget)
    params = {"rollouts": rollouts, "alpha": alpha, "seed": seed, "coupled": coupled,
              "search": search, "budget": budget.to_dict(),
              "agent": agent.name, "indifference": indifference,
              **({"action_key": key_name(action_key)} if action_key is not None else {})}
    session = Session(run, agent, outcome, method="contrastive", seed=seed, coupled=coupled,
                      budget=budget, executor=executor, progress=progress, store=store,
                      attribution_id=attribution_id, params=params, force_agent=force_agent,
                      planned=functools.partial(_planned, n), replace=replace)
    arms = Arms(run, session, key)
    reason: str | None = None
    exhausted = False
    open_cause = False  # no step shown to matter, but a rescue of Δ or more not ruled out
    given_up: tuple[int, ...] = ()
    more: int | None = None
    if chosen == "full":
        # n + 1 arms share the n·K rollouts the default budget allows
        tests, m, level, measured = _full(arms, n, max(1, cap // (n + 1)), alpha)
        effects = {k: _step(k, c) for k, c in tests.items()}
        correction = "bonferroni"
    else:
        effects, decision = _searched(arms, n, cap, alpha, max(1, cap // n), not early_stop,
                                      search_wave(wave, agent), indifference)
        reason, exhausted, measured = decision.note, decision.exhausted, decision.coupling
        open_cause = decision.open_cause
        given_up = decision.given_up
        m = 1 + len(given_up) if decision.candidate is not None else 0
        more = decision.more_rollouts
        level = 1.0 - alpha
        correction = BETTING_EXACT
    significant = [k for k, e in effects.items() if e.significant]
    locus = max(significant) if significant else None
    if chosen == "full" and locus is None and effects:
        # "no cause" only where every step's rescue interval lies below Δ
        reaching = [k for k, e in effects.items() if e.ci is None or e.ci[1] >= indifference]
        if reaching:
            open_cause = True
            named = ("step " if len(reaching) == 1 else "steps ") + ", ".join(map(str, reaching))
            reason = (f"no step's rescue is shown above zero, but the interval of {named} "
                      f"still reaches {indifference:.0%}: too few re-runs to rule a cause out")
    later = decision.later if chosen != "full" else None
    open_after = tuple(j for j in (later.open_steps if later else ()) if locus is not None
                       and j > locus)
    values = arms.all_values()
    if correction == BETTING_EXACT and any(v not in (0.0, 1.0) for v in values):
        # the end-of-sampling sign test needs pairs in {-1, 0, 1} (stats.sequential._signs):
        # graded scores were decided by the anytime test alone, and the words say so
        correction = BETTING_ANYTIME
    budget_note = session.tripped
    if not values and session.failures:
        # every branch failed: the agent, not the budget, stopped the estimate
        budget_note = None
    elif budget_note is None and exhausted:  # the meter's own words when its cap is spent
        budget_note = (session.meter.check(1)
                       or f"rollout budget of {cap} reached before the answer was decided")
    if locus is None:
        if session.failures:  # the arms are incomplete: no other reason can be trusted
            reason = session.failure_note()
        elif values and max(values) == min(values) and (open_cause or reason and
                                                         budget_note is None):
            # undecided with a reason, or "no cause" shown (every rescue below Δ): both hold
            reason = (f"{reason}; the outcome never varied: all {len(values)} rollouts scored "
                      f"{values[0]:g} whatever was resampled")
        elif values and max(values) == min(values):
            reason = (f"the outcome never varied: all {len(values)} rollouts scored "
                      f"{values[0]:g} whatever was resampled, so nothing can be attributed "
                      f"at this sample size (raise rollouts if a step may still matter)")
        elif reason is None and budget_note and not effects:
            reason = f"the budget tripped before any step could be tested ({budget_note})"
        elif reason is None:
            reason = (f"no step's rescue interval lies above zero ({m} test(s) at level "
                      f"{level:.4f})")
    answer, candidate = _answer(locus, effects, budget_note,
                                bool(session.failures) or open_cause)
    # decided before a cap ended the estimate: a locus, and every step after it ruled out
    # (the search's later stage; a full search rules none out). What the cap cut was the
    # re-estimate of the locus's rescue, which spends what is left: not truncated, and no
    # resume is owed (``budget_note`` keeps which cap it was)
    settled = answer == Answer.LOCUS and chosen != "full" and not open_after
    if answer == Answer.UNDECIDED and chosen != "full" and decision.candidate is not None:
        candidate = decision.candidate  # the step being confirmed when the budget ran out
    elif answer == Answer.UNDECIDED and chosen == "full":
        # every step was tested: the one nearest to showing a rescue, not the last one
        candidate = max((k for k, e in effects.items() if e.tested and e.effect is not None),
                        key=lambda k: (effects[k].effect, k), default=candidate)
    steps = with_alternatives(tuple(effects.get(k, StepEffect(step=k)) for k in range(n)),
                              arms.choices, run, level)
    arm_rows = tuple(ArmEstimate(j, sum(v.values()) / len(v),
                                 Interval(*wilson(sum(v.values()) / len(v), len(v), level), level),
                                 len(v))
                     for j, v in sorted(arms.values.items()) if v)
    result = ContrastiveResult(
        run_id=run.id, locus=locus, reason=reason, alpha=float(alpha), tests=m, level=level,
        rollouts_used=session.meter.rollouts, rollouts_cap=rollouts, seed=seed,
        coupled=measured.shared, coupling=session.coupling,
        caveats=caveats_of(agent) + _earlier_decisions(run, answer, arm_rows)
        + _noisy_record(arm_rows, n),
        measured_coupling=measured,
        given_up=given_up, more_rollouts=more,
        # the level a claim was made at: later steps ruled out (a locus), or every rescue
        # shown below it (no cause)
        indifference=indifference if (locus is not None and chosen != "full")
        or answer == Answer.NO_CAUSE else None,
        not_ruled_out=open_after,
        truncated=budget_note is not None and not settled,
        budget_note=budget_note, tokens=session.meter.tokens,
        cost=round(session.meter.cost, 6), search=chosen, steps=steps, arms=arm_rows,
        example_branch=arms.examples.get(locus) if locus is not None else None,
        params=params, attribution_id=session.attribution_id,
        failures=session.failure_rows(), rollout_budget=cap, correction=correction,
        locus_label=step_label(run, locus) if locus is not None else None,
        actions=fmt.step_actions(run),
        answer=answer, candidate=candidate)
    session.finish(result)
    return result


def _earlier_decisions(run: Trajectory, answer: Answer, arms: tuple[ArmEstimate, ...]
                       ) -> tuple[str, ...]:
    """Where the run began from a conversation that already held the agent's decisions: when
    no step of it was shown to cause the failure, the caveat that the cause may be one of
    those (user trials attributed an LLM-as-judge loop's last round and a research pipeline's
    writer, whose failure an earlier run had fixed, and read only "no single step" or
    "undecided"); when a step was named but re-deciding every step still fails, shown above
    zero, that this share lies in what it began from or in the agent's own odds from there
    (a trial's second turn named a step rescuing 0.2 where the first turn's note made the
    other 0.8, and said nothing of it; an audit's planted 50/50 decision showed that the
    odds alone can make the share, so neither is blamed)."""
    before = decisions_before(run)
    if before == 0:
        return ()
    began = run.meta.get(BEGAN_FROM)  # the adapter's words: a thread resumed after a pause
    how = (f"; {began}" if isinstance(began, str) and began
           else f"; `car what {run.id} --step 0` tests what that history said, or attribute "
                "the turn or run that made them")
    held = (f"{before} decision(s) of the agent (an earlier turn, or an earlier run that "
            "handed this one its history)")
    if answer != Answer.LOCUS:
        return (f"the run began from a conversation that already held {held}: no step of "
                f"this run re-decides them, so a cause among them is not found here{how}",)
    first = next((a for a in arms if a.hold_before == 0), None)
    if first is None or first.ci.low <= 0.0:
        return ()
    return (f"re-deciding every step of this run, it still failed in "
            f"{fmt.percent(first.mean)} {fmt.percent_interval(first.ci)} of re-runs: that "
            f"much lies in what it began from, {held}, which no step of this run re-decides, "
            f"or in the agent's own odds of failing from there{how}",)


def _noisy_record(arms: tuple[ArmEstimate, ...], n: int) -> tuple[str, ...]:
    """Where the record itself, every step held, was shown to fail less than always: what
    runs after the decisions (an LLM judge's own randomness, most often) moves the outcome
    by itself, so each rescue is measured through that noise and reads smaller than what
    re-deciding the step does to the run (a judge that errs with probability e both ways
    shrinks it by 1 − 2e). A trial's judge flipped 10% of verdicts and nothing said so."""
    held = next((a for a in arms if a.hold_before == n), None)
    if held is None or held.ci.high >= 1.0 - 1e-9:
        return ()
    return (f"re-scored with every step held as recorded, the run failed in "
            f"{fmt.percent(held.mean)} {fmt.percent_interval(held.ci)} of re-runs, not always: "
            "the outcome (an LLM judge?) or what runs after the last step draws randomness of "
            "its own, so each rescue here reads smaller than what re-deciding the step does "
            "to the run itself",)


def _planned(n_steps: int, params: Mapping[str, Any]) -> tuple[int, int]:
    """The most rollouts an attribution with these params runs in an arm and in all."""
    return contrastive_planned(n_steps, int(params["budget"]["rollouts"]))


def _answer(locus: int | None, effects: dict[int, StepEffect], budget_note: str | None,
            failed: bool) -> tuple[Answer, int | None]:
    """Which of the three answers the estimate gives, and the step it was testing when the
    budget (or failed branches) left it undecided."""
    if locus is not None:
        return Answer.LOCUS, None
    if budget_note is None and not failed:
        return Answer.NO_CAUSE, None
    tested = [k for k, e in effects.items() if e.tested]
    return Answer.UNDECIDED, max(tested) if tested else None


def _step(k: int, c: Comparison | None) -> StepEffect:
    if c is None:
        return StepEffect(step=k)
    return StepEffect(step=k, effect=c.diff.estimate, ci=Interval.of(c.diff.ci, c.diff.level),
                      tested=True,
                      significant=c.diff.ci[0] > 0, fail_held=c.mean_hi,
                      fail_resampled=c.mean_lo, n=min(c.diff.n_a, c.diff.n_b))
