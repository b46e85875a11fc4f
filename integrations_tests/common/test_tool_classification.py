"""Every tool an agent can call is classified before the first branch, on every adapter.

A tool that no source classifies (neither named in ``safe_tools`` / ``side_effect_tools`` nor
annotated by its framework) would run for real on every branch, so the agent is refused where
it is built, naming every such tool and the line to add, and nothing has run: a ledger of real
side-effect calls stays at its recorded count. Safe tools run live on branches; side effects
never do. ``unclassified="live"`` (a sandbox) lets them run, and every result says so: a warning
once per estimate and ``caveats`` in the result, printed with it.

The planted chat agent looks order 42 up (step 0), then refunds it with probability 0.8 (step
1, the failure) or answers; every refund on a branch is the recorded call, answered from the
record when the refund is a side effect.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from typing import Any

import numpy as np
import pytest
from agents import Agent, function_tool
from car_adapters.common.messages import (
    SAFE,
    SIDE_EFFECT,
    Classified,
    ContradictedSafeTool,
    ToolSafety,
    assistant,
    mcp_classified,
    tool_call,
)
from car_adapters.demo import supervisor_app as sv
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from car_adapters.models.chat_agent import ChatAgent
from car_adapters.openai_agents import OpenAIAgentsAgent, ScriptedModel
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langgraph.checkpoint.memory import InMemorySaver
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.objects import ObjectRetriever

import car_core as car
from car_core.engine.agent import AgentCaveat
from car_core.errors import AdapterError, InvalidInput, SideEffectBlocked, UnclassifiedTools
from car_core.results import result_from_dict

P_REFUND = 0.8


class Ledger:
    """Counts every real call of each tool."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def note(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def tools(self) -> dict[str, Any]:
        def lookup_order(order_id: str) -> dict[str, Any]:
            self.note("lookup_order")
            return {"order_id": order_id, "status": "shipped"}

        def issue_refund(order_id: str) -> dict[str, Any]:
            self.note("issue_refund")
            return {"order_id": order_id, "refunded": True}
        return {"lookup_order": lookup_order, "issue_refund": issue_refund}


def planted(history: car.History, rng: np.random.Generator) -> dict[str, Any]:
    k = history.index
    if k == 0:
        return assistant(None, [tool_call("call_0_0", "lookup_order", {"order_id": "42"})])
    if k == 1 and rng.random() < P_REFUND:
        return assistant(None, [tool_call("call_1_0", "issue_refund", {"order_id": "42"})])
    return assistant("Order 42 has shipped.")


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def recorded_refund(ledger: Ledger) -> car.Trajectory:
    agent = ChatAgent(planted, ledger.tools(), safe_tools=["lookup_order"],
                      side_effect_tools=["issue_refund"])
    run = car.record(agent, context="Where is order 42?", outcome=refunded, seed=0)
    assert refunded(run) and ledger.calls == {"lookup_order": 1, "issue_refund": 1}
    return run


# -- the rule, framework-free ------------------------------------------------------------------
def test_the_users_word_wins_and_a_side_effect_wins_between_framework_sources() -> None:
    rule = ToolSafety.of(["refund"], safe_tools=["search"])
    said = {"search": [Classified(SIDE_EFFECT, "unannotated MCP tool")],  # the user said safe
            "book": [Classified(SAFE, "readOnlyHint"), Classified(SIDE_EFFECT, "approval")],
            "find": [Classified(SAFE, "readOnlyHint")]}
    out = rule.classified(["search", "refund", "book", "find"], said)
    assert out.safe_tools == {"search", "find"} and out.side_effect_tools == {"refund", "book"}
    assert out.derived == {"book": "approval", "find": "readOnlyHint"}
    assert out.live == frozenset() and out.caveats == ()


def test_conflicting_or_unknown_names_and_modes_are_refused() -> None:
    with pytest.raises(InvalidInput, match=r"\['refund'\] named both safe"):
        ToolSafety.of(["refund"], safe_tools=["refund"])
    with pytest.raises(InvalidInput, match=r"\['refund'\] named both safe"):
        ToolSafety.of(simulators={"refund": lambda a: "ok"}, safe_tools=["refund"])
    with pytest.raises(InvalidInput, match="unclassified='sometimes'"):
        ToolSafety.of(unclassified="sometimes")
    with pytest.raises(InvalidInput, match=r"safe_tools name \['serch'\].*its tools: "
                                           r"\['refund', 'search'\]"):
        ToolSafety.of(safe_tools=["serch"]).classified(["search", "refund"])


