"""One branch thread in flight: what it was forked for, what it has done, and the trajectory it
records.

``BranchState.open`` checks the user's values (forced actions, the ``do_context`` edit, forced
tool results) and converts the edit to LangChain messages once, then sets up how the thread's
model calls are decided (``Control``) and its tools answered (``Guard``). The recorder, the
guard and ``collect`` all read the same state, so the step a tool call belongs to counts the
step written without a model call (``offset``) wherever it is asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from langchain_core.messages import BaseMessage, ToolMessage

from car_core.contract import Noise, RunStatus, Step, Trajectory, offered_tools, state_of
from car_core.errors import InvalidIntervention

from ..common.messages import (
    ToolSafety,
    apply_edit,
    calls_of,
    check_action,
    check_observation,
    consistent,
    recorded_calls,
)
from ..common.offered_tools import edited_descriptions
from ..common.sources import Drift, Reruns, drifted_tools, tool_errors, with_sources
from .guard import RUN, Guard, Replay
from .messages import BLOCKS, from_dicts, jsonable, state_json, to_dict, to_dicts
from .model import Control
from .plan import BranchPlan, tool_content
from .step_meta import PROMPT_FIRST, builds_input, prompt_first, split_prompt


class BranchRecorder(Protocol):
    """What a branch reads from the callback recording its thread while it runs
    (``CarCallback``, made by the agent inside the branch so it records it): the branch only
    reads the recording, so it never imports the recorder."""

    decisions_started: int  # model calls started so far

    @property
    def runs(self) -> list[Trajectory]: ...

    def tool_results(self) -> dict[str, ToolMessage]: ...

    def decision_with_call(self, tool_call_id: str) -> tuple[int, BaseMessage] | None: ...

    def open_steps(self, values: Any) -> list[Step]: ...


@dataclass
class BranchState:
    """A branch of ``run`` under ``plan`` in thread ``thread_id``, recorded by ``callback``."""

    run: Trajectory
    plan: BranchPlan
    noise: Noise
    agent: str  # the agent's name, recorded on the branch
    thread_id: str
    forced: dict[int, Any]  # step -> forced action, checked
    control: Control
    callback: BranchRecorder
    guard: Guard
    edited: list[BaseMessage] | None = None  # the edit the fork writes into the checkpoint
    inputs: dict[int, Any] = field(default_factory=dict)  # step -> model input CAR gave, as dicts
    prompts: dict[int, Any] = field(default_factory=dict)  # step -> system prompt CAR gave
    tools: dict[int, Any] = field(default_factory=dict)  # step -> tool specs CAR bound
    stop: Callable[[Trajectory], bool] | None = None
    offset: int = 0  # 1 once the branch step is written as its node, without a model call
    # the branch's safe tools, run again where one errored live (``sources.drifted_tools``)
    reruns: Callable[[], Reruns] | None = None

    @classmethod
    def open(cls, run: Trajectory, plan: BranchPlan, noise: Noise, thread_id: str, *,
             agent: str, safety: ToolSafety, decides: bool, coupled: bool,
             recorder: BranchRecorder, at_call: bool = False,
             stop: Callable[[Trajectory], bool] | None = None) -> BranchState:
        """``decides``: CAR decides the app's model calls (``model=`` was given); ``coupled``:
        those calls take CAR's per-step seeds; ``recorder``: the callback that records the
        thread (the agent passes it in the config of the thread's run); ``at_call``: an edited
        system prompt or tool descriptions reach step ``start``'s model call (``refusals``)."""
        k = plan.start
        forced = {j: check_action(a, step=j) for j, a in plan.actions.items()}
        edited = prompt = None
        described: dict[str, str] = {}
        if plan.edit is not None:
            given = apply_edit(plan.edit, state_of(run, k), run_id=run.id, step=k)
            messages = consistent([dict(m) for m in _message_dicts(given, run.id, k)],
                                  run_id=run.id, step=k)
            if prompt_first(run.steps[k]):
                prompt, messages = split_prompt(messages, len(run.steps[k].meta["prompt"]))
                if prompt == run.steps[k].meta["prompt"]:
                    prompt = None  # the node prepends the same prompt again: nothing to give
                elif not at_call:
                    raise _prompt_refused(run, k)
            described = _described(run, k, offered_tools(given), at_call)
            edited = from_dicts(messages)
        control = Control(k, forced={j: a for j, a in forced.items()
                                     if j > k or (j == k and decides)},
                          policy=plan.policy, noise=noise if coupled else None)
        state = cls(run, plan, noise, agent, thread_id, forced, control,
                    recorder,
                    Guard(safety, answerable_calls(run), run_id=run.id), stop=stop)
        if edited is not None and builds_input(run.steps[k]):
            control.inputs[k] = edited  # its task builds its input: edit it at the call
            state.inputs[k] = to_dicts(edited)
        elif prompt is not None and edited is not None:
            # the graph's messages go to the fork, for the steps after; the edited prompt and
            # them are step k's whole model input, given at the call its node prepends it to
            state.edited = edited
            control.inputs[k] = [*from_dicts(prompt), *edited]
            state.inputs[k], state.prompts[k] = to_dicts(edited), prompt
        else:
            state.edited = edited
        if described:  # bound, with the descriptions edited, at step k's call only
            control.tools[k] = described
            state.tools[k] = [{**t, "description": described.get(t["name"], t["description"])}
                              for t in run.steps[k].meta["tools"]]
        state.guard.step = state.current_step
        state.guard.step_of = state.call_step
        if k in plan.observations:
            given = plan.observations[k]
            for m in check_observation(given, forced.get(k, run.steps[k].action), step=k):
                state.guard.forced[str(m.get("tool_call_id"))] = tool_content(m.get("content"),
                                                                              given)
        state.guard.lookup = state.forced_later if plan.later_observations else None
        return state

    @property
    def settles(self) -> bool:
        """Whether the branch may end early where the outcome is settled (not when a later
        step's context is edited: that edit has to run)."""
        return self.stop is not None and not self.plan.edits_later

    def current_step(self) -> int:
        """The step the thread is deciding now (a refusal of a tool call names it)."""
        return self.plan.start + self.offset + max(self.callback.decisions_started - 1, 0)

    def call_step(self, tool_call_id: str) -> int:
        """The step whose decision made the tool call ``tool_call_id`` (a refusal of the call
        names it): a forced action's, or the branch's decision that made it; the step being
        decided where neither holds it. ``current_step`` alone named the step after a forced
        action for that action's own calls (a trial's ``do_action(0, ...)`` refusal said step
        1, whose model only replied)."""
        for j, action in self.forced.items():
            if any(c.get("id") == tool_call_id for c in action.get("tool_calls") or ()):
                return j
        found = self.callback.decision_with_call(tool_call_id)
        if found is not None:
            return self.plan.start + self.offset + found[0]
        return self.current_step()

    def forced_later(self, tool_call_id: str) -> Any:
        """The forced result of a live later step's tool call, or ``RUN``."""
        found = self.callback.decision_with_call(tool_call_id)
        if found is None:
            return RUN
        j = self.plan.start + self.offset + found[0]
        later = self.plan.later_observations
        if j not in later:
            return RUN
        given = check_observation(later[j], to_dict(found[1]), step=j)
        return next(tool_content(m.get("content"), later[j]) for m in given
                    if m.get("tool_call_id") == tool_call_id)

    async def settle(self, values: Any) -> Trajectory | None:
        """The branch so far, if ``stop`` says its outcome is settled with graph state
        ``values``."""
        assert self.stop is not None
        partial = await self.collect(RunStatus.SETTLED, values, self.callback.open_steps(values))
        if partial.status == RunStatus.ERROR:  # a safe tool drifted: never scored
            return partial
        return partial if self.stop(partial) else None

    async def collect(self, status: str, final: Any, live: list[Step] | None = None
                      ) -> Trajectory:
        """The branch as a trajectory: the held prefix, the step written as its node (if
        any), then the steps the callback recorded (``live``: all it finished)."""
        run, plan, k = self.run, self.plan, self.plan.start
        steps = run.held_prefix(k)
        if live is None:
            live = [s for r in self.callback.runs for s in r.steps]
        if self.offset:  # step k was written as its node, without a model call
            rec = run.steps[k]
            results = self.callback.tool_results()
            obs = [to_dict(results[cid]) for cid, _, _ in calls_of(self.forced[k])
                   if cid in results]
            given = plan.recorded_observation(k, obs or None)
            steps.append(with_sources(Step(
                index=k, action=dict(self.forced[k]), observation=given,
                observed=given is not None, state=rec.state,
                meta=jsonable({**rec.meta, "thread_id": self.thread_id,
                               "origin": plan.origin(k)})), self.guard.sources))
        for i, s in enumerate(live):
            j = k + self.offset + i
            meta = {**s.meta, "thread_id": self.thread_id, **self.control.steps.get(j, {}),
                    "origin": plan.origin(j)}
            if j in self.inputs:  # the callback saw the input before CAR replaced it
                s = replace(s, state=self.inputs[j])
            if j in self.prompts:  # and the prompt its node prepended, not the one CAR gave
                meta.update(prompt=self.prompts[j], input=PROMPT_FIRST)
            if j in self.tools:  # and the tools as CAR bound them, described as edited
                meta["tools"] = self.tools[j]
            steps.append(with_sources(Step(
                index=j, action=s.action, observation=plan.recorded_observation(j, s.observation),
                observed=s.observed or j in plan.observations, state=s.state,
                meta=jsonable(meta)), self.guard.sources))
        drift = await self._drift(steps[k:])
        out = Trajectory.new(context=run.context, steps=steps, seed=self.noise.seed,
                             agent=self.agent, status=status,
                             meta={"framework": "langgraph", "thread_id": self.thread_id,
                                   "parent_thread_id": run.meta.get("thread_id"),
                                   "final_state": state_json(final)})
        return out if drift is None else drift.on(out)

    async def _drift(self, new: list[Step]) -> Drift | None:
        """Why the branch cannot be scored when a safe tool errored on it and CAR cannot show
        the error was the call's own (``sources.drifted_tools``, running the tool again with
        ``reruns``): the branch's tool messages as the callback saw them, the record's from its
        final state (``status`` kept there)."""
        now = tool_errors(self.callback.tool_results().values())
        if not now:
            return None
        assert self.reruns is not None  # set by the agent before the branch runs
        return await drifted_tools(self.run.steps, tool_errors(_final_messages(self.run)), new,
                                   now, self.reruns())


def answerable_calls(run: Trajectory) -> dict[tuple[str, str], Any]:
    """Every tool call of ``run`` a branch's matching call may be answered with: the tool calls
    of its decisions, and the calls its nodes made themselves (recorded by the callback). A
    result that was a list of content blocks (an MCP tool's) is that list, as the run's final
    state keeps it, not the JSON string a step stores."""
    blocks = {str(m.get("tool_call_id")): m[BLOCKS] for m in _final_messages(run)
              if m.get("role") == "tool" and isinstance(m.get(BLOCKS), list)}
    out = recorded_calls([replace(s, observation=[
        {**m, "content": blocks[str(m.get("tool_call_id"))]}
        if isinstance(m, Mapping) and str(m.get("tool_call_id")) in blocks else m
        for m in s.observation]) if isinstance(s.observation, list) else s
        for s in run.steps])
    for call in run.meta.get("node_tool_calls") or ():
        if isinstance(call, Mapping) and call.get("name"):
            out.setdefault((str(call["name"]), str(call.get("arguments"))), call.get("content"))
    # a tool whose Command wrote state: an identical call whose write the record holds as JSON
    # replays it; its other calls are answered by its simulator, which writes it again
    writers = set(run.meta.get("state_writing_tools") or ())
    if not writers:
        return out
    replays = _replays(run)
    return {key: replays.get(key, v) for key, v in out.items()
            if key[0] not in writers or key in replays}


def _replays(run: Trajectory) -> dict[tuple[str, str], Replay]:
    """``(tool, canonical arguments) -> Replay`` for the recorded calls whose ``Command`` update
    the recorder kept as JSON (``meta["state_writes"]``, by tool call id)."""
    writes = run.meta.get("state_writes") or {}
    out: dict[tuple[str, str], Replay] = {}
    for s in run.steps:
        results = {m.get("tool_call_id"): m.get("content")
                   for m in (s.observation or ()) if isinstance(m, Mapping)}
        for cid, name, args in calls_of(s.action):
            w = writes.get(cid)
            if isinstance(w, Mapping) and isinstance(w.get("update"), Mapping) \
                    and w.get("tool") == name and cid in results:
                out.setdefault((name, args), Replay(results[cid], dict(w["update"]),
                                                    str(w.get("messages_key") or "messages")))
    return out


def _final_messages(run: Trajectory) -> list[Mapping[str, Any]]:
    """The stored messages of ``run``'s final graph state, in every channel."""
    state = run.meta.get("final_state")
    values = state.values() if isinstance(state, Mapping) else ()
    return [m for v in values if isinstance(v, list) for m in v if isinstance(m, Mapping)]


def _prompt_refused(run: Trajectory, k: int) -> InvalidIntervention:
    """The refusal of an edited system prompt at a step whose model call CAR does not decide on
    this agent: the node prepends the recorded prompt at the call, past the fork's reach."""
    return InvalidIntervention(
        f"the do_context edit changes step {k}'s system prompt, which node "
        f"{run.steps[k].meta.get('node')!r} prepends at the model call, and CAR does not "
        "decide that call here, so the edited prompt cannot reach the model", run_id=run.id,
        step=k, hint="pass the CarMiddleware or CarChatModel the app was built with as "
                     "LangGraphAgent(app, model=...), or leave the system prompt as recorded "
                     "(context_attribution's sources= without it)")


def _described(run: Trajectory, k: int, given: Any, at_call: bool) -> dict[str, str]:
    """The descriptions a ``do_context`` edit of step ``k`` changed (``edited_descriptions``),
    refused where CAR does not decide the call, so they could not reach the model."""
    described = edited_descriptions(run, k, given)
    if described and not at_call:
        raise InvalidIntervention(
            f"the do_context edit changes step {k}'s tool descriptions, which are bound at the "
            "model call, and CAR does not decide that call here, so the edited descriptions "
            "cannot reach the model", run_id=run.id, step=k,
            hint="pass the CarMiddleware or CarChatModel the app was built with as "
                 "LangGraphAgent(app, model=...), or leave the tool descriptions as recorded "
                 "(context_attribution's sources= without them)")
    return described


def _message_dicts(edited: Any, run_id: str, k: int) -> list[Mapping[str, Any]]:
    """What a ``do_context`` edit returned, refused unless it is a list of message dicts."""
    if isinstance(edited, (str, bytes)) or not isinstance(edited, (list, tuple)):
        raise InvalidIntervention(f"the do_context edit returned {type(edited).__name__}, not a "
                                  "list of messages", run_id=run_id, step=k,
                                  hint="the edit takes and returns the list of message dicts")
    for m in edited:
        if not isinstance(m, Mapping):
            raise InvalidIntervention(f"the do_context edit returned a non-message {m!r}",
                                      run_id=run_id, step=k,
                                      hint="each message is a dict with 'role' and 'content'")
    return list(edited)
