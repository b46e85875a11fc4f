"""Branches of a stateful ``AgentWorkflow`` start from the workflow store the recorded step saw.

The app has the docs' research -> write shape: a research agent searches, records notes in
``ctx.store``'s ``state`` (``record_notes``) and hands off; a write agent's ``write_report``
reads the notes back from the store ("No research notes to write from." when there are none)
and ``publish_report`` publishes the result (a side effect, counted by a ledger). The planted
research model copies a forum rumour into its notes with probability 0.7 (step 1); every
other decision is deterministic. Failure = the published report carries the rumour. So,
analytically: P(fail | do_resample(0)) = P(fail | do_resample(1)) = 0.7, and for a recorded
run that failed P(fail | do_resample(k)) = 1 for every k >= 2, since the notes are already in
the store. A branch that started from ``initial_state`` would find no notes at step 3 and
publish nothing of the rumour: 0.
"""

# No ``from __future__ import annotations``: LlamaIndex finds the ``ctx: Context`` parameter
# of a tool by its evaluated annotation, as in the docs' apps.
import asyncio
import math
import threading
from dataclasses import replace
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from car_adapters.llamaindex import agent as li_agent
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.workflow import Context
from pydantic import BaseModel

import car_core as car
from car_core.errors import AdapterError, ConformanceFailure, InvalidIntervention
from car_core.testing import SideEffectLedger, check_held_state, run_conformance

SOURCES = "Source A: the T-100 toner was recalled. Forum post: T-100 printers explode."
FACTS = "the T-100 toner was recalled"
RUMOUR = "T-100 printers explode"
NO_NOTES = "No research notes to write from."
P_RUMOUR = 0.7
INITIAL_STATE = {"research_notes": {}, "report_content": "Not written yet."}
ROLLOUTS = 64
# An arm with p = 0.7 over 64 rollouts has standard error sqrt(0.7 * 0.3 / 64) = 0.057; the
# tolerance is 4 of them. Arms with p in {0, 1} are exact. Seeds are fixed: deterministic.
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
        return call("s0", "search_web", {"query": "T-100 printer"})
    if last.get("name") == "search_web":
        notes = f"{FACTS}; {RUMOUR}" if rng.random() < P_RUMOUR else FACTS
        return call("n1", "record_notes", {"notes": notes, "notes_title": "T-100"})
    return call("h2", "handoff", {"to_agent": "WriteAgent", "reason": "notes are recorded"})


def write_decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    last = messages[-1]
    if last["role"] == "tool" and last.get("name") == "write_report":
        return call("p4", "publish_report", {"report": last["content"]})
    if last["role"] == "tool" and last.get("name") == "publish_report":
        return "The report is published."
    return call("w3", "write_report", {})


