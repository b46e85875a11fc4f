"""OpenAI-style chat messages as CAR actions and observations, and the side-effect tool rule.

Framework adapters translate their message types to the shapes below, so ``car_core`` and users
see one vocabulary whatever the framework:

- an **action** is an assistant message ``{"role": "assistant", "content": str | None,
  "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": JSON string}}]}``;
- an **observation** is the list of tool results that answered it, in the order of its tool
  calls: ``[{"role": "tool", "tool_call_id", "name", "content"}]``;
- a **state** is the message list the step decided from (``do_context`` edits that list).

``ToolSafety`` is the rule for tools on counterfactual branches. Every tool the agent can call
is classified before the first branch (``ToolSafety.classified``): safe tools run live; tools
with side effects never run: a call is served from the record when it matches a recorded call
on the arguments that matter, else by a simulator the user supplies, else the branch stops with
``SideEffectBlocked`` naming the tool. A tool no source classifies is refused by name
(``UnclassifiedTools``) unless the user opted out with ``unclassified="live"``, which every
result then says. A simulator is ``fn(arguments)``, or ``fn(arguments, ctx)`` to be handed the
framework's state handle (a parameter named ``ctx``: see ``takes_state``), sync or async. This
module imports no framework.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from car_core.contract import Plan, ToolSource, canonical_arguments
from car_core.errors import (
    CarError,
    InvalidInput,
    InvalidIntervention,
    SideEffectBlocked,
    UnclassifiedTools,
)

Message = dict[str, Any]
Simulator = Callable[..., Any]  # fn(arguments) or fn(arguments, ctx), sync or async
STATE_PARAMETER = "ctx"  # a simulator with a parameter of this name is handed the state handle
UNCLASSIFIED = ("refuse", "live")  # what a tool no source classifies gets: refused, or run live
SAFE, SIDE_EFFECT = "safe", "side effect"


@dataclass(frozen=True)
class Classified:
    """What a framework source says of one tool: ``kind`` (``SAFE`` or ``SIDE_EFFECT``) and
    ``why`` (the source, for messages: "MCP annotation readOnlyHint=true")."""

    kind: str
    why: str
    # the source says outright that the tool changes things (an MCP server's readOnlyHint=false
    # or destructiveHint=true), not only that nothing says it does not: naming it safe is then
    # more likely a slip than a decision (``ContradictedSafeTool``)
    outright: bool = False
    # the tool's own server says it (an MCP annotation): a hint the specification tells clients
    # not to trust from a server they do not, so it does not outweigh a name that acts
    hint: bool = False


class ContradictedSafeTool(UserWarning):
    """``safe_tools`` names a tool its framework says outright changes things (an MCP server
    annotates it ``readOnlyHint=false`` or ``destructiveHint=true``) or whose name opens with a
    verb that does (``send_email``, ``issue_refund``): the user's word wins, so branches run it
    for real. A trial named a refund tool safe so and 52 refunds ran; another named
    ``send_email`` safe and 13 e-mails went out without a word."""


# First words of a tool's name that say it acts on the world: a tool so named in safe_tools
# is more likely a slip than a decision (``acting_verb``). Kept to verbs that are seldom nouns
# of a lookup ("order", "add", "run" are left out).
ACTING_VERBS = frozenset({
    "send", "email", "mail", "notify", "post", "publish", "tweet", "transfer", "pay", "charge",
    "refund", "wire", "withdraw", "deposit", "purchase", "buy", "sell", "book", "reserve",
    "cancel", "delete", "remove", "destroy", "drop", "purge", "submit", "approve", "revoke",
    "grant", "issue", "write", "upload", "deploy", "insert", "update", "create"})


def acting_verb(name: str) -> str | None:
    """The verb a tool's name opens with when it is one of ``ACTING_VERBS`` (``send_email``,
    ``sendEmail``, ``issue-refund``), else None."""
    first = re.split(r"[_\-.\s]|(?<=[a-z])(?=[A-Z])", name.strip(), maxsplit=1)[0].lower()
    return first if first in ACTING_VERBS else None


class FreeTextMatchWarning(UserWarning):
    """A side-effect tool was recorded with free-text arguments only, so by default a branch's
    call of it is answered from the record only when it is identical (see ``ToolSafety``)."""


def takes_state(fn: Callable[..., Any]) -> bool:
    """Whether a simulator asks for the framework's state handle: it has a parameter named
    ``ctx`` (``fn(arguments, ctx)``), which is then passed by name: the LlamaIndex workflow
    ``Context``, the OpenAI Agents SDK's run context wrapper (``ctx.context`` is the app's
    context object), a LangGraph tool's injected values. Such a simulator may write that
    state as the tool would have."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: it takes the arguments only
        return False
    param = params.get(STATE_PARAMETER)
    return param is not None and param.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                    inspect.Parameter.VAR_KEYWORD)


