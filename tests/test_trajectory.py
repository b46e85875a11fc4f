"""The trajectory record: exact JSON round-trip, chained digests, the state s_k, JSON checks."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trajectories

import car_core as car
from car_core.errors import CorruptRun, InvalidJSONValue, StepOutOfRange


@settings(max_examples=80, deadline=None)
@given(trajectories())
def test_json_round_trip_is_exact(run: car.Trajectory) -> None:
    back = car.Trajectory.from_json(run.to_json())
    assert back == run
    assert back.digest == run.digest
    assert back.to_json() == run.to_json()


@settings(max_examples=60, deadline=None)
@given(trajectories(), st.data())
def test_changing_any_step_field_is_detected(run: car.Trajectory, data: st.DataObject) -> None:
    if not run.steps:
        return
    k = data.draw(st.integers(0, len(run.steps) - 1))
    field = data.draw(st.sampled_from(["action", "observation", "state", "meta"]))
    old = getattr(run.steps[k], field)
    new = {"tampered": old} if field == "meta" else [old, "tampered"]
    raw = run.to_dict()
    raw["steps"][k][field] = new
    with pytest.raises(CorruptRun, match="record it again") as info:
        car.Trajectory.from_dict(json.loads(json.dumps(raw)))
    assert info.value.step == k


def test_editing_the_context_breaks_every_digest(pivot_run: car.Trajectory) -> None:
    raw = pivot_run.to_dict()
    raw["context"] = {"scm": "something else"}
    with pytest.raises(CorruptRun) as info:
        car.Trajectory.from_dict(raw)
    assert info.value.step == 0


def test_reordered_steps_are_detected(pivot_run: car.Trajectory) -> None:
    raw = pivot_run.to_dict()
    raw["steps"][1], raw["steps"][2] = raw["steps"][2], raw["steps"][1]
    with pytest.raises(CorruptRun, match="says it is step"):
        car.Trajectory.from_dict(raw)


def test_truncated_json_is_a_corrupt_run(pivot_run: car.Trajectory) -> None:
    with pytest.raises(CorruptRun, match="truncated or not JSON"):
        car.Trajectory.from_json(pivot_run.to_json()[:-10])
    with pytest.raises(CorruptRun, match="load runs saved by CAR"):
        car.Trajectory.from_dict({"id": "x"})


def test_a_lone_surrogate_in_loaded_json_is_a_corrupt_run(pivot_run: car.Trajectory) -> None:
    text = pivot_run.to_json().replace('"good"', '"\\ud800"', 1)
    with pytest.raises(CorruptRun, match="record it again"):
        car.Trajectory.from_json(text)


@pytest.mark.parametrize("value,where", [
    ((1, 2), "tuple"), (float("nan"), "non-finite"), ({1: "a"}, "non-string key"),
    ({"a": {"b": [object()]}}, "$.a.b[0]"), ("\ud800", "not valid Unicode"),
    ({"\udfff": 1}, "not valid Unicode"),
])
def test_non_json_values_are_refused(value: object, where: str) -> None:
    with pytest.raises(InvalidJSONValue, match=re.escape(where)):
        car.Trajectory.new(context=None, steps=[car.Step(0, action=value)])


def test_steps_must_be_numbered_in_order() -> None:
    with pytest.raises(CorruptRun, match="numbered 0, 1, 2"):
        car.Trajectory.new(context=None, steps=[car.Step(1, action="a")])


def test_history_is_the_record_before_k(pivot_run: car.Trajectory) -> None:
    h = pivot_run.history(3)
    assert h.index == 3 and h.context == pivot_run.context
    assert h.steps == pivot_run.steps[:3]
    assert pivot_run.history(len(pivot_run)).steps == pivot_run.steps


@pytest.mark.parametrize("k", [-1, 7])
def test_history_past_the_end_is_refused(pivot_run: car.Trajectory, k: int) -> None:
    with pytest.raises(StepOutOfRange, match="between 0 and 6"):
        pivot_run.history(k)


@pytest.mark.parametrize("k", [-1, 6])
def test_step_past_the_end_is_refused(pivot_run: car.Trajectory, k: int) -> None:
    with pytest.raises(StepOutOfRange, match="between 0 and 5") as info:
        pivot_run.step(k)
    assert isinstance(info.value, IndexError)


def test_digest_is_a_content_address(pivot_run: car.Trajectory) -> None:
    again = car.Trajectory.new(context=pivot_run.context,
                               steps=[dataclasses.replace(s, digest="") for s in pivot_run.steps])
    assert again.id != pivot_run.id
    assert again.digest == pivot_run.digest
    assert len({s.digest for s in pivot_run.steps}) == len(pivot_run)
