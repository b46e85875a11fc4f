"""What every chat-framework adapter's branch shares, whatever the framework: the session its
stand-in models and tools read (the plan, the noise, the step counter, the record of tool
calls and a refusal to re-raise), how a collected step takes its place in the branch, how a
branch of an app re-entered at its step is put together (``reentered``) and what it refuses
first (tools changed since the record, a forced result of a tool the app does not own), and
how a model client's outage becomes ``ModelUnavailable`` (the attribution stops, resumable,
instead of every later branch failing on the same dead server). This module imports no
framework."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import car_core as car
from car_core.contract import (
    ERROR_STEP,
    Noise,
    Plan,
    ToolSource,
    canonical_arguments,
    outage_hint,
    redact,
    server_address,
)
from car_core.errors import (
    RESUME_SAME_ID,
    AdapterError,
    CarError,
    InvalidIntervention,
    ModelUnavailable,
)

from .messages import ToolSafety, calls_of, routes
from .sources import TOOL_SOURCES


def model_unavailable(exc: BaseException, *, step: int, run_id: str | None,
                      who: str = "the model server") -> ModelUnavailable:
    """The error that stops an attribution on an outage, saying how to go on: wait or slow
    down for a server that rate-limits, start it for one that is down (its text and cause pass
    the redaction rule: a client's error may quote a key)."""
    where = server_address(exc)
    who = f"{who} at {where}" if where else who
    todo = outage_hint(exc, "start the server or fix its address", who=who)
    out = ModelUnavailable(f"{who} failed at step {step}: {redact.describe(exc)}",
                           run_id=run_id, step=step, hint=f"{todo}, then {RESUME_SAME_ID}")
    out.__cause__ = redact.redacted(exc)
    return out


class BranchSession:
    """The state one branch's stand-ins share: the plan, the noise, and the step counter."""

    def __init__(self, plan: Plan, noise: Noise, start: int, safety: ToolSafety,
                 record: Mapping[tuple[str, str], Any], run_id: str | None,
                 forced_obs: Mapping[int, list[dict[str, Any]]]) -> None:
        self.plan = plan
        self.noise = noise
        self.next = start
        self.current = start - 1
        self.safety = safety
        self.record = record
        self.run_id = run_id
        self.forced_obs = forced_obs
        self.model_calls = 0
        self.blocked: CarError | None = None
        # (step, tool, canonical arguments) -> where the tool's result came from
        self.sources: dict[tuple[int, str, str], ToolSource] = {}
        self._lock = threading.Lock()

    def note(self, k: int, tool: str, arguments: Any, source: ToolSource) -> None:
        """Note where the result of step ``k``'s call of ``tool`` came from (the stand-ins do
        not see the call's id; the step's action has it, matched by tool and arguments)."""
        self.sources[(k, tool, canonical_arguments(arguments))] = source

    def sources_at(self, k: int, action: Any) -> dict[str, ToolSource]:
        """``tool call id -> source`` for the calls of step ``k``'s action noted here."""
        return {cid: self.sources[(k, name, args)] for cid, name, args in calls_of(action)
                if (k, name, args) in self.sources}

    def serves(self, tool: str) -> bool:
        """Whether calls to ``tool`` on this branch must be answered without running it."""
        return self.safety.guards(tool) or any(
            m.get("name") == tool for msgs in self.forced_obs.values() for m in msgs)

    def serves_any(self) -> bool:
        return bool(self.safety.side_effect_tools or self.forced_obs)

    def raise_blocked(self) -> None:
        """Re-raise a refusal a tool stand-in had to hand to the framework (which may turn tool
        exceptions into messages for the model), so the branch stops with it."""
        if self.blocked is not None:
            raise self.blocked

    def claim(self) -> int:
        with self._lock:
            k = self.next
            self.next += 1
            self.current = k
            return k


def renumber(step: car.Step, k: int, plan: Plan,
             session: BranchSession | None = None) -> car.Step:
    """A collected step at its place ``k`` in the branch, with its origin and, given the
    ``session`` it ran in, where each of its tool results came from; a forced observation is
    stored as the user gave it."""
    meta = {**step.meta, "origin": plan.origin(k)}
    sources = session.sources_at(k, step.action) if session is not None else {}
    if sources:
        meta[TOOL_SOURCES] = sources
    if k in plan.forced_observations:
        return replace(step, index=k, meta=meta, observed=True,
                       observation=plan.forced_observations[k])
    return replace(step, index=k, meta=meta)


def reentered(run: car.Trajectory, plan: Plan, noise: Noise, *, agent: str, safety: ToolSafety,
              live: Callable[[int], tuple[Sequence[car.Step], car.Trajectory]]
              ) -> car.Trajectory:
    """A branch of an app that is re-entered at ``k = plan.start``: the recorded steps before
    ``k`` (no model or tool call), then the steps ``live(k)`` collected, already in their
    places, with the live run's status and error. A plan that starts past the record's end
    leaves nothing to decide: the branch is the record's steps."""
    held = _held_only(run, plan, noise, agent=agent, safety=safety)
    return held if held is not None else _joined(run, plan, noise, agent, *live(plan.start))


async def areentered(run: car.Trajectory, plan: Plan, noise: Noise, *, agent: str,
                     safety: ToolSafety,
                     live: Callable[[int], Awaitable[tuple[Sequence[car.Step], car.Trajectory]]]
                     ) -> car.Trajectory:
    """``reentered`` for an adapter whose live part is a coroutine (its ``abranch``)."""
    held = _held_only(run, plan, noise, agent=agent, safety=safety)
    if held is not None:
        return held
    return _joined(run, plan, noise, agent, *(await live(plan.start)))


def _held_only(run: car.Trajectory, plan: Plan, noise: Noise, *, agent: str,
               safety: ToolSafety) -> car.Trajectory | None:
    """The branch when nothing is left to decide (a plan past the record's end), else None."""
    safety.warn_free_text(run.id, run.steps)
    if plan.start < len(run.steps):
        return None
    return car.Trajectory.new(context=run.context, steps=run.held_prefix(plan.start),
                              seed=noise.seed, agent=agent, meta=dict(run.meta))


# meta that says how one run ended (a guardrail that stopped it, the output the SDK ended it
# with at a tool call, the step a safe tool's error belongs to), not what app it ran: a branch
# takes it from its own live part, never from the record (without ``ERROR_STEP`` a trial's MCP
# server down read "failed after step 3, its last ... fix the agent")
ENDING_META = ("tripwire", "final_output", ERROR_STEP)


def _joined(run: car.Trajectory, plan: Plan, noise: Noise, agent: str,
            steps: Sequence[car.Step], collected: car.Trajectory) -> car.Trajectory:
    meta = {k: v for k, v in run.meta.items() if k not in ENDING_META}
    meta.update({k: collected.meta[k] for k in ENDING_META if k in collected.meta})
    return car.Trajectory.new(context=run.context,
                              steps=run.held_prefix(plan.start) + list(steps), seed=noise.seed,
                              agent=agent, status=collected.status, error=collected.error,
                              meta=meta)


def check_recorded_tools(run: car.Trajectory, current: Mapping[str, Sequence[str]]) -> None:
    """Refuse a run recorded with other tools (``agent name -> tool names``, as the recorder
    stamped ``meta["tools"]``): its branches would call tools the record never saw."""
    recorded = run.meta.get("tools")
    if recorded is not None and recorded != current:
        raise AdapterError(f"the app's agents and tools {current} no longer match the recorded "
                           f"ones {recorded}", run_id=run.id,
                           hint="branch with the app (and tools) the run was recorded with, or "
                                "record the run again")


def check_forced_actions(plan: Plan, tools: Iterable[str],
                         record: Mapping[tuple[str, str], Any], run_id: str | None) -> None:
    """Refuse a ``do_action`` whose tool call names no tool of the app (``tools``; a name the
    run called, or one a framework adds to route between agents, passes): every branch would
    answer it with the framework's "not a valid tool" and go on, so the rescue measured that
    error. A trial's typo (``get-order`` for ``get_order``) read as a full rescue."""
    tools = set(tools)  # read twice below: an iterator would be spent by the first
    known = tools | {name for name, _ in record}
    for k, action in sorted(plan.forced_actions.items()):
        if k in plan.held:
            continue
        unknown = sorted({n for _, n, _ in calls_of(action) if n not in known and not routes(n)})
        if unknown:
            raise InvalidIntervention(
                f"do_action at step {k} calls {unknown}, but the app has no such tool (its "
                f"tools: {sorted(tools)}): every branch would answer the call with the "
                "framework's error, and the estimate would measure that error", run_id=run_id,
                step=k, hint="spell each tool name exactly as the app registers it")


def check_forced_tools(session: BranchSession, tools: Mapping[str, Sequence[str]],
                       run_id: str | None, *, why: str,
                       refused: Mapping[str, str] | None = None) -> None:
    """A forced observation can only replace the result of one of the app's own tools
    (``agent name -> tool names``), not of one the framework answers itself (``why`` says
    which), nor of a tool in ``refused`` (``name -> why``: one that must run for the branch
    to stay faithful, as a tool that writes the app's state). A forced action must call the
    app's tools too (``check_forced_actions``)."""
    given = {name for names in tools.values() for name in names}
    check_forced_actions(session.plan, given, session.record, run_id)
    for k, msgs in session.forced_obs.items():
        for m in msgs:
            name = m.get("name")
            if name not in given:
                raise InvalidIntervention(
                    f"do_observation cannot replace the result of {name!r}: {why}",
                    run_id=run_id, step=k,
                    hint="intervene on a step that called one of the app's own tools, or force "
                         "the next action with do_action")
            if refused and name in refused:
                raise InvalidIntervention(
                    f"do_observation cannot replace the result of {name!r}: {refused[name]}",
                    run_id=run_id, step=k,
                    hint="force the step's action with do_action (the tool then runs, its "
                         "writes with it), or change what the next step decides from with "
                         "do_context")
