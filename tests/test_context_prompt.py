"""The instructions a model is given are sources too: the system prompt and each tool's
description, found under names a reader knows, taken out by emptying them, and named by
``context_attribution`` when they cause the failure (planted worlds with known rescues)."""

from __future__ import annotations

import pytest

import car_core as car
from car_core.errors import InvalidInput
from car_core.model.context_sources import ablate, split
from car_core.model.trajectory import History
from car_core.testing.synthetic_context import (
    TOOLS,
    ContextWorld,
    in_system_prompt,
    in_tool_description,
)

SEEDS = 20


def test_the_first_system_message_is_the_system_prompt_and_later_ones_keep_their_place() -> None:
    messages = [{"role": "system", "content": "You are a support agent."},
                {"role": "user", "content": "refund please"},
                {"role": "system", "content": "Reminder: policy first."}]
    assert [s.label for s in split(messages)] == ["system prompt", "user message 1",
                                                 "system message 2"]
    assert ablate(messages, split(messages), [0])[0] == {"role": "system", "content": ""}


def test_a_system_prompt_key_and_tool_specs_in_a_context_are_sources_by_name() -> None:
    tools = [{"name": "lookup_policy", "description": "Read the refund policy.",
              "parameters": {"type": "object"}},
             {"name": "issue_refund", "description": "Refund an order."}]
    history = History({"system_prompt": "Follow the policy.", "tools": tools, "ticket": "late"},
                      (), 0)
    sources = split(history)
    assert [s.label for s in sources] == ["system prompt", "tool lookup_policy: description",
                                         "tool issue_refund: description", "ticket"]
    edited = ablate(history, sources, [0, 1])
    # emptied, not dropped: the model is still offered the tool, by name, without its text
    assert edited.context["system_prompt"] == ""
    assert edited.context["tools"] == [{**tools[0], "description": ""}, tools[1]]
    assert history.context["tools"][0]["description"] == "Read the refund policy."


def test_a_tools_key_that_is_not_a_list_of_described_tools_stays_one_item_per_entry() -> None:
    history = History({"tools": ["lookup_policy", "issue_refund"]}, (), 0)
    assert [s.label for s in split(history)] == ["tools[0]", "tools[1]"]


def test_a_world_with_tools_needs_room_for_them() -> None:
    with pytest.raises(InvalidInput, match="needs m"):
        ContextWorld(m=4, causal=(0,), tools=True)
    with pytest.raises(InvalidInput, match="unknown tool"):
        in_tool_description(10, tool="nope")


def _named_with_rescue(world: ContextWorld, label: str) -> tuple[int, int]:
    """Over ``SEEDS`` seeds: how often the planted source (labelled ``label``) was the one named,
    and how often its rescue interval covered the planted rescue ``world.rescue``."""
    cause = world.causal[0]
    named = covered = 0
    for seed in range(SEEDS):
        run = world.failing_run(seed)
        assert car.context_sources(run, world.decide_at)[cause].label == label
        result = car.context_attribution(run, world.agent(), step=world.decide_at,
                                         outcome=world.outcome, rollouts=64, seed=seed)
        assert result.rollouts_used <= 64
        hit = [s for s in result.named if s.source.index == cause]
        named += bool(hit) and len(result.named) == 1
        if hit:
            assert hit[0].source.label == label and hit[0].rescue_ci is not None
            covered += hit[0].rescue_ci[0] <= world.rescue(cause) <= hit[0].rescue_ci[1]
    return named, covered


# The injected-message world at m = 10 names its cause in every one of 100 seeds
# (tests/test_context.py); these worlds differ only in where the cause sits, so the same target
# holds: if the true rate were 0.99, P(fewer than 18 of 20) = P(Bin(20, 0.01) > 2) ≈ 0.001. The
# rescue intervals are at 1 − α/candidates ≥ 98.3%: at that coverage P(fewer than 18 of 20)
# ≈ 0.004. Seeds are fixed, so each test is deterministic (measured: 20 named, 19 covered).
@pytest.mark.parametrize(("world", "label"), [
    (in_system_prompt(10), "system prompt"),
    (in_tool_description(10, TOOLS[0]), f"tool {TOOLS[0]}: description"),
    (in_tool_description(10, TOOLS[2]), f"tool {TOOLS[2]}: description"),
], ids=["system-prompt", "first-tool", "last-tool"])
def test_context_attribution_names_the_planted_instruction_with_its_rescue(
        world: ContextWorld, label: str) -> None:
    named, covered = _named_with_rescue(world, label)
    assert named >= 18
    assert covered >= 18


def test_the_system_prompt_of_a_world_with_tools_is_named_when_it_is_the_cause() -> None:
    world = ContextWorld(m=10, causal=(0,), tools=True)
    named, covered = _named_with_rescue(world, "system prompt")
    assert named >= 18 and covered >= 18
