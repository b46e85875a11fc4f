"""The trajectory record: exact JSON round-trip, chained digests, the state s_k, JSON checks."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import json_values, text, trajectories

import car_core as car
from car_core.errors import CorruptRun, InvalidJSONValue, StepOutOfRange
from car_core.model.json_values import canonical
from car_core.model.trajectory import content_text
from car_core.model.vocabulary import Origin


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


@given(st.lists(json_values, min_size=1, max_size=6), st.data())
def test_a_state_holding_shared_values_is_encoded_as_its_copy(
        messages: list[object], data: st.DataObject) -> None:
    # each step's state is a prefix of one list of shared objects, as a recorder builds it
    steps = [car.Step(k, action=m, state=messages[:k + 1], meta={"m": m})
             for k, m in enumerate(messages)]
    memo: dict[int, str] = {}
    prev = data.draw(text)
    for step in steps:
        assert content_text(step, prev, memo) == canonical(step.content(prev))


def test_shared_values_seal_to_the_bytes_of_their_copies() -> None:
    message = {"role": "tool", "content": "{\"amount\": 129.0}", "extra": [1, 2.5, None]}
    history = [{"role": "user", "content": "héllo"}, message]
    steps = [car.Step(0, action=message, state=history[:1]),
             car.Step(1, action="done", observation=[message], observed=True, state=history)]
    shared = car.Trajectory.new(context={"messages": history[:1]}, steps=steps, id="r",
                                created_at=1.0, meta={"final": history})
    copied = car.Trajectory.new(context=copy.deepcopy({"messages": history[:1]}),
                                steps=copy.deepcopy(steps), id="r", created_at=1.0,
                                meta={"final": copy.deepcopy(history)})
    assert shared.to_json() == copied.to_json()
    shared.verify()


def test_a_bad_value_shared_by_steps_is_refused_where_it_first_sits() -> None:
    bad = {"role": "user", "content": ("a", "tuple")}
    steps = [car.Step(0, action="a", state=[bad]), car.Step(1, action="b", state=[bad])]
    with pytest.raises(InvalidJSONValue, match=re.escape("state of step 0 is not a JSON value: "
                                                         "tuple at $[0].content")):
        car.Trajectory.new(context=None, steps=steps)


def test_subclasses_of_json_types_are_json_values() -> None:
    class Label(str):
        pass

    run = car.Trajectory.new(context=None, steps=[car.Step(0, action={"label": Label("x")},
                                                           meta={"origin": Origin.RECORD})])
    assert run.steps[0].action == {"label": "x"}
