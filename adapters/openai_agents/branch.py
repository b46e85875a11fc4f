"""What an OpenAI Agents SDK app runs with on a CAR branch, in place of its models and tools.

A branch never changes the user's agent objects: it runs a copy of the app (``clone_app``) whose
agents carry a ``CarBranchModel`` each and whose function tools are guarded copies, linked by the
same handoffs (the original objects of side-effect tools dispatch to the branch while it runs, for a
tool's body that calls one: ``originals``). ``CarBranchModel`` numbers the decisions from the branch
step on, answers forced and held steps with the recorded action (no model call), and sends the
others to the agent's own model (or the ``do_policy`` one, for the agents it applies to) with the
step's noise stream in context and a per-step seed in ``ModelSettings.extra_args`` for providers
that honour one (and, at a step whose tool descriptions a ``do_context`` edit changed, copies of the
tools so described); a model client's outage becomes ``ModelUnavailable``. A guarded tool serves a
forced observation as given and answers a side-effect tool with ``ToolSafety``: an identical
recorded call gets its result and its recorded write to the run context replayed
(``_context.replay``), another call the simulator (``fn(arguments, ctx)`` is handed the tool's run
context wrapper), else ``SideEffectBlocked``; other tools run live. A live tool that raises is
answered as in the app, with the message its failure function makes of the error for the model; the
session notes each such call (``BranchSession.failed``): the SDK's default message through
``RunConfig.tool_error_formatter`` (``noting_formatter``), a tool's own failure function (an MCP
tool's too) through a copy of the tool that calls it (``noting``).
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

from agents import ModelResponse, ModelSettings, OpenAIResponsesModel, Usage
from agents.handoffs import Handoff
from agents.models.interface import Model
from agents.run_config import ToolErrorFormatter, ToolErrorFormatterArgs
from agents.tool import FunctionTool, set_function_tool_failure_error_function

from car_core.contract import Noise, Plan, Stream, ToolSource, is_outage, redact
from car_core.errors import (
    AdapterError,
    CarError,
    ModelUnavailable,
    PolicyError,
    SideEffectBlocked,
)

from ..common import branch as chat_branch
from ..common.messages import ToolSafety, as_content, calls_of, canonical_arguments
from ..common.state_change import Change, Conflict
from . import mcp_tools
from ._context import replay
from ._items import action_of, output_of
from .app import handoff_target
from .fake import _STEP_RNG
from .handoff_callbacks import callback_of
from .offered_tools import described


class Decided(Exception):
    """Raised by the model on a ``redecide`` call once step ``k`` is decided (no tool runs)."""

    def __init__(self, action: Any) -> None:
        super().__init__("decided")
        self.action = action


class BranchSession(chat_branch.BranchSession):
    """The shared branch session, plus whether to pass a per-step seed to the provider,
    whether to stop once the first decision is made (``redecide``), and whose model a
    ``do_policy`` swaps: ``"deciding"`` (the agent that decides the policy's step, found as
    the branch gets there), ``"all"``, or a set of agent names; ``swapped`` notes the steps
    the swapped-in model decided; ``writes``, what each recorded tool call wrote to the run
    context where the record shows it (``_context.writes``)."""

    def __init__(self, plan: Plan, noise: Noise, start: int, safety: ToolSafety,
                 record: Mapping[tuple[str, str], Any], run_id: str | None,
                 forced_obs: Mapping[int, list[dict[str, Any]]], *, seeds: bool = True,
                 stop_after_first: bool = False,
                 policy_agents: str | frozenset[str] = "deciding",
                 writes: Mapping[tuple[str, str], Change] | None = None) -> None:
        super().__init__(plan, noise, start, safety, record, run_id, forced_obs)
        self.writes: Mapping[tuple[str, str], Change] = writes or {}
        self.seeds = seeds
        self.stop_after_first = stop_after_first
        self.policy_agents = policy_agents
        self.swapped: set[int] = set()
        # step -> the system message a do_context edit gave it: that step's call alone gets
        # it, and the agent's own (dynamic) instructions decide its later steps as in the app
        self.system_at: dict[int, str] = {}
        # step -> {tool name: description} a do_context edit gave it: that step's call alone
        # is offered copies of the tools so described (``offered_tools.described``)
        self.tools_at: dict[int, dict[str, str]] = {}
        # tool call id -> (what the model was told, the error) for each call whose tool raised
        self.errors: dict[str, tuple[str, str]] = {}
        # the calls whose error says its server is down or gone (``is_outage``: a refused
        # connection, an MCP session whose server died), whatever the model was told
        self.outages: set[str] = set()

    def failed(self, call_id: Any, told: Any, error: BaseException | None) -> None:
        """Note that the tool of call ``call_id`` raised ``error`` and the model was told
        ``told`` (the failure function's message) in place of a result."""
        if call_id:
            self.errors[str(call_id)] = (str(told), redact.describe(error) if error else "")
            if error is not None and is_outage(error):
                self.outages.add(str(call_id))

    def policy_for(self, k: int, agent: str) -> Any:
        """The ``do_policy`` model when it decides step ``k`` of ``agent``, else None."""
        if self.plan.policy is None or k < self.plan.policy[0]:
            return None
        if k == self.plan.policy[0] and self.policy_agents == "deciding":
            self.policy_agents = frozenset({agent})
        scope = self.policy_agents
        if scope != "all" and (isinstance(scope, str) or agent not in scope):
            return None
        self.swapped.add(k)
        return self.plan.policy[1]


class CarBranchModel(Model):
    """Serves one agent's decisions on a branch (see the module docstring)."""

    def __init__(self, inner: Model, session: BranchSession, agent: str,
                 reset_tool_choice: bool = False) -> None:
        self.inner = inner
        self.session = session
        self.agent = agent
        # the agent called tools in the held prefix and resets its tool_choice after one: the
        # SDK did so on every later call of the record, but a branch's fresh Runner.run has
        # not seen those calls, so the reset is made here, after the SDK has merged the run
        # config's settings (a RunConfig(model_settings=...) tool_choice came back on every
        # branch: a user trial's wrong locus)
        self.reset_tool_choice = reset_tool_choice

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: ModelSettings, tools: list[Any], output_schema: Any,
                           handoffs: list[Any], tracing: Any, *, previous_response_id: Any = None,
                           conversation_id: Any = None, prompt: Any = None) -> ModelResponse:
        s = self.session
        s.raise_blocked()
        k = s.claim()
        plan = s.plan
        system_instructions = s.system_at.get(k, system_instructions)
        if k in s.tools_at:
            tools = described(tools, s.tools_at[k])
        swap = s.policy_for(k, self.agent)
        if k in plan.forced_actions and k not in plan.context_edits:
            s.swapped.discard(k)
            if s.stop_after_first:
                raise Decided(plan.forced_actions[k])
            return ModelResponse(output=output_of(plan.forced_actions[k]), usage=Usage(),
                                 response_id=None)
        model = self.inner
        if swap is not None:
            model = swap
            if not isinstance(model, Model):
                raise AdapterError(f"do_policy gave {type(model).__name__}, not an agents.Model",
                                   run_id=s.run_id, step=k,
                                   hint="pass a Model instance (e.g. OpenAIChatCompletionsModel "
                                        "or car_adapters.openai_agents.ScriptedModel)")
        if self.reset_tool_choice and model_settings.tool_choice is not None:
            model_settings = dataclasses.replace(model_settings, tool_choice=None)
        if s.seeds and takes_seed(model):
            extra = {**(model_settings.extra_args or {}), "seed": s.noise.int_seed(k)}
            model_settings = dataclasses.replace(model_settings, extra_args=extra)
        token = _STEP_RNG.set(s.noise.rng(k, Stream.POLICY))
        try:
            s.model_calls += 1
            resp = await model.get_response(
                system_instructions, input, model_settings, tools, output_schema, handoffs,
                tracing, previous_response_id=previous_response_id,
                conversation_id=conversation_id, prompt=prompt)
        except ModelUnavailable as exc:
            s.blocked = exc  # the SDK may wrap it: the branch must still stop with it
            raise
        except CarError:
            raise
        except Exception as exc:  # the model's failure: say which step
            if is_outage(exc):  # stop the attribution (resumable)
                s.blocked = chat_branch.model_unavailable(
                    exc, step=k, run_id=s.run_id, who=f"the model server of agent {self.agent!r}")
                raise s.blocked from s.blocked.__cause__
            raise PolicyError(f"the model of agent {self.agent!r} raised "
                              f"{redact.describe(exc)}", run_id=s.run_id, step=k,
                              hint="check the model (and any do_policy model) works on its own"
                              ) from redact.redacted(exc)
        finally:
            _STEP_RNG.reset(token)
        if s.stop_after_first:
            raise Decided(action_of(resp.output))
        return resp

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise AdapterError("CAR branches drive the app with Runner.run, never streamed",
                           hint="this is a bug in car_adapters.openai_agents; please report it")


