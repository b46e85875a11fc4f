"""LlamaIndex app shapes CAR cannot record or branch, refused by name before anything runs.

LlamaIndex's own example shapes, each over a scripted model: a ``CodeActAgent`` and a
``FunctionAgent(output_cls=...)`` (an audit's branches failed inside the first and ran the
second's unrecorded structured-output call live), the "function calling agent from scratch"
``Workflow`` (``@step`` methods and events of its own, no agent steps), and the
human-in-the-loop tool (``ctx.wait_for_event(HumanResponseEvent,
waiter_event=InputRequiredEvent(...))``), which a branch has nobody to answer. A test that
would wait for that answer without the fix runs under ``within``, so it fails instead of
hanging.

No ``from __future__ import annotations`` here: LlamaIndex hands the ``Context`` only to a tool
whose ``ctx`` annotation is the ``Context`` class itself, not the string that import makes of it.
"""

import asyncio
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from car_adapters.llamaindex.recorder import RunNotRecorded
from llama_index.core.agent.workflow import AgentWorkflow, CodeActAgent, FunctionAgent
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.tools import FunctionTool, ToolSelection
from llama_index.core.workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from pydantic import BaseModel

import car_core as car
from car_core.errors import AdapterError
from car_core.store import RunStore
from car_core.testing import SideEffectLedger

