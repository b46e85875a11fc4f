"""The answer in one sentence: the headline in the method's words (``headline``) and the
plain one a person can act on before any method (``answer``), with the coupling in the one
wording every surface uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from car_core.formatting.numbers import (
    effect,
    effect_interval,
    interval,
    level,
    num,
    percent,
    percent_interval,
    steps_span,
)
from car_core.formatting.rows import _arms, _get, _is_contrastive, method, shown_sample
from car_core.model.trajectory import label_parts


def decided_by(who: str | None) -> str:
    return f" (decided by {who})" if who else ""


def locus_name(r: Any, who: str | None = None) -> str:
    """The locus as every surface names it: ``step 4 (decided by account_agent, its 1st
    decision)``. ``who`` decided it (the caller has the run); without it, the agent named in
    the result's ``locus_label`` (``car_core.model.trajectory.step_label``)."""
    k = r.locus
    found = label_parts(str(getattr(r, "locus_label", None) or ""), k)
    when = found[1] if found else None
    who = who or (found[0] if found else None)
    if not who:
        return f"step {k}"
    return f"step {k} (decided by {who}" + (f", {when}" if when else "") + ")"


def _field(v: Any, name: str) -> Any:
    return v.get(name) if isinstance(v, dict) else getattr(v, name, None)


def shapley_leaders(values: Sequence[Any]) -> tuple[str, list[Any]]:
    """Who carries the largest Shapley share, honestly (values as objects or their dicts):
    ``("one", [top])`` when the top value's interval lies above every other's, ``("equal",
    tied)`` when several share the top value to the digits shown, ``("overlap", contenders)``
    when others' intervals reach the top's, so the data cannot rank them. Contenders come
    largest first; the order among equal values is the steps' order and means nothing."""
    ranked = sorted((v for v in values if _field(v, "estimate") is not None),
                    key=lambda v: -float(_field(v, "estimate")))
    if not ranked:
        return "one", []
    top = ranked[0]
    shown = effect(_field(top, "estimate"))
    same = [v for v in ranked if effect(_field(v, "estimate")) == shown]
    if len(same) > 1:
        return "equal", same
    top_lo = (_field(top, "ci") or (_field(top, "estimate"),))[0]
    overlap = [v for v in ranked[1:]
               if (_field(v, "ci") or (_field(v, "estimate"),) * 2)[1] >= top_lo]
    return ("overlap", [top, *overlap]) if overlap else ("one", [top])


def headline(r: Any, who: str | None = None) -> str:
    """The answer of ``r`` in one line: the locus (``who`` decided it), no cause (and why),
    undecided (and the candidate), or for Shapley the largest value."""
    if not _is_contrastive(r):
        cut = (f"truncated ({r.budget_note}), the values are from what was measured: "
               if r.truncated else "")
        kind, leaders = shapley_leaders(r.values)
        if not leaders:
            return f"{cut}no step could be valued ({r.reason or 'nothing measured'})"
        v = leaders[0]
        sums = (f"at {level(r.level)}; sum {effect(r.total)}, efficiency gap "
                f"{effect(r.efficiency_gap)}")
        names = [u.label or f"step {u.step}" for u in leaders]
        if kind == "equal":
            return (f"{cut}{', '.join(names[:-1])} and {names[-1]} tie for the largest Shapley "
                    f"value, phi {effect(v.estimate)} each, {sums}")
        if kind == "overlap":
            rest = ", ".join(f"{n} phi {effect(u.estimate)} {effect_interval(u.ci)}"
                             for n, u in zip(names[1:], leaders[1:], strict=True))
            return (f"{cut}largest Shapley value: {names[0]} phi {effect(v.estimate)} "
                    f"{effect_interval(v.ci)}, not told apart from {rest} (the intervals "
                    f"overlap), {sums}")
        return (f"{cut}largest Shapley value: {names[0]}{decided_by(who)} "
                f"phi {effect(v.estimate)} {effect_interval(v.ci)} {sums}")
    if str(r.answer) == "undecided":
        by = f"; step {r.candidate} was decided by {who}" if who and r.candidate is not None \
            else ""
        return f"undecided: {r.undecided_why()}; {r.candidate_text()}{by}"
    if r.locus is None:
        return f"no cause: {r.reason or 'no step rescue interval lies above zero'}"
    s = next((e for e in r.steps if e.step == r.locus), None)
    return (f"locus: {locus_name(r, who)}, rescue "
            f"{effect(s.effect if s else None)} {effect_interval(s.ci if s else None)} at "
            f"{level(r.level)} ({method(r)})")


