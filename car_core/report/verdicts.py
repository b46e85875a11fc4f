"""The verdict that opens the page: the answer, its numbers and what to do next, for a
contrastive or a Shapley attribution, read from the result's ``to_dict()``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from car_core import formatting as fmt
from car_core.model.budget import budget_call, larger_budget
from car_core.model.trajectory import Trajectory, is_failure, label_parts, step_label
from car_core.model.vocabulary import Answer
from car_core.report.values import _ci, _clip, _fmt, _pct, compact


def _failure_note(r: Mapping[str, Any]) -> str:
    failures = r.get("failures") or []
    if not failures:
        return ""
    first = failures[0]
    error = _clip(str(first.get("error")))
    return (f"{len(failures)} failed branch(es) left out of the estimate (first: arm "
            f"{first.get('arm')}, rollout {first.get('rollout')}: {error})")


def _continue(r: Mapping[str, Any], method: str, cap: Any) -> str:
    """The command that resumes the attribution with a larger budget (the API call when it
    was not stored, so has nothing to resume)."""
    more = larger_budget(r.get("params", {}).get("budget"), r.get("budget_note"), cap,
                         r.get("more_rollouts"))
    aid = r.get("attribution_id")
    if aid is None:
        return f"run it again with a larger budget: budget={budget_call(more)}"
    flag = f" --budget {more['rollouts']}" if more.get("rollouts") else ""
    return (f"car attribute {r.get('run_id')} --agent MODULE:FACTORY --outcome MODULE:FUNCTION "
            f"--method {method}{flag} --store STORE --resume {aid}")


def _answer(r: Mapping[str, Any]) -> str:
    answer = r.get("answer")
    if answer:
        return str(answer)
    if r.get("locus") is not None:
        return Answer.LOCUS
    return Answer.UNDECIDED if r.get("truncated") else Answer.NO_CAUSE


def _candidate(r: Mapping[str, Any]) -> str:
    c = r.get("candidate")
    if c is None:
        return "No step had been tested yet."
    s: Mapping[str, Any] = next((x for x in r.get("steps") or [] if x.get("step") == c), {})
    if not s.get("tested") or s.get("effect") is None:
        return (f"The candidate is step {c}, chosen from the arms run so far; its own test had "
                "not run.")
    return (f"The candidate is step {c}: rescue so far {_fmt(s.get('effect'))}, interval "
            f"{_ci(s.get('ci'))} from {s.get('n')} pair(s).")


def _contrastive_verdict(r: Mapping[str, Any], run: Trajectory | None) -> dict[str, Any]:
    locus = r.get("locus")
    family = _pct(1 - float(r["alpha"])) if r.get("alpha") is not None else "—"
    answer = _answer(r)
    note = _failure_note(r)
    if answer == Answer.UNDECIDED:
        why = (f"the budget ran out before the answer was decided ({r.get('budget_note')})"
               if r.get("truncated") else "branches failed, so no cause cannot be claimed")
        return {"found": False, "answer": "Answer: undecided",
                "headline": "Undecided: " + why,
                "detail": _candidate(r) + (f" {r['reason']}" if r.get("reason") else ""),
                "note": note,
                "action": "To continue, resume with a larger budget: "
                          + _continue(r, "contrastive", r.get("rollout_budget")
                                      or r.get("rollouts_used"))}
    if locus is None:
        return {"found": False, "answer": "Answer: no cause",
                "headline": "No cause: no step could be blamed.",
                "detail": r.get("reason") or "no step's rescue interval excludes zero",
                "note": note, "action": ""}
    step: Mapping[str, Any] = next(
        (s for s in r.get("steps") or [] if s.get("step") == locus), {})
    action = ""
    if run is not None and 0 <= locus < len(run.steps):
        action = _clip(compact(run.steps[locus].action))
    return {"found": True, "answer": "Answer: locus",
            "headline": (f"Step {locus} is where this run committed to failure"
                         + _decided_by(run, locus)),
            "detail": (f"re-drawing step {locus} (earlier steps held as recorded) lowers "
                       f"P(failure) by {_fmt(step.get('effect'))}, interval "
                       f"{_ci(step.get('ci'))} at {_pct(r.get('level'))} each "
                       f"({r.get('correction', 'bonferroni')}, "
                       f"{r.get('tests', '?')} tested step(s), "
                       f"{family} family-wise)."),
            "note": note, "action": action}


def _decided_by(run: Trajectory | None, k: int) -> str:
    """`` (decided by model, its 2nd decision)`` for a step whose agent the run names, else
    nothing: the label whole read "(model, step 1 (its 2nd decision))" after "Step 1"."""
    found = label_parts(step_label(run, k), k) if run is not None else None
    return f" (decided by {found[0]}, {found[1]})" if found else ""


def _value_label(v: Mapping[str, Any]) -> str:
    return str(v.get("label") or f"step {v.get('step')}")


def _cap(text: str) -> str:
    """The first letter upper case, the rest as written (an agent's name keeps its case)."""
    return text[:1].upper() + text[1:]


def _joined(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def shapley_leaders(values: Sequence[Mapping[str, Any]]) -> tuple[str, list[Mapping[str, Any]]]:
    """``formatting.shapley_leaders`` on stored values: one rule for every surface."""
    return fmt.shapley_leaders(values)


def _shapley_verdict(r: Mapping[str, Any]) -> dict[str, Any]:
    note = _failure_note(r)
    if r.get("truncated"):
        cut = (f"Truncated ({r.get('budget_note')}): the values are from what was measured. "
               "To continue, resume with a larger budget: "
               + _continue(r, "shapley", r.get("budget")))
        note = f"{cut} {note}".strip()
    answer = "Answer: Shapley values" + (" (truncated)" if r.get("truncated") else "")
    values = [v for v in r.get("values") or [] if v.get("estimate") is not None]
    if not values:
        return {"found": False, "answer": answer,
                "headline": "No Shapley values could be estimated.",
                "detail": r.get("reason") or "", "note": note, "action": ""}
    kind, leaders = shapley_leaders(values)
    top = leaders[0]
    level = _pct(r.get("level"))
    total = (f"all steps together account for {_fmt(r.get('total'))} of the failure "
             "probability.")
    names = [_value_label(v) for v in leaders]
    each = "; ".join(f"{_value_label(v)} {_fmt(v['estimate'])} {_ci(v.get('ci'))}"
                     for v in leaders)
    if kind == "equal":
        who = _joined(names) if len(names) <= 3 else f"{len(names)} steps"
        headline = _cap(f"{who} tie for the largest share of the blame")
        detail = (f"Shapley value {_fmt(top['estimate'])} each ({each} at {level}): no one "
                  f"of them carries more than the others; {total}")
    elif kind == "overlap":
        some = "either" if len(names) == 2 else "any of them"
        who = _joined(names) if len(names) <= 3 else f"{len(names)} steps"  # all in the detail
        headline = _cap(f"{who} cannot be told apart: {some} may carry the largest share of "
                        "the blame")
        detail = (f"Shapley values {each} at {level}: the intervals overlap, so this budget "
                  f"does not rank them; {total}")
    else:
        headline = _cap(f"{names[0]} carries the largest share of the blame")
        detail = (f"Shapley value {_fmt(top['estimate'])}, interval {_ci(top.get('ci'))} at "
                  f"{level}, above every other step's interval; {total}")
    return {"found": top["estimate"] > 0, "answer": answer, "headline": headline,
            "detail": detail, "note": note, "action": ""}


def _arm_outcomes(branches: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Counts of branch outcomes per arm, from the stored branches of an attribution."""
    if not branches:
        return []
    by_arm: dict[str, list[float]] = {}
    for b in branches:
        if b.get("outcome") is None:
            continue
        by_arm.setdefault(str(b.get("arm")), []).append(float(b["outcome"]))
    rows = []
    def natural(arm: str) -> list[Any]:  # hold<2 before hold<10
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", arm)]

    for arm, vals in sorted(by_arm.items(), key=lambda kv: natural(kv[0])):
        fails = sum(1 for v in vals if is_failure(v))
        rows.append({"arm": arm, "n": len(vals), "fail": fails, "ok": len(vals) - fails,
                     "mean": _fmt(sum(vals) / len(vals)),
                     "fail_pct": round(100 * fails / len(vals), 1)})
    return rows
