"""The key of a chat model swapped in by ``do_policy`` on a LangGraph app is hidden like the
app's own model's: registered before the branch calls it, so nothing a branch records quotes
it, in any form."""

from __future__ import annotations

import json
from typing import Any

from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.secrets import redact

# delimiters between short pieces: only the whole key's pattern can hide it
POLICY_KEY = "pk9,a1b2;c3d'4e\"5f}6g7h-policy"


class KeyedSupportModel(sa.PlantedSupportModel):
    """The planted model holding an API key, whose replies quote it (as a failing server's
    echo would reach the messages)."""

    api_key: str = ""

    def decide(self, messages: Any) -> AIMessage:
        msg = super().decide(messages)
        msg.content = f"answered with key {self.api_key}"
        return msg


def test_a_do_policy_models_key_never_reaches_a_branch() -> None:
    model = sa.PlantedSupportModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    app = sa.build_app(wrapper, InMemorySaver())
    agent = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t0"}, "callbacks": [cb]})
    run = cb.run
    assert POLICY_KEY not in redact.known_secrets()  # nothing registered it yet
    swapped = KeyedSupportModel(rng_seed=1, p_follow=0.0, api_key=POLICY_KEY)  # denies
    dist = car.intervene(run, agent, car.do_policy(1, swapped), outcome=sa.outcome,
                         rollouts=2, seed=0, progress=False)
    assert POLICY_KEY in redact.known_secrets()
    texts = [json.dumps(t.to_dict()) for t in dist.trajectories]
    assert texts and any("answered with key [REDACTED]" in t for t in texts)
    forms = (POLICY_KEY, json.dumps(POLICY_KEY)[1:-1], "pk9,a1b2", "c3d'4e", "6g7h-policy")
    for text in texts:
        assert [f for f in forms if f in text] == [], text[:300]


def test_a_run_whose_conversation_holds_a_key_is_still_attributable() -> None:
    """A user pasted a key into their message (one CAR knows, and an ``sk-…`` one nobody gave
    it). The record holds the conversation with both removed while the app's checkpoint holds
    them as typed, so every step was refused as "a different graph or thread" and the run
    could not be attributed. The checkpoint is compared as the record keeps it."""
    registered = "reg-9f8e7d6c5b4a-key"
    redact.register(registered)
    pasted = "sk-proj-PASTEDbyTHEuser0123456789"
    model = sa.PlantedSupportModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    app = sa.build_app(wrapper, InMemorySaver())
    cb = CarCallback()
    message = f"{sa.CUSTOMER_MESSAGE} My token is {registered}, and {pasted}."
    for i in range(40):
        app.invoke(sa.inputs(message), {"configurable": {"thread_id": f"t{i}"},
                                        "callbacks": [cb]})
        if sa.outcome(cb.run):
            break
    run = cb.run
    assert sa.outcome(run)
    kept = json.dumps(run.to_dict())
    assert registered not in kept and pasted not in kept and "[REDACTED]" in kept
    agent = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    res = car.contrastive(run, agent, outcome=sa.outcome, rollouts=16, seed=0, progress=False)
    assert res.locus == 1