def as_content(out: Any) -> Any:
    """A simulator's result as a tool message's content (a non-string as JSON)."""
    return out if isinstance(out, str) else json.dumps(out)


@dataclass(frozen=True)
class Answer:
    """How a branch answers one side-effect call without running the tool: from the record
    (``content``, with ``change``: the recorded write to the framework's state to replay, or
    None for none) or, with ``simulate``, by the user's simulator (``ToolSafety.simulate``)."""

    content: Any = None
    change: Any = None
    simulate: bool = False

    @property
    def source(self) -> ToolSource:
        """Where the result comes from, for the step's ``meta["tool_sources"]``."""
        return ToolSource.SIMULATOR if self.simulate else ToolSource.RECORD


def is_free_text(value: Any) -> bool:
    """A string argument holding whitespace: a note, a reason, a message body."""
    return isinstance(value, str) and any(c.isspace() for c in value)


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict (the form framework tools are invoked with)."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str):
        value = json.loads(arguments) if arguments.strip() else {}
        if isinstance(value, dict):
            return value
    raise InvalidIntervention(f"tool-call arguments must be a JSON object, got {arguments!r}",
                              hint="pass arguments as a dict or a JSON object string")


def tool_call(call_id: str, name: str, arguments: Any) -> Message:
    return {"id": str(call_id), "type": "function",
            "function": {"name": str(name), "arguments": canonical_arguments(arguments)}}


def assistant(content: str | None = None, tool_calls: Iterable[Message] = ()) -> Message:
    """An action: the assistant message, with its tool calls (possibly none)."""
    return {"role": "assistant", "content": content, "tool_calls": list(tool_calls)}


def tool_result(call_id: str, name: str, content: Any) -> Message:
    return {"role": "tool", "tool_call_id": str(call_id), "name": str(name),
            "content": content if isinstance(content, str) else json.dumps(content)}


def calls_of(action: Any) -> list[tuple[str, str, str]]:
    """``(id, name, canonical arguments)`` of every tool call in an action."""
    if not isinstance(action, Mapping):
        return []
    out = []
    for call in action.get("tool_calls") or ():
        fn = call.get("function") or {}
        out.append((str(call.get("id", "")), str(fn.get("name", "")),
                    canonical_arguments(fn.get("arguments"))))
    return out


def describe_action(action: Any, limit: int | None = None) -> str:
    """One line for a person: the tool calls as ``name(arguments)``, as recorded, or else the
    reply (its first ``limit`` characters when given)."""
    if not isinstance(action, Mapping):
        action = {"content": action}
    fns = [call.get("function") or {} for call in action.get("tool_calls") or ()]
    calls = [f"{fn.get('name')}({fn.get('arguments')})" for fn in fns]
    content = action.get("content")
    text = content if limit is None else str(content)[:limit]
    return ", ".join(calls) or f"reply: {text!r}"


def check_action(action: Any, *, step: int | None = None) -> Message:
    """Validate an action given by a user (``do_action``) and return it normalised."""
    if not isinstance(action, Mapping) or action.get("role", "assistant") != "assistant":
        raise InvalidIntervention(
            f"a chat action must be an assistant message dict, got {action!r}", step=step,
            hint='pass {"role": "assistant", "content": "...", "tool_calls": [...]}')
    calls = []
    for call in action.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not fn.get("name") or not call.get("id"):
            raise InvalidIntervention(
                f"malformed tool call {call!r}", step=step,
                hint='a tool call is {"id": "...", "type": "function", "function": '
                     '{"name": "...", "arguments": "{...}"}}')
        parse_arguments(fn.get("arguments") or {})
        calls.append(tool_call(call["id"], fn["name"], fn.get("arguments")))
    content = action.get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidIntervention("the action's content must be a string or None", step=step)
    return assistant(content, calls)


