"""The framework-free chat helpers both adapters share: action and observation shapes, and the
side-effect rule for tools on branches."""

from __future__ import annotations

import pytest
from car_adapters.common.messages import (
    ToolSafety,
    assistant,
    canonical_arguments,
    check_action,
    check_observation,
    describe_action,
    recorded_calls,
    tool_call,
    tool_result,
)

from car_core.errors import InvalidIntervention, SideEffectBlocked
from car_core.model.trajectory import Step

REFUND = assistant(None, [tool_call("c1", "refund", {"order": "A1", "amount": 5})])


def test_equal_calls_compare_equal_whatever_their_argument_form() -> None:
    assert canonical_arguments('{"b": 1, "a": 2}') == canonical_arguments({"a": 2, "b": 1})
    assert canonical_arguments("") == canonical_arguments(None) == "{}"


def test_check_action_normalises_and_refuses_malformed_calls() -> None:
    given = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "function": {"name": "refund",
                                                       "arguments": {"amount": 5, "order": "A1"}}}]}
    assert check_action(given) == REFUND
    with pytest.raises(InvalidIntervention, match="assistant message"):
        check_action({"role": "user", "content": "hi"})
    with pytest.raises(InvalidIntervention, match="malformed tool call"):
        check_action({"role": "assistant", "tool_calls": [{"function": {"name": "x"}}]})


def test_check_observation_pairs_results_with_calls() -> None:
    assert check_observation(["ok"], REFUND) == [tool_result("c1", "refund", "ok")]
    # a JSON object that is no tool message is the result itself (car.Fix.guard({...}) and
    # --guard JSON pass one): the model used to be handed "null"
    assert check_observation({"error": "ticket lookup failed"}, REFUND) == [
        tool_result("c1", "refund", '{"error": "ticket lookup failed"}')]
    assert check_observation([{"tool_call_id": "c1", "content": "ok"}], REFUND) == [
        tool_result("c1", "refund", "ok")]
    with pytest.raises(InvalidIntervention, match="1 tool calls"):
        check_observation(["a", "b"], REFUND)
    with pytest.raises(InvalidIntervention, match="called no tool"):
        check_observation(["a"], assistant("hello"))


def test_side_effect_calls_are_served_from_the_record_then_a_simulator_then_refused() -> None:
    step = Step(index=0, action=REFUND, observation=[tool_result("c1", "refund", "refunded 5")],
                observed=True)
    record = recorded_calls([step])
    safety = ToolSafety.of(["refund"])
    assert safety.guards("refund") and not safety.guards("lookup")
    assert safety.serve("refund", '{"amount": 5, "order": "A1"}', record) == "refunded 5"
    with pytest.raises(SideEffectBlocked, match="'refund'"):
        safety.serve("refund", {"order": "A1", "amount": 6}, record)
    simulated = ToolSafety.of(["refund"], {"refund": lambda a: f"would refund {a['amount']}"})
    assert simulated.serve("refund", {"order": "A1", "amount": 6}, record) == "would refund 6"
    with pytest.raises(InvalidIntervention, match="not callable"):
        ToolSafety.of(["refund"], {"refund": "nope"})  # type: ignore[dict-item]


def test_an_action_reads_as_its_calls_as_recorded_or_its_reply():
    both = assistant(None, [tool_call("c1", "check", '{"order_id":"A1"}'),
                            tool_call("c2", "refund", "{}")])
    assert describe_action(both) == 'check({"order_id":"A1"}), refund({})'
    assert describe_action(assistant("Refunded the whole order.")) == \
        "reply: 'Refunded the whole order.'"
    assert describe_action(assistant("Refunded the whole order."), limit=8) == "reply: 'Refunded'"
