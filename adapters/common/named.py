"""The objects a function names in its own code: what a tool or a guardrail reaches past CAR.

A branch guards the calls the agent's model makes; code that holds another tool object or a
whole agent and calls it itself goes around that. Such objects are found where a function names
them, read from the function without running it or needing its source: module globals its code
(inner functions and lambdas included) refers to, its closure, its defaults, the instance of a
bound method, and the same through the functions of its own module it calls. An object reached
some other way (built inside the call, or behind another module's function) is not seen; each
adapter keeps a net at run time for those.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from types import CodeType
from typing import Any

from car_core.errors import AdapterError

from .messages import ToolSafety


def named_objects(fn: Any, wanted: Callable[[Any], bool]) -> list[Any]:
    """The objects ``fn`` names (module docstring) for which ``wanted`` holds, each once."""
    found: dict[int, Any] = {}
    seen: set[int] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        if not callable(f) or id(f) in seen:
            continue
        seen.add(id(f))
        f = inspect.unwrap(f)
        values: list[Any] = []
        owner = getattr(f, "__self__", None)  # a bound method: what its instance holds
        if owner is not None and hasattr(owner, "__dict__"):
            values += vars(owner).values()
        f = getattr(f, "__func__", f)
        if inspect.isfunction(f):
            scope = f.__globals__
            values += [scope[n] for n in code_names(f.__code__) if n in scope]
            values += [c.cell_contents for c in f.__closure__ or () if _filled(c)]
            values += [*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()]
        elif hasattr(f, "__dict__"):  # a callable object: its attributes and its __call__
            values += vars(f).values()
            todo.append(type(f).__dict__.get("__call__"))
        for v in values:
            if wanted(v):
                found[id(v)] = v
            elif inspect.isfunction(v) and v.__globals__ is getattr(f, "__globals__", None):
                todo.append(v)
    return list(found.values())


def refuse_side_effect_functions(functions: Mapping[str, Iterable[Any]],
                                 safety: ToolSafety) -> None:
    """Refuse each tool a branch runs live (not a side effect) whose code calls the Python
    function behind a side-effect tool itself (``functions``: tool name -> its functions, a
    sync and an async one where a tool has both). A plain function call is no tool call, so no
    branch guard can answer it, and the side effect would happen for real on every branch
    that runs the outer tool (a user trial's safe lookup wrote an audit line on each)."""
    fns = {name: [f for f in fs if callable(f)] for name, fs in functions.items()}
    guarded = {id(f): n for n, fs in fns.items() if safety.guards(n) for f in fs}
    if not guarded:
        return
    for name, fs in sorted(fns.items()):
        if safety.guards(name):
            continue
        found = [v for f in fs for v in named_objects(f, lambda v: id(v) in guarded)]
        called = sorted({guarded[id(v)] for v in found} - {name})
        if called:
            raise AdapterError(
                f"tool {name!r} calls the function of side-effect tool(s) {called} in its own "
                "code: a branch runs it live, and a plain function call is not a tool call a "
                "branch can answer, so the side effect would happen for real",
                hint=f"classify {name!r} in side_effect_tools=[...] (branches then get the "
                     "answer the record got, and its code does not run), or call the tool "
                     "through the agent instead")


def code_names(code: CodeType) -> set[str]:
    """The global and attribute names a code object and the code nested in it (functions,
    lambdas, comprehensions) use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= code_names(const)
    return names


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _EMPTY
    except ValueError:  # a closure variable not yet assigned
        return False


_EMPTY = object()


__all__ = ["code_names", "named_objects", "refuse_side_effect_functions"]
