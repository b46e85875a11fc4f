"""The frameworks the pytest plugin records and branches, one ``Integration`` each.

An integration names its framework's top module and two functions given as ``"module:name"``
strings, so nothing is imported until a test uses the fixture with that framework loaded:

- ``recorder()`` starts recording every run of the framework in the current context and returns
  a handle with ``runs`` (the finished ``car.Trajectory`` values) and ``stop()``;
- ``adapter(obj, options)`` turns an object the test watches (a compiled graph, a workflow) into
  a car ``Agent`` to branch with, or returns None when ``obj`` is not of its kind. ``options``
  holds ``safe_tools``, ``side_effect_tools``, ``simulators`` and any adapter keyword
  (``model``, ``unclassified`` …).

A handle may also have ``hooks``: what the test must hand each run itself, for a framework
with no way to watch every run (``car_recorder.hooks_for(agent)`` returns it).

``owns(run)`` says which recorded runs are the framework's. Built in: ``car`` (``car.record``
with any car Agent, ``FunctionAgent`` included), ``langgraph``, ``llamaindex`` and
``openai-agents``. Another
package adds its own with an entry point in the group ``car.pytest_integrations`` that names an
``Integration`` (or a zero-argument callable returning one), or calls ``register``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from contextlib import ExitStack
from contextvars import ContextVar, Token
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "car.pytest_integrations"


@dataclass(frozen=True)
class Integration:
    name: str
    module: str                       # recorded only once this module is imported
    recorder: str                     # "module:function" -> a handle with .runs and .stop()
    adapter: str | None = None        # "module:function" (obj, options) -> Agent | None
    framework: str | None = None      # run.meta["framework"] of its runs (None: no such key)

    def owns(self, run: Any) -> bool:
        return (run.meta or {}).get("framework") == self.framework

    def loaded(self) -> bool:
        return self.module in sys.modules

    def start(self) -> Any:
        return _resolve(self.recorder)()

    def to_agent(self, obj: Any, options: dict[str, Any]) -> Any:
        return _resolve(self.adapter)(obj, options) if self.adapter else None


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


_REGISTRY: dict[str, Integration] = {}
_entry_points_loaded = False


def register(integration: Integration) -> None:
    """Add (or replace, by name) an integration."""
    _REGISTRY[integration.name] = integration


def integrations() -> list[Integration]:
    """Every registered integration, entry points loaded on first call."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            value = ep.load()
            register(value if isinstance(value, Integration) else value())
    return list(_REGISTRY.values())


# -- car.record (FunctionAgent and any car Agent) -------------------------------------------