def _who_when(r: Any, k: int, who: str | None) -> tuple[str | None, str | None]:
    """Who decided step ``k`` and when ("its 1st decision", "parallel task 2"), from ``who``
    or the result's label (``locus_label``, written for multi-agent runs)."""
    found = label_parts(str(_get(r, "locus_label") or ""), k)
    return who or (found[0] if found else None), (found[1] if found else None)


def step_said(r: Any, k: int, who: str | None = None, actions: Sequence[str] = (),
              when: str | None = None) -> str:
    """Step ``k`` with who decided it and what it did: ``step 4 (account_agent called
    lookup(id=3), its 1st decision)``."""
    actions = tuple(actions) or tuple(_get(r, "actions", ()) or ())
    did = actions[k] if 0 <= k < len(actions) else None
    who, found_when = _who_when(r, k, who)
    when = when or found_when
    if did is None and who is None:
        return f"step {k}"
    inner = f"{who or 'the agent'} {did}" if did else f"decided by {who}"
    return f"step {k} ({inner}" + (f", {when}" if when else "") + ")"


def _arm_rate(arm: Any, factual: Any) -> tuple[str, bool]:
    """An arm's failure rate with its interval, and whether the rate of the record held lies
    inside that interval (re-running from there was not shown to change P(fail))."""
    mean, ci = _get(arm, "mean"), _get(arm, "ci")
    held = _get(factual, "mean") if factual is not None else None
    level = bool(held is not None and ci and ci[0] - 1e-9 <= held <= ci[1] + 1e-9)
    return f"{percent(mean)} {percent_interval(ci)}", level


def later_steps(r: Any) -> str | None:
    """What the steps after the locus did, from the arms actually measured: re-deciding from
    the first measured step after it on, and the steps before that, which were not tested.
    "Changes nothing" is said only of steps ruled out at the indifference level: an arm whose
    interval still reaches a rescue of Δ ran too few times to say so (the answer once said
    steps "change nothing" and, in the same sentence, that one was not ruled out)."""
    k, n = _get(r, "locus"), len(_get(r, "steps", ()) or ())
    if k is None or k >= n - 1:
        return None
    arms = _arms(r)
    after = sorted(j for j in arms if k < j < n)
    def untested(first: int, last: int) -> str:
        one = first == last
        return (f"{steps_span(first, last)} {'comes' if one else 'come'} after the point of "
                f"commitment, so {'it was' if one else 'they were'} not tested")
    left = _open_steps(r)
    if not after:
        return left or untested(k + 1, n - 1)
    j = after[0]
    rate, level = _arm_rate(arms[j], arms.get(n))
    measured = f"re-deciding {steps_span(j, n - 1)} left P(fail) at {rate}"
    delta = _get(r, "indifference")
    ruled = [_get(e, "step") for e in _get(r, "steps", ()) or () if _get(e, "ruled_out")]
    if left:
        open_words = _open_steps(r, measured=(j, n - 1))
        if delta is None or not ruled:
            return f"{measured}, {open_words}"
        # some ruled out, the earlier ones open: say both (the sentence once named only the
        # open ones, and a reader could not tell what became of the rest)
        one = len(ruled) == 1
        return (f"{measured}; {_span(ruled)} {'is' if one else 'are'} ruled out as "
                f"{'a cause' if one else 'causes'} ({'it moves' if one else 'each moves'} "
                f"P(fail) by less than {percent(delta)}), but there were {open_words}")
    if delta is not None and ruled and min(ruled) == k + 1:
        one = len(ruled) == 1
        said = (f"re-deciding {steps_span(j, n - 1)} changes nothing: P(fail) stays {rate}"
                if level else measured)
        return (f"{said}: ruled out as {'a cause' if one else 'causes'}, "
                f"{'it moves' if one else 'each moves'} P(fail) by less than {percent(delta)}")
    return measured + (f"; {untested(k + 1, j - 1)}" if j > k + 1 else "")


