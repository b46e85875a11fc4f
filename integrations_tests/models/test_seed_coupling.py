"""Branches are reported coupled only when the backend was measured to honour the seed.

llama.cpp's server honours the request seed with the model's own chat template, and ignores it
with the ``chatml-function-calling`` format (llama-cpp-python 0.3). The same ``ChatAgent`` over
``OpenAIPolicy`` is attributed against both: the first result says coupled, the second says
independent and why, and the measurement runs once per policy object.
"""

from __future__ import annotations

import pytest
from car_adapters.models import local
from car_adapters.models.chat_agent import ChatAgent
from car_adapters.openai import OpenAIPolicy

import car_core as car
from integrations_tests.support.servers import llama_server

CONTEXT = "Tell me about cats."


def long_reply(run: car.Trajectory) -> float:
    return float(len(run.steps[0].action["content"] or "") > 30)


@pytest.mark.slow
@pytest.mark.parametrize("chat_format, honoured", [(None, True),
                                                   ("chatml-function-calling", False)])
def test_coupling_is_reported_only_when_the_server_honours_the_seed(
        chat_format: str | None, honoured: bool) -> None:
    with llama_server(chat_format=chat_format, start_timeout=120) as url:
        policy = OpenAIPolicy(local.MODEL, base_url=url, temperature=1.0, max_tokens=16)
        agent = ChatAgent(policy, max_steps=1)
        run = car.record(agent, context=CONTEXT, outcome=long_reply, seed=0)
        dist = car.intervene(run, agent, car.do_resample(0), outcome=long_reply, rollouts=2,
                             seed=0)
        # what CAR handed out; ``coupled`` itself is measured only with twins
        assert ("same reply twice" in (dist.coupling or "")) is honoured
        assert "measured" in (dist.coupling or "")
        if not honoured:
            assert "ignores the request seed" in (dist.coupling or "")
        # measured once per policy: a second estimate reuses the verdict without calling
        calls = []
        original = policy.complete
        policy.complete = lambda *a: calls.append(a) or original(*a)  # type: ignore[method-assign]
        again = car.intervene(run, agent, car.do_resample(0), outcome=long_reply, rollouts=1,
                              seed=1)
        assert again.coupling == dist.coupling and len(calls) == 1  # the one rollout, no probe