def takes_seed(model: Model) -> bool:
    """Whether a branch may send ``model`` a request ``seed`` (in ``extra_args``, which the
    SDK passes to the client as keywords): not the Responses API's (the SDK's default for a
    model name), whose ``responses.create`` has no such parameter, so every branch of an app
    on it raised ``TypeError``. Its randomness is then the server's own, unshared by
    branches, as the estimators measure."""
    return not isinstance(model, OpenAIResponsesModel)


def noting(tool: FunctionTool, session: BranchSession) -> FunctionTool:
    """``tool``, or a copy of it whose own failure function (one given to ``function_tool``;
    every MCP tool has one) notes each error it turns into a message, in the session: the SDK
    binds a copied tool's failure handling to the copy. A tool on the SDK's default message is
    noted by the run's formatter (``noting_formatter``); one without a failure function lets
    the error out, and the branch fails with it."""
    if getattr(tool, "_use_default_failure_error_function", True):
        return tool
    given = getattr(tool, "_failure_error_function", None)
    if given is None:
        return tool

    async def told(ctx: Any, error: Exception) -> str:
        out = given(ctx, error)
        if inspect.isawaitable(out):
            out = await out
        session.failed(getattr(ctx, "tool_call_id", None), out, error)
        return str(out)

    return set_function_tool_failure_error_function(dataclasses.replace(tool), told)


