"""A branch gives each model call the settings the record's call had. The SDK resets an
agent's ``tool_choice`` once it has called a tool (``reset_tool_choice``), after merging the
run config's settings; a branch from a later step is a fresh ``Runner.run`` that has not seen
the prefix's tool calls. A ``RunConfig(model_settings=ModelSettings(tool_choice="required"))``
came back on every such branch: a user trial's model was forced to call a tool again, and the
wrong step was named."""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    ModelResponse,
    ModelSettings,
    RunConfig,
    Runner,
    Usage,
    function_tool,
)
from agents.models.interface import Model
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent
from car_adapters.openai_agents._items import output_of

import car_core as car

CHOICES: list[Any] = []  # the tool_choice every model call was given


class Desk(Model):
    """Looks the customer up when nothing answered yet, then replies; notes its settings."""

    async def get_response(self, system_instructions: Any, input: Any,
                           model_settings: ModelSettings, tools: Any, output_schema: Any,
                           handoffs: Any, tracing: Any, **kw: Any) -> ModelResponse:
        CHOICES.append(model_settings.tool_choice)
        answered = not isinstance(input, str) and any(
            (i.get("type") if isinstance(i, dict) else getattr(i, "type", None))
            == "function_call_output" for i in input)
        out = (assistant("verified, done") if answered
               else assistant(None, [tool_call("c1", "verify_customer", {})]))
        return ModelResponse(output=output_of(out), usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield


@function_tool
def verify_customer() -> str:
    """Verify the customer (reads only)."""
    return "verified"


def test_a_run_config_tool_choice_the_sdk_reset_stays_reset_on_branches() -> None:
    config = RunConfig(model_settings=ModelSettings(tool_choice="required"))
    app = Agent(name="desk", model=Desk(), tools=[verify_customer])
    rec = CarRecorder()
    Runner.run_sync(app, "refund my order", hooks=rec, run_config=config)
    run = rec.run
    assert CHOICES == ["required", None]  # the SDK reset it after the tool call
    CHOICES.clear()
    agent = OpenAIAgentsAgent(app, run_config=config, safe_tools=["verify_customer"])
    car.intervene(run, agent, car.do_resample(1), outcome=lambda r: 1.0, rollouts=4)
    assert CHOICES == [None] * 4
