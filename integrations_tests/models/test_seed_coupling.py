"""Branches are reported coupled only when the backend was measured to honour the seed.

llama.cpp's server honours the request seed with the model's own chat template, and ignores it
with the ``chatml-function-calling`` format (llama-cpp-python 0.3). The same ``ChatAgent`` over
``OpenAIPolicy`` is attributed against both: the first result says coupled, the second says
independent and why, and the measurement runs once per policy object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from car_adapters.models import local
from car_adapters.models.chat_agent import ChatAgent, ChatPolicy
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
        assert ("repeated its reply for one seed" in (dist.coupling or "")) is honoured
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


class _Planted(ChatPolicy):
    """A model whose reply to a state is ``reply(state, seed, call)``; counts its calls."""

    model = "planted"

    def __init__(self, reply: Callable[[int, int, int], str]) -> None:
        super().__init__()
        self.reply, self.calls = reply, 0

    def complete(self, messages: list[dict[str, Any]], seed: int, k: int
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.calls += 1
        return {"role": "assistant", "content": self.reply(k, seed, self.calls)}, {}


STATES = [([{"role": "user", "content": "hi"}], k) for k in (0, 2, 4)]


def test_a_model_sure_of_every_probed_state_is_not_taken_to_honour_the_seed() -> None:
    # a hosted model that ignores seeds but answers these states alike every time: twice the
    # same reply for one seed said "honours the seed" (29 of 41 attributions in a trial), and
    # a branch that raised was then retried as if it would take the same path again
    sure = _Planted(lambda k, seed, call: f"answer {k}")
    said = sure.seed_check(STATES)
    assert said is not None and "could not be told" in said
    assert sure.calls == 9  # twice with one seed and once with another, each state


@pytest.mark.parametrize(("reply", "honours", "calls"), [
    # follows the seed: the state whose reply changed with it is asked four more times with
    # the first seed, then each other state is decided twice only
    (lambda k, seed, call: f"{k}: {seed % 7}", True, 11),
    (lambda k, seed, call: f"{k}: {seed % 7}" if k else "fixed", True, 12),
    (lambda k, seed, call: f"{k}: {call}", False, 2),  # a new reply every call
    # ignores the seed, and its first two replies matched by chance where another seed's
    # differed: taken to honour it before (4 of 12 of a trial's checks), found out now
    (lambda k, seed, call: "A" if call <= 2 else "B", False, 4),
])
def test_a_model_is_taken_to_honour_the_seed_only_when_its_replies_follow_it(
        reply: Callable[[int, int, int], str], honours: bool, calls: int) -> None:
    policy = _Planted(reply)
    said = policy.seed_check(STATES)
    assert (said is None) is honours, said
    assert policy.calls == calls
    assert policy.seed_check(STATES) == said and policy.calls == calls  # measured once
