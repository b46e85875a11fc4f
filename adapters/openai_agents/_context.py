"""The run context (``Runner.run(..., context=obj)``) as a step records it and a branch
rebuilds it.

The SDK hands the same context object to every hook, tool, dynamic instruction and guardrail
of a run, and they may change it as the run goes (a handoff hook that books a flight, a tool
that writes the seat). A branch from step ``k`` must start from the context *as it was* when
step ``k`` was decided, so the recorder stores a snapshot of it with every step
(``meta["run_context"]``): ``{"type": "module:QualName", "value": JSON}`` for a context
pydantic can dump and load back unchanged (a pydantic model, a dataclass, a dict of plain
JSON), ``{"type": ...}`` alone for one it cannot (a client, a lock, an open connection).

A branch rebuilds the snapshot with the context's own class, found among the classes the
process already has (the app's ``Agent[Ctx]`` type arguments, then the recorded module's
attribute; nothing is imported from a name read from the store), or hands it to the user's
``context_factory(value)`` (``value`` is None where no snapshot could be taken). A run whose
context can be rebuilt neither way is refused before any branch runs.

What a side-effect tool's recorded call wrote to the context is the snapshot before its step
against the one before the next (``writes``); a branch's identical call replays it on the
branch's context in place (``replay``), since the SDK hands the same object to everything.
"""

from __future__ import annotations

import copy
import sys
import typing
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import TypeAdapter

import car_core as car
from car_core.errors import AdapterError, InvalidInput

from ..common.messages import ToolSafety, calls_of
from ..common.state_change import Change, apply, recorded_changes

ContextFactory = Callable[[Any], Any]
NOT_GIVEN: Any = object()  # the default of the removed ``OpenAIAgentsAgent(context=)``


def refuse_shared_context(context: object) -> None:
    """Refuse 0.1's ``context=obj``: every branch ran with that one object, left as the app
    last changed it. Branches now start from the context their step saw, and run at once, so
    neither sharing the object nor copying it can stand in without moving the answer."""
    if context is not NOT_GIVEN:
        raise InvalidInput(
            "OpenAIAgentsAgent(context=...) was removed in 0.2: each branch now gets the run "
            "context its step was decided with, rebuilt from the record",
            hint="drop context=; where the context cannot be recorded (a client, a lock), pass "
                 "context_factory=lambda recorded: MyContext(...) to build each branch's own")


def type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


_ADAPTERS: dict[type, TypeAdapter[Any] | None] = {}  # one per context class: built once


def _adapter(cls: type) -> TypeAdapter[Any] | None:
    if cls not in _ADAPTERS:
        try:
            _ADAPTERS[cls] = TypeAdapter(cls)
        except Exception:  # pydantic has no schema for it (arbitrary class, client, lock)
            _ADAPTERS[cls] = None
    return _ADAPTERS[cls]


def snapshot(obj: Any) -> dict[str, Any] | None:
    """What a step records of the run context (None when the run has none)."""
    if obj is None:
        return None
    cls = type(obj)
    out: dict[str, Any] = {"type": type_name(cls)}
    adapter = _adapter(cls)
    if adapter is None:
        return out
    try:
        value = adapter.dump_python(obj, mode="json")
        # kept only when it loads back to the same context: a rebuilt branch context must
        # equal the recorded one, including what a dump leaves out (a pydantic private
        # attribute, a field excluded from dumps), which the dumps alone cannot show
        rebuilt = adapter.validate_python(value)
        if adapter.dump_python(rebuilt, mode="json") == value and _same(rebuilt, obj):
            out["value"] = value
    except Exception:  # a field pydantic cannot dump, or a type that does not load back
        pass
    return out


def _same(a: Any, b: Any) -> bool:
    """Whether two contexts hold the same: the class's own equality (a pydantic model compares
    its fields, private attributes and extras; a dataclass its fields), or, for a class that
    compares by identity, its attributes."""
    eq: object = type(a).__eq__
    if eq is object.__eq__:
        return hasattr(a, "__dict__") and hasattr(b, "__dict__") and vars(a) == vars(b)
    return bool(a == b)


def context_types(agents: Iterable[Any]) -> dict[str, type]:
    """The context classes the app names itself: ``Agent[Ctx](...)`` keeps ``Ctx`` on the
    agent (``__orig_class__``), so contexts defined inside a function are found too."""
    out: dict[str, type] = {}
    for a in agents:
        for arg in typing.get_args(getattr(a, "__orig_class__", None)):
            if isinstance(arg, type):
                out[type_name(arg)] = arg
    return out


def _known_class(name: str, app_types: dict[str, type]) -> type | None:
    if name in app_types:
        return app_types[name]
    module, _, qualname = name.partition(":")
    if module == "__main__":
        # recorded by ``python my_agent.py`` and attributed with ``--agent my_agent:make``: the
        # same class under its module's name, when the app's agents name it (``Agent[Ctx]``)
        same = [cls for cls in app_types.values() if cls.__qualname__ == qualname]
        if len(same) == 1:
            return same[0]
    if "<locals>" in qualname or module not in sys.modules:
        return None  # never imported on the store's word
    obj: Any = sys.modules[module]
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) and type_name(obj) == name else None


