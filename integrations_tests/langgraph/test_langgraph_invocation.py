"""A branch is invoked with what the run was: the user's ``config["configurable"]`` keys and
the runtime ``context=`` (``car_adapters.langgraph.invocation``).

The desk (``create_agent``): step 0 asks the ``diet`` tool (reads only) for the user's diet,
which it reads from ``runtime.context.user_id`` or ``config["configurable"]["user_id"]``, as
LangGraph's memory docs do; step 1 books a meal (a side effect): for a vegetarian, the
vegetarian meal with probability 0.7, else the standard one; for a user the tool does not
know, always the standard one. The standard meal fails the run. So

    P(fail | do_resample(0)) = 0.3   when branches run as user "u7", a vegetarian,
                             = 1     when they run as no one (what branches did before).

A user trial's branches ran as no one and CAR said no step caused the failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import CarCallback, LangGraphAgent
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.errors import AdapterError

P_VEGETARIAN = 0.7
BOOKED: list[str] = []   # every real booking (the side effect)
ASKED: list[str] = []    # the user every real call of the diet tool ran as
CLASSES: dict[str, Any] = {"safe_tools": ["diet"], "side_effect_tools": ["book_meal"],
                           "simulators": {"book_meal": lambda a: "booked"}}


@dataclasses.dataclass
class Ctx:
    user_id: str


def _diet_of(user: str | None) -> str:
    ASKED.append(str(user))
    return "vegetarian" if user == "u7" else "unknown"


@tool
def diet_from_context(runtime: ToolRuntime[Ctx]) -> str:
    """The user's diet (reads only)."""
    return _diet_of(getattr(runtime.context, "user_id", None))


@tool
def diet_from_config(config: RunnableConfig) -> str:
    """The user's diet (reads only)."""
    return _diet_of((config.get("configurable") or {}).get("user_id"))


@tool
def book_meal(meal: str) -> str:
    """Book a meal (a side effect)."""
    BOOKED.append(meal)
    return "booked"


class Desk(SeededChatModel):
    """Asks for the diet, then books (see above)."""

    @property
    def _llm_type(self) -> str:
        return "planted-meal-desk"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        call = f"c{uuid.uuid4().hex[:6]}"
        if not done:
            msg = AIMessage("", tool_calls=[{"name": "diet", "id": call, "args": {}}])
        elif len(done) == 1:
            veg = done[0].content == "vegetarian" and self._draw() < P_VEGETARIAN
            msg = AIMessage("", tool_calls=[{"name": "book_meal", "id": call, "args": {
                "meal": "vegetarian" if veg else "standard"}}])
        else:
            msg = AIMessage("Booked.")
        return ChatResult(generations=[ChatGeneration(message=msg)])


def desk(read: str) -> Any:
    diet = diet_from_context if read == "context" else diet_from_config
    diet.name = "diet"
    return create_agent(Desk(rng_seed=1), [diet, book_meal], checkpointer=InMemorySaver(),
                        context_schema=Ctx if read == "context" else None)


def standard(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "book_meal"
               and json.loads(c["function"]["arguments"])["meal"] == "standard"
               for s in run.steps for c in s.action.get("tool_calls") or ())


def recorded(app: Any, configurable: dict[str, Any] | None = None, context: Any = None,
             use_async: bool = False) -> car.Trajectory:
    for _ in range(50):
        cb = CarCallback(outcome=standard)
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex, "user_id": "u7",
                                        **(configurable or {})}, "callbacks": [cb]}
        kwargs = {"context": context} if context is not None else {}
        inputs = {"messages": [("user", "Book me a meal.")]}
        if use_async:
            asyncio.run(app.ainvoke(inputs, config, **kwargs))
        else:
            app.invoke(inputs, config, **kwargs)
        assert cb.run is not None
        if cb.run.failed:
            return cb.run
    raise AssertionError("no failing run")


def _p_fail_from_step_0(app: Any, run: car.Trajectory, **options: Any) -> float:
    asked, booked = len(ASKED), list(BOOKED)
    rollouts = 40
    res = car.intervene(run, LangGraphAgent(app, **CLASSES, **options), car.do_resample(0),
                        outcome=standard, rollouts=rollouts, seed=0)
    assert ASKED[asked:] and set(ASKED[asked:]) == {"u7"}  # every branch ran as the user
    assert BOOKED == booked                                  # no real booking on a branch
    # 0.3 (it was 1 as no one): 3.5 standard errors of 40 rollouts
    assert abs(res.mean - (1 - P_VEGETARIAN)) <= 3.5 * (0.21 / rollouts) ** 0.5
    return res.mean