def _span(steps: list[int]) -> str:
    """``step 5``, ``steps 3–5``, or ``steps 2, 5`` where they do not run on."""
    if max(steps) - min(steps) + 1 == len(steps):
        return steps_span(min(steps), max(steps))
    return "steps " + ", ".join(map(str, sorted(steps)))


def _a(share: str) -> str:
    """The article a percentage takes as it is read out: "an 86%", "an 11%", "a 6%"."""
    return "an" if share.startswith("8") or share in ("11%", "18%") else "a"


def _rescue_words(s: Any) -> str:
    held, redrawn, _ = shown_sample(s)
    eff, ci = _get(s, "effect"), _get(s, "ci")
    if eff is not None and eff < 0:  # "lowers P(fail) by -13%" read backwards
        return (f"re-deciding it so far raises P(fail) by {percent(-eff)}, from "
                f"{percent(held)} to {percent(redrawn)}; its rescue's interval is "
                f"{percent_interval(ci).strip('()')}")
    low = ci[0] if ci is not None else None
    if held is not None and held >= 0.995 and (low is None or low >= 0):
        # a share of re-runs: not for an interval reaching below zero ("-6% of re-runs")
        return (f"re-deciding it avoids the failure in {percent(eff)} of re-runs "
                f"{percent_interval(ci, effect=True)}")
    if low is not None and ci is not None and low < 0 and percent(low) != "0%":
        # "lowers P(fail) by 27% (-33% to 100%)" read as a contradiction in a trial
        rise, drop = percent(-low), percent(ci[1])
        span = f"(between {_a(rise)} {rise} rise and {_a(drop)} {drop} drop)"
    else:
        span = percent_interval(ci, effect=True)
    return (f"re-deciding it lowers P(fail) by {percent(eff)} {span}, from {percent(held)} "
            f"to {percent(redrawn)}")


def _no_cause_words(r: Any) -> str:
    """"No cause" with what it rests on: the rescue shown below the indifference level
    (every step's, where each was tested; else re-deciding every step from step 0 on), and
    the two arms' rates."""
    arms, n = _arms(r), len(_get(r, "steps", ()) or ())
    first, held = arms.get(0), arms.get(n)
    delta = _get(r, "indifference")
    if delta is None:
        shown = "re-deciding no step was shown to lower P(fail)"
    elif _get(r, "correction") == "bonferroni":
        shown = f"re-deciding any one step is shown to lower P(fail) by less than {percent(delta)}"
    else:
        shown = (f"re-deciding every step from step 0 on is shown to lower P(fail) by less "
                 f"than {percent(delta)}")
    if first is not None and held is not None:
        return (f"No single step caused the failure: {shown} (P(fail) with every step "
                f"re-decided: {percent(_get(first, 'mean'))} "
                f"{percent_interval(_get(first, 'ci'))}; the record held: "
                f"{percent(_get(held, 'mean'))} {percent_interval(_get(held, 'ci'))})")
    return f"No single step caused the failure: {shown}"