def noting_formatter(session: BranchSession, user: ToolErrorFormatter | None
                     ) -> ToolErrorFormatter:
    """A ``RunConfig.tool_error_formatter`` that notes, in the session, each tool error the
    SDK's default failure message answers (the formatter the app runs with, ``user``, still
    words it)."""

    async def formatter(args: ToolErrorFormatterArgs[Any]) -> str | None:
        out: Any = None
        try:
            if user is not None:
                out = user(args)
                if inspect.isawaitable(out):
                    out = await out
        finally:  # a formatter that raises leaves the SDK's default message
            if args.kind == "tool_exception":
                session.failed(args.call_id, out if isinstance(out, str)
                               else args.default_message, args.error)
        return cast("str | None", out)  # as given: the SDK warns of a non-string itself

    return formatter


def _guarded(tool: FunctionTool, session: BranchSession) -> FunctionTool:
    """A copy of ``tool`` that serves forced observations and guards side effects."""
    inner = tool.on_invoke_tool
    name = tool.name

    async def invoke(ctx: Any, arguments: str) -> Any:
        s = session
        k = s.current
        if k in s.forced_obs:
            wanted = canonical_arguments(arguments)
            cid = getattr(ctx, "tool_call_id", None)
            for msg, (fcid, fname, fargs) in zip(s.forced_obs[k],
                                                 calls_of(s.plan.forced_actions.get(k)),
                                                 strict=False):
                if fname == name and (fcid == cid or fargs == wanted):
                    s.note(k, name, arguments, ToolSource.FORCED)
                    return msg["content"]
        if s.safety.guards(name):
            try:
                return await answered(s, name, ctx, arguments, k)
            except CarError as exc:
                s.blocked = exc
                raise
        s.note(k, name, arguments, ToolSource.LIVE)
        return await inner(ctx, arguments)

    if session.safety.guards(name):  # answered without the tool, so no approval is asked for
        return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=False)
    return dataclasses.replace(tool, on_invoke_tool=invoke)


