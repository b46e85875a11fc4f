"""``step_label``: which agent and which step, for results and reports of multi-agent runs."""

from __future__ import annotations

from car_core.model.trajectory import Step, Trajectory, step_label


def _run(agents: list[str | None]) -> Trajectory:
    steps = [Step(index=i, action={"n": i}, observation=None, observed=False, state=None,
                  meta={"agent": a} if a else {}) for i, a in enumerate(agents)]
    return Trajectory.new(context={}, steps=steps)


def test_names_the_agent_and_its_own_count_of_decisions() -> None:
    run = _run(["supervisor", "worker", "supervisor", "worker", "worker"])
    assert step_label(run, 3) == "worker, step 3 (its 2nd decision)"
    assert step_label(run, 4) == "worker, step 4 (its 3rd decision)"
    assert step_label(run, 0) == "supervisor, step 0 (its 1st decision)"


def test_a_step_without_an_agent_or_out_of_range_is_just_its_index() -> None:
    run = _run([None, "a"])
    assert step_label(run, 0) == "step 0" and step_label(run, 7) == "step 7"
