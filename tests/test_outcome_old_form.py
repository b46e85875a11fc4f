"""An outcome written for the old ``outcome(final_state)`` form, handed the trajectory, is
refused with an ``OutcomeError`` that says how to write it; any other error keeps the general
message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import car_core as car
from car_core.errors import OutcomeError

OLD_FORMS: dict[str, Callable[[Any], Any]] = {
    "subscript": lambda state: state["messages"] == [],
    "get": lambda state: state.get("messages") is None,
    "in": lambda state: "messages" in state,
    "items": lambda state: bool(dict(state.items())),
    "iterate": lambda state: "messages" in list(state),
}


@pytest.fixture
def run() -> car.Trajectory:
    return car.record(car.FunctionAgent(policy=lambda h, rng: "a", max_steps=2), context="c",
                      outcome=lambda r: 1.0, seed=0)


@pytest.mark.parametrize("form", sorted(OLD_FORMS))
def test_an_outcome_reading_the_run_as_a_dict_is_told_to_use_final_state(
        run: car.Trajectory, form: str) -> None:
    agent = car.FunctionAgent(policy=lambda h, rng: "a", max_steps=2)
    with pytest.raises(OutcomeError, match=r"read the run as a dict") as caught:
        car.intervene(run, agent, car.do_resample(0), outcome=OLD_FORMS[form], rollouts=2)
    assert "outcome=lambda run: rule(final_state(run))" in str(caught.value)


def test_another_error_keeps_the_general_message(run: car.Trajectory) -> None:
    def broken(r: car.Trajectory) -> bool:
        return {}["missing"]  # a KeyError of the outcome's own, not a read of the run

    agent = car.FunctionAgent(policy=lambda h, rng: "a", max_steps=2)
    with pytest.raises(OutcomeError, match="fix the outcome function") as caught:
        car.intervene(run, agent, car.do_resample(0), outcome=broken, rollouts=2)
    assert "final_state" not in str(caught.value)
