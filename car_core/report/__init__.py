"""The attribution report: one self-contained HTML file (no CDN, no script, inline SVG plots).

Everything an agent wrote (actions, observations, contexts, tool output) is hostile input: a
transcript may carry HTML and script from a prompt injection. Every value reaches the page
through a Jinja2 template with autoescaping on, nothing is marked safe, and the page carries a
Content-Security-Policy that forbids scripts, so even a missed escape could not run anything,
and forbids a ``<base>`` (relative links re-pointed) and form targets. ``frame-ancestors`` is not
in it: a policy in a ``<meta>`` element cannot carry it (browsers ignore it there and log an
error), and a file opened from disk has no HTTP header to carry it instead.

``render_attribution(result, run=None, branches=None)`` takes a contrastive or Shapley result
(the object or its ``to_dict()``); ``render_run(run)`` draws a run on its own.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import jinja2

from car_core import formatting as fmt
from car_core.assertions import agent_of
from car_core.errors import InvalidInput
from car_core.model.budget import budget_call, larger_budget
from car_core.model.trajectory import Trajectory, is_failure, step_label
from car_core.model.vocabulary import Answer, Origin
from car_core.report.context import context_panels
from car_core.report.plots import arms_plot, rescue_plot, shapley_plot
from car_core.results import result_from_dict
from car_core.secrets.redact import redact, redact_json

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("car_core.report", "templates"),
    autoescape=True,  # unconditional: every variable is escaped, whatever the template's name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)

RECENT = 6  # earlier context items (and identical diff lines) shown before folding the rest


# -- text of agent values ------------------------------------------------------------------
def show(value: Any) -> str:
    """A readable rendering of a JSON value: chat messages as ``[role] text``, strings as is,
    anything else as indented JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if _is_message(value):
        return _message_text(value)
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        return "\n".join(_message_text(m) for m in value)
    one_line = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(one_line) <= 100:
        return one_line
    return json.dumps(value, indent=2, ensure_ascii=False)


def compact(value: Any) -> str:
    """One line per value, for diffs and summaries."""
    if isinstance(value, str):
        return value.replace("\n", " ⏎ ")
    if _is_message(value) or (isinstance(value, list) and value
                              and all(_is_message(m) for m in value)):
        return show(value).replace("\n", " ⏎ ")
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str)