def test_mcp_annotations_say_safe_only_for_read_only_true() -> None:
    assert mcp_classified({"readOnlyHint": True}).kind == SAFE
    assert mcp_classified({"read_only_hint": True}).kind == SAFE  # the SDK's snake_case form
    for given in (None, {}, {"readOnlyHint": False}, {"readOnlyHint": None},
                  {"destructiveHint": False, "idempotentHint": True}):
        said = mcp_classified(given)
        assert said.kind == SIDE_EFFECT and "readOnlyHint=true" in said.why, given


def test_a_read_only_annotation_on_a_tool_named_for_an_action_is_not_taken_on_its_word(
) -> None:
    """A trial's MCP server annotated ``issue_refund`` ``readOnlyHint: true`` (a slip, or a
    server one should not trust: the specification calls annotations hints), and every branch
    refunded for real, with no warning. A server's read-only word on a tool whose name opens
    with an acting verb leaves it unclassified: refused before any branch, saying why, until
    the user names it. A handoff named for an action (``transfer_to_…``) is not a hint."""
    mcp = mcp_classified({"readOnlyHint": True})
    said = {"issue_refund": [mcp], "lookup_order": [mcp],
            "transfer_to_refunds": [Classified(SAFE, "a handoff")]}
    tools = ["issue_refund", "lookup_order", "transfer_to_refunds"]
    with pytest.raises(UnclassifiedTools, match=r"\['issue_refund'\].*'issue_refund': its MCP "
                                                r"server annotates it readOnlyHint=true, but its "
                                                r"name opens with 'issue', an action") as refused:
        ToolSafety.of().classified(tools, said)
    assert list(refused.value.tools) == ["issue_refund"]
    out = ToolSafety.of(["issue_refund"]).classified(tools, said)
    assert out.safe_tools == {"lookup_order", "transfer_to_refunds"}
    assert out.side_effect_tools == {"issue_refund"}


def test_naming_safe_a_tool_its_server_says_changes_things_warns_and_the_user_still_wins(
        ) -> None:
    """A trial named a refund tool safe that its MCP server annotated readOnlyHint=false,
    destructiveHint=true: 52 refunds ran on branches without a word. The user's lists still
    win (a tool may be idempotent in their sandbox), but that contradiction is said; a tool
    whose server only fails to say it is read-only is named safe without one."""
    said = {"refund": [mcp_classified({"readOnlyHint": False, "destructiveHint": True})],
            "mail": [mcp_classified({"destructiveHint": True})],
            "lookup": [mcp_classified(None)], "find": [mcp_classified({"title": "Find"})]}
    rule = ToolSafety.of(safe_tools=["refund", "mail", "lookup", "find"])
    with pytest.warns(ContradictedSafeTool) as seen:
        out = rule.classified(["refund", "mail", "lookup", "find"], said)
    words = sorted(str(w.message) for w in seen)
    assert len(words) == 2
    assert words[0].startswith("safe_tools names 'mail', but its MCP server annotates it "
                               "without readOnlyHint and destructiveHint=True: branches will "
                               "run it for real")
    assert words[1].startswith("safe_tools names 'refund', but its MCP server annotates it "
                               "readOnlyHint=False and destructiveHint=True")
    assert out.safe_tools == {"refund", "mail", "lookup", "find"}
    # the result says it too: a trial's warning was one line among the server's logs, and
    # its result, after three real refunds on branches, said nothing
    assert out.caveats == (
        "safe_tools names 'mail', but its MCP server annotates it without readOnlyHint and "
        "destructiveHint=True: branches ran it for real, so if it changes anything its real "
        "effects happened on every branch that called it",
        "safe_tools names 'refund', but its MCP server annotates it readOnlyHint=False and "
        "destructiveHint=True: branches ran it for real, so if it changes anything its real "
        "effects happened on every branch that called it")


