"""What an executor runs: a ``Task`` (one rollout of one arm, with its own plan and noise), a
``Failure`` (a branch that failed on every attempt), ``run_branch`` (the task run and scored)
and ``check_failures`` (when failed branches stop an estimate).

A branch fails when the agent raises or when it comes back with status ``error`` (the framework
raised inside it and the adapter said so): either way it has no outcome. Scoring such a branch
would let a crash count as a rescue (a hook that raises on branches ends every branch before
the failure could happen), so it is retried like a raise and then left out of the estimate.

The base the execution backends (``car_core.engine.execution``,
``car_core.engine.ray_executor``) and the replay
engine share, so none of them imports another to get at it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from car_core.engine.agent import Agent
from car_core.engine.branching import branch_scope
from car_core.errors import RESUME_SAME_ID, AgentError, BranchesFailed, CarError
from car_core.model.capabilities import Capability, capabilities
from car_core.model.interventions import Plan
from car_core.model.outages import is_outage, says_service_down
from car_core.model.outcome import OutcomeFn, ascored, scored
from car_core.model.seeding import Noise
from car_core.model.trajectory import ERROR_STEP, Lineage, Trajectory
from car_core.model.vocabulary import RunStatus
from car_core.secrets.redact import describe
from car_core.stats import wilson

# The most an estimate may leave out: a failed branch is missing data whose outcome could be
# anything, so each arm mean it leaves out of is off by up to the failed share.
FAILED_SHARE = 0.10
# While the estimate runs it stops early only once the failed share is clearly above
# FAILED_SHARE (the lower end of its Wilson interval at this level, from FAILED_SHARE_FROM
# branches on): a few failures early on are not yet a share. When it ends, the share itself is
# judged.
FAILED_SHARE_LEVEL = 0.95
FAILED_SHARE_FROM = 10


@dataclass(frozen=True)
class Task:
    """One rollout to run: which arm it belongs to, its index, its plan and its noise."""

    arm: str
    rollout: int
    plan: Plan
    noise: Noise


@dataclass(frozen=True)
class Failure:
    """A branch that failed on every attempt, with the last error. Estimators leave it out of
    the estimate and report it (``to_dict``); it still counts as one rollout spent."""

    task: Task
    error: str
    attempts: int
    exception: BaseException | None = field(default=None, compare=False, repr=False)
    step: int | None = None  # the step the branch failed at, when the error says
    # the error came after ``step``, the branch's last, finished (a reply that asked for
    # nothing more, then an output guardrail or a hook at the end raised): no later step ran
    after_step: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.task.arm, "rollout": self.task.rollout, "error": self.error,
                "attempts": self.attempts, "step": self.step}

    @property
    def held_arm(self) -> bool:
        """A branch that holds every recorded step: it only re-runs the record, so its failing
        means the replay itself breaks, not that some step's resample did."""
        return not self.task.plan.interventions

    @property
    def where(self) -> int:
        """The step it failed at, or, when its error does not say, the first step it ran live."""
        return self.step if self.step is not None else self.task.plan.start

    def describe(self) -> str:
        """The branch by what it did and where it stopped, then its error. Not by its rollout
        index: a search's indices start in blocks (2**20 for a confirmation), and a trial's
        message read "(rollout 1048576, ...)"."""
        at = ("" if self.step is None else f" (failed after step {self.step}, its last)"
              if self.after_step else f" (stopped at step {self.step})")
        return f"the branch {self.task.plan.words()}{at}: {self.error}"


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of a branch's error, kept with the results and stored (never with a
    key in it). A CAR error gives its message alone: its run and step are the failure's own,
    and its hint would follow the hint of the error that reports the failures."""
    if isinstance(exc, CarError):
        return f"{type(exc).__name__}: {exc.message}"
    return describe(exc)


def returned_run(value: object, agent: object, method: str) -> Trajectory:
    if not isinstance(value, Trajectory):
        raise AgentError(f"{type(agent).__name__}.{method} returned {type(value).__name__}, "
                         "not a car.Trajectory",
                         hint="an Agent's start and branch must return car.Trajectory "
                              "(see car_core.engine.agent.Agent)")
    return value


def run_branch(run: Trajectory, agent: Agent, outcome: OutcomeFn, task: Task,
               caps: frozenset[Capability] | None = None) -> Trajectory:
    """One rollout: the agent's branch under the task's plan, scored, with its lineage. When
    the outcome says when a run is settled and the agent can stop (``Capability.STOP``), the
    branch ends there. ``caps``: the agent's capabilities, when the caller already has them."""
    if caps is None:
        caps = capabilities(agent)
    if not isinstance(outcome, OutcomeFn):  # a bare function given by a benchmark or a test
        outcome = OutcomeFn(outcome)
    with branch_scope():
        if outcome.settles and Capability.STOP in caps:
            traj = agent.branch(run, task.plan, task.noise,
                                stop=outcome.settled)  # type: ignore[call-arg]  # STOP says so
        else:
            traj = agent.branch(run, task.plan, task.noise)
    return score_branch(run, traj, agent, outcome, task)