def _message_text(msg: Mapping[str, Any]) -> str:
    role = msg.get("role")
    name = msg.get("name")
    head = f"[{role}{' ' + str(name) if name and role == 'tool' else ''}]"
    parts = []
    content = msg.get("content")
    if isinstance(content, list):  # multi-part content: keep the text parts
        content = " ".join(str(p.get("text", p)) if isinstance(p, dict) else str(p)
                           for p in content)
    if content:
        parts.append(str(content))
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f"→ {fn.get('name', '?')}({fn.get('arguments', '')})")
    return f"{head} {' '.join(parts) if parts else '(empty)'}"


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- inputs ----------------------------------------------------------------------------------
def _as_dict(result: Any) -> dict[str, Any]:
    if isinstance(result, Mapping):
        return dict(result)
    to_dict = getattr(result, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise InvalidInput(f"cannot render a {type(result).__name__} as an attribution",
                       hint="pass a contrastive/Shapley result or its to_dict()")


def _as_run(run: Any) -> Trajectory | None:
    if run is None or isinstance(run, Trajectory):
        return run
    if isinstance(run, Mapping):
        return Trajectory.from_dict(dict(run), verify=False)
    raise InvalidInput(f"run must be a car.Trajectory or its dict, not {type(run).__name__}")


def _fmt(x: Any, digits: int = 2) -> str:
    return fmt.num(x, digits)


def _ci(ci: Any) -> str:
    return fmt.interval(ci)


def _pct(level: Any) -> str:
    return fmt.pct(level)


def _step_cells(s: Mapping[str, Any]) -> dict[str, str]:
    """A rescue-table row in the words and digits of every other surface
    (``formatting.shown_sample``): held and re-drawn are of the sample the rescue and its
    interval were computed from, so the row's three numbers agree."""
    held, redrawn, n = fmt.shown_sample(SimpleNamespace(
        estimate=s.get("estimate", "raw"), refit_held=s.get("refit_held"),
        refit_resampled=s.get("refit_resampled"), refit_n=s.get("refit_n", 0),
        fail_held=s.get("fail_held"), fail_resampled=s.get("fail_resampled"),
        n=s.get("n", 0) or 0))
    return {"rescue": fmt.effect(s.get("effect")), "ci": fmt.effect_interval(s.get("ci")),
            "held": fmt.prob(held), "redrawn": fmt.prob(redrawn),
            "n": str(n)}


# -- the run ---------------------------------------------------------------------------------
def _timeline(run: Trajectory, locus: int | None) -> list[dict[str, Any]]:
    items = []
    for s in run.steps:
        items.append({
            "index": s.index, "locus": s.index == locus,
            "origin": s.meta.get("origin", Origin.RECORD) if run.lineage else Origin.RECORD,
            "model": s.meta.get("model"),
            "who": step_label(run, s.index) if s.meta.get("agent") else None,
            "node": s.meta.get("node"),
            "prompt": show(" ".join(_message_text(m) for m in s.meta["prompt"]
                                    if isinstance(m, Mapping)))
            if isinstance(s.meta.get("prompt"), list) else None,
            "action": show(s.action), "observation": show(s.observation) if s.observed else None,
            "state": show(s.state) if s.state is not None else None,
            **_cost(s.meta),
        })
    return items


def _cost(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A step's latency and tokens as its recorder stored them (``latency_s``, ``usage``), each
    None when it did not."""
    latency = meta.get("latency_s")
    usage = meta.get("usage") if isinstance(meta.get("usage"), Mapping) else None
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) \
            or not math.isfinite(latency) or latency < 0:
        latency = None

    def count(key: str) -> int | None:
        v = (usage or {}).get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return {"latency": None if latency is None else float(latency),
            "prompt_tokens": count("prompt_tokens"),
            "completion_tokens": count("completion_tokens")}


def seconds(x: float | None) -> str:
    """A latency for people: milliseconds under a second, else seconds; ``—`` when absent."""
    if x is None:
        return fmt.MISSING
    if x < 0.01:
        return f"{x * 1000:.1f} ms"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _costs(timeline: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-step latency and token table, with totals over the steps that recorded them."""
    if not timeline:
        return {}

    def total(key: str) -> Any:
        vals = [t[key] for t in timeline if t[key] is not None]
        return sum(vals) if vals else None

    recorded = any(t[k] is not None for t in timeline
                   for k in ("latency", "prompt_tokens", "completion_tokens"))
    return {"recorded": recorded, "latency": seconds(total("latency")),
            "prompt_tokens": total("prompt_tokens"),
            "completion_tokens": total("completion_tokens")}


def _decided_from(run: Trajectory, k: int) -> dict[str, Any]:
    """The exact state ``s_k``: the recorded messages when the agent kept them, else the run's
    context and every earlier step (which is exactly what a FunctionAgent policy receives)."""
    step = run.steps[k]
    if step.state is not None:
        if isinstance(step.state, list) and all(_is_message(m) for m in step.state):
            msgs = [{"role": _role_class(m.get("role")), "text": _message_text(m)}
                    for m in step.state]
            return {"messages": msgs[-RECENT:], "folded_messages": msgs[:-RECENT],
                    "context": None, "prior": [], "folded": []}
        return {"messages": None, "folded_messages": [], "context": show(step.state),
                "prior": [], "folded": []}
    prior = [{"index": p.index, "action": show(p.action),
              "observation": show(p.observation) if p.observed else None}
             for p in run.steps[:k]]
    return {"messages": None, "folded_messages": [], "context": show(run.context),
            "prior": prior[-RECENT:], "folded": prior[:-RECENT]}


ROLE_CLASSES = ("system", "user", "assistant", "tool")


def _role_class(role: Any) -> str:
    """The style a message's role gets: one of the four chat roles, else ``other``. The role
    is the agent's text, so it never becomes a class name of its own (``system tag locus``
    would otherwise be styled as the locus)."""
    return role if role in ROLE_CLASSES else "other"


def _diff_lines(run: Trajectory | Mapping[str, Any]) -> list[str]:
    data = run.to_dict() if isinstance(run, Trajectory) else dict(run)
    lines = []
    for s in data.get("steps") or []:
        lines.append(f"step {s['index']} action: {compact(s.get('action'))}")
        if s.get("observed"):
            lines.append(f"step {s['index']} observation: {compact(s.get('observation'))}")
    out = data.get("outcome")
    if out:
        lines.append(f"outcome: {_fmt(out.get('value'))}")
    return lines


def _diff(factual: Trajectory | Mapping[str, Any], branch: Mapping[str, Any]
          ) -> list[dict[str, Any]]:
    """Side-by-side rows (left = factual, right = counterfactual) from difflib opcodes."""
    a, b = _diff_lines(factual), _diff_lines(branch)
    rows: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        left, right = a[i1:i2], b[j1:j2]
        chunk: list[dict[str, Any]] = [{"tag": tag, "left": left[i] if i < len(left) else "",
                  "right": right[i] if i < len(right) else ""}
                 for i in range(max(len(left), len(right)))]
        keep = RECENT // 2
        if tag == "equal" and len(chunk) > RECENT:
            # Long identical stretches (the held prefix) fold away, keeping a few lines of
            # context on each side of a change.
            head = chunk[:keep] if rows else []
            tail = chunk[-keep:]
            hidden = chunk[len(head):len(chunk) - keep]
            chunk = [*head, {"tag": "fold", "rows": hidden, "left": "", "right": ""}, *tail]
        rows.extend(chunk)
    return rows


# -- verdicts ----------------------------------------------------------------------------------
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
    return (f"car attribute {r.get('run_id')} --agent MODULE:FACTORY --method {method}{flag} "
            f"--store STORE --resume {aid}")


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
        return f"The candidate is step {c}, not yet measured."
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
                         + (f" ({step_label(run, locus)})" if run is not None
                            and step_label(run, locus) != f"step {locus}" else "")),
            "detail": (f"re-drawing step {locus} (earlier steps held as recorded) lowers "
                       f"P(failure) by {_fmt(step.get('effect'))}, interval "
                       f"{_ci(step.get('ci'))} at {_pct(r.get('level'))} each "
                       f"({r.get('correction', 'bonferroni')}, "
                       f"{r.get('tests', '?')} tested step(s), "
                       f"{family} family-wise)."),
            "note": note, "action": action}


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


