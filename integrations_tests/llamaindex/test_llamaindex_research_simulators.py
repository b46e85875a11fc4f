"""A guarded tool that writes ``ctx.store`` is simulable: LlamaIndex's multi-agent research app.

The app has the shape of LlamaIndex's own ``AgentWorkflow`` multi-agent example: a
ResearchAgent (``search_web``, ``record_notes``) hands off to a WriteAgent (``write_report``),
which hands off to a ReviewAgent (``review_report``); ``record_notes``, ``write_report`` and
``review_report`` take the workflow ``Context`` and write ``state`` in ``ctx.store``
(``research_notes``, ``report_content``, ``review``), from the example's ``initial_state``.
The deliverable ``write_report`` is a side effect (a ledger counts its real calls); its
simulator takes the ``Context`` and writes the report into the store as the tool does.

Planted truth: every decision is deterministic but the writer's, at step 3, which copies the
forum rumour from the notes into the report with probability 0.7 (two possible reports).
Failure = the report in the final store carries the rumour. Steps: 0 search, 1 notes,
2 handoff, 3 write_report, 4 handoff, 5 review_report, 6 reply. For the recorded run (it
failed), P(fail | factual) = 1, P(fail | do_resample(k)) = 0.7 for k <= 3 (each re-rolls the
writer) and 1 for k >= 4 (the report is written): the rescue is 0.3 at steps 0-3 and 0 after,
so the point of commitment (the latest step whose rescue is positive) is step 3.
"""

# No ``from __future__ import annotations``: LlamaIndex finds the ``ctx: Context`` parameter
# of a tool by its evaluated annotation, as in the docs' apps.
import asyncio
import json
import math
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM, final_state
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.workflow import Context

import car_core as car
from car_core.errors import AdapterError, SideEffectBlocked
from car_core.testing import SideEffectLedger

SOURCES = "Recall notice: the T-100 toner was recalled. Forum post: T-100 printers explode."
FACTS = "the T-100 toner was recalled"
RUMOUR = "T-100 printers explode"
NOTES = f"{FACTS}. Forum: {RUMOUR}."
REPORT_WITH_RUMOUR = f"# T-100 report\n\nThe toner was recalled; {RUMOUR}."
REPORT_FACTS = "# T-100 report\n\nThe toner was recalled."
P_RUMOUR = 0.7
INITIAL_STATE = {"research_notes": {}, "report_content": "Not written yet.",
                 "review": "Review required."}
ROLLOUTS = 64
# An arm with p = 0.7 over 64 rollouts has standard error sqrt(0.7 * 0.3 / 64) = 0.057; the
# tolerance is 4 of them. Arms with p = 1 are exact. Seeds are fixed: the runs are repeatable.
TOL = 4 * math.sqrt(P_RUMOUR * (1 - P_RUMOUR) / ROLLOUTS)


def run_async(start: Any) -> Any:
    """Run ``start()`` (which returns an awaitable) inside a fresh event loop."""
    async def main() -> Any:
        return await start()
    return asyncio.run(main())


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return assistant(None, [tool_call(cid, name, args)])


def research_decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    last = messages[-1]
    if last["role"] != "tool":
        return call("s0", "search_web", {"query": "T-100 printer safety"})
    if last.get("name") == "search_web":
        return call("n1", "record_notes", {"notes": NOTES, "notes_title": "T-100"})
    return call("h2", "handoff", {"to_agent": "WriteAgent",
                                  "reason": "The notes are recorded."})


def write_decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    last = messages[-1]
    if last["role"] == "tool" and last.get("name") == "write_report":
        return call("h4", "handoff", {"to_agent": "ReviewAgent",
                                      "reason": "The report is written."})
    report = REPORT_WITH_RUMOUR if rng.random() < P_RUMOUR else REPORT_FACTS
    return call("w3", "write_report", {"report_content": report})