async def answered(s: BranchSession, name: str, ctx: Any, arguments: str, k: int) -> Any:
    """A side-effect call's result on a branch, with what the recorded call wrote to the run
    context replayed, or the simulator's (handed ``ctx`` when it takes it)."""
    found = s.safety.answer(name, arguments, s.record, run_id=s.run_id, step=k,
                            writes=s.writes)
    s.note(k, name, arguments, found.source)
    if found.simulate:
        return as_content(await s.safety.asimulate(name, arguments, ctx))
    try:
        replay(getattr(ctx, "context", None), found.change or [])
    except Conflict as exc:
        raise SideEffectBlocked(
            f"the branch called side-effect tool {name!r} as the record did, but its run "
            f"context holds another value at {exc} than the record held there when the call "
            "wrote it, so the recorded write is not what the tool would write here",
            run_id=s.run_id, step=k,
            hint=f"pass simulators={{{name!r}: fn(arguments, ctx)}}: it is handed the run "
                 "context wrapper (ctx.context) and writes it as the tool would") from None
    return found.content


def clone_app(agents: Mapping[str, Any], models: Mapping[str, Model], session: BranchSession,
              *, keep_input_guardrails: bool = True, used_tools: frozenset[str] = frozenset(),
              mcp: Mapping[str, list[FunctionTool]] | None = None,
              skip_callbacks: bool = False) -> dict[str, Any]:
    """Copies of the app's agents for one branch: branch models, guarded tools, handoffs that
    lead to the copies (a ``do_context`` edit of the system message is given to its step's
    call alone: ``BranchSession.system_at``). ``used_tools``: the agents that called
    tools in the held prefix; the SDK resets their ``tool_choice`` after a tool call
    (``reset_tool_choice``), state a fresh ``Runner.run`` does not have, so the copies start
    reset. ``mcp``: each agent's tools from its MCP servers, listed before the branch
    (``mcp_tools``); the copies carry them as function tools (first, in the SDK's order) in
    place of the servers. The copies carry no ``AgentHooks``: an agent's hooks observe it (an
    audit log, metrics), and on a branch they wrote what a branch did into the user's log, a
    tool answered from the record among it. ``skip_callbacks``: handoffs hand off without
    calling their ``on_handoff`` (``handoff_callbacks``)."""
    clones: dict[str, Any] = {}
    for name, a in agents.items():
        kw: dict[str, Any] = {
            "model": CarBranchModel(models[name], session, name,
                                    reset_tool_choice=name in used_tools and a.reset_tool_choice),
            "tools": [*(mcp_tools.structured(_guarded(t, session))
                        for t in (mcp or {}).get(name, ())),
                      *(_guarded(noting(t, session), session) if isinstance(t, FunctionTool)
                        else t for t in a.tools or ())]}
        kw["hooks"] = None  # observers of the user's runs, not of branches
        if a.mcp_servers:  # their tools are among the copy's, listed before the branch
            kw["mcp_servers"] = []
        if not keep_input_guardrails:
            kw["input_guardrails"] = []
        if name in used_tools and a.reset_tool_choice and a.model_settings.tool_choice:
            kw["model_settings"] = dataclasses.replace(a.model_settings, tool_choice=None)
        clones[name] = a.clone(**kw)
    for name, a in agents.items():
        links = []
        for h in a.handoffs or ():
            if isinstance(h, Handoff):
                links.append(_relinked(h, clones, skip_callbacks))
            else:
                links.append(clones[h.name])
        clones[name].handoffs = links
    return clones


def _relinked(h: Handoff[Any, Any], clones: Mapping[str, Any], skip_callbacks: bool = False
              ) -> Handoff[Any, Any]:
    """A handoff object whose invocation returns the branch's copy of its target, without
    running the handoff's callback where ``skip_callbacks`` (and it has one)."""
    original = h.on_invoke_handoff
    skipped = handoff_target(h) if skip_callbacks and callback_of(h) is not None else None

    async def invoke(ctx: Any, arguments: str) -> Any:
        target = skipped if skipped is not None else await original(ctx, arguments)
        return clones.get(getattr(target, "name", ""), target)

    out = dataclasses.replace(h, on_invoke_handoff=invoke)
    target = handoff_target(h)
    if target is not None and target.name in clones:
        out._agent_ref = weakref.ref(clones[target.name])
    return out
