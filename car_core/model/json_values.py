"""JSON values: validation, canonical encoding and content digests.

Actions, observations and contexts are stored exactly as the agent returned them, so they must
be JSON values (None, bool, int, finite float, str, list, dict with str keys). Tuples and other
containers are refused rather than silently converted: a converted value would not compare equal
to what the agent produced, and faithfulness checks would lie.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from car_core.errors import InvalidJSONValue

JSON = Any  # a JSON value; Python's type system cannot say it precisely


def check_json(value: Any, what: str, *, path: str = "$",
               checked: set[int] | None = None) -> None:
    """Raise InvalidJSONValue when ``value`` is not a JSON value, naming the offending path.

    ``checked`` (ids of lists and dicts already found valid, shared across the calls that check
    one record while its values are alive and unchanged) lets a value that appears many times
    be walked once: a run's states repeat the same message objects step after step. The walk
    names no paths; only a value it refuses is walked again to say where."""
    if not _valid(value, set() if checked is None else checked):
        _explain(value, what, path)


def _valid(value: Any, checked: set[int]) -> bool:
    """Whether ``value`` is a JSON value; exact types first (the common case), subclasses
    through ``_explain``. A container joins ``checked`` only once its content has passed, so a
    cycle still fails as it would without it."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _utf8(value)
    if kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list or kind is dict:
        if id(value) in checked:
            return True
        if kind is list:
            items = value
        else:
            for key in value:
                if type(key) is not str or not (key.isascii() or _utf8(key)):
                    return False
            items = value.values()
        for item in items:
            kind = type(item)
            if kind is str:
                if not (item.isascii() or _utf8(item)):
                    return False
            elif kind is float:
                if not math.isfinite(item):
                    return False
            elif not (kind is int or kind is bool or item is None) and not _valid(item, checked):
                return False
        checked.add(id(value))
        return True
    try:  # a subclass of a JSON type (a StrEnum, say), or not JSON at all
        _explain(value, "", "$")
    except InvalidJSONValue:
        return False
    return True


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _explain(value: Any, what: str, path: str) -> None:
    """The walk that names the path of the first value that is not JSON."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        _check_text(value, what, path)
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidJSONValue(f"{what} contains a non-finite float at {path}",
                                   hint="use None or a string for NaN/inf")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _explain(item, what, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidJSONValue(f"{what} has a non-string key {key!r} at {path}",
                                       hint="JSON objects only have string keys")
            _check_text(key, what, path)
            _explain(item, what, f"{path}.{key}")
        return
    raise InvalidJSONValue(
        f"{what} is not a JSON value: {type(value).__name__} at {path}",
        hint="return None, bool, int, float, str, list or dict (a tuple must become a list)")


def _check_text(text: str, what: str, path: str) -> None:
    """Refuse lone surrogates: UTF-8 (digests, SQLite) cannot encode them."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJSONValue(f"{what} has a string that is not valid Unicode at {path}",
                                   hint="remove lone surrogate characters (e.g. decode bytes "
                                        "with errors='replace')") from exc


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode  # made once: json.dumps builds one a call


def canonical(value: JSON) -> str:
    """The one encoding digests are taken over: sorted keys, no whitespace, no NaN."""
    return _CANONICAL(value)


def digest(value: JSON) -> str:
    """A short content address (sha256 over the canonical encoding, 32 hex digits)."""
    return digest_of(canonical(value))


def digest_of(text: str) -> str:
    """``digest`` of a value whose canonical encoding is ``text``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def dumps(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def loads(text: str) -> JSON:
    return json.loads(text)