HANG_S = 30  # far above what each call takes with the fix; a hang without it fails here
QUESTION = "May I publish the report?"


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, failed when it has not returned after ``seconds`` (it is left waiting in a
    daemon thread): a call that waits for a human would otherwise hang the suite."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test's thread below
            out["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"still waiting after {seconds} s (for an answer nobody gives)")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def run_async(start: Callable[[], Any]) -> Any:
    """Run ``start()`` (which returns an awaitable: a workflow handler) on a fresh loop."""
    async def main() -> Any:
        return await start()
    return asyncio.run(main())


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return assistant(None, [tool_call(cid, name, args)])


def called(messages: list[dict[str, Any]]) -> list[str]:
    return [c["function"]["name"] for m in messages if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()]


def published_rumour(run: car.Trajectory) -> bool:
    report = ""
    for s in run.steps:
        for c in (s.action or {}).get("tool_calls") or ():
            if c["function"]["name"] == "write_report":
                report = c["function"]["arguments"]
            if c["function"]["name"] == "publish_report" and "RUMOR" in report:
                return True
    return False


def writer(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """Writes the report (with a rumour half the time), publishes it, says so."""
    done = called(messages)
    if "write_report" not in done:
        body = "ARPANET 1969." + (" RUMOR: a teenager in 1950." if rng.random() < 0.5 else "")
        return call("c0", "write_report", {"report_content": body})
    if "publish_report" not in done:
        return call("c1", "publish_report", {"channel": "blog"})
    return "Done."


# -- a custom Workflow: LlamaIndex's "function calling agent from scratch" -----------------
class InputEvent(Event):
    input: list[ChatMessage]


class ToolCallEvent(Event):
    tool_calls: list[ToolSelection]


class FunctionCallingFromScratch(Workflow):
    """The example's workflow: its own steps call the model and the tools; no agent step."""

    def __init__(self, *args: Any, llm: Any = None, tools: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools = tools or []
        self.llm = llm

    @step
    async def prepare_chat_history(self, ctx: Context, ev: StartEvent) -> InputEvent:
        memory = ChatMemoryBuffer.from_defaults(llm=self.llm)
        memory.put(ChatMessage(role="user", content=ev.input))
        await ctx.store.set("memory", memory)
        return InputEvent(input=memory.get())

    @step
    async def handle_llm_input(self, ctx: Context, ev: InputEvent
                               ) -> ToolCallEvent | StopEvent:
        stream = await self.llm.astream_chat_with_tools(self.tools, chat_history=ev.input)
        response = [r async for r in stream][-1]  # the example streams the deltas out
        memory = await ctx.store.get("memory")
        memory.put(response.message)
        await ctx.store.set("memory", memory)
        calls = self.llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
        return ToolCallEvent(tool_calls=calls) if calls else StopEvent(result=response)

    @step
    async def handle_tool_calls(self, ctx: Context, ev: ToolCallEvent) -> InputEvent:
        tools = {t.metadata.get_name(): t for t in self.tools}
        memory = await ctx.store.get("memory")
        for c in ev.tool_calls:
            out = tools[c.tool_name](**c.tool_kwargs)
            memory.put(ChatMessage(role="tool", content=out.content,
                                   additional_kwargs={"tool_call_id": c.tool_id,
                                                      "name": c.tool_name}))
        await ctx.store.set("memory", memory)
        return InputEvent(input=memory.get())


def report_tools(ledger: SideEffectLedger) -> list[Any]:
    def write_report(report_content: str) -> str:
        """Write the report."""
        return "Report written."

    def publish_report(channel: str) -> str:
        """Publish the report (a real side effect)."""
        ledger.note("publish_report", {"channel": channel})
        return f"Published to {channel}."

    return [FunctionTool.from_defaults(write_report), FunctionTool.from_defaults(publish_report)]


@pytest.fixture
def ledger() -> SideEffectLedger:
    return SideEffectLedger(["publish_report"])


def test_a_custom_workflow_run_is_not_stored_as_a_passing_run_of_no_step(
        tmp_path: Any, ledger: SideEffectLedger) -> None:
    """The workflow called the model three times and published, but CAR sees no agent step in
    it: before, it was stored as a complete run of 0 steps that the outcome scored as a pass.
    Now nothing is stored, a warning names the workflow, and ``rec.run`` says why."""
    llm = ScriptedLLM(writer)
    flow = FunctionCallingFromScratch(llm=llm, tools=report_tools(ledger), timeout=60)
    store = RunStore(tmp_path / "runs.db")
    rec = CarRecorder(store=store, outcome=published_rumour).attach()
    try:
        with pytest.warns(RunNotRecorded, match=r"custom Workflow FunctionCallingFromScratch: "
                                                r"CAR records only agent workflows"):
            run_async(lambda: flow.run(input="Write the report and publish it."))
        assert llm.calls == 3 and ledger.count() == 1  # it really ran, and published
        assert rec.runs == [] and store.runs() == []
        assert rec.skipped == ["FunctionCallingFromScratch"]
        with pytest.raises(AdapterError, match=r"no agent run has finished.*"
                                               r"\['FunctionCallingFromScratch'\] with no "
                                               r"agent step"):
            rec.run  # noqa: B018  # the property raises
    finally:
        rec.detach()
        store.close()


def test_a_custom_workflow_running_an_agent_stores_the_agent_run_alone(
        tmp_path: Any, ledger: SideEffectLedger) -> None:
    """A workflow whose step runs a ``FunctionAgent``: the agent's run is recorded on its own
    (its three steps), and the workflow's own run, which holds no step, is neither stored nor
    warned about (nothing of it was lost)."""
    agent = FunctionAgent(tools=report_tools(ledger), llm=ScriptedLLM(writer),
                          system_prompt="Write and publish.")

    class Outer(Workflow):
        @step
        async def delegate(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=await agent.run(user_msg=ev.input))

    store = RunStore(tmp_path / "runs.db")
    rec = CarRecorder(store=store).attach()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RunNotRecorded)
            run_async(lambda: Outer(timeout=60).run(input="Write the report and publish it."))
        rec.flush()
        assert [len(r.steps) for r in rec.runs] == [3]
        assert [r["agent"] for r in store.runs()] == ["llamaindex:FunctionAgent"]
    finally:
        rec.detach()
        store.close()


class Booking(BaseModel):
    fare_id: str


async def run_code(code: str) -> str:
    return "ran"


@pytest.mark.parametrize("shape", ["codeact", "output_cls", "structured_output_fn", "workflow"])
def test_an_agent_whose_decisions_cars_record_misses_is_refused_by_name(shape: str) -> None:
    """``CodeActAgent`` runs the code its model writes, the tools inside it plain functions no
    branch guard sees; ``output_cls`` / ``structured_output_fn`` ask the model once more for
    the structured answer after the last step, a decision neither recorded nor re-drawn (an
    audit's app got a different fare in it than the reply named). Refused when wrapped, in an
    ``AgentWorkflow`` too, before anything runs."""
    llm = ScriptedLLM(lambda messages, tools, rng: assistant("done"))
    tool = FunctionTool.from_defaults(fn=lambda fare_id: "ok", name="book_fare",
                                      description="Book a fare (a side effect).")
    if shape == "codeact":
        agent: Any = CodeActAgent(name="coder", description="d", llm=llm, tools=[tool],
                                  code_execute_fn=run_code)
        said = r"agent 'coder' is a CodeActAgent"
    else:
        extra = ({"output_cls": Booking} if shape != "structured_output_fn"
                 else {"structured_output_fn": lambda messages: {"fare_id": "x"}})
        agent = FunctionAgent(name="desk", description="d", llm=llm, tools=[tool], **extra)
        said = rf"agent 'desk' has {'output_cls' if shape != 'structured_output_fn' else shape}"
    app = (AgentWorkflow(agents=[agent], root_agent=agent.name) if shape == "workflow"
           else agent)
    with pytest.raises(AdapterError, match=said) as refused:
        LlamaIndexAgent(app, side_effect_tools=["book_fare"])
    assert refused.value.hint and "FunctionAgent" in refused.value.hint
    assert llm.calls == 0


def test_a_custom_workflow_is_refused_by_name_before_anything_runs(
        ledger: SideEffectLedger) -> None:
    llm = ScriptedLLM(writer)
    flow = FunctionCallingFromScratch(llm=llm, tools=report_tools(ledger), timeout=60)
    with pytest.raises(AdapterError, match=r"a custom Workflow \(FunctionCallingFromScratch\) "
                                           r"is not an agent workflow CAR can branch: CAR "
                                           r"records and branches FunctionAgent, ReActAgent "
                                           r"and AgentWorkflow") as err:
        LlamaIndexAgent(flow, safe_tools=["write_report"], side_effect_tools=["publish_report"])
    assert "FunctionAgent(tools=[...], llm=...)" in (err.value.hint or "")
    with pytest.raises(AdapterError, match=r"expected a LlamaIndex agent workflow, got str"):
        LlamaIndexAgent("not a workflow")
    assert llm.calls == 0 and ledger.count() == 0


# -- a tool that waits for a human --------------------------------------------------------
class Editor:
    """The publisher app of LlamaIndex's human-in-the-loop example: the agent writes the report,
    asks the editor (``ask_human`` waits for a ``HumanResponseEvent``), and publishes when the
    editor says yes. ``asks`` counts the real runs of the asking tool's body (the framework runs
    the step again once the answer comes, so a recorded ask counts twice). With
    ``in_a_helper`` the tool waits inside a helper, out of sight of reading the tool's code."""

    def __init__(self, ledger: SideEffectLedger, *, in_a_helper: bool = False) -> None:
        self.asks = 0

        async def wait_for_editor(ctx: Context, question: str) -> Any:
            return await ctx.wait_for_event(
                HumanResponseEvent, waiter_id=question,
                waiter_event=InputRequiredEvent(prefix=question, user_name="editor"),
                requirements={"user_name": "editor"})

        async def ask_human(ctx: Context, question: str) -> str:
            """Ask the human editor a question and wait for the answer."""
            self.asks += 1
            answer = await ctx.wait_for_event(
                HumanResponseEvent, waiter_id=question,
                waiter_event=InputRequiredEvent(prefix=question, user_name="editor"),
                requirements={"user_name": "editor"})
            return f"The editor answered: {answer.response}"

        async def ask_human_via_helper(ctx: Context, question: str) -> str:
            """Ask the human editor a question and wait for the answer."""
            self.asks += 1
            answer = await wait_for_editor(ctx, question)
            return f"The editor answered: {answer.response}"

        asking = FunctionTool.from_defaults(ask_human_via_helper if in_a_helper else ask_human,
                                            name="ask_human")
        tools = report_tools(ledger)
        self.llm = ScriptedLLM(self.decide, seed=3)
        self.agent = FunctionAgent(name="publisher", description="writes and publishes",
                                   system_prompt="Write, ask the editor, then publish.",
                                   tools=[tools[0], asking, tools[1]], llm=self.llm)

    @staticmethod
    def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        done = called(messages)
        if "write_report" not in done:
            return writer(messages, tools, rng)
        if "ask_human" not in done:
            return call("c1", "ask_human", {"question": QUESTION})
        if "publish_report" not in done:
            answer = [m["content"] for m in messages if m["role"] == "tool"][-1] or ""
            return (call("c2", "publish_report", {"channel": "blog"}) if "yes" in answer
                    else "Not published.")
        return "Published."

    async def answered(self) -> None:
        """One run of the app, with the editor answering yes as the app's own loop does."""
        handler = self.agent.run(user_msg="Write the report; publish it if the editor agrees.")
        async for event in handler.stream_events():
            if isinstance(event, InputRequiredEvent):
                handler.ctx.send_event(HumanResponseEvent(response="yes",
                                                          user_name=event.user_name))
        await handler

    def record(self) -> car.Trajectory:
        rec = CarRecorder().attach()
        try:
            asyncio.run(self.answered())
            return rec.run
        finally:
            rec.detach()

    def counts(self) -> tuple[int, int]:
        return self.llm.calls, self.asks


@pytest.mark.parametrize("classes", [
    {"safe_tools": ["write_report", "ask_human"], "side_effect_tools": ["publish_report"]},
    {"side_effect_tools": ["publish_report"], "unclassified": "live"},
], ids=["safe", "unclassified-live"])
def test_a_tool_that_waits_for_a_human_is_refused_by_name_before_any_branch(
        ledger: SideEffectLedger, classes: dict[str, Any]) -> None:
    """Run live on a branch, ``ask_human`` would wait for an answer nobody gives (before, the
    attribution hung there). It is refused by name when the agent is wrapped: no branch, no
    model call, no tool call."""
    app = Editor(ledger)
    run = app.record()
    assert [c for s in run.steps for c in called([s.action])] == [
        "write_report", "ask_human", "publish_report"]
    before, published = app.counts(), ledger.count()
    with pytest.raises(AdapterError, match=r"tool 'ask_human' of agent 'publisher' waits for "
                                           r"a human \(ctx.wait_for_event\): a branch runs it "
                                           r"live and has nobody to answer it") as err:
        within(HANG_S, lambda: car.intervene(
            run, LlamaIndexAgent(app.agent, **classes), car.do_resample(0),
            outcome=published_rumour, rollouts=2, seed=0))
    assert "side_effect_tools=['ask_human', ...]" in (err.value.hint or "")
    assert "simulators={'ask_human': fn(arguments, ctx)}" in (err.value.hint or "")
    assert app.counts() == before and ledger.count() == published


def test_a_tool_that_waits_for_a_human_classified_as_a_side_effect_gets_the_recorded_answer(
        ledger: SideEffectLedger) -> None:
    """The way out the refusal names: classified as a side effect, ``ask_human`` never runs on
    a branch; each branch gets the editor's recorded answer and goes on to publish (answered
    from the record too)."""
    app = Editor(ledger)
    run = app.record()
    asks, published = app.asks, ledger.count()
    agent = LlamaIndexAgent(app.agent, safe_tools=["write_report"],
                            side_effect_tools=["publish_report", "ask_human"],
                            match_on={"ask_human": "any"})
    dist = within(HANG_S, lambda: car.intervene(run, agent, car.do_resample(0),
                                                outcome=published_rumour, rollouts=4, seed=0))
    for branch in dist.trajectories:
        assert [c for s in branch.steps for c in called([s.action])] == [
            "write_report", "ask_human", "publish_report"]
        assert branch.steps[1].observation[0]["content"] == "The editor answered: yes"
    assert app.asks == asks and ledger.count() == published


def test_a_branch_whose_workflow_asks_for_input_stops_at_once_naming_the_event(
        ledger: SideEffectLedger) -> None:
    """The net for a wait that reading the tool's code cannot see (it is in a helper): the
    branch's workflow puts an ``InputRequiredEvent`` on its stream, and the branch stops there
    with an error naming the event and the step, instead of waiting for the answer."""
    app = Editor(ledger, in_a_helper=True)
    run = app.record()
    agent = LlamaIndexAgent(app.agent, safe_tools=["write_report", "ask_human"],
                            side_effect_tools=["publish_report"])  # not seen: accepted
    published = ledger.count()
    started = time.monotonic()
    with pytest.raises(AdapterError, match=r"the workflow asked for human input at step 1: it "
                                           r"emitted InputRequiredEvent \('May I publish the "
                                           r"report\?'\)") as err:
        within(HANG_S, lambda: car.intervene(run, agent, car.do_resample(0),
                                             outcome=published_rumour, rollouts=1, seed=0))
    assert time.monotonic() - started < HANG_S / 3
    assert err.value.step == 1 and "['ask_human']" in (err.value.hint or "")
    assert ledger.count() == published  # stopped before the publishing step