def test_a_safe_tool_named_for_an_action_is_warned_of_and_said_on_every_result() -> None:
    """A trial named ``send_email`` safe to get past the refusal of unclassified tools, and 13
    real e-mails went out on branches with no word. The user's list still wins (the tool runs
    live), but a name opening with an acting verb is warned of when the agent is built and
    said on every result; lookups, and nouns such as an order's status, are not."""
    tools = ["send_email", "issueRefund", "lookup_order", "order_status", "get_refund_status"]
    rule = ToolSafety.of(safe_tools=tools)
    with pytest.warns(ContradictedSafeTool) as seen:
        out = rule.classified(tools)
    assert sorted(str(w.message) for w in seen) == [
        "safe_tools names 'issueRefund', but its name opens with 'issue', an action: branches "
        "will run it for real; if it changes anything (a refund, an e-mail, a write), move it "
        "to side_effect_tools",
        "safe_tools names 'send_email', but its name opens with 'send', an action: branches "
        "will run it for real; if it changes anything (a refund, an e-mail, a write), move it "
        "to side_effect_tools"]
    assert out.safe_tools == set(tools)
    assert out.caveats == tuple(
        f"safe_tools names {name!r}, but its name opens with {verb!r}, an action: branches ran "
        "it for real, so if it changes anything its real effects happened on every branch that "
        "called it" for name, verb in (("issueRefund", "issue"), ("send_email", "send")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a side effect named so is where it belongs: no word
        assert ToolSafety.of(side_effect_tools=["send_email"],
                             safe_tools=["lookup_order"]).classified(
            ["send_email", "lookup_order"]).caveats == ()


def test_a_blocked_call_of_a_tool_its_server_says_changes_things_never_offers_safe_tools(
        ) -> None:
    """The blocked call's hint offered "name it in safe_tools if it is safe to run" in the
    same breath as the server's destructiveHint=True; for such a tool it offers a simulator
    or match_on only. A tool whose server merely gives no annotations still gets the offer."""
    said = {"refund": [mcp_classified({"readOnlyHint": False, "destructiveHint": True})],
            "note": [mcp_classified(None)]}
    rule = ToolSafety.of().classified(["refund", "note"], said)
    with pytest.raises(SideEffectBlocked) as err:
        rule.answer("refund", {"order_id": "7"}, {}, run_id="r", step=2)
    assert "safe_tools" not in err.value.hint and "simulators=" in err.value.hint
    assert "destructiveHint=True" in err.value.hint
    with pytest.raises(SideEffectBlocked) as err:
        rule.answer("note", {"order_id": "7"}, {}, run_id="r", step=2)
    assert "name it in safe_tools if it is safe to run" in err.value.hint



def test_a_blocked_call_of_a_tool_named_for_an_action_never_offers_safe_tools() -> None:
    """docs/tools.md promises it: a user trial's blocked ``charge_card`` call was told "or move
    'charge_card' from side_effect_tools to safe_tools if it is safe to run", which would
    charge a card on every branch. A tool whose name is no action still gets the offer."""
    rule = ToolSafety.of(side_effect_tools=["charge_card", "ledger_note"]).classified(
        ["charge_card", "ledger_note"])
    with pytest.raises(SideEffectBlocked) as err:
        rule.answer("charge_card", {"account": "A1", "amount": 100.0}, {}, run_id="r", step=3)
    assert "safe_tools" not in err.value.hint and "simulators=" in err.value.hint
    # the user named it a side effect: no "because" of the tool's name beside their own list
    assert "because" not in err.value.hint
    with pytest.raises(SideEffectBlocked) as err:
        rule.answer("ledger_note", {"text": "x"}, {}, run_id="r", step=3)
    assert "move 'ledger_note' from side_effect_tools to safe_tools" in err.value.hint

# -- ChatAgent ---------------------------------------------------------------------------------
def test_chat_agent_refuses_unclassified_tools_by_name_before_any_branch() -> None:
    ledger = Ledger()
    run = recorded_refund(ledger)
    with pytest.raises(UnclassifiedTools) as err:
        ChatAgent(planted, ledger.tools())
    assert err.value.tools == ("issue_refund", "lookup_order")
    assert ('ChatAgent(policy, tools, ..., safe_tools=[], side_effect_tools=["issue_refund", '
            '"lookup_order"])' in str(err.value))
    with pytest.raises(UnclassifiedTools) as err:
        ChatAgent(planted, ledger.tools(), side_effect_tools=["issue_refund"])
    assert err.value.tools == ("lookup_order",)
    assert ('safe_tools=[], side_effect_tools=["issue_refund", "lookup_order"]'
            in str(err.value))
    assert isinstance(err.value, InvalidInput)
    # a tool named with a simulator stays in the line: two user trials pasted it as given and
    # lost the classification they had written
    with pytest.raises(UnclassifiedTools) as err:
        ChatAgent(planted, ledger.tools(), side_effect_tools=["issue_refund"],
                  simulators={"issue_refund": lambda arguments: "refunded"})
    assert ('safe_tools=[], side_effect_tools=["issue_refund", "lookup_order"]'
            in str(err.value))
    assert ledger.calls == {"lookup_order": 1, "issue_refund": 1} and run.steps  # nothing ran


def test_chat_agent_runs_safe_tools_live_and_never_a_side_effect() -> None:
    ledger = Ledger()
    run = recorded_refund(ledger)
    agent = ChatAgent(planted, ledger.tools(), safe_tools=["lookup_order"],
                      side_effect_tools=["issue_refund"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", AgentCaveat)  # a classified agent has nothing to say
        dist = car.intervene(run, agent, car.do_resample(0), outcome=refunded, rollouts=8,
                             seed=0)
    assert dist.caveats == ()
    assert ledger.calls["lookup_order"] == 1 + 8  # every branch looked the order up, live
    assert ledger.calls["issue_refund"] == 1      # and refunded from the record only


def test_chat_agent_unclassified_live_runs_them_and_every_result_says_so() -> None:
    ledger = Ledger()
    run = recorded_refund(ledger)
    sandbox = ChatAgent(planted, ledger.tools(), unclassified="live")
    line = ("unclassified tools ran live on branches: ['issue_refund', 'lookup_order']")
    with pytest.warns(AgentCaveat) as seen:
        res = car.contrastive(run, sandbox, outcome=refunded, rollouts=8, seed=0,
                              search="full")
    assert len([w for w in seen if issubclass(w.category, AgentCaveat)]) == 1  # once per estimate
    assert line in str(seen[0].message) and "chat-agent" in str(seen[0].message)
    assert res.caveats and line in res.caveats[0]
    assert f"caveat: {res.caveats[0]}" in str(res)
    assert result_from_dict(res.to_dict()).caveats == res.caveats  # stored results keep it
    assert ledger.calls["issue_refund"] > 1  # the sandbox's refunds really ran on branches
    with pytest.warns(AgentCaveat):
        sh = car.shapley(run, sandbox, outcome=refunded, budget=24, seed=0)
    assert sh.caveats == res.caveats and "caveat: unclassified tools ran live" in str(sh)


# -- LangGraph ---------------------------------------------------------------------------------
def support_run() -> tuple[Any, CarChatModel, car.Trajectory]:
    wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver())
    cb = CarCallback()
    for i in range(50):  # p = 0.3 per ticket; the rng is seeded, so this is deterministic
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"u{i}"}, "callbacks": [cb]})
        if sa.outcome(cb.run):
            break
    assert cb.run is not None and sa.outcome(cb.run)
    return app, wrapper, cb.run