def check_observation(observation: Any, action: Any, *, step: int | None = None
                      ) -> list[Message]:
    """Validate an observation given by a user (``do_observation``) against the action it
    answers: one tool message per tool call, matched by ``tool_call_id``, returned in call
    order. A bare list of strings is accepted too and paired with the calls in order; a
    JSON object that is no tool message (no ``content``, no ``tool_call_id``) is a result,
    given to the model as its JSON text, as a tool returning it would be."""
    calls = calls_of(action)
    if not calls:
        raise InvalidIntervention("do_observation on a step whose action called no tool",
                                  step=step, hint="intervene on a step that called a tool")
    if not isinstance(observation, Sequence) or isinstance(observation, str):
        observation = [observation]
    if len(observation) != len(calls):
        raise InvalidIntervention(
            f"the observation has {len(observation)} results but the action made "
            f"{len(calls)} tool calls", step=step,
            hint="give one tool result per tool call, in call order")
    by_id = {}
    for i, item in enumerate(observation):
        if isinstance(item, Mapping) and ("content" in item or "tool_call_id" in item):
            call_id = str(item.get("tool_call_id", calls[i][0]))
            by_id[call_id] = item.get("content")
        elif isinstance(item, Mapping):  # the tool's result itself, a JSON object: its text
            # (read as a tool message it lost every key, and the model was handed "null")
            by_id[calls[i][0]] = json.dumps(item)
        else:
            by_id[calls[i][0]] = item
    missing = [cid for cid, _, _ in calls if cid not in by_id]
    if missing:
        raise InvalidIntervention(f"no result for tool call(s) {missing}", step=step,
                                  hint="each result's tool_call_id must match a call")
    return [tool_result(cid, name, by_id[cid]) for cid, name, _ in calls]


def apply_edit(edit: Callable[[Any], Any], messages: list[Message], *, run_id: str | None,
               step: int) -> Any:
    """Run a user's ``do_context`` edit on a copy of the messages step ``step`` decides from;
    whatever the edit raises becomes an ``InvalidIntervention`` naming the step."""
    try:
        return edit(copy.deepcopy(messages))
    except CarError:
        raise
    except Exception as exc:  # the user's edit
        raise InvalidIntervention(f"the do_context edit raised {exc!r}", run_id=run_id, step=step,
                                  hint=f"fix the edit; it receives the message dicts step {step} "
                                       "decides from and returns them edited") from exc


def edited_messages(edit: Callable[[Any], Any], messages: list[Message], *,
                    run_id: str | None, step: int) -> list[Message]:
    """The messages a ``do_context`` edit returns (``apply_edit``), checked: a list of message
    dicts with a role each, tool calls still paired with their results (``consistent``)."""
    edited = apply_edit(edit, messages, run_id=run_id, step=step)
    if not isinstance(edited, list) or not all(isinstance(m, dict) and "role" in m
                                               for m in edited):
        raise InvalidIntervention("the do_context edit must return a list of message dicts",
                                  run_id=run_id, step=step,
                                  hint='return [{"role": ..., "content": ...}, ...]')
    return consistent([dict(m) for m in edited], run_id=run_id, step=step)


def consistent(messages: list[Message], *, run_id: str | None = None,
               step: int | None = None) -> list[Message]:
    """Keep tool calls and tool results paired after a ``do_context`` edit: a result whose call
    was removed is dropped; a call left without a result is an error (no chat model accepts
    it)."""
    open_calls: set[str] = set()
    answered: set[str] = set()
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            open_calls |= {cid for cid, _, _ in calls_of(m)}
        if m.get("role") == "tool":
            cid = str(m.get("tool_call_id"))
            if cid not in open_calls:
                continue
            answered.add(cid)
        out.append(m)
    missing = sorted(open_calls - answered)
    if missing:
        raise InvalidIntervention(
            f"the edited messages keep tool call(s) {missing} without their results",
            run_id=run_id, step=step,
            hint="remove the assistant message that made the call, or keep its tool results")
    return out


def routes(name: str) -> bool:
    """Whether a tool name is one a framework adds to route between agents (an SDK or
    supervisor ``transfer_to_…``, an AgentWorkflow ``handoff``): no tool list of the app's
    holds it, and CAR classifies it itself."""
    return name == "handoff" or name.startswith("transfer_to_")


def recorded_calls(steps: Iterable[Any]) -> dict[tuple[str, str], Any]:
    """``(tool name, canonical arguments) -> result content`` over a run's recorded steps."""
    out: dict[tuple[str, str], Any] = {}
    for step in steps:
        results = {m.get("tool_call_id"): m.get("content")
                   for m in (step.observation or ()) if isinstance(m, Mapping)}
        for cid, name, args in calls_of(step.action):
            if cid in results:
                out.setdefault((name, args), results[cid])
    return out


