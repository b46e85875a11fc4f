"""Apps for the agent-fingerprint tests: each framework's ticket desk, built the same way in
every process, plus variants with another prompt or other tools. ``python fingerprint_apps.py
FRAMEWORK STORE [CHECKPOINTS]`` records one run with that framework's own recorder (another
process than the test, with another string-hash seed)."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from typing import Any

from car_adapters.common.messages import assistant, tool_call

PROMPT = "You are the ticket desk. Escalate only what policy says to escalate."
OTHER_PROMPT = "You are the ticket desk. Escalate everything."
THREAD = "ticket-7"


def escalate() -> str:
    """Escalate the ticket to a human."""
    return "escalated"


def close_ticket() -> str:
    """Close the ticket."""
    return "closed"


def reopen_ticket() -> str:
    """Reopen the ticket."""
    return "reopened"


def classified(extra_tool: bool = False) -> dict[str, Any]:
    """The desk's tools for an adapter: each changes the ticket, so each is a side effect,
    answered on branches by its own fake (which writes nothing)."""
    tools = [escalate, close_ticket, *([reopen_ticket] if extra_tool else [])]
    return {"simulators": {t.__name__: (lambda _args, t=t: t()) for t in tools}}


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """Step 0 escalates with probability 1/2, then the desk answers in text."""
    if not any(m["role"] == "assistant" for m in messages):
        name = "escalate" if rng.random() < 0.5 else "close_ticket"
        return assistant(None, [tool_call("c0", name, {})])
    return "done"


def escalated(run: Any) -> bool:
    """The failure: the run escalated."""
    return any(c["function"]["name"] == "escalate" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def closed(run: Any) -> bool:
    """The other failure, for a run that closed the ticket: an attribution explains a failure,
    so a test attributes a recorded run under whichever of the two it shows."""
    return not escalated(run)


# -- LlamaIndex --------------------------------------------------------------------------------
def llamaindex_workflow(prompt: str = PROMPT, extra_tool: bool = False) -> Any:
    from car_adapters.llamaindex import ScriptedLLM
    from llama_index.core.agent.workflow import FunctionAgent
    tools = [escalate, close_ticket, *([reopen_ticket] if extra_tool else [])]
    return FunctionAgent(name="desk", description="the ticket desk", tools=tools,
                         system_prompt=prompt, llm=ScriptedLLM(decide))


def llamaindex_same() -> Any:
    from car_adapters.llamaindex import LlamaIndexAgent
    return LlamaIndexAgent(llamaindex_workflow(), **classified())


def llamaindex_other_prompt() -> Any:
    from car_adapters.llamaindex import LlamaIndexAgent
    return LlamaIndexAgent(llamaindex_workflow(OTHER_PROMPT), **classified())


def llamaindex_other_tools() -> Any:
    from car_adapters.llamaindex import LlamaIndexAgent
    return LlamaIndexAgent(llamaindex_workflow(extra_tool=True), **classified(extra_tool=True))


# -- OpenAI Agents SDK -------------------------------------------------------------------------
def openai_app(prompt: str = PROMPT, extra_tool: bool = False) -> Any:
    from agents import Agent, function_tool
    from car_adapters.openai_agents import ScriptedModel
    tools = [escalate, close_ticket, *([reopen_ticket] if extra_tool else [])]
    return Agent(name="desk", instructions=prompt, tools=[function_tool(t) for t in tools],
                 model=ScriptedModel(decide))


# -- LangGraph ---------------------------------------------------------------------------------
def langgraph_app(checkpoints: str, prompt: str | None = None, tools: int = 3) -> Any:
    """The demo's support graph (its planted model, tools and prompt), checkpointed in the
    SQLite file ``checkpoints`` so another process can fork its threads."""
    from car_adapters.demo import support_agent as sa
    from langgraph.checkpoint.sqlite import SqliteSaver
    saver = SqliteSaver(sqlite3.connect(checkpoints, check_same_thread=False))
    return sa.build_app(sa.PlantedSupportModel(p_follow=0.5), saver, tools=sa.TOOLS[:tools],
                        system_prompt=prompt or sa.SYSTEM_PROMPT)


def langgraph_tools(tools: int = 3) -> dict[str, Any]:
    """How the support graph's first ``tools`` tools are classified for ``LangGraphAgent``: the
    reads run on branches, a refund the record cannot answer is simulated."""
    from car_adapters.demo import support_agent as sa
    names = [t.name for t in sa.TOOLS[:tools]]
    return {"safe_tools": [n for n in names if n in sa.SAFE_TOOLS],
            "simulators": {n: (lambda a: f"simulated refund of {a['order_id']}")
                           for n in names if n in sa.SIDE_EFFECT_TOOLS}}


def record(framework: str, store: str, checkpoints: str = "") -> None:
    if framework == "llamaindex":
        from car_adapters.llamaindex import CarRecorder
        # stored without an outcome: the tests score it under whichever failure it shows
        rec = CarRecorder(store=store).attach()
        async def main() -> None:
            await llamaindex_workflow().run(user_msg="Handle ticket 7.")
        asyncio.run(main())
        rec.detach()
    elif framework == "openai-agents":
        from agents import Runner
        from car_adapters.openai_agents import CarRecorder as Hooks
        Runner.run_sync(openai_app(), "Handle ticket 7.", hooks=Hooks(store=store))
    else:
        from car_adapters.demo.support_agent import inputs, outcome
        from car_adapters.langgraph import CarCallback
        app = langgraph_app(checkpoints)
        cb = CarCallback(store, app=app, outcome=outcome)
        app.invoke(inputs(), {"configurable": {"thread_id": THREAD}, "callbacks": [cb]})


if __name__ == "__main__":
    record(*sys.argv[1:])
