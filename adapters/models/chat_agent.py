"""A chat agent over OpenAI-style messages, and the base every model policy shares.

The agent is a ``car.FunctionAgent``: its context is the initial message list, its policy is a
model policy (``OpenAIPolicy``, ``OllamaPolicy``, ``LocalPolicy``), its environment runs the
action's tool calls and answers with tool messages, and it stops at the first action with no
tool calls.

An action is an assistant message dict ``{"role": "assistant", "content", "tool_calls"}`` with
tool-call ids that depend only on the step and position (``call_<k>_<i>``), so that re-deciding
a recorded state can reproduce the recorded action exactly whatever ids a server invents. A
response that cannot be used (a malformed tool call, a reply cut off at ``max_tokens``) is not
an exception: the action carries ``finish_reason`` and ``error`` and ends the run, so the
failure is recorded and attributable like any other. What the engine needs besides the action
(model, token usage, seed, latency, fingerprint) is handed back through ``step_meta()``.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import car_core as car
from car_core.contract import Noise, Plan, StopRule, ToolSource, redact
from car_core.errors import CarError, InvalidInput, PolicyError

from ..common.branch import check_forced_actions
from ..common.messages import (
    Simulator,
    ToolSafety,
    assistant,
    calls_of,
    parse_arguments,
    recorded_calls,
    tool_call,
    tool_result,
)
from ..common.named import refuse_side_effect_functions
from ..common.sources import (
    Drift,
    Reruns,
    answered_error,
    drifted_tools,
    reads_as_outage,
    with_sources,
)
from ..common.sync import run_sync

Message = dict[str, Any]
EnvironmentFn = Callable[[car.History, Any, np.random.Generator], list[Message]]


@dataclass
class _Branch:
    """The counterfactual branch being driven: its run's id and recorded calls, and where each
    tool result of its steps came from (step -> tool call id -> source), noted as the
    environment answers them."""

    run_id: str
    record: dict[tuple[str, str], Any]
    sources: dict[int, dict[str, ToolSource]] = field(default_factory=dict)


_BRANCH: contextvars.ContextVar[_Branch | None] = \
    contextvars.ContextVar("car_chat_branch", default=None)


def _current_branch() -> _Branch | None:
    """The branch being driven, if any. Environments read it through this module-level
    function, not the ContextVar itself: a closure pickled by value (cloudpickle, for Ray
    workers) then refers to the function by name instead of capturing an unpicklable
    ContextVar."""
    return _BRANCH.get()


def context_messages(context: Any) -> list[Message]:
    """The run's context as a message list: a list of messages, or a string as one user turn."""
    if isinstance(context, str):
        return [{"role": "user", "content": context}]
    if isinstance(context, list) and all(isinstance(m, dict) and "role" in m for m in context):
        return [dict(m) for m in context]
    raise InvalidInput("a chat agent's context must be a list of messages or a string",
                       hint='pass context=[{"role": "user", "content": "..."}]')


def assistant_message(action: Any) -> Message:
    """The part of an action a model sees again: role, content and tool calls."""
    if not isinstance(action, dict):
        return {"role": "assistant", "content": json.dumps(action)}
    msg: Message = {"role": "assistant", "content": action.get("content")}
    if action.get("tool_calls"):
        msg["tool_calls"] = action["tool_calls"]
    return msg


def history_messages(history: car.History) -> list[Message]:
    """The messages step ``history.index`` decides from: context, then each step's assistant
    message and its tool results."""
    messages = context_messages(history.context)
    for step in history.steps:
        messages.append(assistant_message(step.action))
        if isinstance(step.observation, list):
            messages.extend(m for m in step.observation if isinstance(m, dict))
    return messages