def published_rumour(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "publish_report" and RUMOUR in c["function"]["arguments"]
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def tool_results(run: car.Trajectory, name: str) -> list[str]:
    return [m["content"] for s in run.steps for m in s.observation or ()
            if isinstance(m, dict) and m.get("name") == name]


class ResearchApp:
    """The research -> write ``AgentWorkflow``, with a ledger on ``publish_report``."""

    def __init__(self, ledger: SideEffectLedger, seed: int = 0) -> None:
        self.ledger = ledger

        def search_web(query: str) -> str:
            """Search the web."""
            return SOURCES

        async def record_notes(ctx: Context, notes: str, notes_title: str) -> str:
            """Record notes on a topic for the writer."""
            state = await ctx.store.get("state")
            state["research_notes"][notes_title] = notes
            await ctx.store.set("state", state)
            return "Notes recorded."

        async def write_report(ctx: Context) -> str:
            """Write the report from the recorded notes."""
            state = await ctx.store.get("state")
            if not state["research_notes"]:
                return NO_NOTES
            report = "Report: " + "; ".join(state["research_notes"].values())
            state["report_content"] = report
            await ctx.store.set("state", state)
            return report

        def publish_report(report: str) -> str:
            """Publish the report to every customer (a side effect)."""
            ledger.note("publish_report", {"report": report})
            return "published"

        self.research_llm = ScriptedLLM(research_decide, seed=seed)
        self.write_llm = ScriptedLLM(write_decide)
        research = FunctionAgent(name="ResearchAgent", description="researches a topic",
                                 system_prompt="Research, record notes, hand off.",
                                 tools=[search_web, record_notes], llm=self.research_llm,
                                 can_handoff_to=["WriteAgent"])
        write = FunctionAgent(name="WriteAgent", description="writes the report",
                              system_prompt="Write the report from the notes and publish it.",
                              tools=[write_report, publish_report], llm=self.write_llm)
        self.flow = AgentWorkflow(agents=[research, write], root_agent="ResearchAgent",
                                  initial_state=INITIAL_STATE)

    def agent(self) -> LlamaIndexAgent:
        # research and writing only touch the workflow's store: safe; publishing never runs
        return LlamaIndexAgent(self.flow, safe_tools=["search_web", "record_notes", "write_report"],
                               side_effect_tools=["publish_report"],
                               simulators={"publish_report": lambda args: "published (sim)"})


@pytest.fixture
def recorder() -> Any:
    rec = CarRecorder().attach()
    yield rec
    rec.detach()


@pytest.fixture
def ledger() -> SideEffectLedger:
    return SideEffectLedger(["publish_report"])


@pytest.fixture
def recorded(recorder: Any, ledger: SideEffectLedger) -> tuple[ResearchApp, car.Trajectory]:
    app = ResearchApp(ledger)
    run_async(lambda: app.flow.run(user_msg="Write a customer report on the T-100 printer."))
    run = recorder.run
    assert published_rumour(run), "seed 0 draws 0.64 < 0.7 at step 1, so the record fails"
    assert ledger.count() == 1          # the recorded run published for real, once
    ledger.reset()
    return app, run


def test_forcing_the_result_of_a_tool_that_writes_the_store_is_refused_by_name(
        recorded: Any, ledger: SideEffectLedger) -> None:
    """``record_notes`` takes the workflow Context and writes the notes to the store. Forcing
    its result (even the text it returned) serves that text without running it, so the notes
    would never reach the store and the writer would report from nothing: a full rescue from
    an intervention that changes nothing. It is refused by name before any model or tool
    runs; forcing the step's action instead runs the tool, and the branch is the record."""
    app, run = recorded
    calls = (app.research_llm.calls, app.write_llm.calls)
    with pytest.raises(InvalidIntervention, match=r"'record_notes'.*takes the workflow Context"):
        car.intervene(run, app.agent(), car.do_observation(1, "Notes recorded."),
                      outcome=published_rumour, rollouts=4, seed=0)
    assert (app.research_llm.calls, app.write_llm.calls) == calls
    dist = car.intervene(run, app.agent(), car.do_action(1, run.steps[1].action),
                         outcome=published_rumour, rollouts=4, seed=0)
    assert dist.mean == 1.0
    for branch in dist.trajectories:
        assert tool_results(branch, "write_report") == tool_results(run, "write_report")
    assert ledger.count() == 0


def test_each_step_records_the_store_it_decided_from(recorded: Any) -> None:
    _, run = recorded
    assert [s.meta["agent"] for s in run.steps] == ["ResearchAgent"] * 3 + ["WriteAgent"] * 3
    notes = {"T-100": f"{FACTS}; {RUMOUR}"}
    report = f"Report: {FACTS}; {RUMOUR}"
    assert [s.meta["store"] for s in run.steps] == [
        {"state": INITIAL_STATE}, {"state": INITIAL_STATE},
        *[{"state": {"research_notes": notes, "report_content": "Not written yet."}}] * 2,
        *[{"state": {"research_notes": notes, "report_content": report}}] * 2]
    assert tool_results(run, "write_report") == [report]


@pytest.mark.parametrize("k", range(2, 6))
def test_a_branch_after_the_notes_reads_them_from_the_store(recorded: Any,
                                                            ledger: SideEffectLedger,
                                                            k: int) -> None:
    app, run = recorded
    research_calls = app.research_llm.calls
    dist = car.intervene(run, app.agent(), car.do_resample(k), outcome=published_rumour,
                         rollouts=16, seed=0)
    assert dist.mean == 1.0                       # the notes were there: every branch fails
    for branch in dist.trajectories:
        assert tool_results(branch, "write_report") == tool_results(run, "write_report")
        assert branch.steps[k].meta["store"] == run.steps[k].meta["store"]
    # the held research steps asked nobody; at k = 2 the research agent decides the handoff
    assert app.research_llm.calls == research_calls + (16 if k == 2 else 0)
    assert ledger.count() == 0                    # publishing was answered from the record


@pytest.mark.parametrize("k", [0, 1])
def test_resampling_the_research_moves_the_failure_to_its_planted_rate(recorded: Any,
                                                                       ledger: SideEffectLedger,
                                                                       k: int) -> None:
    app, run = recorded
    dist = car.intervene(run, app.agent(), car.do_resample(k), outcome=published_rumour,
                         rollouts=ROLLOUTS, seed=1)
    assert abs(dist.mean - P_RUMOUR) <= TOL
    assert NO_NOTES not in {r for t in dist.trajectories for r in tool_results(t, "write_report")}
    assert ledger.count() == 0                    # a new report went to the simulator


def test_the_branch_sees_the_recorded_messages_at_every_step(recorded: Any) -> None:
    """Chat history and memory: a branch from each step, with the recorded actions forced from
    there on, decides every step from exactly the messages the record did (the state prompt
    the framework put on the first message included, not added a second time)."""
    app, run = recorded
    assert "Current state:" in run.steps[0].state[-1]["content"]
    agent = app.agent()
    for k in range(len(run.steps)):
        forced = [car.do_action(j, run.steps[j].action) for j in range(k, len(run.steps))]
        branch = car.intervene(run, agent, forced, outcome=published_rumour, rollouts=1,
                               seed=0).trajectories[0]
        assert [s.state for s in branch.steps] == [s.state for s in run.steps], k
        assert [s.meta["store"] for s in branch.steps] == [s.meta["store"] for s in run.steps]


def test_the_adapter_passes_the_conformance_suite_with_the_state_check(
        ledger: SideEffectLedger) -> None:
    """Recorded through CAR's noise (``context=``), so re-deciding the stochastic step with
    the record's noise must give the recorded action. The recording is a real run, so it
    publishes once for real; ``publish_report`` is guarded on every branch, which the suite's
    ledger check asserts for every check it runs (and once more on a branch from each step)."""
    ran = run_conformance(lambda: ResearchApp(ledger).agent(),
                          context="Write a customer report on the T-100 printer.",
                          outcome=published_rumour, seed=0, side_effects=ledger)
    assert ran == ["replay", "state", "lineage", "forced", "noise", "identity", "async",
                   "coupling", "fingerprint-in-process", "side-effects"]
    assert ledger.count() == 0  # reset before each check: what the last one's branches did


def test_the_state_check_fails_for_branches_that_start_from_initial_state(
        recorded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What branches did before the store was restored: the check names the step and the
    key, and the writer finds no notes."""
    app, run = recorded

    async def initial_state_only(ctx: Any, values: Any) -> None:
        return None

    monkeypatch.setattr(li_agent, "restore", initial_state_only)
    with pytest.raises(ConformanceFailure, match=r"step 2 from another framework state.*"
                                                 r"\['state'\]") as err:
        check_held_state(app.agent(), run)
    assert err.value.step == 2
    dist = car.intervene(run, app.agent(), car.do_resample(3), outcome=published_rumour,
                         rollouts=2, seed=0)
    assert dist.mean == 0.0
    assert all(tool_results(t, "write_report") == [NO_NOTES] for t in dist.trajectories)


class Ticket(BaseModel):
    """A pydantic value a tool keeps in ``ctx.store``."""

    number: int
    priority: str


def _decide_ticket(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    if messages[-1]["role"] != "tool":
        return call("t0", "open_ticket", {})
    if messages[-1].get("name") == "open_ticket":
        return call("t1", "read_priority", {})
    return "priority " + messages[-1]["content"]


async def open_ticket(ctx: Context) -> str:
    """Open ticket 7."""
    await ctx.store.set("ticket", Ticket(number=7, priority="high"))
    return "opened"


async def read_priority(ctx: Context) -> str:
    """Read the ticket's priority."""
    ticket = await ctx.store.get("ticket")
    return f"{type(ticket).__name__} {ticket.number}: {ticket.priority}"


def _ticket_desk() -> tuple[FunctionAgent, ScriptedLLM]:
    """An agent that keeps a ``Ticket`` in ``ctx.store`` and reads it back, and its LLM."""
    llm = ScriptedLLM(_decide_ticket)
    return FunctionAgent(tools=[open_ticket, read_priority], llm=llm,
                         system_prompt="Triage."), llm


def test_a_pydantic_value_in_the_store_comes_back_as_the_same_model(recorder: Any) -> None:
    agent, _ = _ticket_desk()
    run_async(lambda: agent.run(user_msg="go"))
    run = recorder.run
    assert tool_results(run, "read_priority") == ["Ticket 7: high"]
    dist = car.intervene(run, LlamaIndexAgent(agent, safe_tools=["open_ticket", "read_priority"]),
                         car.do_resample(1),
                         outcome=lambda r: False, rollouts=2, seed=0)
    assert all(tool_results(t, "read_priority") == ["Ticket 7: high"]
               for t in dist.trajectories)


def _as_if_from_main(run: car.Trajectory, cls: str) -> car.Trajectory:
    """``run`` as a script run as ``__main__`` records it: its store's classes under
    ``__main__.<cls>``."""
    def renamed(value: Any) -> Any:
        if isinstance(value, dict):
            out = {k: renamed(v) for k, v in value.items()}
            if "qualified_name" in out:
                out["qualified_name"] = f"__main__.{cls}"
            return out
        return [renamed(v) for v in value] if isinstance(value, list) else value
    steps = [replace(st, meta=renamed(st.meta), digest="") for st in run.steps]
    return car.Trajectory.new(context=run.context, steps=steps, agent=run.agent,
                              meta=dict(run.meta))


@pytest.mark.parametrize("cls", ["Ticket", "Missing"])
def test_a_store_class_recorded_under_main_is_found_in_the_app_or_refused(
        recorder: Any, cls: str) -> None:
    """Recorded by ``python my_app.py`` and attributed with ``--agent my_app:make``, the store
    names ``__main__.Ticket``: a user trial's branches raised "Attribute Order not found in
    module __main__" after eight had run. The class is found in the module the app's tools
    are defined in, or refused by name before any model call."""
    agent, llm = _ticket_desk()
    run_async(lambda: agent.run(user_msg="go"))
    run = _as_if_from_main(recorder.run, cls)
    branches = LlamaIndexAgent(agent, safe_tools=["open_ticket", "read_priority"])
    if cls == "Missing":
        calls = llm.calls
        with pytest.raises(AdapterError, match=r"__main__\.Missing.*no module of the app"):
            car.intervene(run, branches, car.do_resample(1), outcome=lambda r: False,
                          rollouts=2)
        assert llm.calls == calls
        return
    dist = car.intervene(run, branches, car.do_resample(1), outcome=lambda r: False,
                         rollouts=2, seed=0)
    assert all(tool_results(t, "read_priority") == ["Ticket 7: high"]
               for t in dist.trajectories)


def test_a_store_value_the_serializer_cannot_write_is_refused_by_name(recorder: Any) -> None:
    def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        return "done" if messages[-1]["role"] == "tool" else call("c0", "open_session", {})

    async def open_session(ctx: Context) -> str:
        """Open a session and keep it in the store."""
        await ctx.store.set("session", threading.Lock())
        return "open"

    llm = ScriptedLLM(decide)
    agent = FunctionAgent(tools=[open_session], llm=llm, system_prompt="Open a session.")
    run_async(lambda: agent.run(user_msg="go"))
    run = recorder.run
    assert run.steps[1].meta["store_unrestorable"] == ["session"]
    calls = llm.calls
    with pytest.raises(AdapterError, match=r"\['session'\].*cannot write") as err:
        car.intervene(run, LlamaIndexAgent(agent, safe_tools=["open_session"]),
                      car.do_resample(1), outcome=lambda r: False, rollouts=1)
    assert err.value.step == 1 and llm.calls == calls     # refused before any model call
    dist = car.intervene(run, LlamaIndexAgent(agent, safe_tools=["open_session"]),
                         car.do_resample(0), outcome=lambda r: False,
                         rollouts=1)   # step 0 came before the write
    assert dist.n == 1


def test_a_run_recorded_without_its_store_is_refused(recorded: Any) -> None:
    app, run = recorded
    steps = [replace(s, meta={k: v for k, v in s.meta.items() if k != "store"})
             for s in run.steps]
    old = car.Trajectory.new(context=run.context, steps=steps, agent=run.agent,
                             meta=dict(run.meta))
    with pytest.raises(AdapterError, match="recorded without its workflow store"):
        car.intervene(old, app.agent(), car.do_resample(3), outcome=published_rumour,
                      rollouts=1)
    # before the first step only the framework's setup ran: step 0 starts from initial_state
    branch = car.intervene(old, app.agent(), car.do_resample(0), outcome=published_rumour,
                           rollouts=1, seed=0).trajectories[0]
    assert branch.steps[0].meta["store"] == {"state": INITIAL_STATE}
    assert branch.steps[0].state == run.steps[0].state


# -- the orchestrator pattern: sub-agents called as tools, notes in the orchestrator's store --
def orchestrator_decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    last = messages[-1]
    if last["role"] != "tool":
        topic = "T-100 forum posts" if rng.random() < P_RUMOUR else "T-100 recall notice"
        return call("r0", "call_research_agent", {"prompt": topic})
    if last.get("name") == "call_research_agent":
        return call("w1", "call_write_agent", {})
    if last.get("name") == "call_write_agent":
        return call("p2", "publish_report", {"report": last["content"]})
    return "The report is published."


def notes_on(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> str:
    return f"{FACTS}; {RUMOUR}" if "forum" in (messages[-1]["content"] or "") else FACTS


def report_from(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> str:
    return "Report: " + (messages[-1]["content"] or "").split("<notes>")[-1]


class OrchestratorApp:
    """An orchestrator ``FunctionAgent`` whose tools run a research and a write agent and
    keep the research notes in the orchestrator's ``ctx.store``."""

    def __init__(self, ledger: SideEffectLedger, seed: int = 0) -> None:
        self.research_llm, self.write_llm = ScriptedLLM(notes_on), ScriptedLLM(report_from)
        research_agent = FunctionAgent(name="research", llm=self.research_llm,
                                       system_prompt="Take notes.")
        write_agent = FunctionAgent(name="write", llm=self.write_llm,
                                    system_prompt="Write a report.")

        async def call_research_agent(ctx: Context, prompt: str) -> str:
            """Record research notes on a topic."""
            notes = str(await research_agent.run(user_msg=f"Notes on: {prompt}"))
            state = await ctx.store.get("state")
            state["research_notes"].append(notes)
            await ctx.store.set("state", state)
            return notes

        async def call_write_agent(ctx: Context) -> str:
            """Write the report from the research notes."""
            state = await ctx.store.get("state")
            if not state["research_notes"]:
                return NO_NOTES
            report = str(await write_agent.run(
                user_msg="Write a report from <notes>" + "; ".join(state["research_notes"])))
            state["report_content"] = report
            await ctx.store.set("state", state)
            return report

        def publish_report(report: str) -> str:
            """Publish the report to every customer (a side effect)."""
            ledger.note("publish_report", {"report": report})
            return "published"

        self.orchestrator = FunctionAgent(
            name="orchestrator", system_prompt="Research, write, then publish.",
            llm=ScriptedLLM(orchestrator_decide, seed=seed),
            tools=[call_research_agent, call_write_agent, publish_report],
            initial_state={"research_notes": [], "report_content": None})

    def agent(self) -> LlamaIndexAgent:
        return LlamaIndexAgent(self.orchestrator,
                               safe_tools=["call_research_agent", "call_write_agent"],
                               side_effect_tools=["publish_report"],
                               simulators={"publish_report": lambda args: "published (sim)"})


def test_the_orchestrators_writer_finds_the_notes_on_a_branch(recorder: Any,
                                                              ledger: SideEffectLedger) -> None:
    """Analytically P(fail | do_resample(0)) = 0.7 and, after a recorded run that researched
    the forum posts, P(fail | do_resample(k)) = 1 for k = 1, 2."""
    app = OrchestratorApp(ledger)
    run_async(lambda: app.orchestrator.run(user_msg="Publish a report on the T-100 printer."))
    run = recorder.run
    assert published_rumour(run) and ledger.count() == 1, "seed 0 draws 0.64 < 0.7 at step 0"
    ledger.reset()
    assert run.steps[1].meta["store"] == {"state": {"research_notes": [f"{FACTS}; {RUMOUR}"],
                                                    "report_content": None}}
    research_calls = app.research_llm.calls
    for k in (1, 2):
        dist = car.intervene(run, app.agent(), car.do_resample(k), outcome=published_rumour,
                             rollouts=8, seed=0)
        assert dist.mean == 1.0, k
        assert all(NO_NOTES not in tool_results(t, "call_write_agent")
                   for t in dist.trajectories)
    assert app.research_llm.calls == research_calls   # the held research step ran no agent
    dist = car.intervene(run, app.agent(), car.do_resample(0), outcome=published_rumour,
                         rollouts=ROLLOUTS, seed=1)
    assert abs(dist.mean - P_RUMOUR) <= TOL
    assert ledger.count() == 0


# -- what is refused, by name, before any branch runs -------------------------------------
def test_a_memory_that_dropped_messages_refuses_the_branches_it_would_mislead(
        recorder: Any, ledger: SideEffectLedger) -> None:
    """A 60-token ``ChatMemoryBuffer`` drops the oldest messages, the user's first, when the
    handoff flushes the research into memory: step 3 sees one message where step 2 saw five.
    A branch keeps every message, so a branch from before the drop is refused; one from the
    drop on would have to re-enter from a history with no user message, which LlamaIndex
    cannot start from, and is refused too. Both before any model call or publication."""
    app = ResearchApp(ledger)
    run_async(lambda: app.flow.run(user_msg="Write a customer report on the T-100 printer.",
                                   memory=ChatMemoryBuffer.from_defaults(token_limit=60)))
    run = recorder.run
    ledger.reset()
    assert [len(s.state) for s in run.steps] == [2, 4, 6, 2, 4, 6]  # system prompt included
    calls = (app.research_llm.calls, app.write_llm.calls)
    for k in (0, 1, 2):
        with pytest.raises(AdapterError, match=r"dropped or rewrote messages before step 3.*"
                                               r"branch from step 3 or later") as err:
            car.intervene(run, app.agent(), car.do_resample(k), outcome=published_rumour,
                          rollouts=1)
        assert err.value.step == k
    for k in (3, 4, 5):
        with pytest.raises(AdapterError, match=r"begin with tool, not a user message") as err:
            car.intervene(run, app.agent(), car.do_resample(k), outcome=published_rumour,
                          rollouts=1)
        assert err.value.step == k
    assert (app.research_llm.calls, app.write_llm.calls) == calls and ledger.count() == 0


def test_a_side_effect_tool_whose_simulator_cannot_write_the_store_is_refused(
        ledger: SideEffectLedger) -> None:
    async def publish_and_note(ctx: Context, report: str) -> str:
        """Publish the report and note that it went out."""
        ledger.note("publish_report", {"report": report})
        await ctx.store.set("published", True)
        return "published"

    agent = FunctionAgent(tools=[publish_and_note], llm=ScriptedLLM(lambda m, t, r: "done"),
                          system_prompt="Publish.")
    with pytest.raises(AdapterError, match=r"'publish_and_note'.*takes the workflow Context, "
                                           r"but its simulator does not"):
        LlamaIndexAgent(agent, side_effect_tools=["publish_and_note"],
                        simulators={"publish_and_note": lambda arguments: "published"})
    # with no simulator, each run is checked before its branches: an identical call replays
    # its recorded write (llamaindex/test_llamaindex_research_simulators.py)
    LlamaIndexAgent(agent, side_effect_tools=["publish_and_note"])


def test_only_the_apps_keys_are_recorded_for_every_agent_kind(recorder: Any) -> None:
    """The framework's own keys (memory, scratchpads, ReAct reasoning, hand-off bookkeeping)
    are rebuilt on re-entry, never recorded: an app whose tools leave the store alone records
    only the (empty) ``state`` at every step, whichever agent kind ran; and a branch of each
    kind sees the record's messages at every step."""
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    def tool_then_answer(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        return "3" if messages[-1]["role"] == "tool" else call("a0", "add", {"a": 1, "b": 2})

    def react(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> str:
        if any((m["content"] or "").startswith("Observation") for m in messages[1:]):
            return "Thought: I can answer without using any more tools.\nAnswer: 3"
        return 'Thought: I need the sum.\nAction: add\nAction Input: {"a": 1, "b": 2}'

    def triage(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        return call("h0", "handoff", {"to_agent": "maths", "reason": "a sum"})

    maths = FunctionAgent(name="maths", description="adds", tools=[add],
                          llm=ScriptedLLM(tool_then_answer), system_prompt="Add.")
    apps = [
        FunctionAgent(tools=[add], llm=ScriptedLLM(tool_then_answer), system_prompt="Add."),
        ReActAgent(tools=[add], llm=ScriptedLLM(react)),
        AgentWorkflow(agents=[FunctionAgent(name="triage", description="routes",
                                            llm=ScriptedLLM(triage), system_prompt="Route.",
                                            can_handoff_to=["maths"]), maths],
                      root_agent="triage"),
    ]
    for app in apps:
        run_async(lambda app=app: app.run(user_msg="What is 1 + 2?"))
        run = recorder.run
        assert len(run.steps) >= 2, type(app).__name__
        assert [s.meta["store"] for s in run.steps] == [{"state": {}}] * len(run.steps), \
            type(app).__name__
        # the models are deterministic, so a branch from the first step replays the record,
        # and sees at every step the messages the record's memory gave (none refused)
        branch = car.intervene(run, LlamaIndexAgent(app, safe_tools=["add"]), car.do_resample(0),
                               outcome=lambda r: False, rollouts=1, seed=0).trajectories[0]
        assert [s.state for s in branch.steps] == [s.state for s in run.steps]