def review_decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    if messages[-1]["role"] == "tool" and messages[-1].get("name") == "review_report":
        return "The report is approved."
    return call("r5", "review_report", {"review": "Approved as written."})


def rumour_published(run: car.Trajectory) -> bool:
    """The app's own rule, on the store its last step saw (``final_state``)."""
    store = final_state(run)["store"] or {}
    return RUMOUR in str(store.get("state", {}).get("report_content"))


class ResearchApp:
    """The example's three agents, tools and state, with a planted model per agent and a
    ledger on ``write_report`` (the deliverable)."""

    def __init__(self, ledger: SideEffectLedger) -> None:
        self.ledger = ledger

        async def search_web(query: str) -> str:
            """Useful for using the web to answer questions."""
            return SOURCES

        async def record_notes(ctx: Context, notes: str, notes_title: str) -> str:
            """Useful for recording notes on a given topic."""
            async with ctx.store.edit_state() as ctx_state:
                ctx_state["state"]["research_notes"][notes_title] = notes
            return "Notes recorded."

        async def write_report(ctx: Context, report_content: str) -> str:
            """Useful for writing a report on a given topic."""
            ledger.note("write_report", {"report_content": report_content})
            async with ctx.store.edit_state() as ctx_state:
                ctx_state["state"]["report_content"] = report_content
            return "Report written."

        async def review_report(ctx: Context, review: str) -> str:
            """Useful for reviewing a report and providing feedback."""
            async with ctx.store.edit_state() as ctx_state:
                ctx_state["state"]["review"] = review
            return "Report reviewed."

        self.llms = {"ResearchAgent": ScriptedLLM(research_decide),
                     "WriteAgent": ScriptedLLM(write_decide),
                     "ReviewAgent": ScriptedLLM(review_decide)}
        research = FunctionAgent(
            name="ResearchAgent", description="Searches the web and records notes.",
            system_prompt="You are the ResearchAgent. Search, record notes, then hand off.",
            llm=self.llms["ResearchAgent"], tools=[search_web, record_notes],
            can_handoff_to=["WriteAgent"])
        write = FunctionAgent(
            name="WriteAgent", description="Writes a markdown report from the notes.",
            system_prompt="You are the WriteAgent. Write the report, then get it reviewed.",
            llm=self.llms["WriteAgent"], tools=[write_report],
            can_handoff_to=["ReviewAgent", "ResearchAgent"])
        review = FunctionAgent(
            name="ReviewAgent", description="Reviews the report and gives feedback.",
            system_prompt="You are the ReviewAgent. Review the report and give feedback.",
            llm=self.llms["ReviewAgent"], tools=[review_report],
            can_handoff_to=["WriteAgent"])
        self.flow = AgentWorkflow(agents=[research, write, review], root_agent="ResearchAgent",
                                  initial_state=INITIAL_STATE)

    def calls(self) -> tuple[int, ...]:
        return tuple(llm.calls for llm in self.llms.values())

    def agent(self, **simulators: Any) -> LlamaIndexAgent:
        return LlamaIndexAgent(self.flow,
                               safe_tools=["search_web", "record_notes", "review_report"],
                               side_effect_tools=["write_report"], simulators=simulators)


async def simulate_write_report(arguments: dict[str, Any], ctx: Context) -> str:
    """``write_report`` without the delivery: the report goes into the store, as the tool
    puts it there."""
    async with ctx.store.edit_state() as ctx_state:
        ctx_state["state"]["report_content"] = arguments["report_content"]
    return "Report written."


def reports(run: car.Trajectory) -> list[str]:
    return [json.loads(c["function"]["arguments"])["report_content"] for s in run.steps
            for c in (s.action or {}).get("tool_calls") or ()
            if c["function"]["name"] == "write_report"]


@pytest.fixture
def ledger() -> SideEffectLedger:
    return SideEffectLedger(["write_report"])