def tool_schema(name: str, description: str, properties: Mapping[str, Any],
                required: Sequence[str] | None = None) -> dict[str, Any]:
    """An OpenAI function-tool schema."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": dict(properties),
                       "required": list(required if required is not None else properties)}}}


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> set[str]:
    return {t["function"]["name"] for t in tools or () if "function" in t}


def make_action(k: int, content: str | None, calls: Sequence[tuple[str, Any]],
                finish_reason: str | None, tools: Sequence[Mapping[str, Any]] | None,
                max_tokens: int | None) -> dict[str, Any]:
    """Build a clean action from a model's reply. ``calls`` are ``(name, arguments)`` with
    arguments a dict or a JSON string; bad ones become a recorded error, not an exception."""
    known = tool_names(tools)
    parsed, problems = [], []
    for i, (name, args) in enumerate(calls):
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                problems.append(f"arguments of {name!r} are not JSON: {args[:80]!r}")
                continue
        if not isinstance(args, dict):
            problems.append(f"arguments of {name!r} are not an object")
            continue
        if known and name not in known:
            problems.append(f"unknown tool {name!r}")
            continue
        parsed.append(tool_call(f"call_{k}_{i}", name, args))
    action = assistant(content or None, parsed if not problems and finish_reason != "length"
                       else ())
    if finish_reason == "length":
        action["finish_reason"] = "length"
        action["error"] = f"the reply was cut off at max_tokens={max_tokens}"
    elif problems:
        action["finish_reason"] = finish_reason or "stop"
        action["error"] = "malformed tool call: " + "; ".join(problems)
    return action


class ChatPolicy:
    """What every model policy shares: turning a history into messages, a noise-derived seed,
    and per-thread metadata about the last decision for the engine (``step_meta``)."""

    model: str = ""
    tools: list[dict[str, Any]] | None = None
    remote = False  # True when each decision waits on a model server
    # Whether the same state and seed give the same reply: None means measure it (once per
    # policy object, by ``seed_check``); a backend known to honour the seed says True.
    honours_seed: bool | None = None
    PROBE_SEED = 1_234_567
    SEED_REPEATS = 4  # more calls with the probe seed where another seed changed the reply

    def __init__(self) -> None:
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (Ray ships the agent to its workers): the per-thread meta stays behind."""
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def complete(self, messages: list[Message], seed: int, k: int
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One model call: (action, meta). Subclasses implement it."""
        raise NotImplementedError

    def __call__(self, history: car.History, rng: np.random.Generator) -> dict[str, Any]:
        seed = int(rng.integers(2**31 - 1))
        started = time.monotonic()
        action, meta = self.complete(history_messages(history), seed, history.index)
        meta = {"model": self.model, "seed": seed, **meta,
                "latency_s": round(time.monotonic() - started, 4)}
        self._local.meta = meta
        return action

    def seed_check(self, states: Sequence[tuple[list[Message], int]]) -> str | None:
        """Why branches cannot share this model's randomness, or None when they can: each of
        ``states`` (messages, step) is decided twice with one seed and the replies compared
        (llama.cpp's ``chatml-function-calling`` format, for one, ignores the request seed),
        and once with another seed until some state's reply changes with it, that state then
        ``SEED_REPEATS`` more times with the first seed. Only a model
        whose replies follow the seed, the same for one and another for another, is taken to
        honour it: a hosted model that ignores seeds answers states it is sure of alike
        whatever the seed, and a trial's check called it seed-honouring in 29 of 41
        attributions (retrying a branch that raised then favours the paths that do not).
        Measured once per policy object; the calls are not charged to any budget."""
        if self.honours_seed is True:
            return None
        verdict = self.__dict__.get("_seed_verdict")
        if verdict is None:
            verdict, varied = "", False

            def ignored(k: int) -> str:
                return (f"measured: model {self.model!r} gave two different replies to the "
                        f"state of step {k} with one seed, so it ignores the request seed and "
                        "branches cannot share its randomness")
            for messages, k in states:
                first, again = (self._probe(messages, k) for _ in range(2))
                if first != again:
                    verdict = ignored(k)
                    break
                if varied or self._probe(messages, k, self.PROBE_SEED + 1) == first:
                    continue
                varied = True
                # the reply changed with the seed, or by the model's own chance: a model that
                # ignores the seed repeated itself twice there by chance in 4 of 12 of a
                # trial's checks; asked SEED_REPEATS more times, a seed-honouring one still
                # repeats itself
                if any(self._probe(messages, k) != first for _ in range(self.SEED_REPEATS)):
                    verdict = ignored(k)
                    break
            if not verdict and not varied:
                verdict = (f"measured: model {self.model!r} gave the same reply to each state "
                           "probed whatever the seed, so whether it honours the request seed "
                           "could not be told; branches do not share its randomness")
            self.__dict__["_seed_verdict"] = verdict
        return verdict or None

    def _probe(self, messages: list[Message], k: int, seed: int | None = None
               ) -> dict[str, Any]:
        try:
            return self.complete(messages, self.PROBE_SEED if seed is None else seed, k)[0]
        except CarError:
            raise
        except Exception as exc:  # as call_policy reports a policy's own failure
            raise PolicyError(f"the policy raised {redact.describe(exc)} while CAR checked whether "
                              "it honours the seed", step=k,
                              hint="run the policy alone to see the error"
                              ) from redact.redacted(exc)

    def step_meta(self) -> dict[str, Any]:
        """Metadata of this thread's last decision (model, params, usage, seed, latency)."""
        meta = getattr(self._local, "meta", None) or {}
        self._local.meta = None
        return meta


def run_tools(tools: Mapping[str, Callable[..., Any]],
              safety: ToolSafety | None = None) -> EnvironmentFn:
    """An environment that runs each tool call with ``tools[name](**arguments)`` and answers
    with tool messages; a tool that raises answers with its error, as real agents see it,
    except a CAR error (a blocked side effect, a budget), which stops the branch. On a
    counterfactual branch the tools ``safety`` guards never run: ``safety.serve`` answers them
    from the record, by a simulator, or stops the branch with ``SideEffectBlocked``."""
    def environment(history: car.History, action: Any, rng: np.random.Generator
                    ) -> list[Message]:
        results = []
        branch = _current_branch()
        sources: dict[str, ToolSource] = {}
        if branch is not None:  # a step decided again (after an edit) notes its sources anew
            branch.sources[history.index] = sources
        for call in (action or {}).get("tool_calls") or []:
            name = call["function"]["name"]
            args = parse_arguments(call["function"]["arguments"] or "{}")
            fn = tools.get(name)
            content: Any
            if branch is not None and safety is not None and safety.guards(name):
                found = safety.served(name, args, branch.record, run_id=branch.run_id,
                                      step=history.index)
                content, sources[str(call["id"])] = found.content, found.source
            elif fn is None:
                content = f"error: no tool named {name!r}"
            else:
                sources[str(call["id"])] = ToolSource.LIVE
                try:
                    content = fn(**args)
                except CarError:
                    raise
                except Exception as exc:  # the tool's own failure is part of the episode
                    content = f"{TOOL_ERROR}{redact.redact(str(exc))}"
            results.append(tool_result(call["id"], name, content))
        return results
    return environment


TOOL_ERROR = "error: "  # how a tool that raised answers the model


def _tool_errors(steps: Iterable[car.Step]) -> dict[str, str]:
    """The tool results of ``steps`` that were errors (a tool that raised, or returned its
    outage as text), by tool call id."""
    out = {}
    for step in steps:
        for m in step.observation if isinstance(step.observation, list) else ():
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, str) and (content.startswith(TOOL_ERROR)
                                             or reads_as_outage(content)):
                out[str(m.get("tool_call_id"))] = content.removeprefix(TOOL_ERROR)
    return out


def _rerun(tools: Mapping[str, Callable[..., Any]]) -> Callable[[str, str], Any]:
    """Runs one call of a safe tool again, outside any branch: its error, or None."""
    async def rerun(name: str, args: str) -> str | None:
        try:
            content = tools[name](**parse_arguments(args or "{}"))
        except CarError:
            raise
        except Exception as exc:
            return redact.redact(str(exc)) or type(exc).__name__
        # the test ``_tool_errors`` reads a branch's results with: a tool may return its error
        return answered_error(str(content), str(content).startswith(TOOL_ERROR))
    return rerun


def is_final(action: Any) -> bool:
    """A chat agent stops at the first reply with no tool calls (an answer or an error)."""
    return not (isinstance(action, dict) and action.get("tool_calls"))


@dataclass
class ChatFunctionAgent(car.FunctionAgent):
    """The ``car.FunctionAgent`` a ``ChatAgent`` is: its branches run with the record's tool
    calls at hand, so the environment can answer side-effect tools without running them."""

    safety: ToolSafety = field(default_factory=ToolSafety)
    prefers_concurrency: bool = False
    tools: Mapping[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def caveats(self) -> tuple[str, ...]:
        """What every result must say: tools left unclassified that branches ran live."""
        return self.safety.caveats

    def seed_check(self, run: car.Trajectory) -> str | None:
        """Measured by the policy (see ``ChatPolicy.seed_check``) on the run's first, middle
        and last recorded states; a plain policy function draws from CAR's noise, so None."""
        check = getattr(self.policy, "seed_check", None)
        if not callable(check) or not run.steps:
            return None
        ks = sorted({0, len(run.steps) // 2, len(run.steps) - 1})
        return check([(history_messages(run.history(k)), k) for k in ks])  # type: ignore[no-any-return]

    def check_plan(self, run: car.Trajectory, plan: Plan) -> None:
        """Refuse, before any branch, a ``do_action`` calling a tool this agent does not
        have: the branch would answer it "no tool named ..." and the estimate measure that."""
        check_forced_actions(plan, self.tools, recorded_calls(run.steps), run.id)

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise,
               stop: StopRule | None = None) -> car.Trajectory:
        self.safety.warn_free_text(run.id, run.steps)
        branch = _Branch(run.id, recorded_calls(run.steps))
        token = _BRANCH.set(branch)
        try:
            out = super().branch(run, plan, noise, stop=stop)
        finally:
            _BRANCH.reset(token)
        out = _with_sources(out, plan, branch.sources)
        drift = self._drift(run, out.steps[plan.start:])
        return out if drift is None else drift.on(out)

    def _drift(self, run: car.Trajectory, new: Sequence[car.Step]) -> Drift | None:
        """Why the branch is not scored: a safe tool returned an error live that CAR cannot
        show was the call's own (``sources.drifted_tools``: the same call run again, and the
        record's answered call of the tool). A tool that raised answers with ``error: ...``,
        which the model reads like any result, so without this a flaky lookup on a branch
        read as a rescue of the step that re-worded its call."""
        now = _tool_errors(new)
        if not now:
            return None
        safe = [name for name in self.tools if name in self.safety.safe_tools]
        reruns = Reruns(safe, _rerun(self.tools), self.safety.safe_tools)
        return run_sync(lambda: drifted_tools(run.steps, _tool_errors(run.steps), new, now,
                                              reruns))


def _with_sources(run: car.Trajectory, plan: Plan,
                  noted: Mapping[int, Mapping[str, ToolSource]]) -> car.Trajectory:
    """The branch with each step's ``meta["tool_sources"]``: what the environment noted, and
    the forced source for every call of a step whose observation ``do_observation`` gave."""
    def found(step: car.Step) -> Mapping[str, ToolSource]:
        if step.index in plan.forced_observations:
            return {cid: ToolSource.FORCED for cid, _, _ in calls_of(step.action)}
        return noted.get(step.index, {})

    steps = [s if s.index < plan.start else with_sources(s, found(s)) for s in run.steps]
    if all(new is old for new, old in zip(steps, run.steps, strict=True)):
        return run
    return car.Trajectory.new(context=run.context, steps=steps, id=run.id, outcome=run.outcome,
                              seed=run.seed, agent=run.agent, status=run.status,
                              error=run.error, lineage=run.lineage, meta=run.meta,
                              created_at=run.created_at)


def ChatAgent(policy: Callable[..., Any], tools: Mapping[str, Callable[..., Any]] | None = None,
              *, safe_tools: Iterable[str] = (), side_effect_tools: Iterable[str] = (),
              simulators: Mapping[str, Simulator] | None = None,
              match_on: Mapping[str, Iterable[str] | str] | None = None, max_steps: int = 8,
              name: str = "chat-agent", unclassified: str = "refuse") -> ChatFunctionAgent:
    """A tool-calling chat agent as a ``car.FunctionAgent``. Every tool is classified here:
    ``safe_tools`` run live on branches; ``side_effect_tools`` never run on a counterfactual
    branch: a call is answered from the record when it matches a recorded call on the
    arguments that matter (``match_on``, see ``ToolSafety``), else by
    ``simulators[name](arguments)``, else the branch stops with ``SideEffectBlocked``. A tool
    in neither list is refused here (``UnclassifiedTools``), as is a name that is not one of
    ``tools``; ``unclassified="live"`` lets such tools run live instead (a sandbox), and every
    result then says so. Over a model server (``remote`` policies) it asks for the asyncio
    executor by default: branches then wait on the server together instead of one after
    another."""
    tools = dict(tools or {})
    safety = ToolSafety.of(side_effect_tools, simulators, match_on, safe_tools=safe_tools,
                           unclassified=unclassified)
    safety = safety.classified(tools, agent=f"chat agent {name!r}",
                               call="ChatAgent(policy, tools")
    refuse_side_effect_functions({n: (fn,) for n, fn in tools.items()}, safety)
    return ChatFunctionAgent(policy=policy, environment=run_tools(tools, safety),
                             is_final=is_final, max_steps=max_steps, name=name, safety=safety,
                             prefers_concurrency=bool(getattr(policy, "remote", False)),
                             tools=tools)


def edit_context(edit: Callable[[list[Message]], list[Message]]
                 ) -> Callable[[car.History], car.History]:
    """Turn a message-list edit of the initial messages into a ``do_context`` edit for a
    ``ChatAgent`` (whose do_context edits receive the ``car.History``)."""
    def apply(history: car.History) -> car.History:
        return car.History(edit(context_messages(history.context)), history.steps,
                           history.index)
    return apply
