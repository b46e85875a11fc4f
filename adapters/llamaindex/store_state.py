"""The workflow ``Context`` store a step decided from: taken at each step, put back on branches.

Tools of a ``FunctionAgent`` / ``AgentWorkflow`` keep what later steps read in ``ctx.store``
(the docs' ``await ctx.store.get("state")`` notes, or keys of their own). A branch from step
``k`` re-enters the workflow with a fresh ``Context``, so without this module it would start
from the workflow's ``initial_state`` and a tool reading the notes a held step wrote would find
none. The recorder takes, as each step's ``run_agent_step`` begins, every store key that is not
the framework's own bookkeeping (``FRAMEWORK_KEYS`` and each agent's scratchpad / reasoning
key, which the framework rebuilds from the re-entered messages); the branch puts those keys
into its ``Context`` before the run starts, and the framework keeps them (it sets its defaults
only for keys that are missing).

Values travel as the workflow's own ``JsonSerializer`` writes them, parsed into JSON, so a
pydantic model in the store comes back as the same model. A value that serializer cannot write
is named in the step's record, and a branch that would need it is refused.

What a side-effect tool handed the ``Context`` wrote is the store before its step against the
store before the next (``writes``); a branch's identical call replays it (``replay``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from llama_index.core.workflow import JsonSerializer

from car_core.errors import AdapterError

from ..common.state_change import Change, apply, recorded_changes

STORE_KEY = "store"              # step meta: {key: JSON value} the step decided from
UNRESTORABLE_KEY = "store_unrestorable"  # step meta: keys whose values could not be written

# What AgentWorkflow / FunctionAgent / ReActAgent write for their own running (llama-index-core
# 0.14): rebuilt on every run from the start event, the chat history and the root agent.
FRAMEWORK_KEYS = frozenset({
    "memory", "agents", "can_handoff_to", "current_agent_name", "handoff_output_prompt",
    "max_iterations", "early_stopping_method", "num_iterations", "formatted_input_with_state",
    "user_msg_str", "current_tool_calls", "num_tool_calls", "next_agent"})


def framework_keys(agents: Iterable[Any]) -> frozenset[str]:
    """The framework's keys for these agents: the shared ones and each agent's scratchpad
    (``FunctionAgent``, ``CodeActAgent``) or reasoning list (``ReActAgent``)."""
    own = {getattr(a, attr) for a in agents for attr in ("scratchpad_key", "reasoning_key")
           if isinstance(getattr(a, attr, None), str)}
    return FRAMEWORK_KEYS | own


def snapshot(ctx: Any, skip: frozenset[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """The store's user keys as JSON, and the keys whose values could not be written.
    ``None`` when the store keeps its state outside the process (a durable store), where no
    synchronous read exists."""
    checkpoint = getattr(getattr(ctx, "store", None), "checkpoint", None)
    if not callable(checkpoint):
        return None, []
    try:
        state = checkpoint().state
    except TypeError:  # the store was given a serializer other than JsonSerializer
        return None, []
    items = state.items() if hasattr(state, "items") else state.model_dump().items()
    serializer = JsonSerializer()
    values: dict[str, Any] = {}
    unrestorable: list[str] = []
    for key, value in items:
        if key in skip:
            continue
        try:
            values[str(key)] = json.loads(serializer.serialize(value))
        except Exception:  # the workflow's serializer cannot write it: name it, refuse later
            unrestorable.append(str(key))
    return values, sorted(unrestorable)


def recorded(meta: Mapping[str, Any], *, run_id: str, step: int) -> dict[str, Any]:
    """The store step ``step`` decided from, or a refusal saying why a branch cannot have it.
    Nothing runs before the first step but the framework's own setup, so step 0 recorded
    without its store starts from the workflow's initial state, as the record did."""
    bad = meta.get(UNRESTORABLE_KEY) or []
    if bad:
        raise AdapterError(
            f"ctx.store key(s) {sorted(bad)} held values the workflow's JsonSerializer cannot "
            f"write when step {step} began, so a branch cannot start from that state",
            run_id=run_id, step=step,
            hint="keep JSON values or pydantic models in ctx.store (put clients and "
                 "connections on the tools instead), then record the run again")
    values = meta.get(STORE_KEY)
    if values is None and step == 0:
        return {}
    if not isinstance(values, dict):
        raise AdapterError(
            f"step {step} was recorded without its workflow store (a durable state store, or "
            "a recorder from before the store was recorded), so a branch cannot start from "
            "the state it saw", run_id=run_id, step=step,
            hint="record the run again with car_adapters.llamaindex.CarRecorder on an "
                 "in-memory workflow Context")
    return values


