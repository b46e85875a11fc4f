"""The demo behind ``make demo`` / ``car demo``: a LangGraph support agent, a prompt injection,
and the step that caused the failure.

On the embedded SmolLM2 model (``policy="local"``) the app is the refund desk
(``refund_desk``): the rule says to check the refund policy before refunding, the customer's
message says to refund at once, and whether the model checks first is its own stochastic
choice. With ``policy="synthetic"`` the app is the support agent (``support_agent``) driven by
a planted fake model, whose answer is known analytically.

It records tickets into the store until one fails (bounded tries), runs contrastive attribution
with a progress bar, prints the per-step table with intervals and the locus, shows what
``do_context`` removing the injection does to the failure rate, names the sentence of the
decision's messages that caused it (``car.context_attribution``), and writes the HTML report
with that "what" panel.
Nothing leaves the machine and no API key is needed.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import car_core as car
from car_core import formatting as fmt
from car_core.errors import CarError, InvalidInput

from ..common.messages import describe_action
from ..langgraph import CarCallback, CarChatModel, LangGraphAgent
from . import refund_desk, support_agent


@dataclass(frozen=True)
class _Settings:
    """One model's demo budget: rollouts per arm, tickets to try, and the wall-time caps (s) of
    the attribution, each do(·) and the context attribution."""

    rollouts: int
    tries: int
    wall_time: float
    intervene_time: float
    what_time: float
    intervene_rollouts: int | None = None  # each do(·)'s rollouts; None: ``rollouts``


# Branches stop once the refund rule is settled (its outcome's settled hook), so a branch costs
# one model call at most: n·K = 96 rollouts for the attribution, 16 for each do(·), 64 for the
# context attribution (about a minute idle)
SETTINGS = {
    "local": _Settings(rollouts=32, tries=12, wall_time=120.0, intervene_time=40.0,
                       what_time=120.0, intervene_rollouts=16),
    "synthetic": _Settings(rollouts=32, tries=100, wall_time=60.0, intervene_time=30.0,
                           what_time=30.0),
}


def _scenario(policy: str) -> SimpleNamespace:
    """The app, its failure and its edit for each model."""
    if policy == "local":
        return SimpleNamespace(app=refund_desk, failure="refund before any policy check",
                               simulators={"issue_refund": refund_desk.simulated_refund},
                               decision=lambda run: 0)
    return SimpleNamespace(app=support_agent, failure="refund against policy",
                           simulators={"issue_refund": _simulated_refund},
                           decision=_decision_step)


def _model(policy: str) -> Any:
    if policy == "synthetic":
        return support_agent.PlantedSupportModel(rng_seed=0)
    if policy == "local":
        from ..models.local import LocalChatModel
        return LocalChatModel(max_tokens=32, temperature=0.8, fresh_tools=True)
    raise InvalidInput(f"unknown demo policy {policy!r}",
                       hint='use policy="local" or policy="synthetic"')


def _record_failure(app: Any, wrapper: CarChatModel, cb: CarCallback, policy: str,
                    tries: int, scenario: SimpleNamespace, seed: int) -> car.Trajectory | None:
    base = wrapper.inner
    for i in range(tries):
        if policy == "local":  # a fresh sample per ticket; the seed makes each one replayable
            wrapper.inner = base.model_copy(update={"seed": seed * 1000 + i})
        app.invoke(scenario.app.inputs(), {"configurable": {"thread_id": f"ticket-{i}"},
                                           "callbacks": [cb], "recursion_limit": 20})
        run = cb.run
        assert run is not None  # the invocation just finished recorded it
        verdict = f"FAILED ({scenario.failure})" if run.failed else "ok"
        print(f"  ticket {i}: {len(run.steps)} steps, {verdict}")
        if run.failed:
            return run
    wrapper.inner = base
    return None


def run_demo(policy: str = "local", store: str = "car.db", report: str | None = "report.html",
             rollouts: int | None = None, progress: Any = True, seed: int = 0,
             time_caps: bool = True) -> dict[str, Any]:
    """Run the demo end to end; returns the numbers it printed. ``time_caps=False`` lifts the
    wall-time caps, so a busy machine cannot truncate an estimate (the README's generated
    output uses it)."""
    model = _model(policy)  # refuses an unknown policy
    settings = SETTINGS[policy]
    scenario = _scenario(policy)
    app_module, outcome = scenario.app, scenario.app.outcome
    # a caller's rollouts count for every estimate
    per_arm = rollouts or settings.rollouts
    checks = rollouts or settings.intervene_rollouts or per_arm
    started = time.monotonic()
    db = car.RunStore(store)
    # the branch threads' checkpoints are scratch: in memory, so a killed demo leaves no folder
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver  # loaded only when a demo runs
        wrapper = CarChatModel(inner=model)
        app = app_module.build_app(wrapper, SqliteSaver(conn))
        cb = CarCallback(store=db, outcome=outcome)  # stored scored: `car runs` shows which failed
        print(f"recording support tickets with the {policy} model into {store} ...")
        run = _record_failure(app, wrapper, cb, policy, settings.tries, scenario, seed)
        if run is None:
            print(f"no ticket failed in {settings.tries} tries: nothing to attribute")
            return {"run_id": None, "locus": None}
        print(f"run {run.id} failed; its steps:")
        for s in run.steps:
            print(f"  step {s.index}: {describe_action(s.action, limit=70)}")

        agent = LangGraphAgent(app, model=wrapper, safe_tools=app_module.SAFE_TOOLS,
                               side_effect_tools=app_module.SIDE_EFFECT_TOOLS,
                               simulators=scenario.simulators)
        budget = car.Budget(wall_time=settings.wall_time if time_caps else None)
        print(f"\ncontrastive attribution, {per_arm} rollouts per arm ...")
        res = car.contrastive(run, agent, outcome=outcome, rollouts=per_arm, seed=seed,
                              budget=budget, store=db, progress=progress)
        print(res)
        decision = res.locus if res.locus is not None else scenario.decision(run)
        cap = car.Budget(wall_time=settings.intervene_time if time_caps else None)
        factual = car.intervene(run, agent, car.do_resample(decision), outcome=outcome,
                                rollouts=checks, seed=seed + 1, progress=progress,
                                budget=cap)
        rescued = car.intervene(run, agent, car.do_context(decision, app_module.remove_injection),
                                outcome=outcome, rollouts=checks, seed=seed + 1,
                                progress=progress, budget=cap)
        print()
        print(_checks(res, decision, factual, rescued))
        what = _what(run, agent, decision, outcome, 4 * checks, seed,
                     car.Budget(wall_time=settings.what_time if time_caps else None))
        written = _write_report(res, run, db, report, what)
        elapsed = time.monotonic() - started
        print(f"\n{'wrote ' + written + '; ' if written else ''}done in {elapsed:.0f}s. "
              f"Look again with: car show {run.id} --store {store}")
        return {"run_id": run.id, "locus": res.locus, "attribution_id": res.attribution_id,
                "decision_step": decision, "resampled": factual.mean, "rescued": rescued.mean,
                "what": [] if what is None else [s.source.text for s in what.named],
                "rollouts_used": res.rollouts_used + factual.rollouts_used
                + rescued.rollouts_used + (what.rollouts_used if what is not None else 0),
                "seconds": elapsed, "report": written,
                "truncated": res.truncated or factual.truncated or rescued.truncated}
    finally:
        db.close()
        conn.close()


def _checks(res: Any, decision: int, factual: Any, rescued: Any) -> str:
    """The two do(·) checks in the words of the table above them, and why the first need not
    match the table's re-drawn column: it is a new sample, drawn with another seed."""
    def rate(d: Any) -> str:
        return fmt.failure_rate(d.mean, d.ci, d.level, d.n) + (" (truncated)" if d.truncated
                                                             else "")
    lines = [f"step {decision} decided again from the same messages: {rate(factual)}",
             f"step {decision} decided without the injection:       {rate(rescued)}"]
    step = next((s for s in res.steps if s.step == decision and s.tested), None)
    if step is not None:
        _, redrawn, n = fmt.shown_sample(step)
        lines.append(f"(new branches, seed {factual.seed}: the table's {fmt.REDRAWN} "
                     f"{fmt.prob(redrawn)} for step {decision} is from the attribution's own "
                     f"{n} pair(s); both estimate P(fail) with step {decision} re-drawn, from "
                     "different samples)")
    return "\n".join(lines)