def test_langgraph_refuses_unclassified_tools_and_runs_the_safe_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app, wrapper, run = support_run()
    calls: list[str] = []
    for t in sa.TOOLS:
        monkeypatch.setattr(t, "func", (lambda f, name: lambda **kw: (calls.append(name),
                                                                       f(**kw))[1])(t.func,
                                                                                    t.name))
    with pytest.raises(UnclassifiedTools) as err:
        LangGraphAgent(app, model=wrapper, side_effect_tools=["issue_refund"])
    assert err.value.tools == ("lookup_order", "record_decision")
    assert ('LangGraphAgent(app, ..., safe_tools=[], side_effect_tools=["issue_refund", '
            '"lookup_order", "record_decision"])' in str(err.value))
    with pytest.raises(InvalidInput, match=r"safe_tools names \['lookup'\]"):
        LangGraphAgent(app, model=wrapper, safe_tools=["lookup"])
    assert calls == []  # nothing ran
    agent = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    dist = car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome, rollouts=4, seed=0)
    assert "issue_refund" not in calls            # answered from the record
    assert calls.count("record_decision") == 4    # the safe tool of step 1 ran on each branch
    assert dist.caveats == ()


def test_langgraph_unclassified_live_says_so_in_the_result() -> None:
    app, wrapper, run = support_run()
    sandbox = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS, unclassified="live")
    assert sandbox.safety.live == {"issue_refund"}
    with pytest.warns(AgentCaveat, match=r"unclassified tools ran live on branches: "
                                         r"\['issue_refund'\]"):
        dist = car.intervene(run, sandbox, car.do_resample(2), outcome=sa.outcome, rollouts=2,
                             seed=0)
    assert "['issue_refund']" in dist.caveats[0] and "caveat: " in str(dist)


