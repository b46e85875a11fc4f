"""``CarRecorder``: the SDK's own run hooks, turned into ``car.Trajectory`` values.

Pass it as ``hooks=`` to ``Runner.run`` / ``run_sync`` / ``run_streamed``. Every model call is
one step: the input items and instructions it saw (stored as OpenAI-style messages in
``state``, the raw items in ``meta["input_items"]`` for exact re-entry), the agent that made
it, its action, usage and latency. A step's observation is the tool results that answered its
calls, read from the next call's input (what the model saw) or, for the last step, from the
tool hooks. Handoffs are noted on the step that made them. The run context (``context=``) is
snapshotted as the step's model call starts (``meta["run_context"]``, see ``_context``), so a
branch from that step starts from it as it was; so are the names and descriptions of the function
tools the call was offered (``meta["tools"]``, see ``offered_tools``), which a branch can give
that call edited. Runs are told apart by their usage
object, so one recorder can watch concurrent runs. A run that ends without a final output
(an exception, a guardrail tripwire, ``max_turns``) is closed when ``run`` / ``runs`` is read,
with status ``"error"``, once the task that ran it is over (a run still going in another task,
a search of ``asyncio.gather``, stays open: ``run`` is the latest run that ended); a run the
SDK stopped for a tool call's approval and the user resumed (``Runner.run(agent,
result.to_state())``) is recorded as one run, if the recorder is not read in between. The
SDK tells its hooks nothing of a guardrail's tripwire (``guardrails``): a run
recorded inside ``with recorder.recording(agent):`` is kept until the block ends, with the
app's guardrails watched, and one a guardrail stopped says so (``meta["tripwire"]``); outside a
block, a run an output or parallel input guardrail stopped after the reply looks finished. Each run
carries the app's fingerprint (``car_adapters.openai_agents.fingerprint``), taken from the
agent it started with, so attributing it with another app is refused; for an app with MCP
servers the recorder lists their tools once as the run starts (one ``list_tools`` per server:
the fingerprint covers them) and notes the loop they live on, where branches will call them.
With ``outcome=`` (``outcome(run)`` or ``outcome(run, rng)``, as for ``car.record``) each
run is scored as it closes, so ``car runs`` shows which runs failed; a judge that raises leaves
the run unscored (the error is kept in ``outcome_errors``) and never breaks the user's run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agents import RunHooks

import car_core as car
from car_core.contract import OutcomeFn, RunStatus, in_branch, redact
from car_core.errors import AdapterError, InvalidInput, OutcomeError, StoreError

from ..common.messages import calls_of, tool_result
from ..common.run_keeping import score_run, store_run, unstored
from . import mcp_tools
from ._context import snapshot
from ._items import action_of, to_dicts
from .app import agents_of, tool_names
from .fingerprint import app_digest
from .guardrails import BLOCKED, TRIPS, tripwire_of, watch
from .offered_tools import offered

UNFINISHED = "the run stopped before a final output (an exception, a guardrail or max_turns)"
CANCELLED = "the stream was cancelled before a final output (RunResultStreaming.cancel)"


def _model_name(agent: Any, chosen: Any = None) -> str:
    """The name of the model a step was decided with: ``chosen`` (the run config's model, the
    SDK's pick for every agent) where the block knew one, else the agent's own."""
    model = chosen if chosen is not None else agent.model
    model = getattr(model, "inner", model)  # a CAR branch model names the one it serves
    if isinstance(model, str):
        return model
    return str(getattr(model, "model", None) or type(model).__name__ if model else "default")


def _content(result: Any) -> Any:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)


def _jsonable(value: Any) -> Any:
    """Input items as plain JSON (a caller may pass SDK or pydantic objects as input)."""
    def fallback(obj: Any) -> Any:
        dump = getattr(obj, "model_dump", None)
        return dump(mode="json", exclude_unset=True) if callable(dump) else str(obj)
    return json.loads(json.dumps(value, default=fallback))


def _context_of(given: Any) -> Any:
    """A run's context from its input (plain JSON): a lone user message's text, else the
    input as it is (a string, or the list of items)."""
    if (isinstance(given, list) and len(given) == 1 and isinstance(given[0], dict)
            and given[0].get("role") == "user" and isinstance(given[0].get("content"), str)):
        return given[0]["content"]
    return given


STALE_S = 1.0  # a run whose last turn ended this long ago, none begun since, is over


class RunStillOpen(UserWarning):
    """A run that may have stopped between turns was taken to be still going (``runs``)."""


def _cancelled(task: Any) -> bool:
    """Whether a run's latest turn was cancelled (``RunResultStreaming.cancel()``): done
    cancelled, or asked to be and not yet there."""
    if not isinstance(task, asyncio.Task):
        return False
    return task.cancelled() if task.done() else task.cancelling() > 0


def _task() -> asyncio.Task[Any] | None:
    """The asyncio task running now, if any."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        return None


@dataclass
class _RunBuf:
    root: Any
    usage: Any  # held so that its id, the run's key, is not reused while the run is open
    context: Any = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    open: dict[str, Any] | None = None
    tool_results: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    mcp: dict[str, list[str]] = field(default_factory=dict)  # agent -> its MCP tools' names
    listing: mcp_tools.Listing = field(default_factory=dict)  # agent -> its MCP tools
    block: _Block | None = None  # the ``recording(agent)`` block it started in
    model: Any = None  # the run config's model its block was told of (every step's), or None
    members: frozenset[str] = frozenset()  # the agents its handoffs reach (empty: unknown)
    final_output: Any = None  # what the SDK ended the run with (``on_agent_end``)
    task: Any = None  # the asyncio task that runs it: while it goes, the run is in flight


@dataclass
class _Block:
    """One ``with recorder.recording(agent):`` block: the runs that started in it, those that
    finished, held until it ends, and the tripwires its watched guardrails reported."""

    watched: list[str] = field(default_factory=list)  # the guardrails it watches, labelled
    model: Any = None  # ``run_config.model``: the model every agent of its runs decides with
    bufs: list[_RunBuf] = field(default_factory=list)
    held: list[tuple[_RunBuf, BaseException | str | None]] = field(default_factory=list)
    trips: dict[int, dict[str, str]] = field(default_factory=dict)  # run key -> its tripwire
    blocked: dict[int, Any] = field(default_factory=dict)  # run key -> the input it stopped
    settled: bool = False  # ended: a run that starts after it is kept as any other


# the block the code running now is in: hooks run in the Runner's task, which copies the
# context of the code that called Runner.run / run_sync / run_streamed
_BLOCK: ContextVar[_Block | None] = ContextVar("car_openai_agents_block", default=None)


def _members(root: Any) -> frozenset[str]:
    """The names of the agents ``root``'s handoffs reach (empty where CAR cannot read it)."""
    try:
        return frozenset(agents_of(root))
    except AdapterError:
        return frozenset()


def _fingerprint(root: Any, listing: mcp_tools.Listing | None = None) -> str | None:
    """The app's fingerprint, or None (unchecked) for an app CAR cannot read: two agents
    under one name, which ``OpenAIAgentsAgent`` refuses anyway; the user's run goes on."""
    try:
        return app_digest(root, listing)
    except AdapterError:
        return None


class CarRecorder(RunHooks[Any]):
    """Run hooks that record each run; ``store`` (a path or ``car.RunStore``) saves each one,
    ``outcome`` scores it."""

    def __init__(self, store: str | Path | car.RunStore | None = None, *,
                 outcome: Callable[..., Any] | None = None) -> None:
        self.store = car.RunStore(store) if isinstance(store, (str, Path)) else store
        self.outcome = OutcomeFn(outcome) if outcome is not None else None
        self.outcome_errors: list[OutcomeError] = []
        self._runs: list[car.Trajectory] = []
        # one made inside a branch records that branch; one made outside never records one
        self._records_branches = in_branch()
        self._bufs: dict[int, _RunBuf] = {}
        self._tasks: dict[int, asyncio.Task[Any] | None] = {}  # run key -> its task (noted)
        self._kept: dict[int, tuple[Any, car.Trajectory]] = {}  # run key -> (usage, its run)
        self._ended: dict[int, float] = {}  # run key -> when its latest turn's task ended
        self._lock = threading.Lock()
        self.store_errors: list[StoreError] = []
        self._raised = 0  # of store_errors, how many a flush raised already
        # runs a block settled while the SDK may still call hooks for them (a model call a
        # tripwire did not cancel): ignored, their usage objects held so no id is reused
        self._settled: dict[int, Any] = {}

    @contextmanager
    def recording(self, agent: Any, *, run_config: Any = None) -> Iterator[None]:
        """Record the runs started inside the block knowing which a guardrail stopped: the
        SDK tells its hooks nothing of a tripwire (``guardrails``), so the guardrails of
        ``agent``'s app (and ``run_config``'s) are watched, and a run one of them stopped gets
        ``meta["tripwire"]``, whether the tripwire left the block or the app caught it. Put
        ``Runner.run`` / ``run_sync`` / ``run_streamed`` (and the loop over its events)
        inside; the runs are stored and scored as the block ends. An app with guardrails is
        attributable only from runs recorded so. ``run_config.model``, where it names one, is
        the model its steps are labelled with (the SDK decides every agent's turns with it;
        hooks alone see only each agent's own)."""
        block = _Block(watched=watch(agents_of(agent), run_config),
                       model=getattr(run_config, "model", None))
        token, trips = _BLOCK.set(block), TRIPS.set(block.trips)
        blocked = BLOCKED.set(block.blocked)
        raised: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            raised = exc
            raise
        finally:
            BLOCKED.reset(blocked)
            TRIPS.reset(trips)
            _BLOCK.reset(token)
            self._settle(block, raised)

    def _settle(self, block: _Block, raised: BaseException | None) -> None:
        """Close the block's runs: those still open end with ``raised`` (if anything was;
        else they go on past the block, a stream not read in it, kept when they end), each
        stopped one is marked with its tripwire, then each is scored and stored."""
        with self._lock:
            block.settled = True
            open_ = [b for b in block.bufs if self._bufs.get(id(b.usage)) is b]
            # a run stopped mid-way ends here: by what left the block, by a tripwire the app
            # caught (its model call cancelled, it never reached its end) or by a stream
            # cancelled in the block (the SDK tells the hooks nothing of it)
            stopped = [b for b in open_ if raised is not None or id(b.usage) in block.trips
                       or _cancelled(b.task)]
            for b in stopped:
                del self._bufs[id(b.usage)]
                self._settled[id(b.usage)] = b.usage
            for b in open_:
                if not any(b is x for x in stopped):
                    b.block = None

        def why(b: _RunBuf) -> BaseException | str:
            """What ended a run stopped in the block: what left it, else its cancelled
            stream, else (a tripwire the app caught) that it never finished."""
            if raised is not None:
                return raised
            cancelled = _cancelled(b.task) and id(b.usage) not in block.trips
            return CANCELLED if cancelled else UNFINISHED
        ended = [*block.held, *((b, why(b)) for b in stopped)]
        for buf, err in ended:
            if buf.context is None and id(buf.usage) in block.blocked:
                # stopped before its first model call: what it was asked is the input the
                # guardrail judged, kept so the run shows what was blocked
                buf.context = _context_of(_jsonable(block.blocked[id(buf.usage)]))
            run = self._built(buf, err)
            meta = {**run.meta, "guardrails_watched": block.watched}
            tripwire = block.trips.get(id(buf.usage))
            if tripwire is not None:  # a designed stop, scored: not a crash
                meta["tripwire"] = tripwire
                said = (repr(raised) if tripwire_of(raised) == tripwire else
                        f"the {tripwire['kind']} guardrail {tripwire['guardrail']!r} stopped "
                        "the run (its tripwire was caught in the block)")
                run = replace(run, status=RunStatus.COMPLETE, error=said, meta=meta)
            else:
                run = replace(run, meta=meta)
            self._keep(run, buf.usage)

    @property
    def runs(self) -> list[car.Trajectory]:
        """The runs recorded so far (an unfinished one that is over is closed as an error
        first: ``_over``)."""
        if self._close_stopped():
            warnings.warn(
                "a run of this recorder ended a turn just now and has not gone on: it is taken "
                "to be still going (the next turn starts as soon as it is scheduled); one that "
                "raised between turns (max_turns) is recorder.run_of(the exception)",
                RunStillOpen, stacklevel=3)
        return list(self._runs)

    def _close_stopped(self) -> int:
        """Close, as errors, the unfinished runs that can no longer go on, and return how many
        were left open that may have (``_over``; read outside an event loop, or while no run's
        turn is running, every unfinished run is over, and so is one the reader's own task ran:
        the SDK runs a turn in the caller's task where it runs no guardrail beside it). A user
        trial's research pipeline read
        ``recorder.run`` while other searches ran: every run in flight was closed as an error,
        its next steps dropped, and an empty run stored as complete."""
        me = _task()
        with self._lock:
            # with no run's turn running, nothing here is between turns of a run still going
            going = any(b.task is not None and b.task is not me and not b.task.done()
                        for b in self._bufs.values())
            over = {k: b for k, b in self._bufs.items()
                    if me is None or not going or b.task is me or self._over(k, b)}
            for key in over:
                del self._bufs[key]
                self._ended.pop(key, None)
            unsure = sum(1 for k, b in self._bufs.items()
                         if b.task is not None and b.task.done())
        for buf in over.values():
            if buf.steps:
                self._finish(buf, UNFINISHED)
        return unsure

    def _over(self, key: int, buf: _RunBuf) -> bool:
        """Whether a run read from inside an event loop is over. The SDK runs each turn in a
        task of its own (``_note_task``): a turn that raised ended the run; one still running
        has not; one that returned may be followed by the next turn, whose task its run starts
        as soon as it is scheduled, so the run counts as over once its last turn ended
        ``STALE_S`` ago with no other begun (``max_turns``, a guardrail: raised between turns).
        """
        task = buf.task
        if task is None:
            return True
        if not task.done():
            return False
        if task.cancelled() or task.exception() is not None:
            return True
        ended = self._ended.get(key)
        return ended is None or time.monotonic() - ended > STALE_S

    def flush(self) -> None:
        """Raise ``StoreError`` (once) for the runs that could not be stored (each stays in
        ``runs``); reading ``run`` does too. Each run is stored as it ends."""
        failed = unstored(self.store, self.store_errors, self._raised)
        self._raised = len(self.store_errors)
        if failed is not None:
            raise failed

    @property
    def run(self) -> car.Trajectory:
        runs = self.runs
        self.flush()
        block = _BLOCK.get()
        if not runs and block is not None and not block.settled:
            raise AdapterError("the runs of a `with recorder.recording(agent):` block are kept "
                               "as the block ends, and this one has not ended",
                               hint="read recorder.run after the block")
        if not runs:
            raise AdapterError("the recorder has seen no run",
                               hint="pass hooks=recorder to Runner.run / run_sync / "
                                    "run_streamed")
        return runs[-1]

    def run_of(self, ended: Any) -> car.Trajectory:
        """The run a ``Runner.run`` gave ``ended`` for: its result (``RunResult``,
        ``RunResultStreaming``) or the exception it raised (the SDK's carry ``run_data``).
        Among runs that overlap (``asyncio.gather``) this is the one to attribute; ``run``
        is only the latest that ended."""
        wrapper = getattr(ended, "context_wrapper", None) or getattr(
            getattr(ended, "run_data", None), "context_wrapper", None)
        usage = getattr(wrapper, "usage", None)
        if usage is None:
            raise InvalidInput(f"{type(ended).__name__} is neither a run's result nor an error "
                               "of the SDK that carries its run",
                               hint="pass what Runner.run returned, or the exception it raised")
        raised = isinstance(ended, BaseException)
        complete = None if raised else getattr(ended, "is_complete", None)  # a stream's
        if complete is False:
            raise AdapterError("that streamed run has not ended",
                               hint="read result.stream_events() to the end (or cancel the "
                                    "stream) before recorder.run_of(result)")
        # it raised, or its stream ended with the run still open: the SDK calls no hook when
        # a stream is cancelled, and a user's Stop lost the run it stopped (a run paused for
        # approvals is not over: it goes on when resumed)
        over = raised or (complete is True and not getattr(ended, "interruptions", None))
        with self._lock:
            buf = self._bufs.pop(id(usage), None) if over else None
        if buf is not None and buf.steps:  # over, whatever its turns' tasks say
            self._finish(buf, ended if raised else CANCELLED)
        with self._lock:
            kept = self._kept.get(id(usage))
        if kept is None or kept[0] is not usage:
            block = _BLOCK.get()
            if block is not None and not block.settled:  # the likely cause, said first
                raise AdapterError("the runs of a `with recorder.recording(agent):` block are "
                                   "kept as the block ends, and this one has not ended",
                                   hint="call recorder.run_of(result) after the block")
            raise AdapterError("this recorder kept no run for that result",
                               hint="pass hooks=recorder to the Runner.run that gave it; a run "
                                    "recorded in a `with recorder.recording(agent):` block is "
                                    "kept as the block ends")
        return kept[1]

    # -- the hooks -----------------------------------------------------------------------------
    def _buf(self, context: Any, agent: Any) -> _RunBuf:
        key = id(context.usage)
        with self._lock:
            if self._settled.get(key) is context.usage:  # its block ended: kept as it was
                return _RunBuf(root=agent, usage=context.usage)
            if key not in self._bufs:
                resumed = self._interrupted(context)
                if resumed is not None:  # the same run, resumed after its approvals
                    buf = self._bufs.pop(resumed)
                    buf.usage, buf.task = context.usage, self._tasks.pop(key, None)
                    self._bufs[key] = buf
                else:
                    block = _BLOCK.get()
                    if block is not None and block.settled:  # a stream read past its block
                        block = None
                    buf = _RunBuf(root=agent, usage=context.usage,
                                  fingerprint=_fingerprint(agent), block=block,
                                  model=block.model if block is not None else None,
                                  members=_members(agent), task=self._tasks.pop(key, None))
                    if block is not None:
                        block.bufs.append(buf)
                    self._bufs[key] = buf
            return self._bufs[key]

    def _interrupted(self, context: Any) -> int | None:
        """The open run that ``context`` resumes: the SDK stops a run at a tool call that needs
        approval and ``Runner.run(agent, result.to_state())`` goes on with a copy of its
        context (another usage object) that holds the decision on that call; the open run whose
        last step made the call, still unanswered, is the one resumed."""
        approved = getattr(context, "is_tool_approved", None)
        if not callable(approved):
            return None
        for key, buf in self._bufs.items():
            if not buf.steps:
                continue
            for cid, name, _ in calls_of(buf.steps[-1]["action"]):
                if cid not in buf.tool_results and approved(name, cid) is not None:
                    return key
        return None

    def _ignored(self, context: Any, agent: Any) -> bool:
        """Events that are no run of the user's: those of a CAR branch (for a recorder made
        outside one), and those of an agent tool's nested run (``agent.as_tool(hooks=...)``),
        which shares its parent run's usage object and so its key: a user trial's nested
        events were spliced into the parent run as its steps, and the nested run's end closed
        the parent, whose rest was stored as a second run. The nested agent's calls are inside
        the agent tool's call, which the parent run records."""
        if not self._records_branches and in_branch():
            return True
        buf = self._bufs.get(id(context.usage))
        return buf is not None and bool(buf.members) and agent.name not in buf.members

    def on_agent_start(self, context: Any, agent: Any) -> Coroutine[Any, Any, None]:
        """A plain method, so it runs in the run's own task: the SDK gathers the coroutine it
        returns in a task of its own, which ends with the hook (``_note_task``)."""
        self._note_task(context, agent)
        return self._agent_start(context, agent)

    def on_llm_start(self, context: Any, agent: Any, system_prompt: str | None,
                     input_items: list[Any]) -> Coroutine[Any, Any, None]:
        self._note_task(context, agent)
        return self._llm_start(context, agent, system_prompt, input_items)

    def _note_task(self, context: Any, agent: Any) -> None:
        """Note the task running this turn of the run of ``context`` (the SDK runs each turn,
        its model call and its tools, in a task of its own): a run whose latest turn's task
        is over is closed when the recorder is read, one still going is not (``runs``)."""
        if self._ignored(context, agent):
            return
        key, task = id(context.usage), _task()
        if task is not None:  # when the turn ends, for ``_over``
            task.add_done_callback(functools.partial(self._turn_ended, key))
        with self._lock:
            self._ended.pop(key, None)
            buf = self._bufs.get(key)
            if buf is not None:
                buf.task = task
            else:  # the run starts (or resumes): taken by ``_buf``
                self._tasks[key] = task

    def _turn_ended(self, key: int, task: asyncio.Task[Any]) -> None:
        self._ended[key] = time.monotonic()

    async def _agent_start(self, context: Any, agent: Any) -> None:
        if self._ignored(context, agent):
            return
        redact.register_from(agent)  # its model client's key is never recorded
        with self._lock:
            new = id(context.usage) not in self._bufs
        if new:
            try:
                agents = agents_of(agent)
            except AdapterError:  # two agents under one name: refused when attributed
                agents = {}
            if mcp_tools.servers_of(agents):
                mcp_tools.note_loop(agents)
                buf = self._buf(context, agent)
                try:
                    listing = await mcp_tools.list_tools(agents, context)
                except Exception:  # the user's run goes on (and fails there, if it must);
                    buf.fingerprint = None  # unchecked: the run's tools are not all known
                else:
                    buf.fingerprint = _fingerprint(agent, listing)
                    buf.mcp, buf.listing = mcp_tools.names(listing), listing
        self._buf(context, agent)

    async def _llm_start(self, context: Any, agent: Any, system_prompt: str | None,
                         input_items: list[Any]) -> None:
        if self._ignored(context, agent):
            return
        buf = self._buf(context, agent)
        items = _jsonable(list(input_items))
        if buf.context is None:
            buf.context = _context_of(items)
        run_context = snapshot(context.context)
        if run_context is not None:  # stored with the step: its secrets never are
            redact.register_from(context.context)  # a client or model it holds
            redact.register_fields(run_context.get("value"))  # api_key=, *_token=, password=
        tools = await offered(agent, context, buf.listing.get(agent.name, ()))
        buf.open = {"agent": agent.name, "system": system_prompt, "items": items,
                    "context": run_context, "tools": tools, "started": time.monotonic()}

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        if self._ignored(context, agent):
            return
        buf = self._buf(context, agent)
        opened, buf.open = buf.open, None
        if opened is None:
            return
        u = response.usage
        meta = {"agent": agent.name, "model": _model_name(agent, buf.model),
                "params": agent.model_settings.to_json_dict(),
                "usage": {"prompt_tokens": int(u.input_tokens),
                          "completion_tokens": int(u.output_tokens)},
                "latency_s": round(time.monotonic() - opened["started"], 6),
                "input_items": opened["items"]}
        if opened["context"] is not None:
            meta["run_context"] = opened["context"]
        if opened["tools"]:
            meta["tools"] = opened["tools"]
        buf.steps.append({"action": action_of(response.output),
                          "state": to_dicts(opened["system"], opened["items"]), "meta": meta})

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        if self._ignored(context, agent):
            return
        cid = getattr(context, "tool_call_id", None)
        if cid is not None:
            self._buf(context, agent).tool_results[str(cid)] = _content(result)

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        if self._ignored(context, from_agent):
            return
        buf = self._buf(context, from_agent)
        if buf.steps:
            buf.steps[-1]["meta"]["handoff"] = {"from": from_agent.name, "to": to_agent.name}

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        if self._ignored(context, agent):
            return
        with self._lock:
            buf = self._bufs.pop(id(context.usage), None)
            if buf is None:  # a resumed run that ends at once (a rejection under StopAtTools)
                resumed = self._interrupted(context)
                buf = self._bufs.pop(resumed, None) if resumed is not None else None
        if buf is not None:
            buf.final_output = output
            self._finish(buf, None)

    # -- closing runs --------------------------------------------------------------------------
    def close(self, error: BaseException | str | None) -> None:
        """Close every unfinished run as an error (``error`` says why)."""
        with self._lock:
            bufs, self._bufs = list(self._bufs.values()), {}
        for buf in bufs:
            if buf.steps:
                self._finish(buf, error if error is not None else UNFINISHED)

    def _finish(self, buf: _RunBuf, err: BaseException | str | None) -> None:
        """The run is over: kept now, or, in a ``recording(agent)`` block, when it ends."""
        with self._lock:
            block = buf.block if buf.block is not None and not buf.block.settled else None
            if block is not None:
                block.held.append((buf, err))
        if block is None:
            self._keep(self._built(buf, err), buf.usage)

    def _keep(self, run: car.Trajectory, usage: Any) -> None:
        run = score_run(run, self.outcome, self.outcome_errors)
        self._runs.append(run)
        with self._lock:
            self._kept[id(usage)] = (usage, run)
        store_run(run, self.store, self.store_errors)

    def _built(self, buf: _RunBuf, err: BaseException | str | None) -> car.Trajectory:
        steps = []
        for i, s in enumerate(buf.steps):
            nxt = buf.steps[i + 1]["meta"]["input_items"] if i + 1 < len(buf.steps) else []
            outputs = {str(it.get("call_id")): it.get("output") for it in nxt
                       if isinstance(it, dict) and it.get("type") == "function_call_output"}
            results = []
            for cid, name, _ in calls_of(s["action"]):
                if cid in outputs:
                    results.append(tool_result(cid, name, _content(outputs[cid])))
                elif cid in buf.tool_results:
                    results.append(tool_result(cid, name, buf.tool_results[cid]))
            steps.append(car.Step(index=i, action=s["action"], observation=results or None,
                                  observed=bool(results), state=s["state"], meta=s["meta"]))
        meta = {"framework": "openai-agents", "root_agent": buf.root.name,
                "tools": {a: sorted([*ts, *buf.mcp.get(a, ())])
                          for a, ts in tool_names(buf.root).items()},
                "agent_fingerprint": buf.fingerprint}
        if err is None and steps and calls_of(steps[-1].action):
            # a run the SDK ended at a tool call (tool_use_behavior="stop_on_first_tool",
            # StopAtTools, a function's ToolsToFinalOutputResult): its final output is no
            # reply of the model, so it is kept as the SDK gave it (``final_state``)
            meta["final_output"] = _jsonable(buf.final_output)
        return car.Trajectory.new(
            context=buf.context, steps=steps, agent=f"openai-agents:{buf.root.name}",
            status=RunStatus.ERROR if err is not None else RunStatus.COMPLETE,
            error=(err if isinstance(err, str) else repr(err)) if err is not None else None,
            meta=meta)