def score_branch(run: Trajectory, traj: object, agent: object, outcome: OutcomeFn,
                 task: Task) -> Trajectory:
    """A finished branch (``traj``, what ``agent`` returned) scored, with its lineage; a
    branch that came back with status ``error`` raises instead of being scored."""
    return scored(_to_score(run, traj, agent, task), outcome, task.noise)


async def ascore_branch(run: Trajectory, traj: object, agent: object, outcome: OutcomeFn,
                        task: Task) -> Trajectory:
    """``score_branch`` on an event loop: the same branch and value, the outcome awaited (an
    async one) or run in a worker thread (a sync one), so the loop's other branches go on."""
    return await ascored(_to_score(run, traj, agent, task), outcome, task.noise)


def _to_score(run: Trajectory, traj: object, agent: object, task: Task) -> Trajectory:
    """The branch as it is scored: checked, with its lineage."""
    traj = returned_run(traj, agent, "branch")
    if traj.status == RunStatus.ERROR:  # no outcome: retried and left out like a raise
        raise errored_branch(traj, run.id)
    lineage = Lineage(parent_id=run.id, interventions=tuple(task.plan.describe()),
                      branch_step=task.plan.start if task.plan.interventions else None,
                      arm=task.arm, rollout=task.rollout)
    # the lineage first, so an outcome's error can name the branch and the run it came from
    return replace(traj, lineage=lineage)


SERVICE_FIX = ("bring that service up where this estimate runs (or answer the tool with a "
               "simulator)")


def errored_branch(traj: Trajectory, run_id: str | None) -> AgentError:
    """The error a branch that came back with status ``error`` stands for; its step is the one
    it was running (the first it did not finish): its last step where that one called tools and
    got no result (a tool, or a hook after the call, raised: a user trial's error in a tool of
    step 1 read "stopped at step 2"), else the step after its last. A last step that asked for
    nothing (a reply: no tool call, no result) ended the branch, so what raised came after it
    (an output guardrail, a hook at the end): its step is that last one, with
    ``after_step`` (a user trial's guardrail after the reply of step 5 read "stopped at step
    6", a step no branch took). Where the adapter said the step (``ERROR_STEP``: a safe
    tool's error at step 1 of a branch that ran on to step 5), that one."""
    last = traj.steps[-1] if traj.steps else None
    calls = last.action.get("tool_calls") if last is not None and isinstance(
        last.action, dict) else None
    unfinished = last is not None and bool(calls) and not last.observed
    ended = last is not None and not calls and not last.observed
    said = traj.meta.get(ERROR_STEP)  # the adapter knows the step (a safe tool's error)
    step = (said if isinstance(said, int) else
            len(traj.steps) - 1 if unfinished or ended else len(traj.steps))
    if isinstance(said, int):  # a safe tool's world changed: the service, not the agent
        return AgentError(f"the branch ended with status error: {traj.error}", run_id=run_id,
                          step=step, hint=f"{SERVICE_FIX}, then {RESUME_SAME_ID}",
                          tool_world=True)
    return AgentError(f"the branch ended with status error: {traj.error or 'no error given'}",
                      run_id=run_id, step=step,
                      hint="the framework raised inside the branch, or a tool answered it "
                           "otherwise than the record; fix what raised (a node, a hook, a tool) "
                           f"or what the tool reads, then {RESUME_SAME_ID}", **(
                          {"after_step": True} if ended else {}))


