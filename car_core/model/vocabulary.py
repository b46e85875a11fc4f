"""The words CAR writes into runs and the store, as ``StrEnum``s.

Each member *is* its string (``Origin.HELD == "held"``), so stored runs, JSON and digests read
exactly as before; code compares and writes members instead of literals.
"""

from __future__ import annotations

from enum import StrEnum


class Origin(StrEnum):
    """Who decided a step (``step.meta["origin"]``)."""

    RECORD = "record"  # the factual run, as recorded
    HELD = "held"  # copied from the record: no model call, no tool call
    FORCED = "forced"  # the action was set by do_action (or held after a resampled step)
    LIVE = "live"  # decided by the agent's own policy on the branch
    EDITED = "edited"  # decided after a do_context edit of its history
    POLICY_SWAPPED = "policy-swapped"  # decided by the policy do_policy put in


class ToolSource(StrEnum):
    """Where a tool result on a branch step came from: ``step.meta["tool_sources"]`` maps the
    id of each tool call the step's action made to one of these. Written by adapters on the
    steps a branch decides (a held step is copied from the record whole: its origin says so);
    a call an adapter could not tell the source of is left out."""

    LIVE = "live"  # the tool ran on the branch (a safe tool)
    RECORD = "record"  # the tool did not run: the result of the matching recorded call
    SIMULATOR = "simulator"  # the tool did not run: the user's simulator answered
    FORCED = "forced"  # the tool did not run: do_observation gave the result


# Steps that spend model tokens / money on a branch.
SPENDING_ORIGINS = (Origin.LIVE, Origin.EDITED, Origin.POLICY_SWAPPED)
# Steps the agent's own policy did not decide from the recorded state.
NOT_REDECIDED = (Origin.FORCED, Origin.HELD, Origin.EDITED, Origin.POLICY_SWAPPED)


class RunStatus(StrEnum):
    """How a run ended (``Trajectory.status``)."""

    COMPLETE = "complete"
    MAX_STEPS = "max_steps"  # stopped at the agent's step limit
    ERROR = "error"  # the framework raised; the trajectory says why
    INTERRUPTED = "interrupted"  # a LangGraph interrupt paused it
    SETTLED = "settled"  # a branch stopped once its outcome could no longer change


class Answer(StrEnum):
    """Which of the three answers an attribution gives; every surface says which one it is."""

    LOCUS = "locus"  # a step is shown to matter, with family-wise error <= alpha
    NO_CAUSE = "no cause"  # the estimate finished and no step's rescue was shown positive
    UNDECIDED = "undecided"  # the budget ran out first; ``candidate`` is the step it was testing


class AttributionStatus(StrEnum):
    """The state of a stored attribution."""

    RUNNING = "running"
    COMPLETE = "complete"
    TRUNCATED = "truncated"  # the budget tripped; the result keeps what was measured