@dataclass(frozen=True)
class ToolSafety:
    """Which tools may run on a counterfactual branch, which never do, and how to answer those.

    ``safe_tools``: names of tools that only read (a search, a lookup): they run live on
    branches. ``side_effect_tools``: names of tools with effects outside the agent (refunds,
    emails, writes): they never run on a branch. ``simulators``: ``name -> fn(arguments dict)
    -> result`` used when a branch makes a call the record cannot answer (a simulated tool is a
    side-effect tool); ``fn(arguments, ctx)`` is also handed the framework's state handle
    (``takes_state``) and may write it as the tool would, and an async one is awaited.
    ``classified`` adds what the framework says of the other tools (MCP annotations, approval
    gates) and refuses, by name, any tool still unclassified, unless
    ``unclassified="live"``: those then run live (``live``) and ``caveats`` says so.

    A branch call is answered from the record when it matches a recorded call of the same tool
    on the arguments that matter; an identical call always matches. ``match_on[name]`` says
    which arguments matter for a tool: a list of argument names, ``"exact"`` (every argument) or
    ``"any"`` (none: any call of the tool gets the tool's first recorded result). The default is
    every argument except free text (a string holding whitespace: a note, a reason), so a
    re-worded note on ``close_account(account_id, note)`` gets the recorded result instead of
    stopping the estimate. A call whose arguments are *all* free text (``send_email(body)``)
    leaves nothing that tells one action from another, so by default it matches only an
    identical call: answering any wording with the recorded result could credit a branch with
    an effect it did not ask for. Such a tool needs a choice — ``"any"``, the names that
    matter, or a simulator — and ``warn_free_text`` says so before a run's first branch.
    """

    side_effect_tools: frozenset[str] = frozenset()
    simulators: Mapping[str, Simulator] = field(default_factory=dict)
    match_on: Mapping[str, tuple[str, ...] | str] = field(default_factory=dict)
    safe_tools: frozenset[str] = frozenset()
    unclassified: str = "refuse"
    live: frozenset[str] = frozenset()  # unclassified tools branches run (unclassified="live")
    derived: Mapping[str, str] = field(default_factory=dict)  # tool -> the source that said so
    # safe tools the framework says outright change things -> what it says (``caveats``)
    contradicted: Mapping[str, str] = field(default_factory=dict)
    # side effects the framework says outright change things: not offered to safe_tools
    outright: frozenset[str] = frozenset()
    _warned: set[str] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def of(cls, side_effect_tools: Iterable[str] = (),
           simulators: Mapping[str, Simulator] | None = None,
           match_on: Mapping[str, Iterable[str] | str] | None = None, *,
           safe_tools: Iterable[str] = (), unclassified: str = "refuse") -> ToolSafety:
        if isinstance(side_effect_tools, str):
            side_effect_tools = [side_effect_tools]
        if isinstance(safe_tools, str):
            safe_tools = [safe_tools]
        safe = frozenset(safe_tools)
        if unclassified not in UNCLASSIFIED:
            raise InvalidInput(f"unclassified={unclassified!r}",
                               hint='use "refuse" (the default: a tool no source classifies is '
                                    'refused before any branch) or "live" (it runs for real on '
                                    'branches: for a sandbox only)')
        sims = dict(simulators or {})
        for name, fn in sims.items():
            if not callable(fn):
                raise InvalidIntervention(f"the simulator for {name!r} is not callable",
                                          hint="pass simulators={name: fn(arguments) -> str}, "
                                               "or fn(arguments, ctx) to be handed the "
                                               "framework's state")
        keys: dict[str, tuple[str, ...] | str] = {}
        for name, spec in (match_on or {}).items():
            if spec in ("exact", "any"):
                keys[name] = str(spec)
            elif (isinstance(spec, str) or not all(isinstance(a, str) for a in spec)
                  or not tuple(spec)):
                raise InvalidIntervention(f"match_on[{name!r}] = {spec!r}",
                                          hint="give the names of the arguments that decide "
                                               "what the call does, as a list of strings, or "
                                               "'exact' (every argument) or 'any' (none)")
            else:
                keys[name] = tuple(spec)
        unguarded = sorted(set(keys) - set(side_effect_tools) - set(sims))
        if unguarded:
            raise InvalidIntervention(f"match_on names {unguarded}, which are not side-effect "
                                      "tools", hint="name the tool in side_effect_tools too")
        side = frozenset(side_effect_tools) | frozenset(sims)
        both = sorted(safe & side)
        if both:
            raise InvalidInput(f"{both} named both safe (safe_tools) and a side effect "
                               "(side_effect_tools or simulators)",
                               hint="a tool that changes anything outside the agent is a side "
                                    "effect: keep it in side_effect_tools only; one that only "
                                    "reads, in safe_tools only")
        return cls(side, sims, keys, safe, unclassified)

    def classified(self, tools: Iterable[str],
                   derived: Mapping[str, Iterable[Classified]] | None = None, *,
                   agent: str = "the agent", call: str = "the agent") -> ToolSafety:
        """This rule over every tool the agent can call (``tools``), each classified before the
        first branch: first by the user (``safe_tools``, ``side_effect_tools``, ``simulators``;
        a name the agent has no tool for is refused), then by what the framework says of it
        (``derived``: MCP annotations, approval gates; where two sources disagree the side
        effect wins). A tool still unclassified is refused with ``UnclassifiedTools`` naming
        every one and the line to add to ``call`` (the constructor, for the message), unless
        ``unclassified="live"``: then branches run it and ``caveats`` says so."""
        tools = set(tools)
        self.check_names(tools, agent=agent)
        safe, side, why = set(self.safe_tools), set(self.side_effect_tools), {}
        contradicted, outright, doubted = {}, set(), {}
        for name, said in (derived or {}).items():
            said = list(said)
            against = next((c for c in said if c.outright), None)
            if name in tools and against is not None:
                outright.add(name)
            if name in tools and name in self.safe_tools and against is not None:
                contradicted[name] = against.why.split(", and ")[0]
                warnings.warn(ContradictedSafeTool(
                    f"safe_tools names {name!r}, but {contradicted[name]}: "
                    "branches will run it for real; if it changes anything (a refund, an "
                    "e-mail, a write), move it to side_effect_tools"), stacklevel=3)
            if name not in tools or name in safe or name in side or not said:
                continue  # the user's word wins over the framework's
            pick = next((c for c in said if c.kind == SIDE_EFFECT), said[0])
            verb = acting_verb(name)
            if pick.kind == SAFE and pick.hint and verb is not None:
                # a trial's MCP server annotated issue_refund read-only: every branch refunded
                doubted[name] = f"{pick.why}, but its name opens with {verb!r}, an action"
                continue
            (side if pick.kind == SIDE_EFFECT else safe).add(name)
            why[name] = pick.why
        for name in sorted((self.safe_tools & tools) - set(contradicted)):
            verb = acting_verb(name)
            if verb is not None:
                contradicted[name] = f"its name opens with {verb!r}, an action"
                warnings.warn(ContradictedSafeTool(
                    f"safe_tools names {name!r}, but {contradicted[name]}: branches will run "
                    "it for real; if it changes anything (a refund, an e-mail, a write), move "
                    "it to side_effect_tools"), stacklevel=3)
        rest = sorted(tools - safe - side)
        if rest and self.unclassified == "refuse":
            # the user's own lists and the rest: what the framework classified (a handoff, an
            # MCP annotation) stays classified without being named
            mine = set(self.side_effect_tools)
            line = (f"safe_tools={sorted(self.safe_tools)!r}, "
                    f"side_effect_tools={sorted(mine | set(rest))!r}".replace("'", '"'))
            unsure = "".join(f"; {n!r}: {doubted[n]}" for n in rest if n in doubted)
            raise UnclassifiedTools(
                f"{agent} can call {len(rest)} tool(s) that nothing classifies as safe to run "
                f"on a branch or as a side effect: {rest}; a branch would run them for real, so "
                f"no branch runs{unsure}", tools=rest,
                hint=f"Say which is which: {call}, ..., {line}), then move each that only reads "
                     "(a search, a lookup) from side_effect_tools to safe_tools; side effects "
                     "(bookings, e-mails, writes) never run on a branch. In a sandbox where "
                     'every tool may run for real, pass unclassified="live" instead')
        return replace(self, side_effect_tools=frozenset(side), safe_tools=frozenset(safe),
                       live=frozenset(rest), derived=why, contradicted=contradicted,
                       outright=frozenset(outright - safe))

    @property
    def caveats(self) -> tuple[str, ...]:
        """What every result of an agent under this rule must say: the unclassified tools its
        branches ran live (``unclassified="live"``), and each tool ``safe_tools`` names that
        its framework says outright changes things. The build-time ``ContradictedSafeTool``
        warning alone was one line among a server's logs, and a trial's result, after three
        real refunds on branches, said nothing of it."""
        said = [f"safe_tools names {name!r}, but {why}: branches ran it for real, so if it "
                "changes anything its real effects happened on every branch that called it"
                for name, why in sorted(self.contradicted.items())]
        if self.live:
            said.insert(0, f"unclassified tools ran live on branches: {sorted(self.live)} "
                           '(unclassified="live": their real effects happened on every branch '
                           "that called them)")
        return tuple(said)

    def _key_args(self, name: str, arguments: Any) -> dict[str, Any] | None:
        """The arguments a call is matched on (None: match exactly)."""
        spec = self.match_on.get(name)
        if spec == "exact":
            return None
        args = parse_arguments(arguments)
        if not isinstance(args, dict):
            return None
        if spec == "any":
            return {}
        if spec is None:  # all but free text; nothing left (all free text): exactly
            return {k: v for k, v in args.items() if not is_free_text(v)} or None
        return {k: args.get(k) for k in spec}

    def _relaxed(self, name: str, arguments: Any,
                 record: Mapping[tuple[str, str], Any]) -> tuple[bool, Any]:
        wanted = self._key_args(name, arguments)
        if wanted is None:
            return False, None
        for (rec_name, rec_args), content in record.items():
            if (rec_name == name and self._key_args(name, rec_args) == wanted
                    and self._echo(name, rec_args, arguments, content) is None):
                return True, content
        return False, None

    def _echo(self, name: str, recorded: Any, arguments: Any, content: Any) -> str | None:
        """Under the default rule, the free-text argument of a recorded call whose value its
        result repeats and the branch's call changes (``"restaurant='Taberna Baixa'"``), else
        None. Such a result is about that argument, so it is not the other call's: a user
        trial's branch booked "Cervejaria Ramiro" and was answered "booked at Taberna Baixa",
        and CAR said no step caused the failure, when one did. A free-text argument the
        result does not repeat (a message body under "sent") still matches loosely."""
        if self.match_on.get(name) is not None:
            return None  # the user said which arguments decide
        rec, mine = parse_arguments(recorded), parse_arguments(arguments)
        text = (content if isinstance(content, str) else json.dumps(content)).casefold()
        for key, value in rec.items():
            said = value.strip().casefold() if is_free_text(value) else ""
            if len(said) >= 3 and mine.get(key) != value and said in text:
                return f"{key}={value!r}"
        return None

    def _echoed_match(self, name: str, arguments: Any,
                      record: Mapping[tuple[str, str], Any]) -> str | None:
        """Why the recorded call that matches ``arguments`` on all but free text does not answer
        it (``_echo``), for the message that stops the branch; None where none matched."""
        wanted = self._key_args(name, arguments)
        if wanted is None:
            return None
        for (rec_name, rec_args), content in record.items():
            if rec_name == name and self._key_args(name, rec_args) == wanted:
                echo = self._echo(name, rec_args, arguments, content)
                if echo is not None:
                    return echo
        return None

    def _undecided(self, name: str, arguments: Any) -> bool:
        """A call the default rule can only match exactly: every argument is free text."""
        if name in self.match_on or name in self.simulators:
            return False
        args = parse_arguments(arguments)
        return isinstance(args, dict) and bool(args) and all(map(is_free_text, args.values()))

    def _choose(self, name: str) -> str:
        return (f"choose how to answer {name!r} on branches: match_on={{{name!r}: 'any'}} if "
                f"every call of it has the recorded effect, match_on={{{name!r}: [argument "
                f"names]}} for the ones that decide what it does, or simulators={{{name!r}: "
                "fn(arguments)} (fn(arguments, ctx) where the tool writes the framework's "
                "state)")

    def warn_free_text(self, run_id: str | None, steps: Iterable[Any]) -> None:
        """Warn, once per run, before its first branch, about each guarded tool the run called
        with free-text arguments only and for which the user chose no rule."""
        names = sorted({n for n, args in recorded_calls(steps)
                        if n in self.side_effect_tools and self._undecided(n, args)})
        if not names or str(run_id) in self._warned:
            return
        self._warned.add(str(run_id))  # two branches racing here warn twice at worst
        for name in names:
            warnings.warn(
                f"side-effect tool {name!r} was recorded with free-text arguments only, so a "
                "branch's call of it is answered from the record only when it is identical "
                "(a re-worded call stops the estimate with SideEffectBlocked); "
                + self._choose(name), FreeTextMatchWarning, stacklevel=3)

    def guards(self, name: str) -> bool:
        return name in self.side_effect_tools

    def check_names(self, available: Iterable[str], *, agent: str = "the agent") -> None:
        """Refuse a side-effect tool (or simulator) or safe tool name the agent has no tool
        for: a typo would leave the real tool unguarded (or unclassified) on every branch."""
        tools = sorted(set(available))
        for param, names in (("side_effect_tools/simulators", self.side_effect_tools),
                             ("safe_tools", self.safe_tools)):
            unknown = sorted(names - set(tools))
            if unknown:
                routing = [u for u in unknown if routes(u)]
                also = (f"; {routing} route between agents: the framework runs them and CAR "
                        "classifies them itself (they only route), so leave them out"
                        if routing else "")
                raise InvalidInput(
                    f"{param} name {unknown}, but {agent} has no such tool (its tools: "
                    f"{tools}){also}", hint="spell each name exactly as the tool is "
                                            "registered, so branches can tell whether it may "
                                            "run")

    def serve(self, name: str, arguments: Any, record: Mapping[tuple[str, str], Any], *,
              run_id: str | None = None, step: int | None = None) -> Any:
        """The result a side-effect call gets on a branch, without running the tool: the tool
        message content, so a simulator's non-string result is sent as JSON. For callers that
        have no state handle to pass and no recorded state change to replay (``answer`` is the
        rule with both); an async simulator is run to completion here."""
        return self.served(name, arguments, record, run_id=run_id, step=step).content

    def served(self, name: str, arguments: Any, record: Mapping[tuple[str, str], Any], *,
               run_id: str | None = None, step: int | None = None) -> Answer:
        """``serve``'s result with where it came from: the ``Answer`` with its ``content``
        filled in, from the record or (``simulate``) by the simulator, already run."""
        found = self.answer(name, arguments, record, run_id=run_id, step=step)
        if not found.simulate:
            return found
        out = self.simulate(name, arguments, None)
        if inspect.isawaitable(out):
            from .sync import run_sync  # the sync bridge, only for an async simulator

            async def finish(out: Awaitable[Any] = out) -> Any:
                return await out
            out = run_sync(finish)
        return Answer(as_content(out), simulate=True)

    def simulates_state(self, name: str) -> bool:
        """Whether ``name``'s simulator takes the framework's state handle (``takes_state``)."""
        return name in self.simulators and takes_state(self.simulators[name])

    def simulate(self, name: str, arguments: Any, ctx: Any) -> Any:
        """The simulator's raw result for a call (an awaitable for an async simulator: the
        caller awaits it), handed ``ctx`` when it takes the state handle."""
        fn = self.simulators[name]
        if takes_state(fn):
            return fn(parse_arguments(arguments), ctx=ctx)
        return fn(parse_arguments(arguments))

    async def asimulate(self, name: str, arguments: Any, ctx: Any) -> Any:
        """``simulate``, awaited when the simulator is async."""
        out = self.simulate(name, arguments, ctx)
        return await out if inspect.isawaitable(out) else out

    def answer(self, name: str, arguments: Any, record: Mapping[tuple[str, str], Any], *,
               run_id: str | None = None, step: int | None = None,
               writes: Mapping[tuple[str, str], Any] | None = None) -> Answer:
        """How a side-effect call is answered on a branch (``Answer``), or ``SideEffectBlocked``.

        ``writes`` is given for a tool whose recorded calls may have written the framework's
        state: ``(name, canonical arguments) -> change`` for every recorded call whose change
        could be derived from the record (None or empty for one that wrote nothing). Then an
        identical recorded call replays its result and its change; any other call goes to the
        simulator; a call that only matches on the arguments that matter (``match_on``) gets
        the recorded result only when the matched call wrote nothing, since the change it
        wrote belongs to other arguments; otherwise the branch stops."""
        key = (name, canonical_arguments(arguments))
        if writes is not None:
            if key in record and key in writes:
                return Answer(record[key], change=writes[key])
            if name in self.simulators:
                return Answer(simulate=True)
            wanted = self._key_args(name, arguments)
            matched = [(rec_key, content) for rec_key, content in record.items()
                       if rec_key == key or (rec_key[0] == name and wanted is not None
                                             and self._key_args(name, rec_key[1]) == wanted
                                             and self._echo(name, rec_key[1], arguments,
                                                            content) is None)]
            if matched and matched[0][0] != key and matched[0][0] in writes \
                    and not writes[matched[0][0]]:
                return Answer(matched[0][1])  # the matched recorded call wrote nothing
            if matched:
                raise SideEffectBlocked(
                    f"the branch called side-effect tool {name!r} with arguments {key[1]}; the "
                    "matching recorded call wrote the framework's state, and that write "
                    "replays only for an identical call whose write the record shows",
                    run_id=run_id, step=step,
                    hint=f"pass simulators={{{name!r}: fn(arguments, ctx)}}: it gets the "
                         "state handle as ctx and writes what the tool would have")
        else:
            if key in record:
                return Answer(record[key])
            found, content = self._relaxed(name, arguments, record)
            if found:
                return Answer(content)
            if name in self.simulators:
                return Answer(simulate=True)
        echo = self._echoed_match(name, arguments, record)
        if echo is not None:
            raise SideEffectBlocked(
                f"the branch called side-effect tool {name!r} with arguments {key[1]}; the "
                f"recorded call that matches it on all but free text answered naming {echo}, "
                "which this call changes, so its result is not this call's", run_id=run_id,
                step=step, hint=f"pass simulators={{{name!r}: fn(arguments)}} to answer such "
                "calls (fn(arguments, ctx) where the tool writes the framework's state), or "
                f"match_on={{{name!r}: [argument names]}} without {echo.split('=')[0]!r} if "
                "that argument does not change what the call does")
        recorded = any(rec_name == name for rec_name, _ in record)
        if self._undecided(name, arguments) and recorded:  # else match_on could not help
            raise SideEffectBlocked(
                f"the branch called side-effect tool {name!r} with arguments {key[1]}, all "
                "free text and not those of any recorded call: nothing tells whether it does "
                "what a recorded call did", run_id=run_id, step=step, hint=self._choose(name))
        verb = acting_verb(name)
        if name in self.outright or verb:  # it says it changes things: never offer safe_tools
            why = self.derived.get(name)  # named by the user: no reason to give them
            undo = (f"match_on={{{name!r}: [the argument names that matter]}} if the record "
                    "holds such a call" + (f" (it is a side effect because: {why})" if why
                                            else ""))
        elif name in self.derived:
            undo = (f"name it in safe_tools if it is safe to run (it is a side effect "
                    f"because: {self.derived[name]})")
        else:
            undo = f"move {name!r} from side_effect_tools to safe_tools if it is safe to run"
        never = "" if recorded else " (the recorded run never called it)"
        raise SideEffectBlocked(
            f"the branch called side-effect tool {name!r} with arguments {key[1]}, which the "
            f"record cannot answer{never}", run_id=run_id, step=step,
            hint=f"pass simulators={{{name!r}: fn}} to answer such calls (fn(arguments), or "
                 "fn(arguments, ctx) to write the framework's state as the tool does), or "
                 f"{undo}")


