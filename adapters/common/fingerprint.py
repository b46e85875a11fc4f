"""Fingerprints of framework apps: what makes an app this app, as plain JSON.

An adapter's ``fingerprint()`` and its recorder both build the value from the app object, so a
run recorded through the framework's own hooks carries the digest ``car.record`` would give it
(``car_core.contract.fingerprint_digest``). The value must be the same in every process that
builds the same app and change when its graph, tools or prompts change; so it holds names,
tool descriptions and argument schemas, and for the code a node runs, its bytecode, the string
constants it uses (a prompt written in it, passed to its builder, or kept in a module
constant) and never an address, an id or a model object (a test swaps the model for a fake;
an app is the same app with another model behind it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import types
from typing import Any

_DEPTH = 3  # closures of closures: deep enough for builders, bounded against cycles


def jsonable(value: Any) -> Any:
    """``value`` as JSON, unknown objects by their type name (never their repr: it may hold
    an address)."""
    def fallback(obj: Any) -> Any:
        dump = getattr(obj, "model_dump", None)
        if callable(dump):
            try:
                return dump(mode="json")
            except Exception:  # noqa: BLE001 - a schema that cannot dump is named by type
                pass
        return type(obj).__qualname__
    return json.loads(json.dumps(value, default=fallback, sort_keys=True))


def _const(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, types.CodeType):
        return code_print(value)
    if isinstance(value, tuple):
        return [_const(v) for v in value]
    if isinstance(value, frozenset):  # set order follows string hashing: sort it
        return sorted(json.dumps(_const(v), sort_keys=True) for v in value)
    return type(value).__qualname__


def code_print(code: types.CodeType) -> dict[str, Any]:
    """A code object by its bytecode, constants and the names it uses (no line numbers, no
    file path: moving the file keeps the app)."""
    return {"ops": hashlib.sha256(code.co_code).hexdigest()[:16],
            "consts": [_const(c) for c in code.co_consts], "names": list(code.co_names)}


def _names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _captured(value: Any, depth: int) -> Any:
    """What a closure cell contributes: text and numbers, message text, nested functions;
    any other object (a model, a client, a tool list) only as being there."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return _const(value)
    content = getattr(value, "content", None)
    if isinstance(content, str):  # a prompt message built once and captured
        return {"message": content}
    if isinstance(value, (types.FunctionType, functools.partial)):
        return callable_print(value, depth - 1)
    return "object"  # not even its type: a counting or fake model is the same app


def callable_print(fn: Any, depth: int = _DEPTH) -> Any:
    """A callable by its code, closure strings and referenced module-level strings."""
    if depth <= 0:
        return "…"
    if isinstance(fn, functools.partial):
        return {"partial": callable_print(fn.func, depth - 1),
                "args": [_captured(a, depth) for a in fn.args],
                "kwargs": {k: _captured(v, depth) for k, v in sorted(fn.keywords.items())}}
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        call = type(fn).__dict__.get("__call__")  # a callable object: its class's method
        inner = getattr(call, "__code__", None)
        return {"object": type(fn).__qualname__,
                **({"call": code_print(inner)} if isinstance(inner, types.CodeType) else {})}
    cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
    scope = getattr(fn, "__globals__", {})
    strings = {n: scope[n] for n in sorted(_names(code))
               if isinstance(scope.get(n), str)}
    return {"name": fn.__qualname__, "code": code_print(code),
            "closure": [_captured(v, depth) for v in cells], "globals": strings}


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def tool_print(name: Any, description: Any, schema: Any) -> dict[str, Any]:
    """A tool as the model sees it: name, description, argument schema."""
    return {"name": str(name), "description": str(description or ""),
            "schema": jsonable(schema)}
