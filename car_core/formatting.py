"""How results are said to people: one vocabulary and one number format for every surface.

The plain-text ``str()`` of a result, the ``car`` command's tables and verdicts, the pytest
plugin's headline and summary, the demo's printout and the HTML report all build their words
here, so the same attribution reads the same way wherever it is shown:

- probabilities with three decimals (``prob``), effects (rescue, φ) signed (``effect``) and
  their intervals likewise (``effect_interval``); a missing (None) or non-finite value is
  written as ``missing``;
- confidence levels as percentages (``level``: ``"95%"``, never ``0.9500``);
- the same column names (``STEP_COLUMNS``, ``SHAPLEY_COLUMNS``) and the same locus mark;
- the method named as it was computed (``method``);
- the rescue shown beside the failure rates of the very sample it and its interval were
  computed from (``step_row``), with one line saying so when the test decided on other pairs
  (``sample_note``).

The generic helpers (``num``, ``interval``, ``pct``) take their style as parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MISSING = "—"
PROB_DIGITS = 3  # every probability and effect a person reads

# -- one vocabulary --------------------------------------------------------------------------
STEP, RESCUE, INTERVAL, HELD, REDRAWN, PAIRS, TESTED = (
    "step", "rescue", "interval", "P(fail) held", "P(fail) re-drawn", "n", "tested")
STEP_COLUMNS = (STEP, RESCUE, INTERVAL, HELD, REDRAWN, PAIRS, TESTED)
PLAYER, PHI = "player", "phi"
SHAPLEY_COLUMNS = (PLAYER, PHI, INTERVAL, PAIRS)
ACTION = "what it did"
# the default view: what each step did and what re-deciding it changed; the sample sizes are
# in ``explain``
PLAIN_COLUMNS = (STEP, ACTION, RESCUE, INTERVAL, HELD, REDRAWN, "")
PLAIN_SHAPLEY_COLUMNS = (PLAYER, ACTION, PHI, INTERVAL)
LOCUS_MARK = "<- locus"
NOT_TESTED, SIGNIFICANT, NOT_SIGNIFICANT = "not tested", "significant", "not significant"


# -- numbers ---------------------------------------------------------------------------------
def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def num(x: Any, digits: int = 2, *, missing: str = MISSING, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals (``sign``: always with its sign)."""
    if _missing(x):
        return missing
    return f"{float(x):+.{digits}f}" if sign else f"{float(x):.{digits}f}"


def interval(ci: Any, digits: int = 2, *, missing: str = MISSING, sign: bool = False) -> str:
    """``[low, high]`` of an interval (or of a stored ``[low, high]`` list)."""
    if not ci:
        return missing
    return (f"[{num(ci[0], digits, missing=missing, sign=sign)}, "
            f"{num(ci[1], digits, missing=missing, sign=sign)}]")


def pct(level: Any, decimals: int | None = None, *, missing: str = MISSING) -> str:
    """A fraction as a percentage: ``decimals`` places, or (None) none when it is whole and
    one otherwise."""
    if level is None:
        return missing
    p = float(level) * 100
    if decimals is None:
        decimals = 0 if abs(p - round(p)) < 1e-9 else 1
    return f"{p:.{decimals}f}%"


def prob(x: Any, *, missing: str = MISSING) -> str:
    """A probability (a failure rate): ``0.312``."""
    return num(x, PROB_DIGITS, missing=missing)


def effect(x: Any, *, missing: str = MISSING) -> str:
    """A difference of probabilities (a rescue, a Shapley value), signed: ``+0.417``."""
    return num(x, PROB_DIGITS, missing=missing, sign=True)


def effect_interval(ci: Any, *, missing: str = MISSING) -> str:
    """The interval of an effect: ``[+0.200, +0.600]``."""
    return interval(ci, PROB_DIGITS, missing=missing, sign=True)


def prob_interval(ci: Any, *, missing: str = MISSING) -> str:
    """The interval of a probability: ``[0.180, 0.490]``."""
    return interval(ci, PROB_DIGITS, missing=missing)