class _Collected:
    """A recording handle over a list its source appends to."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self.runs: list[Any] = []
        self._stop = stop

    def stop(self) -> None:
        self._stop()


def car_recorder() -> _Collected:
    from car_core.engine.replay import observing_records
    scope = ExitStack()
    handle = _Collected(scope.close)
    scope.enter_context(observing_records(lambda run: handle.runs.append(run)))
    return handle


def car_adapter(obj: Any, options: dict[str, Any]) -> Any:
    """A car Agent is branched as it is: it takes no adapter options. Side-effect tools named
    for it (marker or ``watch``) that it does not guard itself are refused, not dropped: a
    ``car.FunctionAgent`` has no named tools CAR could answer from the record, so they would
    run live on every branch. Safe tools named for it must be ones it classifies safe itself
    (``ChatAgent(safe_tools=...)``), and ``unclassified`` must be what it was built with."""
    if not (callable(getattr(obj, "start", None)) and callable(getattr(obj, "branch", None))):
        return None
    safety = getattr(obj, "safety", None)
    named = [*options.get("side_effect_tools", ()), *(options.get("simulators") or {})]
    unguarded = sorted({t for t in named
                        if safety is None or not callable(getattr(safety, "guards", None))
                        or not safety.guards(t)})
    safe = options.get("safe_tools") or ()
    unclassified = sorted(set([safe] if isinstance(safe, str) else safe)
                          - set(getattr(safety, "safe_tools", ())))
    mode = options.get("unclassified")
    other = sorted(k for k, v in options.items()
                   if k not in ("side_effect_tools", "simulators", "safe_tools", "unclassified")
                   and v is not None)
    if mode is not None and mode != getattr(safety, "unclassified", None):
        other.append("unclassified")
    if unguarded or unclassified or other:
        from car_core.errors import AdapterError
        what = (f"side-effect tool(s) {unguarded}" if unguarded else
                f"safe tool(s) {unclassified}" if unclassified else
                f"adapter option(s) {other}")
        raise AdapterError(
            f"{what} cannot be applied to a {type(obj).__name__}: a car Agent is branched as it "
            "is, so CAR has nothing to guard by that name and it would run live on branches",
            hint="make the agent answer branches itself (its environment sees the recorded "
                 "steps in history), give the tools to the agent when you build it where it "
                 "takes them (ChatAgent(safe_tools=..., side_effect_tools=...)), or build the "
                 "agent on "
                 "LangGraph, LlamaIndex or the OpenAI Agents SDK, whose tools CAR guards by "
                 "name")
    return obj


# -- LangGraph -----------------------------------------------------------------------------

_LANGCHAIN_HANDLER: ContextVar[Any] = ContextVar("car_pytest_langchain_handler", default=None)
_hooked_into: Any = None  # the module registered with (a fresh import needs it again)


class _LangGraphRecording:
    """A ``CarCallback`` added to every LangChain run in this context (LangChain's configure
    hook, the mechanism its own ``collect_runs`` uses), so graphs need no ``callbacks=``."""

    def __init__(self) -> None:
        global _hooked_into
        from ..langgraph import CarCallback

        # by sys.modules, not the package attribute: a re-imported module has its own hooks
        context = importlib.import_module("langchain_core.tracers.context")
        if _hooked_into is not context:
            context.register_configure_hook(_LANGCHAIN_HANDLER, True)
            _hooked_into = context
        self.callback = CarCallback(store=None)
        self._token: Token[Any] | None = _LANGCHAIN_HANDLER.set(self.callback)

    @property
    def runs(self) -> list[Any]:
        return [r for r in self.callback.runs if r.steps]  # a bare LCEL chain is no agent run

    def stop(self) -> None:
        if self._token is not None:
            try:
                _LANGCHAIN_HANDLER.reset(self._token)
            except ValueError:  # set in another context: clear it here
                _LANGCHAIN_HANDLER.set(None)
            self._token = None


def langgraph_recorder() -> _LangGraphRecording:
    return _LangGraphRecording()


def langgraph_adapter(obj: Any, options: dict[str, Any]) -> Any:
    if not (hasattr(obj, "get_state_history") and hasattr(obj, "builder")):
        return None
    from ..langgraph import LangGraphAgent
    return LangGraphAgent(obj, **options)


# -- LlamaIndex ----------------------------------------------------------------------------

class _LlamaIndexRecording:
    def __init__(self) -> None:
        from ..llamaindex import CarRecorder
        self.recorder = CarRecorder(store=None).attach()

    @property
    def runs(self) -> list[Any]:
        return list(self.recorder.runs)

    def stop(self) -> None:
        self.recorder.detach()


def llamaindex_recorder() -> _LlamaIndexRecording:
    return _LlamaIndexRecording()


def llamaindex_adapter(obj: Any, options: dict[str, Any]) -> Any:
    from llama_index.core.workflow import Workflow
    if not isinstance(obj, Workflow):
        return None
    from ..llamaindex import LlamaIndexAgent
    return LlamaIndexAgent(obj, **options)


# -- OpenAI Agents SDK ---------------------------------------------------------------------

class _OpenAIAgentsRecording:
    """One ``CarRecorder`` (the SDK's ``RunHooks``) per test, passed by the test as
    ``Runner.run(..., hooks=car_recorder.hooks_for(agent))``: the SDK takes hooks per run only
    (its swappable default runner is marked experimental, not public), and branches, which run
    without these hooks, are then never mistaken for the test's runs."""

    def __init__(self) -> None:
        from ..openai_agents import CarRecorder
        self.hooks = CarRecorder(store=None)

    @property
    def runs(self) -> list[Any]:
        return self.hooks.runs  # an unfinished run is closed as an error first

    def stop(self) -> None:
        self.hooks.close(None)


def openai_agents_recorder() -> _OpenAIAgentsRecording:
    return _OpenAIAgentsRecording()


def openai_agents_adapter(obj: Any, options: dict[str, Any]) -> Any:
    from agents import Agent
    if not isinstance(obj, Agent):
        return None
    from ..openai_agents import OpenAIAgentsAgent
    return OpenAIAgentsAgent(obj, **options)


# "car" is always recorded: its module is the one this plugin ships in
register(Integration("car", "car_adapters", f"{__name__}:car_recorder", f"{__name__}:car_adapter"))
register(Integration("langgraph", "langgraph", f"{__name__}:langgraph_recorder",
                     f"{__name__}:langgraph_adapter", framework="langgraph"))
register(Integration("llamaindex", "llama_index.core", f"{__name__}:llamaindex_recorder",
                     f"{__name__}:llamaindex_adapter", framework="llama-index"))
register(Integration("openai-agents", "agents", f"{__name__}:openai_agents_recorder",
                     f"{__name__}:openai_agents_adapter", framework="openai-agents"))
