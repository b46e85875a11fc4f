"""The objects a function names in its own code: what a tool or a guardrail reaches past CAR.

A branch guards the calls the agent's model makes; code that holds another tool object or a
whole agent and calls it itself goes around that. Such objects are found where a function names
them, read from the function without running it or needing its source: module globals its code
(inner functions and lambdas included) refers to, its closure, its defaults, the instance of a
bound method, and the same through the functions of its own module it calls. A module (or a
package's module) the code names counts for the attributes the code also names
(``audit.write_audit(...)``: a LlamaIndex trial's safe tool credited for real on every branch
through ``app.apply_credit``); the module itself is not walked. An object reached some other
way (built inside the call, or behind another module's function) is not seen; each adapter
keeps a net at run time for those.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from types import CodeType
from typing import Any

from car_core.errors import AdapterError

from .messages import ToolSafety


def named_objects(fn: Any, wanted: Callable[[Any], bool],
                  names: set[str] | None = None) -> list[Any]:
    """The objects ``fn`` names (module docstring) for which ``wanted`` holds, each once;
    ``names`` (when given) collects the global and attribute names of all the code read."""
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
        owner = getattr(f, "__self__", None)  # a bound method: what its instance holds, and
        if owner is not None and hasattr(owner, "__dict__"):  # the methods its code names
            values += vars(owner).values()
            code = getattr(getattr(f, "__func__", None), "__code__", None)
            if isinstance(code, CodeType):
                values += [v for n in sorted(code_names(code))
                           if (v := inspect.getattr_static(type(owner), n, None)) is not None]
        f = getattr(f, "__func__", f)
        if inspect.isfunction(f):
            scope = f.__globals__
            used = code_names(f.__code__)
            if names is not None:
                names |= used
            values += [scope[n] for n in used if n in scope]
            values += module_attributes([scope[n] for n in used if n in scope], used)
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


# the attributes a tool object holds its function under (LangChain's ``func`` / ``coroutine``
# and ``_run``, LlamaIndex's ``real_fn`` / ``_fn``, the SDK's ``__wrapped__``): calling one runs
# the tool's code past every guard, as a plain call of the function does
FUNCTION_PARTS = frozenset({"func", "coroutine", "_run", "_arun", "real_fn", "_fn", "async_fn",
                            "_async_fn", "__wrapped__"})


def refuse_side_effect_functions(functions: Mapping[str, Iterable[Any]], safety: ToolSafety,
                                 *, objects: Mapping[str, Any] | None = None,
                                 code: Mapping[str, Iterable[Any]] | None = None) -> None:
    """Refuse each tool a branch runs live (not a side effect), and each other piece of
    ``code`` branches run (a graph's nodes, by how a message names them), whose code calls
    the Python function behind a side-effect tool itself: a plain call of it (``functions``:
    tool name -> its functions, a sync and an async one where a tool has both; a bound
    method's ``self.refund(...)`` included), or a call through the tool object's function
    attribute (``objects``: tool name -> the tool; ``audit_log.func(...)``). No branch guard
    sees such a call, and the side effect would happen for real on every branch that runs
    that code (user trials: a safe lookup that audited, a node that called ``.func``)."""
    guarded = {id(_plain(f)): n for n, fs in functions.items() if safety.guards(n)
               for f in fs if callable(f)}
    held = {id(o): n for n, o in (objects or {}).items() if safety.guards(n)}
    if not guarded and not held:
        return
    live: list[tuple[str, str | None, list[Any]]] = [
        (f"tool {n!r}", n, list(fs)) for n, fs in functions.items() if not safety.guards(n)]
    live += [(label, None, list(fs)) for label, fs in (code or {}).items()]
    for label, own, fs in sorted(live, key=lambda x: x[0]):
        called: set[str] = set()
        for f in fs:
            if not callable(f):
                continue
            used: set[str] = set()
            found = named_objects(f, lambda v: id(_plain(v)) in guarded or id(v) in held, used)
            for v in found:
                if id(_plain(v)) in guarded:
                    called.add(guarded[id(_plain(v))])
                elif FUNCTION_PARTS & used:  # the tool object, and its function attribute
                    called.add(held[id(v)])
        called.discard(own or "")
        if called:
            raise AdapterError(
                f"{label} calls the function of side-effect tool(s) {sorted(called)} in its "
                "own code: branches run it live, and a plain function call is not a tool call "
                "a branch can answer, so the side effect would happen for real",
                hint=(f"classify {own!r} in side_effect_tools=[...] (branches then get the "
                      "answer the record got, and its code does not run), or call the tool "
                      "through the agent instead" if own else
                      "call the tool object (tool.invoke(...)), which a branch answers from "
                      "the record or a simulator, instead of its function"))


def module_attributes(values: Iterable[Any], names: set[str]) -> list[Any]:
    """What the modules among ``values``, and the modules they hold under ``names``, hold
    under ``names``: read from each module's namespace (no attribute hook runs)."""
    modules = [v for v in values if inspect.ismodule(v)]
    seen = {id(m) for m in modules}
    found: list[Any] = []
    while modules:
        space = vars(modules.pop())
        for name in sorted(names & space.keys()):
            value = space[name]
            if inspect.ismodule(value):
                if id(value) not in seen:
                    seen.add(id(value))
                    modules.append(value)
            else:
                found.append(value)
    return found


def _plain(f: Any) -> Any:
    """A bound method's function (each access makes a new method object), else ``f``."""
    return getattr(f, "__func__", f)


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


__all__ = ["FUNCTION_PARTS", "code_names", "module_attributes", "named_objects",
           "refuse_side_effect_functions"]