def level(x: Any, *, missing: str = MISSING) -> str:
    """A confidence level: ``95%`` (``99.5%`` when it is not whole)."""
    return pct(x, None, missing=missing)


def failure_rate(mean: Any, ci: Any, lvl: Any, n: int, *, missing: str = MISSING) -> str:
    """One estimated failure rate with everything it rests on: ``P(fail) 0.312 [0.180,
    0.490] at 95%, n=32``."""
    return (f"P(fail) {prob(mean, missing=missing)} {prob_interval(ci, missing=missing)} at "
            f"{level(lvl, missing=missing)}, n={n}")


# -- what was computed -------------------------------------------------------------------------
def _is_contrastive(r: Any) -> bool:
    return hasattr(r, "locus")


def method(r: Any) -> str:
    """How the intervals of ``r`` were computed, in the words of the computation."""
    if not _is_contrastive(r):
        return f"{r.mode} mode, intervals at {level(r.level)}"
    family = level(1 - float(r.alpha))
    correction = str(r.correction)
    if correction.lower() in ("bonferroni", "holm"):
        name = correction.capitalize()
        return (f"{name} over {r.tests} test(s), each interval at {level(r.level)}, "
                f"family-wise {family}")
    if not r.tests:
        return f"no step was tested, family-wise {family}"
    if "betting" in correction:  # the search's confirmation (estimators/search.py)
        # paired when the arms were measured to share their noise, else on the two rates
        pairing = "paired" if r.coupled else "unpaired"
        return (f"{pairing} betting test with an exact sign test at the end, alpha spent over "
                f"{r.tests} confirmation(s), family-wise {family}")
    return f"{correction}, {r.tests} test(s), intervals at {level(r.level)}, family-wise {family}"


# -- one row per step ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepRow:
    """A step's cells, as every table shows them (``STEP_COLUMNS``); ``mark`` is the locus mark
    or the test's outcome."""

    step: str
    rescue: str
    interval: str
    held: str
    redrawn: str
    n: str
    tested: str
    mark: str
    is_locus: bool

    def cells(self) -> list[str]:
        return [self.step, self.rescue, self.interval, self.held, self.redrawn, self.n,
                self.mark]


def shown_sample(s: Any) -> tuple[float | None, float | None, int]:
    """P(fail | held), P(fail | re-drawn) and n of the sample the step's rescue and interval
    were computed from: the pairs of a re-estimate, else the pairs the test ran on. ``s`` is
    a ``StepEffect`` or its stored dict (the report reads those)."""
    def get(name: str, default: Any = None) -> Any:
        return s.get(name, default) if isinstance(s, Mapping) else getattr(s, name, default)
    if get("estimate", "raw") == "refit":
        return get("refit_held"), get("refit_resampled"), int(get("refit_n", 0) or 0)
    return get("fail_held"), get("fail_resampled"), int(get("n", 0) or 0)


def step_row(r: Any, s: Any, *, missing: str = MISSING) -> StepRow:
    """The row of step ``s`` of contrastive result ``r``."""
    held, redrawn, n = shown_sample(s)
    is_locus = s.step == r.locus
    tested = ((SIGNIFICANT if s.significant else NOT_SIGNIFICANT) if s.tested
              else NOT_TESTED)
    mark = (LOCUS_MARK if is_locus else
            ("shown to help" if s.significant else "not shown to help") if s.tested
            else untested_mark(r, int(s.step)))
    return StepRow(str(s.step), effect(s.effect, missing=missing),
                   effect_interval(s.ci, missing=missing), prob(held, missing=missing),
                   prob(redrawn, missing=missing), str(n), tested, mark, is_locus)


def plain_cells(r: Any, row: StepRow) -> list[str]:
    """The cells of ``row`` in the default view (``PLAIN_COLUMNS``)."""
    actions = tuple(_get(r, "actions", ()) or ())
    k = int(row.step)
    did = actions[k] if 0 <= k < len(actions) else MISSING
    return [row.step, did, row.rescue, row.interval, row.held, row.redrawn, row.mark]