def test_human_approval_gates_make_side_effects() -> None:
    """A tool ``HumanInTheLoopMiddleware`` asks a person about is a side effect, in both of
    its modes; the user's own lists still win."""
    for mode in ("batched", "per_call"):
        gate = HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True,
                                                      "record_decision": False},
                                        interrupt_mode=mode)
        app = create_agent(sa.PlantedSupportModel(), sa.TOOLS, middleware=[gate],
                           checkpointer=InMemorySaver())
        with pytest.raises(UnclassifiedTools) as err:
            LangGraphAgent(app)
        assert err.value.tools == ("lookup_order", "record_decision")  # not the gated refund
        agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS)
        assert agent.safety.guards("issue_refund")
        assert "HumanInTheLoopMiddleware" in agent.safety.derived["issue_refund"]
        said_safe = LangGraphAgent(app, safe_tools=[t.name for t in sa.TOOLS])
        assert not said_safe.safety.guards("issue_refund")


def test_handoff_tools_of_a_supervisor_are_safe_without_naming_them() -> None:
    with pytest.warns(Warning):  # create_supervisor calls the deprecated create_react_agent
        app = sv.build_app(sv.PlantedAgentModel(rng_seed=1), InMemorySaver())
    agent = LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS, side_effect_tools=sv.SIDE_EFFECT_TOOLS)
    handoffs = {t for t in agent.tools if t.startswith("transfer_to_")}
    assert handoffs and handoffs <= agent.safety.safe_tools
    assert all("hands the conversation" in agent.safety.derived[t] for t in handoffs)
    # the line to add names the user's tools only: a handoff is classified without it (a
    # user trial's refusal told them to list transfer_to_billing in safe_tools)
    with pytest.raises(UnclassifiedTools) as info:
        LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS)
    assert "transfer_to_" not in (info.value.hint or "")
    assert f"safe_tools={json.dumps(sorted(sv.SAFE_TOOLS))}" in (info.value.hint or "")


def test_the_supervisors_forward_message_tool_is_safe_without_naming_it() -> None:
    """``create_forward_message_tool`` only copies a worker's message into the conversation,
    but carries no handoff mark: a supervisor trial was told to list it as a side effect."""
    from langchain.agents import create_agent
    from langgraph_supervisor import create_supervisor
    from langgraph_supervisor.handoff import create_forward_message_tool
    model = sv.PlantedAgentModel(rng_seed=1)
    research = create_agent(model, [sv.read_ticket], name="research_agent")
    account = create_agent(model, [sv.flag_account, sv.close_account], name="account_agent")
    with pytest.warns(Warning):  # create_supervisor calls the deprecated create_react_agent
        app = create_supervisor([research, account], model=model,
                                tools=[create_forward_message_tool("supervisor")]
                                ).compile(checkpointer=InMemorySaver())
    agent = LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS, side_effect_tools=sv.SIDE_EFFECT_TOOLS)
    assert "forward_message" in agent.safety.safe_tools
    assert "copies a worker's message" in agent.safety.derived["forward_message"]


# -- LlamaIndex --------------------------------------------------------------------------------
def li_decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "42"})])
    if k == 1 and rng.random() < P_REFUND:
        return assistant(None, [tool_call("c1", "issue_refund", {"order_id": "42"})])
    return "Order 42 has shipped."


def li_app(ledger: Ledger) -> tuple[FunctionAgent, car.Trajectory]:
    tools = ledger.tools()

    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return str(tools["lookup_order"](order_id))

    def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return str(tools["issue_refund"](order_id))

    agent = FunctionAgent(tools=[lookup_order, issue_refund], llm=ScriptedLLM(li_decide))
    rec = CarRecorder().attach()
    try:
        async def main() -> None:
            await agent.run(user_msg="Where is order 42?")
        asyncio.run(main())
    finally:
        rec.detach()
    assert refunded(rec.run) and ledger.calls == {"lookup_order": 1, "issue_refund": 1}
    return agent, rec.run


