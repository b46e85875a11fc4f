"""The conformance check that a branch from step k starts from the state the record decided
step k from: messages and, through the optional ``framework_state`` hook, framework state.

``NotesAgent`` keeps a framework state the way a workflow store does: beside the history, not
in it. Each step records the notes the earlier steps wrote (``meta["store"]``) and the actions
it saw (``Step.state``, its "messages"). A faithful agent rebuilds both from the whole held
prefix; the buggy ones start the store empty at the branch step (a workflow's initial state)
or forget the held messages, and the check must catch each.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import car_core as car
from car_core.errors import ConformanceFailure
from car_core.testing import ScriptedPolicy, check_held_state, run_conformance

SCRIPT = ["note:ticket", "note:refund", "report", "done"]


def report_failed(run: car.Trajectory) -> bool:
    """The failure: the report went out without the notes the first steps took."""
    return any(s.observation == "no notes" for s in run.steps)


class NotesAgent:
    """A ``FunctionAgent`` whose steps carry a store of notes beside the history."""

    couples_noise = True

    def __init__(self, *, store_from_prefix: bool = True,
                 messages_from_prefix: bool = True) -> None:
        self.store_from_prefix = store_from_prefix
        self.messages_from_prefix = messages_from_prefix
        self.name = "notes-agent"
        self.inner = car.FunctionAgent(policy=ScriptedPolicy(SCRIPT, after="done"),
                                       environment=self._environment,
                                       is_final=lambda a: a == "done", name=self.name)

    @staticmethod
    def _environment(history: car.History, action: Any, rng: Any) -> Any:
        notes = [s.action.split(":")[1] for s in history.steps
                 if str(s.action).startswith("note:")]
        return ("report of " + ",".join(notes) if notes else "no notes") \
            if action == "report" else "noted"

    def _annotate(self, run: car.Trajectory, start: int) -> car.Trajectory:
        """Steps from ``start`` on get their store and messages; a buggy agent builds them
        from the steps from ``start`` only, as if the run began there."""
        steps = list(run.steps[:start])
        for s in run.steps[start:]:
            store_since = 0 if self.store_from_prefix else start
            seen_since = 0 if self.messages_from_prefix else start
            notes = [p.action.split(":")[1] for p in run.steps[store_since:s.index]
                     if p.action.startswith("note:")]
            seen = [p.action for p in run.steps[seen_since:s.index]]
            steps.append(replace(s, state=seen, meta={**s.meta, "store": {"notes": notes}}))
        return car.Trajectory.new(context=run.context, steps=steps, seed=run.seed,
                                  agent=run.agent, status=run.status)

    def framework_state(self, run: car.Trajectory, k: int) -> Any:
        return run.step(k).meta.get("store")

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self._annotate(self.inner.start(context, noise), 0)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        return self._annotate(self.inner.branch(run, plan, noise), plan.start)

    def redecide(self, run: car.Trajectory, k: int, noise: Any) -> Any:
        return self.inner.redecide(run, k, noise)


@pytest.fixture
def run() -> car.Trajectory:
    recorded = car.record(NotesAgent(), context="ticket 7", outcome=report_failed, seed=0)
    assert [s.meta["store"] for s in recorded.steps] == [
        {"notes": []}, {"notes": ["ticket"]}, {"notes": ["ticket", "refund"]},
        {"notes": ["ticket", "refund"]}]
    assert recorded.steps[2].observation == "report of ticket,refund"
    return recorded


def test_a_faithful_agent_passes_the_state_check_in_the_suite() -> None:
    ran = run_conformance(NotesAgent, context="ticket 7", outcome=report_failed, seed=0,
                          identity_rollouts=8)
    assert ran == ["replay", "state", "lineage", "forced", "noise", "identity", "coupling"]


def test_a_branch_that_starts_from_the_initial_store_fails_the_check(run: Any) -> None:
    buggy = NotesAgent(store_from_prefix=False)
    # step 0 starts from the initial store either way, so the first step that shows it is 1
    check_held_state(buggy, run, steps=[0])
    with pytest.raises(ConformanceFailure, match=r"state: .*step 1 from another framework "
                                                 r"state.*\['notes'\]") as err:
        check_held_state(buggy, run)
    assert err.value.step == 1


def test_the_suite_stops_at_the_state_check_for_that_agent() -> None:
    def make() -> NotesAgent:
        return NotesAgent(store_from_prefix=False)
    with pytest.raises(ConformanceFailure, match="framework state"):
        run_conformance(make, context="ticket 7", outcome=report_failed, seed=0)


def test_a_branch_that_forgets_the_held_messages_fails_the_check(run: Any) -> None:
    with pytest.raises(ConformanceFailure, match="other messages than the record") as err:
        check_held_state(NotesAgent(messages_from_prefix=False), run)
    assert err.value.step == 1


def test_an_agent_without_the_hook_is_checked_on_messages_only(run: Any) -> None:
    class NoHook(NotesAgent):
        framework_state = None  # type: ignore[assignment]

    check_held_state(NoHook(store_from_prefix=False), run)   # the store is not its to show
    with pytest.raises(ConformanceFailure, match="other messages"):
        check_held_state(NoHook(messages_from_prefix=False), run)