def sample_note(r: Any) -> str | None:
    """One line for each re-estimated step: the test decided on other pairs than the ones the
    rescue, its interval and the failure rates beside it come from (so the two may differ)."""
    notes = []
    for s in getattr(r, "steps", ()):
        if getattr(s, "estimate", "raw") != "refit" or not s.tested:
            continue
        pooled = int(getattr(s, "refit_pooled", 0) or 0)
        sample = (f"{s.refit_n - pooled} fresh pair(s) drawn after it and {pooled} of the "
                  f"test's (all but the one its stop was decided on)" if pooled
                  else f"{s.refit_n} fresh pair(s) drawn after it")
        notes.append(f"step {s.step}: the test decided on {s.n} pair(s) (rescue "
                     f"{effect(s.effect_raw)}: {prob(s.fail_held)} held, "
                     f"{prob(s.fail_resampled)} re-drawn); the row shows the re-estimate on "
                     f"{sample}, the sample its interval is about")
    return "\n".join(notes) or None


# -- one sentence per answer -------------------------------------------------------------------
def decided_by(who: str | None) -> str:
    return f" (decided by {who})" if who else ""


def locus_name(r: Any, who: str | None = None) -> str:
    """The locus as every surface names it: ``step 4 (decided by account_agent, its 1st
    decision)``. ``who`` decided it (the caller has the run); without it, the agent named in
    the result's ``locus_label`` (``car_core.model.trajectory.step_label``)."""
    k = r.locus
    label = str(getattr(r, "locus_label", None) or "")
    found = re.fullmatch(rf"(.+), step {k} \(its (\w+) decision\)", label)
    nth = found[2] if found else None
    who = who or (found[1] if found else None)
    if not who:
        return f"step {k}"
    return f"step {k} (decided by {who}" + (f", its {nth} decision" if nth else "") + ")"


def coupling_note(r: Any) -> str:
    """How much the branches shared their noise: ``coupled`` is what the pairs showed, the
    reason says what noise CAR handed out, and the measurement comes with its interval."""
    note = f"coupled={r.coupled}" + (f" (noise handed out: {r.coupling})"
                                     if r.coupling and not r.coupled else "")
    if r.coupling_measured is not None:
        note += (f"; coupling measured {num(r.coupling_measured, 2, missing='-')} "
                 f"{interval(r.coupling_ci, 2, missing='-')} from {r.coupling_pairs} pairs")
    return note


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


# -- plain words: the answer before the method ---------------------------------------------------
ACTION_CHARS = 60  # how much of a recorded action the answer quotes


