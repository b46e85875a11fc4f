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

from .errors import InvalidJSONValue

JSON = Any  # a JSON value; Python's type system cannot say it precisely


def check_json(value: Any, what: str, *, path: str = "$") -> None:
    """Raise InvalidJSONValue when ``value`` is not a JSON value, naming the offending path."""
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
            check_json(item, what, path=f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidJSONValue(f"{what} has a non-string key {key!r} at {path}",
                                       hint="JSON objects only have string keys")
            _check_text(key, what, path)
            check_json(item, what, path=f"{path}.{key}")
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


def canonical(value: JSON) -> str:
    """The one encoding digests are taken over: sorted keys, no whitespace, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


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
