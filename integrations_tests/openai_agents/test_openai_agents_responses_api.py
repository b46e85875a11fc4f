"""An app on the SDK's default model, the Responses API (``Agent(model="gpt-4.1-mini")`` with
``set_default_openai_client``, or ``OpenAIResponsesModel``), over HTTP to an in-process
server. ``responses.create`` takes no ``seed``: a trial's branches each raised ``TypeError``
("unexpected keyword argument 'seed'"), the attribution stopped after twelve of them saying
"fix the agent", and no app on the default model could be attributed. Branches send it none;
the model's own randomness is then unshared, which the estimators measure."""

from __future__ import annotations

import json
from typing import Any

import httpx
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent
from openai import AsyncOpenAI

import car_core as car

set_tracing_disabled(True)


class ResponsesServer:
    """``POST /v1/responses``: a call of ``lookup_order`` first, then a reply that refunds
    (the failure) or declines, alternating; every request body is kept."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.replies = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        said = [i for i in body.get("input", []) if isinstance(i, dict)]
        if not any(i.get("type") == "function_call_output" for i in said):
            item: dict[str, Any] = {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                                    "name": "lookup_order", "arguments": "{\"order\": \"A7\"}",
                                    "status": "completed"}
        else:
            self.replies += 1
            text = "Refunded." if self.replies % 2 else "Sorry, no refund."
            item = {"type": "message", "id": f"msg_{self.replies}", "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        return httpx.Response(200, json={
            "id": f"resp_{len(self.bodies)}", "object": "response", "created_at": 0,
            "model": body.get("model", "m"), "status": "completed", "output": [item],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}})


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    return f"order {order}: final sale"


def refunded(run: car.Trajectory) -> bool:
    last = run.steps[-1].action
    return "Refunded" in str(last.get("content") if isinstance(last, dict) else last)


def test_branches_of_a_responses_api_model_send_no_seed() -> None:
    server = ResponsesServer()
    client = AsyncOpenAI(base_url="http://model.test/v1", api_key="sk-test-responses",
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(server)))
    app = Agent(name="desk", instructions="Help with orders.", tools=[lookup_order],
                model=OpenAIResponsesModel(model="gpt-4.1-mini", openai_client=client))
    rec = CarRecorder()
    Runner.run_sync(app, "Refund order A7", hooks=rec)
    run = rec.run
    assert refunded(run) and len(run.steps) == 2
    recorded = len(server.bodies)
    agent = OpenAIAgentsAgent(app, safe_tools=["lookup_order"])
    dist = car.intervene(run, agent, car.do_resample(1), outcome=refunded, rollouts=4)
    assert dist.n == 4 and 0.0 < dist.mean < 1.0  # the replies alternate across branches
    branch_bodies = server.bodies[recorded:]
    assert branch_bodies and not any("seed" in b for b in branch_bodies)