def _clip(text: str, limit: int = ACTION_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _json(value: Any) -> str:
    import json
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _call(name: Any, args: Any) -> str:
    """``refund(order="A7", amount=120)`` from a tool name and its arguments (a dict or the
    JSON string chat APIs send)."""
    if isinstance(args, str):
        import json
        try:
            args = json.loads(args)
        except ValueError:
            return _clip(f"called {name}({args})")
    if isinstance(args, Mapping):
        inner = ", ".join(f"{k}={_json(v)}" for k, v in args.items())
    elif args is None:
        inner = ""
    else:
        inner = _json(args)
    return _clip(f"called {name}({inner})")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # content blocks: the text ones, in order
        return " ".join(str(b.get("text", "")) if isinstance(b, Mapping) else str(b)
                        for b in content)
    return ""


def action_summary(action: Any) -> str:
    """What a recorded action did, in a few words: ``called refund(order="A7")`` for a tool
    call (the first, with how many more), ``replied "Sure, I can…"`` for a reply, else
    ``chose {...}`` with the action's JSON, shortened."""
    if isinstance(action, Mapping):
        calls = action.get("tool_calls")
        if isinstance(calls, Sequence) and not isinstance(calls, str) and calls:
            first = calls[0] if isinstance(calls[0], Mapping) else {}
            inner = first.get("function")
            fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else first
            said = _call(fn.get("name", "?"), fn.get("arguments", fn.get("args")))
            return said + (f" and {len(calls) - 1} more call(s)" if len(calls) > 1 else "")
        if action.get("name") and any(k in action for k in ("arguments", "args", "input")):
            args = next(action[k] for k in ("arguments", "args", "input") if k in action)
            return _call(action["name"], args)
        said = _text(action.get("content")).strip()
        if said:
            return f'replied "{_clip(said, ACTION_CHARS - 10)}"'
    elif isinstance(action, str) and action.strip():
        return f'replied "{_clip(action, ACTION_CHARS - 10)}"'
    return "chose " + _clip(_json(action), ACTION_CHARS - 6)


def step_actions(run: Any) -> tuple[str, ...]:
    """``action_summary`` of every recorded step of ``run``, in order (kept with results)."""
    return tuple(action_summary(s.action) for s in run.steps)


def percent(x: Any) -> str:
    """A probability or an effect as a whole percentage a person reads: ``41%``."""
    return MISSING if _missing(x) else f"{round(float(x) * 100):d}%"


def percent_interval(ci: Any) -> str:
    """``(24%–55%)``; with a negative end ``(-5% to 30%)``, where a dash would misread."""
    if not ci or _missing(ci[0]) or _missing(ci[1]):
        return "(interval not measured)"
    lo, hi = percent(ci[0]), percent(ci[1])
    return f"({lo}–{hi})" if not lo.startswith("-") else f"({lo} to {hi})"


def steps_span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}–{last}"


def _get(r: Any, name: str, default: Any = None) -> Any:
    return r.get(name, default) if isinstance(r, Mapping) else getattr(r, name, default)


def _who_nth(r: Any, k: int, who: str | None) -> tuple[str | None, str | None]:
    """Who decided step ``k`` and which of their decisions it was, from ``who`` or the
    result's label (``locus_label``, written for multi-agent runs)."""
    label = str(_get(r, "locus_label") or "")
    found = re.fullmatch(rf"(.+), step {k} \(its (\w+) decision\)", label)
    return who or (found[1] if found else None), (found[2] if found else None)


def step_said(r: Any, k: int, who: str | None = None, actions: Sequence[str] = (),
              nth: str | None = None) -> str:
    """Step ``k`` with who decided it and what it did: ``step 4 (account_agent called
    lookup(id=3), its 1st decision)``."""
    actions = tuple(actions) or tuple(_get(r, "actions", ()) or ())
    did = actions[k] if 0 <= k < len(actions) else None
    who, found_nth = _who_nth(r, k, who)
    nth = nth or found_nth
    if did is None and who is None:
        return f"step {k}"
    inner = f"{who or 'the agent'} {did}" if did else f"decided by {who}"
    return f"step {k} ({inner}" + (f", its {nth} decision" if nth else "") + ")"


def _arms(r: Any) -> dict[int, Any]:
    return {int(_get(a, "hold_before")): a for a in _get(r, "arms", ()) or ()}


def _stays(r: Any, arm: Any, factual: Any) -> str:
    """How an arm's failure rate compares with the record held: ``changes nothing: P(fail)
    stays 100% (90%–100%)`` when the held rate lies inside its interval."""
    mean, ci = _get(arm, "mean"), _get(arm, "ci")
    rate = f"{percent(mean)} {percent_interval(ci)}"
    held = _get(factual, "mean") if factual is not None else None
    if held is not None and ci and ci[0] - 1e-9 <= held <= ci[1] + 1e-9:
        return f"changes nothing: P(fail) stays {rate}"
    return f"leaves P(fail) at {rate}"