def _undecided_words(r: Any, who: str | None) -> str:
    if _get(r, "truncated"):
        why = "the budget ran out before the answer was decided"
    elif _get(r, "failures"):
        failures = _get(r, "failures")
        first = " ".join(str(_get(failures[0], "error") or "").split())
        first = first if len(first) <= 160 else first[:159] + "…"
        # the first error, not "the agent raised": most branches left out on a trial were a
        # safe tool's errors the branch could not be scored with, where the agent raised nothing
        why = (f"{len(failures)} branch(es) failed and were left out (first: {first}), so no "
               "answer can be claimed")
    else:  # the search's own words (no rise seen, but too few re-runs to rule a cause out)
        why = _get(r, "reason") or "the estimate stopped before the answer was decided"
    c = _get(r, "candidate")
    if c is None:
        return f"Undecided: {why}; no step had been tested yet"
    s = next((e for e in _get(r, "steps", ()) if _get(e, "step") == c), None)
    name = step_said(r, c, who)
    if s is None or not _get(s, "tested") or _get(s, "effect") is None:
        return (f"Undecided: {why}; the best candidate is {name}, chosen from the arms run so "
                "far; its own test had not run")
    ci = _get(s, "ci")
    if (ci is not None and ci[0] <= -0.99 and ci[1] >= 0.99  # "(-100% to 100%)": nothing
            and _get(r, "search") != "full"):
        n = shown_sample(s)[2]
        return (f"Undecided: {why}; the search had just begun testing {name}, on {n} "
                "pair(s) of re-runs: nothing is measured yet")
    if float(_get(s, "effect")) <= 0:  # no rescue seen: not a candidate worth the name
        if _get(r, "search") == "full":  # every step was tested, none is "being" tested
            return (f"Undecided: {why}; every step was tested and none has shown a rescue so "
                    f"far (the nearest, {name}: {_rescue_words(s)} so far)")
        return (f"Undecided: {why}; the search was testing {name}, which has shown no rescue "
                f"so far: {_rescue_words(s)} so far")
    return (f"Undecided: {why}; the best candidate so far is {name}: "
            f"{_rescue_words(s)} so far")


def _shapley_words(r: Any, who: str | None) -> str:
    cut = "From what was measured before the budget ran out: " if _get(r, "truncated") else ""
    kind, leaders = shapley_leaders(_get(r, "values", ()))
    if not leaders:
        return f"{cut}No step could be valued: {_get(r, 'reason') or 'nothing was measured'}"
    actions = tuple(_get(r, "actions", ()) or ())

    def name(v: Any) -> str:
        k = _get(v, "step")
        if k is None:
            return str(_get(v, "label") or "the other steps")
        # a multi-agent label names who decided the step: "account_agent, step 4 (its 1st
        # decision)"
        found = label_parts(str(_get(v, "label") or ""), int(k))
        return step_said(r, int(k), (found[0] if found else None)
                         or (who if len(leaders) == 1 else None), actions,
                         found[1] if found else None)

    def share(v: Any) -> str:
        return f"{percent(_get(v, 'estimate'))} {percent_interval(_get(v, 'ci'))}"
    head = name(leaders[0])
    head = head[:1].upper() + head[1:]
    if kind == "equal":
        names = [name(v) for v in leaders]
        names[0] = names[0][:1].upper() + names[0][1:]
        return (f"{cut}{', '.join(names[:-1])} and {names[-1]} share the largest part of the "
                f"failure equally: keeping any one of them as recorded adds "
                f"{percent(_get(leaders[0], 'estimate'))} to P(fail) on average")
    if kind == "overlap":
        rest = ", ".join(f"{name(v)} {share(v)}" for v in leaders[1:])
        return (f"{cut}{head} carries the largest share of the failure, though the data cannot "
                f"rank it above {rest}: keeping it as recorded adds {share(leaders[0])} to "
                "P(fail) on average")
    return (f"{cut}{head} carries the largest share of the failure: keeping it as recorded "
            f"adds {share(leaders[0])} to P(fail) on average")