def failure_of(task: Task, exc: BaseException | None, attempts: int) -> Failure:
    step = getattr(exc, "step", None)
    context = getattr(exc, "context", None)
    after = isinstance(context, dict) and context.get("after_step") is True
    return Failure(task, describe_error(exc) if exc is not None else "unknown error", attempts,
                   exc, step if isinstance(step, int) else None, after)


def check_failures(failures: Sequence[Failure], ran: int, *, run_id: str,
                   final: bool = False, resumable: bool = True,
                   ran_by_arm: Mapping[str, int] | None = None) -> None:
    """Stop the estimate (``BranchesFailed``) when what failed makes what is left untrustworthy:
    any branch of the held arm (everything held as recorded), more than ``FAILED_SHARE`` of
    the ``ran`` branches (when ``final``; before, only once that is clear, see above), or, with
    ``ran_by_arm`` (the branches each arm ran), an arm whose own failed share is clearly above
    it (the lower end of its Wilson interval): failures of one arm's paths bias that arm's mean
    however few the whole estimate ran (a user trial's re-decided step lost 40% of its
    branches, the failing ones, within a 10% share overall, and a rescue of 0.6 read 1.0)."""
    if not failures:
        return
    then = ("resume the attribution; the branches that finished are kept" if resumable
            else "run it again")
    held = next((f for f in failures if f.held_arm), None)
    if held is not None:
        raise BranchesFailed(
            f"a branch that holds every recorded step failed, so the replay itself breaks "
            f"({len(failures)} of {ran} branches failed; {held.describe()})",
            run_id=run_id, step=held.where, failures=tuple(failures), first=held, ran=ran,
            hint="replaying the record must not raise: fix the agent (or the hook that raises "
                 f"on branches) and {then}")
    share = len(failures) / max(ran, len(failures))
    arm = _arm_over_share(failures, ran_by_arm or {})
    if arm is None:
        if final and share <= FAILED_SHARE:
            return
        if not final and (ran < FAILED_SHARE_FROM
                          or wilson(share, ran, FAILED_SHARE_LEVEL)[0] <= FAILED_SHARE):
            return
    first = failures[0] if arm is None else next(f for f in failures if f.task.arm == arm)
    if arm is not None:
        lost = sum(f.task.arm == arm for f in failures)
        raise BranchesFailed(
            f"{lost} of the {(ran_by_arm or {})[arm]} branches {first.task.plan.words()} "
            f"failed, more than the {FAILED_SHARE:.0%} they may leave out: the ones left "
            f"would stand for paths that did not fail (first: {first.describe()})",
            run_id=run_id, step=first.where, failures=tuple(failures), first=first, ran=ran,
            hint=f"{_fix(first)} and " + ("resume the attribution; the branches that finished "
                                          "are kept" if resumable else "run it again"))
    fix = _fix(first)
    raise BranchesFailed(
        f"{len(failures)} of {ran} branches failed, more than the {FAILED_SHARE:.0%} an "
        f"estimate may leave out (first: {first.describe()})",
        run_id=run_id, step=first.where, failures=tuple(failures), first=first, ran=ran,
        hint=f"{fix} and {then}")


def _fix(first: Failure) -> str:
    """What to do about the failures ``first`` leads: a service its text, or its exception
    (a closed MCP stream has no text; a safe tool whose world changed, ``tool_world``), says
    is down, or the agent."""
    exc = first.exception
    down = says_service_down(first.error) or (exc is not None and is_outage(exc)) or (
        isinstance(exc, CarError) and exc.context.get("tool_world") is True)
    return SERVICE_FIX if down else "fix the agent (or the hook that raises on branches)"


def _arm_over_share(failures: Sequence[Failure], ran_by_arm: Mapping[str, int]) -> str | None:
    """The first arm whose failed share is shown above ``FAILED_SHARE`` (the lower end of its
    Wilson interval at ``FAILED_SHARE_LEVEL``), from ``FAILED_SHARE_FROM`` of its branches on."""
    lost: dict[str, int] = {}
    for f in failures:
        lost[f.task.arm] = lost.get(f.task.arm, 0) + 1
    for arm, n in lost.items():
        ran = ran_by_arm.get(arm, 0)
        if ran >= FAILED_SHARE_FROM and wilson(n / ran, ran, FAILED_SHARE_LEVEL)[0] > FAILED_SHARE:
            return arm
    return None