# -- entry points ------------------------------------------------------------------------------
def render_attribution(result: Any, run: Any = None,
                       branches: Iterable[Mapping[str, Any]] | None = None,
                       choice: str | None = None, home: str | None = None,
                       what: Any = None, fixes: Any = None) -> str:
    """The full HTML report of a contrastive or Shapley attribution (secrets redacted);
    ``choice`` says which stored attribution the page shows and how to pick another, ``home``
    is the relative link back to the index that lists it (our own file name, never agent
    text); ``what`` and ``fixes`` (a context attribution, a repair ranking) add their panels."""
    r = redact_json(_as_dict(result))
    method = r.get("method")
    if method not in ("contrastive", "shapley"):
        raise InvalidInput(f"unknown attribution method {method!r}",
                           hint="render the to_dict() of car.contrastive or car.shapley")
    traj = _as_run(run)
    ctx: dict[str, Any] = {"r": r, "method": method, "fmt": _fmt, "ci": _ci, "pct": _pct,
                           "cells": _step_cells, "run": _run_summary(traj), "timeline": [],
                           "locus_view": None,
                           "diff": [], "rescue": {}, "arms": {}, "shapley": {},
                           "arm_outcomes": _arm_outcomes(branches), "steps": [],
                           "values": [], "efficiency": None, "choice": choice,
                           "costs": {}, "seconds": seconds, "home": home,
                           **context_panels(what, fixes)}
    locus = r.get("locus") if method == "contrastive" else None
    if traj is not None:
        ctx["timeline"] = _timeline(traj, locus)
        ctx["costs"] = _costs(ctx["timeline"])
    if method == "contrastive":
        ctx["verdict"] = _contrastive_verdict(r, traj)
        ctx["steps"] = r.get("steps") or []
        ctx["rescue"] = rescue_plot(ctx["steps"], locus)
        ctx["arms"] = arms_plot(r.get("arms") or [], len(traj.steps) if traj else None)
        if locus is not None and traj is not None and 0 <= locus < len(traj.steps):
            ctx["locus_view"] = _decided_from(traj, locus)
        example = r.get("example_branch")
        if example:
            factual = traj if traj is not None else None
            ctx["diff"] = _diff(factual, example) if factual is not None else \
                [{"tag": "insert", "left": "", "right": line} for line in _diff_lines(example)]
    else:
        ctx["verdict"] = _shapley_verdict(r)
        ctx["values"] = r.get("values") or []
        ctx["shapley"] = shapley_plot(ctx["values"])
        vf, ve = r.get("v_full") or {}, r.get("v_empty") or {}
        if vf and ve:
            ctx["efficiency"] = {"total": r.get("total"), "v_full": vf, "v_empty": ve,
                                 "target": (vf.get("mean") or 0) - (ve.get("mean") or 0),
                                 "gap": r.get("efficiency_gap")}
    _plain_first(ctx, r, traj)
    return redact(_ENV.get_template("report.html.j2").render(**ctx))