@pytest.mark.parametrize("use_async", [False, True])
def test_a_branch_runs_with_the_runtime_context_the_run_was_given(use_async: bool) -> None:
    app = desk("context")
    run = recorded(app, context=Ctx("u7"), use_async=use_async)
    held = run.meta["invocation"]["context"]
    assert held["value"] == {"user_id": "u7"} and held["class"].endswith(":Ctx")
    _p_fail_from_step_0(app, run)


def test_a_branch_runs_with_the_configurable_keys_the_run_was_given() -> None:
    app = desk("config")
    run = recorded(app)
    assert run.meta["invocation"]["configurable"] == {"user_id": "u7"}
    _p_fail_from_step_0(app, run)


def test_a_run_whose_context_the_record_lacks_is_refused_before_any_branch() -> None:
    app = desk("context")
    run = recorded(app, context=Ctx("u7"))
    old = replace(run, meta={k: v for k, v in run.meta.items() if k != "invocation"})
    asked = len(ASKED)
    with pytest.raises(AdapterError, match=r"takes a runtime context \(context_schema=Ctx\)"):
        car.intervene(old, LangGraphAgent(app, **CLASSES), car.do_resample(0),
                      outcome=standard, rollouts=4, seed=0)
    assert len(ASKED) == asked
    _p_fail_from_step_0(app, old, context=Ctx("u7"))  # given, it runs as that user


def test_configurable_values_the_record_cannot_keep_must_be_given() -> None:
    app = desk("config")
    client, key = object(), "sk-planted-0123456789abcdef"
    run = recorded(app, configurable={"db": client, "openai_api_key": key})
    assert run.meta["invocation"]["unrecorded"] == ["db", "openai_api_key"]
    assert key not in json.dumps(run.to_dict())  # a secret is never kept
    asked = len(ASKED)
    with pytest.raises(AdapterError, match=r"configurable keys \['db', 'openai_api_key'\]"):
        car.intervene(run, LangGraphAgent(app, **CLASSES), car.do_resample(0),
                      outcome=standard, rollouts=4, seed=0)
    assert len(ASKED) == asked
    _p_fail_from_step_0(app, run, configurable={"db": client, "openai_api_key": key})


def test_a_run_given_no_context_by_an_app_that_takes_one_branches_without_one() -> None:
    app = desk("context")
    run = recorded(app)  # invoked without context=: the tool runs as no one
    assert "context" not in run.meta["invocation"]
    asked = len(ASKED)
    res = car.intervene(run, LangGraphAgent(app, **CLASSES), car.do_resample(0),
                        outcome=standard, rollouts=4, seed=0)
    assert res.mean == 1.0 and set(ASKED[asked:]) == {"None"}  # as the run ran: as no one
    older = replace(run, meta={k: v for k, v in run.meta.items() if k != "invocation"})
    with pytest.raises(AdapterError, match=r"pass context=None if it was given none"):
        car.intervene(older, LangGraphAgent(app, **CLASSES), car.do_resample(0),
                      outcome=standard, rollouts=4, seed=0)


def test_a_thread_imported_from_the_checkpointer_keeps_its_configurable_keys() -> None:
    """LangGraph copies the plain configurable values into the checkpoints' metadata, so a
    run imported from a checkpointer (``import_thread``) is branched as its user; its runtime
    context is not there, so an app that takes one must be given it."""
    app = desk("config")
    thread = str(recorded(app).meta["thread_id"])
    agent = LangGraphAgent(app, **CLASSES)
    run = agent.import_thread(thread)
    assert run.meta["invocation"]["configurable"]["user_id"] == "u7"
    _p_fail_from_step_0(app, run)
    with_context = desk("context")
    thread = str(recorded(with_context, context=Ctx("u7")).meta["thread_id"])
    imported = LangGraphAgent(with_context, **CLASSES).import_thread(thread)
    with pytest.raises(AdapterError, match="imported from a checkpointer"):
        car.intervene(imported, LangGraphAgent(with_context, **CLASSES), car.do_resample(0),
                      outcome=standard, rollouts=4, seed=0)
    _p_fail_from_step_0(with_context, imported, context=Ctx("u7"))