def later_steps(r: Any) -> str | None:
    """What the steps after the locus did, from the arms actually measured: re-deciding from
    the first measured step after it on, and the steps before that, which were not tested."""
    k, n = _get(r, "locus"), len(_get(r, "steps", ()) or ())
    if k is None or k >= n - 1:
        return None
    arms = _arms(r)
    after = sorted(j for j in arms if k < j < n)
    def untested(first: int, last: int) -> str:
        one = first == last
        return (f"{steps_span(first, last)} {'comes' if one else 'come'} after the point of "
                f"commitment, so {'it was' if one else 'they were'} not tested")
    if not after:
        return untested(k + 1, n - 1)
    j = after[0]
    said = f"re-deciding {steps_span(j, n - 1)} {_stays(r, arms[j], arms.get(n))}"
    return said + (f"; {untested(k + 1, j - 1)}" if j > k + 1 else "")


def _rescue_words(s: Any) -> str:
    held, redrawn, _ = shown_sample(s)
    eff, ci = _get(s, "effect"), _get(s, "ci")
    if held is not None and held >= 0.995:
        return (f"re-deciding it avoids the failure in {percent(eff)} of re-runs "
                f"{percent_interval(ci)}")
    return (f"re-deciding it lowers P(fail) by {percent(eff)} {percent_interval(ci)}, from "
            f"{percent(held)} to {percent(redrawn)}")


def _no_cause_words(r: Any) -> str:
    arms, n = _arms(r), len(_get(r, "steps", ()) or ())
    first, held = arms.get(0), arms.get(n)
    if first is not None and held is not None:
        return ("No single step caused the failure: re-deciding no step was shown to lower "
                f"P(fail) (re-deciding every step from step 0 on: {percent(_get(first, 'mean'))}"
                f" {percent_interval(_get(first, 'ci'))}; the record held: "
                f"{percent(_get(held, 'mean'))} {percent_interval(_get(held, 'ci'))})")
    return "No single step caused the failure: re-deciding no step was shown to lower P(fail)"


def _undecided_words(r: Any, who: str | None) -> str:
    if _get(r, "truncated"):
        why = "the budget ran out before the answer was decided"
    elif _get(r, "failures"):
        why = (f"{len(_get(r, 'failures'))} branch(es) failed (the agent raised), so no "
               "answer can be claimed")
    else:
        why = "the estimate stopped before the answer was decided"
    c = _get(r, "candidate")
    if c is None:
        return f"Undecided: {why}; no step had been tested yet"
    s = next((e for e in _get(r, "steps", ()) if _get(e, "step") == c), None)
    name = step_said(r, c, who)
    if s is None or not _get(s, "tested") or _get(s, "effect") is None:
        return f"Undecided: {why}; the best candidate is {name}, not yet measured"
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
        found = re.fullmatch(rf"(.+), step {k} \(its (\w+) decision\)",
                             str(_get(v, "label") or ""))
        return step_said(r, int(k), (found[1] if found else None)
                         or (who if len(leaders) == 1 else None), actions,
                         found[2] if found else None)

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
    later = later_steps(r)
    return said + (f"; {later}" if later else "") + "."


def coupling(r: Any) -> str:
    """Whether the branches shared the agent's randomness, in the one wording every surface
    uses: ``paired: …`` when the pairs were measured to share it, else ``unpaired: …``."""
    measured, ci, pairs = (_get(r, "coupling_measured"), _get(r, "coupling_ci"),
                           int(_get(r, "coupling_pairs", 0) or 0))
    agreement = (f" (measured agreement {num(measured, 2)} {interval(ci, 2)} from {pairs} "
                 "pair(s))" if measured is not None else "")
    if _get(r, "coupled"):
        return f"paired: branches shared the agent's randomness{agreement}"
    if measured is not None:
        return f"unpaired: branches were not shown to share randomness{agreement}"
    return ("unpaired: whether branches shared randomness was not measured, so they were "
            "compared as independent")


def untested_mark(r: Any, k: int) -> str:
    """Why step ``k`` was not tested, in the table's last column."""
    if str(_get(r, "answer")) == "undecided":
        return "not reached"
    locus = _get(r, "locus")
    if locus is None:
        return "not needed"
    if k < locus:
        return "before the locus"
    n = len(_get(r, "steps", ()) or ())
    after = [j for j in _arms(r) if locus < j <= k and j < n]
    return "followed from it" if after else "after the locus"
