"""LlamaIndex tools whose own code reaches a side effect: another tool object, the function
behind another tool, or a whole sub-agent. A branch runs a safe tool live, so without a check
its code made real side-effect calls on every branch that re-decided it (a user trial: four
real audit lines from one attribution, five real refunds from another). Each side-effect
function here writes a ledger line; none may be written while an attribution runs.

The planted desk looks order 7 up (step 0, safe, its code audits the lookup), then writes an
audit entry of its own with probability 0.5 (step 1: the failure), then says it is done.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import AsyncBaseTool, BaseTool, FunctionTool, ToolMetadata, ToolOutput

import car_core as car
from car_core.engine.execution import Sequential
from car_core.errors import AdapterError, SideEffectBlocked, UnclassifiedTools

LEDGER: list[str] = []


def write_audit(entry: str) -> str:
    """Write an entry to the audit log (a side effect)."""
    LEDGER.append(f"audit {entry}")
    return "audited"


def refund(order_id: str, amount: int) -> str:
    """Refund the customer (moves money)."""
    LEDGER.append(f"refund {order_id} {amount}")
    return f"refunded {amount}"


AUDIT = FunctionTool.from_defaults(fn=write_audit, name="write_audit")
_AUDIT_META = ToolMetadata(name="write_audit", description=write_audit.__doc__ or "")


def _audited(entry: str) -> ToolOutput:
    return ToolOutput(content=write_audit(entry), tool_name="write_audit",
                      raw_input={"entry": entry}, raw_output="audited")


class AuditTool(AsyncBaseTool):
    """An app's own tool class, not a ``FunctionTool``: its ``call`` and ``acall`` write."""

    @property
    def metadata(self) -> ToolMetadata:
        return _AUDIT_META

    def call(self, entry: str = "") -> ToolOutput:
        return _audited(entry)

    async def acall(self, entry: str = "") -> ToolOutput:
        return _audited(entry)


class PlainAuditTool(BaseTool):
    """The oldest shape of a tool: a ``BaseTool`` called with one input."""

    @property
    def metadata(self) -> ToolMetadata:
        return _AUDIT_META

    def __call__(self, input: Any) -> ToolOutput:
        return _audited(dict(input)["entry"])


CUSTOM_AUDIT, PLAIN_AUDIT = AuditTool(), PlainAuditTool()


def reply(text: str) -> str:
    """Answer the customer."""
    return "sent"


def _call(k: int, tool: str, **args: Any) -> dict[str, Any]:
    return assistant(None, [tool_call(f"call_{k}", tool, args)])