def _plain_first(ctx: dict[str, Any], r: dict[str, Any], traj: Trajectory | None) -> None:
    """The report opens with the plain sentence every surface opens with
    (``formatting.answer``); the method's words (test, level, sample sizes, pairing) go to
    "How this was measured", complete (``explain``)."""
    typed = result_from_dict(r)
    if not typed.actions and traj is not None:  # stored before results kept them
        typed = replace(typed, actions=fmt.step_actions(traj))
    step = getattr(typed, "locus", None)
    if step is None:
        step = getattr(typed, "candidate", None)
    who = agent_of(traj, step) if traj is not None and step is not None else None
    verdict = ctx["verdict"]
    verdict["measured"] = verdict.pop("detail", "")
    if r.get("method") == "contrastive":  # the Shapley verdict is in plain words already
        verdict["plain"] = fmt.answer(typed, who)
    ctx["explain"] = typed.explain(who)


def render_run(run: Any, home: str | None = None, what: Any = None, fixes: Any = None) -> str:
    """A run on its own: header and timeline (used when no attribution exists yet), with the
    ``what`` and ``fixes`` panels when given."""
    traj = _as_run(run)
    if traj is None:
        raise InvalidInput("render_run needs a run", hint="pass a car.Trajectory")
    timeline = _timeline(traj, None)
    return redact(_ENV.get_template("report.html.j2").render(
        r={}, method="run", fmt=_fmt, ci=_ci, pct=_pct, cells=_step_cells, run=_run_summary(traj),
        timeline=timeline, costs=_costs(timeline), seconds=seconds, home=home,
        locus_view=None, diff=[],
        rescue={}, arms={},
        shapley={}, arm_outcomes=[], steps=[], values=[], efficiency=None, choice=None,
        **context_panels(what, fixes),
        verdict={"found": False, "answer": "", "note": "", "headline": f"Run {traj.id}",
                 "detail": "No attribution yet: run `car attribute` to find the step that "
                           "caused the failure.", "action": ""}))


def _run_summary(run: Trajectory | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"id": run.id, "agent": run.agent, "status": run.status, "seed": run.seed,
            "n_steps": len(run.steps),
            "outcome": _fmt(run.outcome.value) if run.outcome else "—",
            "failed": run.failed, "context": show(run.context),
            "test": str((run.meta or {}).get("test") or "")}


__all__ = ["compact", "render_attribution", "render_run", "show"]
