"""Frozen dataclasses to JSON objects and back, field by field.

A class names only its fields that are not plain JSON in a small table of ``Codec``s; every
other field is written as it is and read back by its declared type: ``int``, ``float``,
``str`` and ``bool`` are coerced, tuples are written as lists, and a key that a row stored by
an earlier version lacks reads as the field's default (a field without one is required: its
absence is a ``KeyError``, which the caller reports as a malformed row).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import Any, NamedTuple

Row = Mapping[str, Any]
Dump = Callable[[Any, str], dict[str, Any]]  # (the object, the field's name) -> its keys
Load = Callable[[Row, str, Any], Any]  # (the row, the field's name, context) -> the value


class Codec(NamedTuple):
    """How one field is written (as one or more keys) and read back from the row; ``context``
    is what the enclosing object hands down (a result's level, for its intervals)."""

    dump: Dump
    load: Load


_NOT_GIVEN: Any = object()
_SCALARS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "str": str,
                                             "bool": bool}


def _read(row: Row, name: str, missing: Any) -> Any:
    if name in row or missing is _NOT_GIVEN:
        return row[name]
    return missing


def value(to_json: Callable[[Any], Any] = lambda v: v,
          from_json: Callable[[Any], Any] = lambda v: v, *, missing: Any = _NOT_GIVEN) -> Codec:
    """A field written under its own name as ``to_json(value)`` and read as
    ``from_json(stored)``; ``missing`` is what a row without the key reads as (none: the
    key is required)."""
    return Codec(lambda obj, name: {name: to_json(getattr(obj, name))},
                 lambda row, name, _: from_json(_read(row, name, missing)))


def nested(load: Callable[[Row, Any], Any], *, many: bool = False,
           missing: Any = _NOT_GIVEN) -> Codec:
    """A field holding one object with ``to_dict`` (or, ``many``, a tuple of them), read back
    with ``load(row, context)``: the enclosing object's context is handed down."""
    def dump(obj: Any, name: str) -> dict[str, Any]:
        v = getattr(obj, name)
        return {name: [x.to_dict() for x in v] if many else v.to_dict()}

    def read(row: Row, name: str, context: Any) -> Any:
        stored = _read(row, name, missing)
        return (tuple(load(x, context) for x in stored) if many else load(stored, context))
    return Codec(dump, read)


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return _NOT_GIVEN


@cache
def _by_type(f: Field[Any]) -> Codec:
    """The codec a field gets from its declared type (annotations are strings here)."""
    kind = str(f.type)
    default = _default(f)
    if kind.endswith("| None"):  # stored as it is; an older row without it reads as None
        return value(missing=None if default is _NOT_GIVEN else default)
    if kind in _SCALARS:
        return value(from_json=_SCALARS[kind], missing=default)
    if kind.startswith("tuple["):
        return value(list, lambda v: tuple(v or ()), missing=default)
    if kind.startswith("dict["):
        return value(dict, lambda v: dict(v or {}), missing=default)
    return value(missing=default)


def dump_fields(obj: Any, codecs: Mapping[str, Codec], order: Iterable[str] = (),
                **extra: Any) -> dict[str, Any]:
    """``obj``'s fields as a JSON object, with the ``extra`` keys (those no field holds); the
    keys in ``order`` come first (those written), then any others in field order."""
    out: dict[str, Any] = dict(extra)
    for f in fields(obj):
        out.update((codecs.get(f.name) or _by_type(f)).dump(obj, f.name))
    first = {k: out.pop(k) for k in order if k in out}
    return {**first, **out}


def load_fields(cls: Any, row: Row, codecs: Mapping[str, Codec], context: Any = None) -> Any:
    """An instance of the dataclass ``cls`` read back from what ``dump_fields`` wrote."""
    return cls(**{f.name: (codecs.get(f.name) or _by_type(f)).load(row, f.name, context)
                  for f in fields(cls) if f.init})