def answer(r: Any, who: str | None = None) -> str:
    """The answer of ``r`` in one plain sentence a person can act on, before any method:
    which step, what it did (and who decided it), how much re-deciding it helps, in percent
    with its interval, and what the later steps did, from the arms measured. No test name,
    level or sample size: ``explain`` has those."""
    if not _is_contrastive(r):
        return _shapley_words(r, who) + "."
    if str(_get(r, "answer")) == "undecided":
        return _undecided_words(r, who) + "."
    k = _get(r, "locus")
    if k is None:
        return _no_cause_words(r) + "."
    s = next((e for e in _get(r, "steps", ()) if _get(e, "step") == k), None)
    name = step_said(r, k, who)
    said = f"{name[:1].upper()}{name[1:]} caused the failure"
    if s is not None and _get(s, "effect") is not None:
        said += f": {_rescue_words(s)}"
    earlier = earlier_causes(r, who)
    later = later_steps(r)
    return said + (f" — and {earlier}" if earlier else "") + (f"; {later}" if later else "") + "."


def earlier_causes(r: Any, who: str | None = None) -> str | None:
    """The steps before the locus shown to matter too: ``step 3 (…) also mattered:
    re-deciding it lowers P(fail) by 38% (20%–55%)``. ``who`` (the locus's decider) is not
    said of them."""
    k = _get(r, "locus")
    shown = [e for e in _get(r, "steps", ()) or () if _get(e, "significant")
             and _get(e, "step") != k and _get(e, "effect") is not None]
    # ``who`` decided the locus: an earlier step may be another agent's (a user trial's
    # sentence named the refunds agent for the triage agent's step 0)
    said = [f"{step_said(r, _get(e, 'step'))} also mattered: {_rescue_words(e)}"
            for e in sorted(shown, key=lambda e: _get(e, "step"))]
    return "; ".join(said) or None


def _open_steps(r: Any, measured: tuple[int, int] | None = None) -> str | None:
    """The steps after the locus the budget left untested at the indifference level; after
    a measured arm's rate (``measured``: the steps it spoke for) worded as what its re-runs
    could not tell, naming the open steps again only where they are not those steps."""
    left, delta = tuple(_get(r, "not_ruled_out", ()) or ()), _get(r, "indifference")
    if not left or delta is None:
        return None
    one = len(left) == 1
    span = _span(list(left))
    might = (f"re-deciding {'it' if one else 'them'} may still lower P(fail) by "
             f"{percent(delta)} or more (a larger budget would tell)")
    if measured is not None:
        same = sorted(left) == list(range(measured[0], measured[1] + 1))
        which = ("them" if not one else "it") if same else span
        # right after that rate's 95% interval, which may already look clear of Δ: ruling
        # out holds every later step at once, at a stricter level (a trial read "100%
        # (94%–100%), too few re-runs to rule them out" as a contradiction)
        return (f"too few re-runs to rule {which} out at the stricter level that holds for "
                f"every later step at once: {might}" if same
                else f"too few re-runs to rule out {which}: {might}")
    return f"{span} {'was' if one else 'were'} not ruled out: {might}"


def coupling(r: Any) -> str:
    """Whether the branches shared the agent's randomness, in the one wording every surface
    uses: ``paired: …`` when the pairs were measured to agree above independence, else
    ``unpaired: …``."""
    measured, ci, pairs = (_get(r, "coupling_measured"), _get(r, "coupling_ci"),
                           int(_get(r, "coupling_pairs", 0) or 0))
    # the scale said with the number: a trial read "measured agreement -1.00" as the
    # branches always disagreeing, where it meant less alike than independent re-runs
    agreement = (f" (measured coupling {num(measured, 2)} {interval(ci, 2)} from {pairs} "
                 "pair(s); 0: as alike as independent re-runs, 1: as alike as can be)"
                 if measured is not None else "")
    if _get(r, "coupled"):
        # what was measured, not a cause: an agent whose model ignores CAR's noise can agree
        # so by chance (at most 2.5% of the time: ``Coupling.shared``), and then "shared the
        # agent's randomness" read as false beside "does not come from CAR's noise streams"
        return f"paired: branches agreed more than independent re-runs would{agreement}"
    if measured is not None:
        return f"unpaired: branches were not shown to share randomness{agreement}"
    return ("unpaired: whether branches shared randomness was not measured, so they were "
            "compared as independent")