class ContextRebuilder:
    """Builds each branch's context from the recorded snapshot at its step."""

    def __init__(self, agents: Iterable[Any], factory: ContextFactory | None) -> None:
        if factory is not None and not callable(factory):
            raise AdapterError(f"context_factory must be callable, got {type(factory).__name__}",
                               hint="pass context_factory=lambda recorded: MyContext(**recorded)")
        self.factory = factory
        self.app_types = context_types(agents)

    def check(self, run: car.Trajectory) -> None:
        """Refuse, before any branch, a run with a context no branch could be given."""
        if self.factory is not None:
            return
        for step in run.steps:
            rec = step.meta.get("run_context")
            if rec is None:
                continue
            name = str(rec.get("type"))
            if "value" not in rec:
                raise AdapterError(
                    f"the run's context (a {name}) could not be recorded: pydantic cannot "
                    "dump it and load back the same context (a client or lock in it, or a "
                    "private attribute or a field left out of dumps that would be lost), so no "
                    "branch can be given the context the recorded step saw",
                    run_id=run.id, step=step.index,
                    hint="make the context a pydantic model or a dataclass of JSON fields, or "
                         "pass OpenAIAgentsAgent(..., context_factory=lambda recorded: ...) "
                         "that builds a fresh one (recorded is None for this context)")
            if _known_class(name, self.app_types) is None:
                raise AdapterError(
                    f"the run's context class {name} is not one this process has loaded",
                    run_id=run.id, step=step.index,
                    hint=("recorded from a script run as __main__: type the agents with it "
                          "(Agent[MyContext](...)), so it is found under its module's name, "
                          "or pass context_factory=lambda recorded: "
                          "MyContext.model_validate(recorded)") if name.startswith("__main__:")
                    else ("import the module that defines it, type the agents "
                          "(Agent[MyContext](...)), or pass context_factory=lambda recorded: "
                          "MyContext.model_validate(recorded)"))

    def at(self, run: car.Trajectory, k: int) -> Any:
        """A fresh context equal to the one step ``k`` was decided with (None: no context)."""
        rec = run.step(k).meta.get("run_context") if k < len(run.steps) else None
        # a copy: the record is shared by every branch, and the app may change its context
        value = copy.deepcopy(rec.get("value")) if rec is not None else None
        if self.factory is not None:
            return self.factory(value)
        if rec is None:
            return None
        cls = _known_class(str(rec["type"]), self.app_types)
        if cls is None:
            raise AdapterError(f"the run's context class {rec['type']} is not loaded",
                               run_id=run.id, step=k, hint="see OpenAIAgentsAgent's "
                               "context_factory")
        adapter = _adapter(cls)
        if adapter is None:  # recorded with a value, so pydantic could load it then
            raise AdapterError(f"pydantic can no longer load the context class {rec['type']}",
                               run_id=run.id, step=k, hint="see OpenAIAgentsAgent's "
                               "context_factory")
        return adapter.validate_python(value)


def _known(step: Any) -> Any:
    """A step's recorded context as JSON: ``{}`` for a run without one (nothing to write),
    None where the record does not have its value."""
    rec = step.meta.get("run_context")
    if rec is None:
        return {}
    return rec.get("value")


def writes(steps: Any) -> dict[tuple[str, str], Change]:
    """What each recorded tool call wrote to the run context, where the record shows it
    (``state_change.recorded_changes``: every tool and hook may write it, so a step's write is
    one call's only when the step made one call). A change of the whole value (a context that
    is not an object) is left out: a branch can only write the context in place."""
    found = recorded_changes(steps, _known, lambda name: True)
    return {key: change for key, change in found.items()
            if all(op["path"] for op in change)}


def replay(context: Any, change: Change) -> None:
    """Write a recorded change into the branch's context object, in place
    (``state_change.Conflict`` where it does not hold what the record held there)."""
    if not change:
        return
    adapter = _adapter(type(context))
    if adapter is None:
        raise AdapterError(f"pydantic cannot dump the context class {type_name(type(context))}",
                           hint="see OpenAIAgentsAgent's context_factory")
    rebuilt = adapter.validate_python(apply(adapter.dump_python(context, mode="json"), change))
    for key in dict.fromkeys(str(op["path"][0]) for op in change):
        if isinstance(context, dict):
            if key in rebuilt:
                context[key] = rebuilt[key]
            else:
                context.pop(key, None)
        else:
            setattr(context, key, getattr(rebuilt, key))


def replayable_writes(run: car.Trajectory, safety: ToolSafety) -> dict[tuple[str, str], Change]:
    """``writes(run.steps)``, for a branch to replay; refused, before any branch, where a
    side-effect tool with no simulator taking ``ctx`` has a recorded call that wrote the run
    context, or may have, and a branch could not make that write: the record cannot show what
    it wrote (its step made other calls, it was the last, the context has no recorded value),
    or its simulator does not take ``ctx``, so a simulated call would drop the write."""
    found = writes(run.steps)
    if all(step.meta.get("run_context") is None for step in run.steps):
        # a run without a run context: no tool had one to write, whatever the record cannot
        # show (a user trial's run that stopped after a refund was refused for a write it
        # could not have made)
        return {(name, args): [] for step in run.steps for _, name, args in calls_of(step.action)}
    for j, step in enumerate(run.steps):
        for _, name, args in calls_of(step.action):
            if not safety.guards(name) or safety.simulates_state(name):
                continue
            change = found.get((name, args), None)
            if change is not None and not (change and name in safety.simulators):
                continue
            why = ("its simulator does not take the run context (ctx), so a simulated call "
                   "would drop what the tool writes there" if change else
                   "what it wrote to the run context cannot be told from the record (other "
                   "calls ran in that step, it was the run's last step, or the context's "
                   "value was not recorded), so a branch that made the call again would "
                   "drop that write")
            raise AdapterError(
                f"side-effect tool {name!r} wrote, or may have written, the run context at "
                f"step {j}, and {why}", run_id=run.id, step=j,
                hint=f"pass simulators={{{name!r}: fn(arguments, ctx)}}: it is handed the "
                     "run context wrapper and writes ctx.context as the tool does (async def "
                     "is fine); or leave the tool out of side_effect_tools if it is safe to "
                     "run")
    return found