@pytest.fixture
def recorded(ledger: SideEffectLedger) -> tuple[ResearchApp, car.Trajectory]:
    app = ResearchApp(ledger)
    rec = CarRecorder().attach()
    try:
        run_async(lambda: app.flow.run(
            user_msg="Write me a report on the T-100 printer's safety."))
    finally:
        rec.detach()
    run = rec.run
    assert [s.meta["agent"] for s in run.steps] == (
        ["ResearchAgent"] * 3 + ["WriteAgent"] * 2 + ["ReviewAgent"] * 2)
    assert reports(run) == [REPORT_WITH_RUMOUR], "the writer's own seed 0 draws 0.64 < 0.7"
    assert rumour_published(run)
    assert ledger.count() == 1          # the recorded run wrote its report for real, once
    ledger.reset()
    return app, run


def test_the_research_app_is_attributed_to_the_writer_with_no_real_write(
        recorded: Any, ledger: SideEffectLedger) -> None:
    app, run = recorded
    res = car.contrastive(run, app.agent(write_report=simulate_write_report),
                          outcome=rumour_published, rollouts=32, alpha=0.05, seed=0)
    assert res.locus == 3
    assert ledger.count() == 0


@pytest.mark.parametrize("k", [0, 3])
def test_resampling_up_to_the_writer_gives_the_planted_rate(recorded: Any,
                                                            ledger: SideEffectLedger,
                                                            k: int) -> None:
    """Both reports are written into the store on branches: the rumour one by replaying the
    recorded call's write (an identical call), the other by the simulator; without either
    the final store would say "Not written yet." and no branch would fail."""
    app, run = recorded
    dist = car.intervene(run, app.agent(write_report=simulate_write_report),
                         car.do_resample(k), outcome=rumour_published, rollouts=ROLLOUTS,
                         seed=1)
    assert abs(dist.mean - P_RUMOUR) <= TOL
    for branch in dist.trajectories:
        (report,) = reports(branch)
        assert final_state(branch)["store"]["state"]["report_content"] == report
        assert final_state(branch)["store"]["state"]["review"] == "Approved as written."
    assert {r for t in dist.trajectories for r in reports(t)} == {REPORT_WITH_RUMOUR,
                                                                  REPORT_FACTS}
    assert ledger.count() == 0


@pytest.mark.filterwarnings("ignore::car_adapters.common.messages.FreeTextMatchWarning")
def test_an_identical_call_replays_the_recorded_store_change(recorded: Any,
                                                             ledger: SideEffectLedger) -> None:
    """With no simulator at all, a branch that makes the recorded ``write_report`` call gets
    the recorded result and the recorded write: its store after that step is the record's."""
    app, run = recorded
    calls = app.calls()
    dist = car.intervene(run, app.agent(), car.do_action(3, run.steps[3].action),
                         outcome=rumour_published, rollouts=4, seed=0)
    assert dist.mean == 1.0
    for branch in dist.trajectories:
        assert [s.meta["store"] for s in branch.steps] == [s.meta["store"] for s in run.steps]
        assert branch.steps[3].observation == run.steps[3].observation
    assert ledger.count() == 0
    # the writer held, the branches' later agents decided live (2 + 2 calls each)
    assert app.calls() == (calls[0], calls[1] + 4, calls[2] + 8)


@pytest.mark.filterwarnings("ignore::car_adapters.common.messages.FreeTextMatchWarning")
def test_another_report_without_a_simulator_stops_the_branch(recorded: Any,
                                                             ledger: SideEffectLedger) -> None:
    app, run = recorded
    other = call("w3", "write_report", {"report_content": REPORT_FACTS})
    with pytest.raises(SideEffectBlocked, match=r"'write_report'.*not those of any recorded "
                                                r"call.*fn\(arguments, ctx\)"):
        car.intervene(run, app.agent(), car.do_action(3, other), outcome=rumour_published,
                      rollouts=1, seed=0)
    assert ledger.count() == 0
    dist = car.intervene(run, app.agent(write_report=simulate_write_report),
                         car.do_action(3, other), outcome=rumour_published, rollouts=2, seed=0)
    assert dist.mean == 0.0
    assert all(final_state(t)["store"]["state"]["report_content"] == REPORT_FACTS
               for t in dist.trajectories)
    assert ledger.count() == 0


