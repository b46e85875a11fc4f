"""What a graph node can call: the tools, chat models and ``create_agent`` middleware reachable
from the code a node runs.

A node function reaches its tools and models through its closure, the globals its code names,
a bound method's object, ``functools.partial`` arguments and the runnables it wraps
(``RunnableBinding.bound``, a sequence's steps). ``LangGraphAgent`` uses this to check every tool
name the user gives against the tools the graph really has (a ``ToolNode``'s and those a node
calls itself), to tell a node that calls a model from one that only writes messages, and to
find the chat models that would run on a branch without CAR deciding them. It also finds what
``create_agent(response_format=...)`` gave its model node: the tools of its structured output
(a schema offered to the model as a tool, whose call the node parses, never runs) and whether
the node parses a text answer into the structured response (a provider's, or a raw schema's
that may pick the provider). The walk is bounded (depth and object count) and only reads
attributes: it calls no node, tool or model.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.structured_output import AutoStrategy, OutputToolBinding, ProviderStrategy
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from ..common.named import code_names, module_attributes
from .middleware import CarMiddleware
from .model import CarChatModel

_DEPTH = 8
_LIMIT = 4000
_RUNNABLE_PARTS = ("func", "afunc", "bound", "first", "middle", "last", "steps", "steps__",
                   "runnable", "default", "branches", "mapper")


@dataclass
class Reach:
    """What one node can call."""

    tools: dict[str, BaseTool] = field(default_factory=dict)
    models: list[BaseChatModel] = field(default_factory=list)  # chat models CAR does not wrap
    wrapped: bool = False  # a CarChatModel or a CarMiddleware decides a model here
    middleware: list[Any] = field(default_factory=list)
    structured: set[str] = field(default_factory=set)  # create_agent's structured-output tools
    answers_in_text: bool = False  # a text answer may be parsed into the structured response

    @property
    def calls_a_model(self) -> bool:
        return self.wrapped or bool(self.models)


def _children(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        yield from obj.values()
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
        return
    if isinstance(obj, types.MethodType):
        yield obj.__self__
        yield obj.__func__
        return
    if isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
        return
    if isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                continue
        yield from obj.__defaults__ or ()
        wrapped = getattr(obj, "__wrapped__", None)
        if wrapped is not None:
            yield wrapped
        names = code_names(obj.__code__)
        used = [obj.__globals__[n] for n in sorted(names) if n in obj.__globals__]
        yield from (v for v in used if not isinstance(v, (types.ModuleType, type)))
        # ``tools.lookup(...)``, ``app.tools.lookup(...)``: a tool or model a module the code
        # names holds under a name the code also uses (the modules themselves are not walked)
        yield from (v for v in module_attributes(used, names)
                    if isinstance(v, (BaseTool, BaseChatModel)))
        return
    if hasattr(obj, "get_subgraphs") or isinstance(obj, (types.ModuleType, type)):
        return  # a compiled graph (its nodes are walked on their own) or a module or class
    for part in _RUNNABLE_PARTS:
        value = getattr(type(obj), part, None)
        if isinstance(value, property):
            continue
        value = getattr(obj, "__dict__", {}).get(part)
        if value is not None:
            yield value
    if not type(obj).__module__.startswith(("langchain_core.", "langgraph.", "pydantic")):
        yield from (getattr(obj, "__dict__", None) or {}).values()  # a user's or a middleware's


def reach(root: Any) -> Reach:
    """The tools, models and middleware reachable from ``root`` (a node's runnable)."""
    found = Reach()
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack and len(seen) < _LIMIT:
        obj, depth = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, BaseTool):
            found.tools.setdefault(obj.name, obj)
            continue
        if isinstance(obj, OutputToolBinding):  # a schema create_agent offers as a tool
            found.structured.add(obj.tool.name)
            found.tools.setdefault(obj.tool.name, obj.tool)
            continue
        if isinstance(obj, (ProviderStrategy, AutoStrategy)):
            found.answers_in_text = True
            continue
        if isinstance(obj, CarChatModel):
            found.wrapped = True
            continue
        if isinstance(obj, BaseChatModel):
            found.models.append(obj)
            continue
        if isinstance(obj, CarMiddleware):
            found.wrapped = True
            continue
        if type(obj).__name__ != "CarMiddleware" and _is_middleware(obj):
            found.middleware.append(obj)
        if depth < _DEPTH:
            try:
                children = list(_children(obj))
            except Exception:  # an object whose attribute lookup raises: not walked further
                children = []
            stack.extend((child, depth + 1) for child in children)
    return found


def _is_middleware(obj: Any) -> bool:
    return isinstance(obj, AgentMiddleware)


def model_name(model: Any) -> str:
    """A chat model as an error message names it."""
    name = getattr(model, "model_name", None) or getattr(model, "model", None)
    return f"{type(model).__name__}({name!r})" if name else type(model).__name__
