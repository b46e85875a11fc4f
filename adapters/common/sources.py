"""Where each tool result on a branch came from, as a step records it.

A branch answers a side-effect call without running the tool (from the record, by the user's
simulator, or with a forced result) and runs a safe tool live. Every adapter notes the source
of each call it answers, by tool call id, and writes it on the step the call belongs to as
``meta["tool_sources"]`` (``{tool call id: ToolSource}``), so the step shows a simulated result
as simulated, not as a call that happened. A safe tool's error on a branch is scored only
where CAR can show it was the call's own (``drifted_tools``), running the tool again through the
adapter's ``Reruns``. This module imports no framework.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from car_core.contract import (
    ERROR_STEP,
    RunStatus,
    Step,
    ToolSource,
    Trajectory,
    says_service_down,
)
from car_core.errors import AdapterError

from .messages import calls_of

TOOL_SOURCES = "tool_sources"  # the step meta key


def sources_of(action: Any, found: Mapping[str, ToolSource]) -> dict[str, ToolSource]:
    """The ``meta["tool_sources"]`` of a step whose action is ``action``: the source of each of
    its tool calls the branch answered (``found``: tool call id -> source), in call order."""
    return {cid: found[cid] for cid, _, _ in calls_of(action) if cid in found}


def with_sources(step: Step, found: Mapping[str, ToolSource]) -> Step:
    """``step`` with ``meta["tool_sources"]`` for its answered tool calls (unchanged when the
    branch answered none of them)."""
    sources = sources_of(step.action, found)
    if not sources:
        return step
    return replace(step, meta={**step.meta, TOOL_SOURCES: sources})


def tool_errors(messages: Iterable[Any]) -> dict[str, str]:
    """The tool results that came back as errors, by tool call id, with their text: from a
    final state's stored dicts (``"status": "error"``) or a framework's message objects, and
    results a tool returned as plain text that read as an outage (``reads_as_outage``)."""
    out = {}
    for m in messages:
        get = m.get if isinstance(m, Mapping) else lambda k, m=m: getattr(m, k, None)
        if not get("tool_call_id"):
            continue
        text = result_text(get("content"))
        if get("status") == "error" or reads_as_outage(text):
            out[str(get("tool_call_id"))] = text
    return out


_ERROR_FIRST = re.compile(r"\s*(?:error|exception|failed|failure)\b", re.IGNORECASE)


def reads_as_outage(text: str) -> bool:
    """A result a tool returned, not raised, that opens as an error and blames its service
    ("Error: hotel search service unavailable (503)"): the tool caught its own failure. A user
    trial's branches got that text from a search that was down and the agent apologised,
    which CAR scored as a rescue of 65% at a step whose rescue was 0. Only a text that opens
    with the error counts: a search result that mentions a 503 is an answer."""
    return bool(_ERROR_FIRST.match(text)) and says_service_down(text)


def result_text(content: Any) -> str:
    """A tool result's words: its content blocks' text joined (an MCP tool's result is a
    list of blocks; a record may keep them as JSON text), else the content as a string, so a
    branch's result and the record's compare alike."""
    if isinstance(content, str) and content[:1] in ("[", "{"):
        try:
            content = json.loads(content)
        except ValueError:
            return str(content)
    if isinstance(content, Mapping) and "text" in content:
        content = [content]
    if isinstance(content, list):
        texts = [str(b.get("text")) for b in content if isinstance(b, Mapping) and "text" in b]
        if texts:
            return " ".join(texts)
    if isinstance(content, (list, Mapping)):
        return json.dumps(content, sort_keys=True)
    return str(content or "")


PAST_CALLS = 3  # the most answered calls of the record a tool's error is checked against

# a live re-run of one call of a safe tool: ``(tool name, canonical arguments)`` -> the error
# text it came back with, or None when it answered
Rerun = Callable[[str, str], Awaitable[str | None]]


class Reruns:
    """The extra live calls one branch may make to tell a safe tool's error apart from its
    world's: only of the tools named in ``safe`` (classified safe for the branch: they only
    read), each call made at most once per branch (``call``: the adapter's way to run a tool
    outside the app, never charged to the rollout budget)."""

    def __init__(self, safe: Collection[str], call: Rerun,
                 classified: Collection[str] = ()) -> None:
        self.safe = frozenset(safe)
        self.classified = self.safe | frozenset(classified)  # named safe or read-only
        self._call = call
        self._done: dict[tuple[str, str], str | None] = {}

    def can(self, name: str) -> bool:
        return name in self.safe

    async def __call__(self, name: str, args: str) -> str | None:
        if name not in self.safe:  # never a side effect, whatever a caller asks
            raise AdapterError(f"CAR was about to run tool {name!r} again outside a branch, "
                               "and it is not classified safe",
                               hint="this is a bug in car_adapters; please report it")
        key = (name, args)
        if key not in self._done:
            self._done[key] = await self._call(name, args)
        return self._done[key]


def answered_error(text: str, errored: bool) -> str | None:
    """What a re-run's result says: its text when the tool marked it an error or it reads as
    an outage (``reads_as_outage``), else None (it answered)."""
    if errored or reads_as_outage(text):
        return " ".join(text.split()) or "an error with no text"
    return None


@dataclass(frozen=True)
class Drift:
    """Why a branch is not scored (``drifted_tools``), and the step whose tool call it was:
    the branch ran on past it, and its error was tagged with the step it ended at (a trial
    read "ran live at step 1 ... [step 5]")."""

    text: str
    step: int

    def on(self, branch: Trajectory) -> Trajectory:
        """``branch`` with status error, this text and its step (``ERROR_STEP``)."""
        return replace(branch, status=RunStatus.ERROR, error=self.text,
                       meta={**branch.meta, ERROR_STEP: self.step})


async def drifted_tools(recorded: Iterable[Step], recorded_errors: Collection[str],
                        branch: Iterable[Step], branch_errors: Mapping[str, str],
                        reruns: Reruns, outages: Collection[str] = ()) -> Drift | None:
    """What a branch must not be scored for: a safe tool that ran live on it and returned an
    error (``branch_errors``: call id -> its text) that CAR cannot show was the call's own.
    The held arm replays the record's answers while a re-decided step meets the live tool, so
    a tool that errors now and did not then would read as a rescue of the re-decided step.

    Not scored: an error for a call the record made with the same arguments and got an answer
    for (``recorded_errors``: the record's errored call ids); an error that says its service
    is down (``says_service_down``), or that an exception showed was one (``outages``: call
    ids); an error for a call the tool answers when CAR runs it again (``reruns``: the error
    was transient, the service's); and one whose tool now errors on a call the record got an
    answer for too (its world changed: a server down, a credential missing). Only an error the
    same call gives again, from a tool that still answers the record's call (or that the
    record never called with an answer), is the agent's own doing (an unknown order), and
    scored; so is one from a tool the record saw fail too (the same world). None when no call
    drifted."""
    calls = [(cid, name, args) for step in recorded for cid, name, args in calls_of(step.action)]
    answered = {(name, args) for cid, name, args in calls if cid not in recorded_errors}
    # a tool the record saw fail (or cannot say it did not) was in the same world then
    failing = {name for cid, name, _ in calls if cid in recorded_errors}
    for step in branch:
        sources = step.meta.get(TOOL_SOURCES) or {}
        for cid, name, args in calls_of(step.action):
            if cid not in branch_errors or sources.get(cid) != ToolSource.LIVE:
                continue
            said = " ".join(branch_errors[cid].split())[:200]
            kind = _kind(name, reruns)
            where = (f"{kind} ran live at step {step.index} and returned an error "
                     f"for arguments {args} ({said!r})")
            if (name, args) in answered:
                return Drift(f"{where}, where the record's identical call was answered: the "
                             "tool answers differently where this estimate runs (a service "
                             "down, a credential missing), so the branch cannot stand for the "
                             "recorded run and is not scored", step.index)
            if name not in failing and (cid in outages or says_service_down(said)):
                return Drift(f"{kind} ran live at step {step.index} and returned an "
                             f"error that says its service is down or unreachable ({said!r}): "
                             "the agent's reply to an outage is not what re-deciding the step "
                             "does, so the branch is not scored", step.index)
            why = await _not_the_calls(name, args, calls, answered, reruns)
            if why is not None:
                return Drift(f"{where}, {why}", step.index)
    return None


def _kind(name: str, reruns: Reruns) -> str:
    """How a message names a tool that ran live: "safe tool" only where it was classified
    safe; one that ran only because ``unclassified="live"`` let it is a plain tool."""
    return f"safe tool {name!r}" if name in reruns.classified else f"tool {name!r}"


async def _not_the_calls(name: str, args: str, calls: list[tuple[str, str, str]],
                         answered: Collection[tuple[str, str]], reruns: Reruns) -> str | None:
    """Why an error of ``name`` for ``args`` (arguments the record never got an answer for)
    is not the call's own, from the tool run again (``reruns``), or None when it is."""
    if name not in reruns.classified:
        return ("and CAR runs again only tools classified safe, to tell whether the error was "
                "the call's or its service's: this one ran live because unclassified=\"live\" "
                "let it. Name it in safe_tools if it only reads, or answer it with a "
                "simulator; the branch is not scored")
    if not reruns.can(name):
        return ("and CAR cannot run it again to tell whether the error was the call's or its "
                "service's: only a tool named in safe_tools (or annotated read-only) that needs "
                "nothing the framework hands it (a workflow Context, an injected state, a "
                "nested agent run) is run again. Name it in safe_tools if it only reads, or "
                "answer it with a simulator; the branch is not scored")
    again = await reruns(name, args)
    if again is None:
        return ("and answered the same call when CAR ran it again: the error was the "
                "service's, not the call's (it was temporarily unavailable), so the branch is "
                "not scored")
    # every answered call of the record (up to ``PAST_CALLS``) must error now: one the record
    # shows answered may have been an error worded as an answer (an SDK tool's own failure
    # function), and one that still answers says the tool's world is as it was
    pasts = list(dict.fromkeys(a for _, n, a in calls if n == name and (n, a) in answered))
    if not pasts:
        return None
    first = ""
    for past in pasts[:PAST_CALLS]:
        then = await reruns(name, past)
        if then is None:
            return None
        first = first or f"({then[:200]!r})"
    tried = min(len(pasts), PAST_CALLS)
    which = (f"answered call of it (arguments {pasts[0]}) errors too when CAR runs it again"
             if tried == 1
             else f"{tried} answered calls of it (the first with arguments {pasts[0]}) error "
                  "too when CAR runs them again")
    return (f"and the record's {which} {first}: the tool's world changed where this estimate "
            "runs (a service down or unreachable, a credential missing), so the error is "
            "not the call's and the branch is not scored")


__all__ = ["TOOL_SOURCES", "Drift", "Rerun", "Reruns", "answered_error", "drifted_tools",
           "reads_as_outage", "sources_of", "tool_errors", "with_sources"]