def test_a_sync_simulator_taking_ctx_is_handed_the_context(recorded: Any,
                                                           ledger: SideEffectLedger) -> None:
    app, run = recorded
    seen: list[Any] = []

    def simulate(arguments: dict[str, Any], ctx: Context) -> str:
        seen.append(ctx)
        return "Report written (simulated)."

    other = call("w3", "write_report", {"report_content": REPORT_FACTS})
    branch = car.intervene(run, app.agent(write_report=simulate), car.do_action(3, other),
                           outcome=rumour_published, rollouts=1, seed=0).trajectories[0]
    assert len(seen) == 1 and isinstance(seen[0], Context)
    assert branch.steps[3].observation[0]["content"] == "Report written (simulated)."
    # it wrote nothing: the store keeps the recorded state from before the write
    assert branch.steps[4].meta["store"] == run.steps[3].meta["store"]
    assert ledger.count() == 0


def test_a_simulator_that_cannot_write_the_store_is_refused(recorded: Any) -> None:
    app, _ = recorded
    with pytest.raises(AdapterError, match=r"'write_report'.*takes the workflow Context, but "
                                           r"its simulator does not"):
        app.agent(write_report=lambda arguments: "Report written.")


def test_a_write_the_record_cannot_show_is_refused_before_any_branch(
        ledger: SideEffectLedger) -> None:
    """Two calls of a store-writing side-effect tool in one step: which wrote what cannot be
    told from the stores around the step, so without a simulator taking the ``Context`` the
    run is refused before any model call; with one, branches run."""
    async def publish(ctx: Context, channel: str) -> str:
        """Publish the report on a channel and note it in the store."""
        ledger.note("publish", {"channel": channel})
        async with ctx.store.edit_state() as ctx_state:
            ctx_state["published"] = [*ctx_state.get("published", []), channel]
        return f"published on {channel}"

    def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        if messages[-1]["role"] == "tool":
            return "Published."
        return assistant(None, [tool_call("p0", "publish", {"channel": "web"}),
                                tool_call("p1", "publish", {"channel": "mail"})])

    ledger = SideEffectLedger(["publish"])
    llm = ScriptedLLM(decide)
    agent = FunctionAgent(tools=[publish], llm=llm, system_prompt="Publish.")
    rec = CarRecorder().attach()
    try:
        run_async(lambda: agent.run(user_msg="Publish the report."))
    finally:
        rec.detach()
    run = rec.run
    assert ledger.count() == 2
    ledger.reset()
    calls = llm.calls
    with pytest.raises(AdapterError, match=r"'publish'.*takes the workflow Context.*at step 0 "
                                           r"wrote to ctx.store cannot be told") as err:
        car.intervene(run, LlamaIndexAgent(agent, side_effect_tools=["publish"]),
                      car.do_resample(1), outcome=lambda r: False, rollouts=1)
    assert err.value.step == 0 and llm.calls == calls

    async def simulate(arguments: dict[str, Any], ctx: Context) -> str:
        async with ctx.store.edit_state() as ctx_state:
            ctx_state["published"] = [*ctx_state.get("published", []), arguments["channel"]]
        return f"published on {arguments['channel']}"

    dist = car.intervene(run, LlamaIndexAgent(agent, side_effect_tools=["publish"],
                                              simulators={"publish": simulate}),
                         car.do_resample(0), outcome=lambda r: False, rollouts=2, seed=0)
    assert all(t.steps[1].meta["store"]["published"] == ["web", "mail"]
               for t in dist.trajectories)
    assert ledger.count() == 0