def mcp_classified(annotations: Any) -> Classified:
    """What a tool served over MCP is by its server's annotations (``ToolAnnotations`` or its
    dict): safe only when ``readOnlyHint`` is true; anything else, no annotations included, is
    a side effect, as the MCP specification defaults (a tool may modify its environment)."""
    if isinstance(annotations, Mapping):
        hint = annotations.get("readOnlyHint", annotations.get("read_only_hint"))
        destructive = annotations.get("destructiveHint", annotations.get("destructive_hint"))
    else:
        hint = getattr(annotations, "readOnlyHint", getattr(annotations, "read_only_hint", None))
        destructive = getattr(annotations, "destructiveHint",
                              getattr(annotations, "destructive_hint", None))
    if hint is True:
        return Classified(SAFE, "its MCP server annotates it readOnlyHint=true", hint=True)
    if annotations is None:
        return Classified(SIDE_EFFECT, "it comes from an MCP server that gives no annotations, "
                                       "and MCP tools are taken to have side effects unless "
                                       "annotated readOnlyHint=true")
    said = "without readOnlyHint" if hint is None else f"readOnlyHint={hint!r}"
    if destructive is True:
        said += " and destructiveHint=True"
    return Classified(SIDE_EFFECT, f"its MCP server annotates it {said}, and MCP tools are "
                                   "taken to have side effects unless annotated "
                                   "readOnlyHint=true",
                      outright=hint is False or destructive is True)