def resolved(values: Any, modules: Iterable[ModuleType], *, run_id: str, step: int) -> Any:
    """``values`` (a recorded store) with each pydantic value's class named so this process
    finds it. A run recorded by ``python my_app.py`` names its classes ``__main__.Order``;
    attributed through the module (``car attribute --agent my_app:make``), ``__main__`` is
    another program, and a user trial's branches raised "Attribute Order not found in module
    __main__" after eight had run. Such a class is looked up in ``modules`` (the app's: where
    its tools and agents are defined) and refused, before any branch, where none has it."""
    if isinstance(values, list):
        return [resolved(v, modules, run_id=run_id, step=step) for v in values]
    if not isinstance(values, dict):
        return values
    out = {k: resolved(v, modules, run_id=run_id, step=step) for k, v in values.items()}
    name = out.get("qualified_name")
    if not out.get("__is_pydantic") or not isinstance(name, str):
        return out
    module, _, cls = name.rpartition(".")
    if module != "__main__" or isinstance(getattr(sys.modules.get(module), cls, None), type):
        return out
    found = {m.__name__ for m in modules if isinstance(getattr(m, cls, None), type)}
    if len(found) != 1:
        raise AdapterError(
            f"step {step}'s ctx.store holds a {name}, recorded by a script run as __main__, "
            "and " + ("no module of the app defines a class " if not found else
                      f"several modules of the app ({sorted(found)}) define a class ")
            + f"{cls!r}, so a branch cannot rebuild it", run_id=run_id, step=step,
            hint="define the class in a module the app imports (my_app.py's classes are "
                 "found when the agent factory lives there too), then record the run again")
    out["qualified_name"] = f"{found.pop()}.{cls}"
    return out


def app_modules(agents: Iterable[Any]) -> list[ModuleType]:
    """The modules an app is defined in: its agents' and their models' classes', and its
    tools' functions' (sync and async)."""
    names: dict[str, None] = {}
    for agent in agents:
        names[type(agent).__module__] = None
        names[type(getattr(agent, "llm", None)).__module__] = None
        for tool in getattr(agent, "tools", None) or ():
            for fn in (getattr(tool, "fn", None), getattr(tool, "async_fn", None)):
                module = getattr(fn, "__module__", None)
                if isinstance(module, str):
                    names[module] = None
    return [sys.modules[n] for n in names if n in sys.modules]


async def restore(ctx: Any, values: Mapping[str, Any]) -> None:
    """Put recorded store values into a fresh ``Context`` before its run starts."""
    if not values:
        return
    serializer = JsonSerializer()
    async with ctx.store.edit_state() as state:  # keys as recorded (``set`` reads dots as paths)
        for key, value in values.items():
            state[key] = serializer.deserialize(json.dumps(value))


def _known(meta: Mapping[str, Any]) -> Any:
    """A step's recorded store as JSON, or None where the record does not have all of it."""
    values = meta.get(STORE_KEY)
    return values if isinstance(values, dict) and not meta.get(UNRESTORABLE_KEY) else None


def writes(steps: Any, tools: Iterable[str]) -> dict[tuple[str, str], Change]:
    """What each recorded call of ``tools`` (those handed the ``Context``) wrote to the store,
    where the record shows it (``state_change.recorded_changes``: the only such call of its
    step, both stores recorded whole). A write that removed a store key is left out: a
    ``Context`` store has no way to remove one."""
    names = set(tools)
    found = recorded_changes(steps, lambda step: _known(step.meta), names.__contains__)
    return {key: change for key, change in found.items()
            if all(len(op["path"]) > 1 or "after" in op for op in change)}


async def replay(ctx: Any, change: Change) -> None:
    """Write a recorded change into the branch's ``Context`` store (``state_change.Conflict``
    where the store does not hold what the record held where the change writes)."""
    if not change:
        return
    serializer = JsonSerializer()
    keys = list(dict.fromkeys(str(op["path"][0]) for op in change))
    async with ctx.store.edit_state() as state:
        present = {key: json.loads(serializer.serialize(state[key])) for key in keys
                   if key in state}
        after = apply(present, change)
        for key in keys:
            state[key] = serializer.deserialize(json.dumps(after[key]))