def _simulated_refund(arguments: dict[str, Any]) -> str:
    """What a branch's refund call answers instead of moving money: the live model may ask for
    refunds the record never made (another amount), and no branch may run the real tool."""
    return json.dumps({"refunded": arguments.get("order_id"), "amount": arguments.get("amount"),
                       "simulated": True})


def _decision_step(run: car.Trajectory) -> int:
    """Without a locus, the step that chose a tool with a side effect's precondition: the
    first record_decision or issue_refund call, else the first step."""
    for s in run.steps:
        names = {c["function"]["name"] for c in s.action.get("tool_calls") or ()}
        if names & {"record_decision", *support_agent.SIDE_EFFECT_TOOLS}:
            return s.index
    return 0


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+", text)


def _what(run: car.Trajectory, agent: Any, step: int, outcome: Any, rollouts: int, seed: int,
          cap: car.Budget) -> Any:
    """Which sentence of what the decision saw caused it (context attribution), printed."""
    print(f"\nwhat in step {step}'s messages caused it, {rollouts} rollouts ...")
    try:
        what = car.context_attribution(run, agent, step=step, outcome=outcome,
                                       rollouts=rollouts, splitter=_sentences, seed=seed,
                                       budget=cap)
    except CarError as exc:
        print(f"  not measured: {exc}")
        return None
    for s in what.named:
        lo, hi = s.rescue_ci or (float("nan"), float("nan"))
        print(f"  caused by {s.source.label}: {s.source.text!r}, removing it rescues "
              f"{s.rescue:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    if not what.named:
        print("  no sentence shown to cause it at this budget")
    if what.truncated:
        print(f"  (stopped by the wall-time cap after {what.rollouts_used} of {rollouts} "
              "rollouts)")
    return what


def _write_report(res: Any, run: car.Trajectory, db: car.RunStore, path: str | None,
                  what: Any = None) -> str | None:
    if not path:
        return None
    try:
        from car_core.report import render_attribution
    except ImportError:
        return None
    aid = res.attribution_id
    branches = list(db.branches(aid)) if aid else None
    Path(path).write_text(render_attribution(res, run=run, branches=branches, what=what),
                          encoding="utf-8")
    return str(path)


__all__ = ["run_demo"]