def test_llamaindex_refuses_unclassified_tools_and_says_so_when_live() -> None:
    ledger = Ledger()
    agent, run = li_app(ledger)
    with pytest.raises(UnclassifiedTools) as err:
        LlamaIndexAgent(agent, side_effect_tools=["issue_refund"])
    assert err.value.tools == ("lookup_order",) and "LlamaIndexAgent(agent, ..., " in str(
        err.value)
    assert ledger.calls == {"lookup_order": 1, "issue_refund": 1}
    guarded = LlamaIndexAgent(agent, safe_tools=["lookup_order"],
                              side_effect_tools=["issue_refund"])
    car.intervene(run, guarded, car.do_resample(0), outcome=refunded, rollouts=4, seed=0)
    assert ledger.calls == {"lookup_order": 5, "issue_refund": 1}  # safe live, refund served
    sandbox = LlamaIndexAgent(agent, unclassified="live")
    with pytest.warns(AgentCaveat, match=r"\['issue_refund', 'lookup_order'\]"):
        dist = car.intervene(run, sandbox, car.do_resample(0), outcome=refunded, rollouts=4,
                             seed=0)
    assert dist.caveats and ledger.calls["issue_refund"] > 1


def test_llamaindex_tools_a_retriever_picks_cannot_be_classified() -> None:
    class Retriever(ObjectRetriever):  # an object index's retriever: nothing calls it here
        def __init__(self) -> None:  # nothing to retrieve from
            pass

    agent = FunctionAgent(tool_retriever=Retriever(), llm=ScriptedLLM(li_decide))
    with pytest.raises(UnclassifiedTools, match="tool_retriever") as err:
        LlamaIndexAgent(agent)
    assert len(err.value.tools) == 1 and "tool_retriever" in err.value.tools[0]
    with pytest.raises(AdapterError, match="tool_retriever"):
        LlamaIndexAgent(agent, side_effect_tools=["issue_refund"])
    sandbox = LlamaIndexAgent(agent, unclassified="live")
    assert "tool_retriever picks" in sandbox.caveats[0]


# -- OpenAI Agents SDK -------------------------------------------------------------------------
def test_openai_agents_refuses_unclassified_tools_and_says_so_when_live() -> None:
    ledger = Ledger()
    tools = ledger.tools()

    @function_tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return str(tools["lookup_order"](order_id))

    @function_tool
    def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return str(tools["issue_refund"](order_id))

    app = Agent(name="desk", instructions="Help.", tools=[lookup_order, issue_refund],
                model=ScriptedModel(li_decide))
    with pytest.raises(UnclassifiedTools) as err:
        OpenAIAgentsAgent(app)
    assert err.value.tools == ("issue_refund", "lookup_order")
    assert 'OpenAIAgentsAgent(agent, ..., safe_tools=[], side_effect_tools=["issue_refund", ' \
           '"lookup_order"])' in str(err.value)
    guarded = OpenAIAgentsAgent(app, safe_tools=["lookup_order"],
                                side_effect_tools=["issue_refund"])
    run = next(r for r in (car.record(guarded, context="Where is order 42?", outcome=refunded,
                                      seed=s) for s in range(20)) if refunded(r))
    recorded = dict(ledger.calls)
    car.intervene(run, guarded, car.do_resample(0), outcome=refunded, rollouts=4, seed=0)
    assert ledger.calls["issue_refund"] == recorded["issue_refund"]  # answered, never run
    assert ledger.calls["lookup_order"] == recorded["lookup_order"] + 4  # safe: live
    sandbox = OpenAIAgentsAgent(app, unclassified="live")
    with pytest.warns(AgentCaveat, match=r"\['issue_refund', 'lookup_order'\]"):
        dist = car.intervene(run, sandbox, car.do_resample(0), outcome=refunded, rollouts=4,
                             seed=0)
    assert dist.caveats and ledger.calls["issue_refund"] > recorded["issue_refund"]


def test_naming_a_routing_tool_says_the_framework_runs_it() -> None:
    """A trial named LlamaIndex's ``handoff`` in safe_tools (``car show`` lists it as a
    step's tool call) and was told only that the workflow has no such tool."""
    rule = ToolSafety.of(safe_tools=["handoff", "lookup"])
    with pytest.raises(InvalidInput) as err:
        rule.check_names(["lookup", "refund"], agent="the AgentWorkflow")
    assert "['handoff'] route between agents: the framework runs them" in str(err.value)
    with pytest.raises(InvalidInput) as err:
        ToolSafety.of(safe_tools=["lokup"]).check_names(["lookup"])
    assert "route between agents" not in str(err.value)