def desk(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    done = [c["function"]["name"] for m in messages if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()]
    if not done:
        return _call(0, "lookup_order", order_id="7")
    if done == ["lookup_order"]:
        if rng.random() < 0.5:
            return _call(1, "write_audit", entry="refund 5000")
        return _call(1, "reply", text="ok")
    return "done"


def audited(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "write_audit"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


async def _ask(app: FunctionAgent) -> None:
    await app.run(user_msg="Where is order 7?")


def record(app: FunctionAgent, failed: Callable[[car.Trajectory], bool] = audited
           ) -> car.Trajectory:
    rec = CarRecorder().attach()
    try:
        for _ in range(40):  # p = 0.5 a run; the LLM's rng is seeded
            asyncio.run(_ask(app))
            if failed(rec.run):
                return rec.run
    finally:
        rec.detach()
    raise AssertionError("no failing run recorded")


def attribute(run: car.Trajectory, agent: LlamaIndexAgent,
              outcome: Callable[[car.Trajectory], bool] = audited) -> car.ContrastiveResult:
    LEDGER.clear()
    try:
        return car.contrastive(run, agent, outcome=outcome, rollouts=8, seed=0,
                               executor=Sequential(), progress=False)
    finally:
        assert LEDGER == [], f"real side effects on branches: {LEDGER}"


def lookup_sync(order_id: str) -> str:
    """Look an order up (reads only, says the app)."""
    AUDIT.call(entry=f"looked up {order_id}")
    return f"order {order_id}: kettle, 40 EUR"


async def lookup_async(order_id: str) -> str:
    """Look an order up (reads only, says the app)."""
    await AUDIT.acall(entry=f"looked up {order_id}")
    return f"order {order_id}: kettle, 40 EUR"


def lookup_raw(order_id: str) -> str:
    """Look an order up (reads only, says the app)."""
    write_audit(f"looked up {order_id}")
    return f"order {order_id}: kettle, 40 EUR"


def app_with(lookup: Callable[..., Any], audit: BaseTool = AUDIT) -> FunctionAgent:
    tool = FunctionTool.from_defaults(fn=lookup, name="lookup_order")
    return FunctionAgent(name="desk", tools=[tool, audit, reply],
                         llm=ScriptedLLM(desk, seed=0), system_prompt="You help customers.")


def simulating_audits(app: FunctionAgent) -> tuple[LlamaIndexAgent, list[dict[str, Any]]]:
    """The agent over ``app`` with the audit a side effect answered by a simulator, and the
    list of arguments that simulator was called with."""
    simulated: list[dict[str, Any]] = []

    def fake_audit(arguments: dict[str, Any]) -> str:
        simulated.append(arguments)
        return "audited"

    return LlamaIndexAgent(app, safe_tools=["lookup_order", "reply"],
                           side_effect_tools=["write_audit"],
                           simulators={"write_audit": fake_audit}), simulated


@pytest.fixture(autouse=True)
def _clean_ledger() -> Iterator[None]:
    LEDGER.clear()
    yield
    LEDGER.clear()


@pytest.mark.parametrize("lookup", [lookup_sync, lookup_async])
def test_a_safe_tool_whose_code_calls_a_side_effect_tool_is_refused_before_any_branch(
        lookup: Callable[..., Any]) -> None:
    with pytest.raises(AdapterError, match="tool 'lookup_order' calls side-effect tool"
                                           r"\(s\) \['write_audit'\] itself") as info:
        LlamaIndexAgent(app_with(lookup), safe_tools=["lookup_order", "reply"],
                        side_effect_tools=["write_audit"])
    assert "simulators={'write_audit'" in (info.value.hint or "")
    assert LEDGER == []


@pytest.mark.parametrize("lookup", [lookup_sync, lookup_async])
def test_with_a_simulator_branches_simulate_the_nested_call(lookup: Callable[..., Any]) -> None:
    """The nested call happens on every branch that runs the lookup again, and the net answers
    it with the simulator: the side effect never runs."""
    run = record(app_with(lookup))
    agent, simulated = simulating_audits(app_with(lookup))
    attribute(run, agent)
    assert {"entry": "looked up 7"} in simulated  # the lookup's own audit, from its code


def custom_lookup_call(order_id: str) -> str:
    """Look an order up (reads only, says the app)."""
    CUSTOM_AUDIT.call(entry=f"looked up {order_id}")
    return f"order {order_id}: kettle, 40 EUR"


def plain_lookup(order_id: str) -> str:
    """Look an order up (reads only, says the app)."""
    PLAIN_AUDIT({"entry": f"looked up {order_id}"})
    return f"order {order_id}: kettle, 40 EUR"


async def custom_lookup_async(order_id: str) -> str:
    """Look an order up (reads only, says the app)."""
    await CUSTOM_AUDIT.acall(entry=f"looked up {order_id}")
    return f"order {order_id}: kettle, 40 EUR"


@pytest.mark.parametrize(("lookup", "audit"), [
    (custom_lookup_async, CUSTOM_AUDIT), (custom_lookup_call, CUSTOM_AUDIT),
    (plain_lookup, PLAIN_AUDIT)])
def test_an_apps_own_tool_class_called_from_code_is_simulated_on_branches(
        lookup: Callable[..., Any], audit: BaseTool) -> None:
    """A tool of the app's own class (an ``AsyncBaseTool`` or a ``BaseTool`` subclass), not a
    ``FunctionTool``, called from a safe tool's code: the net answers its ``acall``, ``call``
    or ``__call__`` too. It covered ``FunctionTool`` only, and a user trial's own
    ``AsyncBaseTool`` wrote real ledger lines from the branches with a simulator given."""
    run = record(app_with(lookup, audit))
    agent, simulated = simulating_audits(app_with(lookup, audit))
    attribute(run, agent)  # asserts that the ledger stayed empty
    assert {"entry": "looked up 7"} in simulated


def test_classified_a_side_effect_the_tool_is_answered_from_the_record() -> None:
    run = record(app_with(lookup_sync))
    agent = LlamaIndexAgent(app_with(lookup_sync), safe_tools=["reply"],
                            side_effect_tools=["lookup_order", "write_audit"])
    attribute(run, agent)


def test_a_tool_that_calls_a_side_effect_tools_function_is_refused() -> None:
    """A plain function call is no tool call: no net can answer it, so only the check before
    any branch stands between it and a real side effect."""
    with pytest.raises(AdapterError, match=r"calls the function of side-effect tool\(s\) "
                                           r"\['write_audit'\]"):
        LlamaIndexAgent(app_with(lookup_raw), safe_tools=["lookup_order", "reply"],
                        side_effect_tools=["write_audit"])


def _hidden(tool: BaseTool) -> types.ModuleType:
    """A module of the app's whose function calls ``tool``: reading the lookup's code does
    not follow another module's functions, so only the net on the branch sees the call."""
    module = types.ModuleType("orders_helpers")
    module.TOOL = tool  # type: ignore[attr-defined]
    exec("def audit(entry):\n    return TOOL.call(entry=entry)\n", module.__dict__)
    return module


@pytest.mark.parametrize(("tool", "said"), [
    (AUDIT, "from another tool's code (not a model's tool call): the branch called "
            "side-effect tool 'write_audit'"),
    (FunctionTool.from_defaults(fn=refund, name="refund"),
     "a branch reached tool 'refund' from another tool's code, and it is none of the tools "
     "CAR classified"),
    (CUSTOM_AUDIT, "from another tool's code (not a model's tool call): the branch called "
                   "side-effect tool 'write_audit'"),
])
def test_the_net_stops_a_side_effect_the_code_check_cannot_see(tool: BaseTool,
                                                               said: str) -> None:
    helpers = _hidden(tool)

    def lookup_order(order_id: str) -> str:
        """Look an order up (reads only, says the app)."""
        helpers.audit(f"looked up {order_id}")
        return f"order {order_id}: kettle, 40 EUR"

    run = record(app_with(lookup_order))
    agent = LlamaIndexAgent(app_with(lookup_order), safe_tools=["lookup_order", "reply"],
                            side_effect_tools=["write_audit"])
    with pytest.raises(SideEffectBlocked, match=said.replace("(", r"\(").replace(")", r"\)")):
        attribute(run, agent)


def billing_model(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    if any(m["role"] == "tool" for m in messages):
        return "refund issued"
    return _call(0, "refund", order_id="7", amount=40)


BILLING = FunctionAgent(name="billing", tools=[refund], llm=ScriptedLLM(billing_model),
                        system_prompt="You issue refunds.")


async def ask_billing(question: str) -> str:
    """Ask the billing desk (the app calls this read only)."""
    return str(await BILLING.run(user_msg=question))


def front(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    done = [c["function"]["name"] for m in messages if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()]
    if not done:
        if rng.random() < 0.5:
            return _call(0, "ask_billing", question="refund order 7")
        return _call(0, "reply", text="please wait")
    return "done"


def asked(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "ask_billing"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def front_desk() -> FunctionAgent:
    return FunctionAgent(name="desk", tools=[ask_billing, reply], llm=ScriptedLLM(front, seed=0),
                         system_prompt="You help customers.")


def test_a_sub_agents_tools_must_be_classified() -> None:
    with pytest.raises(UnclassifiedTools, match=r"\['refund'\]"):
        LlamaIndexAgent(front_desk(), safe_tools=["ask_billing", "reply"])


def test_a_safe_tool_that_runs_a_sub_agent_with_a_side_effect_is_refused() -> None:
    with pytest.raises(AdapterError, match=r"tool 'ask_billing' runs agent\(s\) \['billing'\] "
                                           r"in its own code, which can call side-effect "
                                           r"tool\(s\) \['refund'\]"):
        LlamaIndexAgent(front_desk(), safe_tools=["ask_billing", "reply"],
                        side_effect_tools=["refund"])
    assert LEDGER == []


def test_a_sub_agents_side_effect_is_simulated_on_branches() -> None:
    run = record(front_desk(), asked)
    simulated: list[dict[str, Any]] = []

    def fake_refund(arguments: dict[str, Any]) -> str:
        simulated.append(arguments)
        return "refunded 40"

    agent = LlamaIndexAgent(front_desk(), safe_tools=["ask_billing", "reply"],
                            side_effect_tools=["refund"], simulators={"refund": fake_refund})
    attribute(run, agent, asked)
    assert {"order_id": "7", "amount": 40} in simulated


def test_a_safe_tool_run_again_meets_the_net_too() -> None:
    """A lookup that errors on a branch for an order the record never asked about is run
    again (to tell whose error it was), outside the workflow: its nested audit, which only the
    net sees (another module's code), must be answered there too, not written."""
    helpers = _hidden(AUDIT)

    def lookup_order(order_id: str) -> str:
        """Look an order up (reads only, says the app)."""
        helpers.audit(f"looked up {order_id}")
        if order_id != "7":
            raise LookupError(f"no order {order_id}")
        return f"order {order_id}: kettle, 40 EUR"

    def asks(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        done = [m for m in messages if m["role"] == "assistant"]
        if not done:
            return _call(0, "lookup_order", order_id="7" if rng.random() < 0.5 else "8")
        if len(done) == 1:
            return _call(1, "write_audit", entry="refund 5000")
        return "done"

    def app() -> FunctionAgent:
        tool = FunctionTool.from_defaults(fn=lookup_order, name="lookup_order")
        return FunctionAgent(name="desk", tools=[tool, AUDIT, reply],
                             llm=ScriptedLLM(asks, seed=0), system_prompt="You help.")

    run = record(app(), lambda r: audited(r) and "order 7" in str(r.steps[0].observation))
    agent, simulated = simulating_audits(app())
    LEDGER.clear()
    car.intervene(run, agent, car.do_action(0, _call(0, "lookup_order", order_id="8")),
                  outcome=audited, rollouts=2)
    assert LEDGER == []
    assert simulated.count({"entry": "looked up 8"}) >= 3  # on each branch, and run again
