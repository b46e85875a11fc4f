"""Actions compare as decisions: tool-call ids and other provider-assigned fields do not count."""

from __future__ import annotations

import itertools

import car_core as car
from car_core.model.actions import canonical_action, same_action
from car_core.model.seeding import Noise


def chat(content, *calls, **extra):
    return {"role": "assistant", "content": content, **extra,
            "tool_calls": [{"id": cid, "type": "function",
                            "function": {"name": name, "arguments": args}}
                           for cid, name, args in calls]}


def test_ids_key_order_and_empty_text_do_not_count() -> None:
    a = chat("", ("call_1", "refund", '{"order": "A1", "amount": 5}'))
    b = chat(None, ("call_9f3", "refund", '{"amount":5, "order":"A1"}'), id="msg_77")
    assert same_action(a, b) and canonical_action(a) == canonical_action(b)


def test_what_the_model_decided_does_count() -> None:
    a = chat("", ("c1", "refund", '{"amount": 5}'))
    assert not same_action(a, chat("", ("c1", "refund", '{"amount": 6}')))
    assert not same_action(a, chat("", ("c1", "deny", '{"amount": 5}')))
    assert not same_action(a, chat("ok", ("c1", "refund", '{"amount": 5}')))
    assert not same_action(a, chat("", ("c1", "refund", '{"amount": 5}'),
                                   ("c2", "refund", '{"amount": 5}')))
    two = [("c1", "a", "{}"), ("c2", "b", "{}")]
    assert not same_action(chat("", *two), chat("", *reversed(two)))  # call order counts


def test_other_actions_compare_as_json_values() -> None:
    assert same_action({"choice": "bad", "id": 1}, {"choice": "bad", "id": 1})
    assert not same_action({"choice": "bad", "id": 1}, {"choice": "bad", "id": 2})
    assert same_action("buy", "buy") and not same_action("buy", "wait")


def test_match_rate_is_one_for_a_deterministic_step_with_fresh_ids() -> None:
    ids = itertools.count()

    def policy(history, rng):  # deterministic, but every call gets a new id, as providers do
        return chat("", (f"call_{next(ids)}", "lookup", '{"order": "A1"}')) \
            if history.index == 0 else chat("done")

    agent = car.FunctionAgent(policy=policy, environment=lambda h, a, rng: "found",
                              is_final=lambda a: not a["tool_calls"], max_steps=3)
    run = car.record(agent, outcome=lambda r: 0.0, seed=0)
    assert agent.redecide(run, 0, Noise(0)) != run.steps[0].action  # ids differ
    assert car.action_match_rate(run, agent, replays=3).per_step == (1.0, 1.0)