def forced_observations(plan: Plan, run_id: str | None = None
                        ) -> dict[int, list[dict[str, Any]]]:
    """The plan's forced observations as tool messages matched to the forced action's calls.
    A list is read as one result per call; any other JSON value answers every call (as text),
    and is stored on the step as given. The action must be known before the branch runs (the
    recorded one, or a ``do_action`` at the same step)."""
    out = {}
    for k, obs in plan.forced_observations.items():
        if k not in plan.forced_actions:
            raise InvalidIntervention(
                "on a chat agent do_observation answers a known action, so it cannot be "
                "combined with a do_resample or do_context that decides the same step again",
                run_id=run_id, step=k,
                hint="use do_observation alone (the recorded action) or with do_action at "
                     "that step")
        action = plan.forced_actions[k]
        if isinstance(obs, list):
            out[k] = check_observation(obs, action, step=k)
        else:
            text = obs if isinstance(obs, str) else json.dumps(obs)
            out[k] = [tool_result(cid, name, text) for cid, name, _ in calls_of(action)]
    return out


__all__ = ["SAFE", "SIDE_EFFECT", "STATE_PARAMETER", "Answer", "Classified", "ToolSafety",
           "apply_edit", "as_content", "assistant", "calls_of", "canonical_arguments",
           "check_action", "check_observation", "consistent", "edited_messages",
           "forced_observations", "mcp_classified", "parse_arguments", "recorded_calls", "routes",
           "takes_state", "tool_call", "tool_result"]
