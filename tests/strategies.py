"""Hypothesis strategies for CAR values, shared by the round-trip tests."""

from __future__ import annotations

from hypothesis import strategies as st

import car_core as car

text = st.text(max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=10)


@st.composite
def trajectories(draw: st.DrawFn) -> car.Trajectory:
    n = draw(st.integers(0, 5))
    steps = []
    for i in range(n):
        observed = draw(st.booleans())
        steps.append(car.Step(
            index=i, action=draw(json_values),
            observation=draw(json_values) if observed else None, observed=observed,
            state=draw(json_values),
            meta=draw(st.dictionaries(text, json_values, max_size=3))))
    lineage = draw(st.none() | st.builds(
        car.Lineage, parent_id=text,
        interventions=st.lists(st.fixed_dictionaries({"kind": st.just("resample"),
                                                      "step": st.integers(0, 9)}),
                               max_size=2).map(tuple),
        branch_step=st.none() | st.integers(0, 9), attribution_id=st.none() | text,
        arm=st.none() | text, rollout=st.none() | st.integers(0, 99)))
    outcome = draw(st.none() | st.builds(car.Outcome, value=st.floats(0, 1), detail=json_values))
    return car.Trajectory.new(
        context=draw(json_values), steps=steps, outcome=outcome,
        seed=draw(st.none() | st.integers(0, 2**62)), agent=draw(text),
        status=draw(st.sampled_from(["complete", "max_steps", "error"])),
        error=draw(st.none() | text), lineage=lineage,
        meta=draw(st.dictionaries(text, json_values, max_size=3)),
        created_at=draw(st.floats(0, 2e9)))
