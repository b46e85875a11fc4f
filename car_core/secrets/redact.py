"""One redaction rule for secrets, applied before anything is stored, rendered or printed.

By value first: what a secret *is*, not what keys usually look like. Replaced by ``MARK``:

- every secret registered here: the API keys, credential headers and URL userinfo given to a
  model policy or held by a model client (``register``, ``register_url``,
  ``register_headers``, ``register_from``), and the value of every environment variable whose
  name says it holds one (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD``); each in
  every form it can be written in (raw, percent-encoded, JSON-, repr- or HTML-escaped, base64,
  in any mix: ``car_core.secrets.forms``), and each run of 8+ plain characters between its
  delimiters too, so a quoted piece of a key or a key with a mangled non-ASCII character is
  caught;
- then, for secrets nobody registered: ``Bearer``/``Basic`` credentials, the value of
  ``Authorization``, ``api-key``/``x-api-key`` and ``api_key`` headers or fields, OpenAI-style
  ``sk-…`` keys and the password (or lone token) of a URL's userinfo.

Strings shorter than ``MIN_SECRET`` are placeholders ("test", "none"), never registered.

``redact(text)`` applies the rule to a string, ``redact_json(value)`` to every string in a
JSON value, ``scrub(value)`` the same to recorded content, every string on its own, the same
object back where nothing matched (``holds_secret`` first: the cheap test), ``redacted(exc)``
to an exception and its chained causes (a stand-in exception carrying the redacted text, safe
to chain with ``raise … from``), and ``LogFilter`` to log records, installed on every record
made once a secret is registered (``guard_records``). No redaction path takes a lock: a
garbage collection inside it may run a dropped client's ``__del__`` whose log record comes
straight back here. Registration
appends to a list (atomic), and the compiled rule is an immutable snapshot, rebuilt and
swapped in one assignment when what it was built from has changed. Imports nothing outside
the standard library.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from car_core.secrets.patterns import (
    _CHILD_ATTRS as _CHILD_ATTRS,
)
from car_core.secrets.patterns import (
    _HEADER_ATTRS as _HEADER_ATTRS,
)
from car_core.secrets.patterns import (
    _KEY_ATTRS as _KEY_ATTRS,
)
from car_core.secrets.patterns import (
    _LEAVES as _LEAVES,
)
from car_core.secrets.patterns import (
    _NOT_DONE as _NOT_DONE,
)
from car_core.secrets.patterns import (
    _PATTERNS as _PATTERNS,
)
from car_core.secrets.patterns import (
    _SECRET_ENV as _SECRET_ENV,
)
from car_core.secrets.patterns import (
    _SECRET_FIELD as _SECRET_FIELD,
)
from car_core.secrets.patterns import (
    _URL_ATTRS as _URL_ATTRS,
)
from car_core.secrets.patterns import (
    _URL_ENV as _URL_ENV,
)
from car_core.secrets.patterns import (
    _VALUE as _VALUE,
)
from car_core.secrets.patterns import (  # the façade keeps every name it had
    MARK as MARK,
)
from car_core.secrets.patterns import (
    MIN_SECRET as MIN_SECRET,
)
from car_core.secrets.patterns import PATTERN_ANCHORS
from car_core.secrets.patterns import (
    PUBLIC_HEADERS as PUBLIC_HEADERS,
)
from car_core.secrets.patterns import (
    _attr as _attr,
)
from car_core.secrets.patterns import (
    _compile as _compile,
)
from car_core.secrets.patterns import (
    _compiled as _compiled,
)
from car_core.secrets.patterns import (
    _entry as _entry,
)
from car_core.secrets.patterns import (
    _environment_secrets as _environment_secrets,
)
from car_core.secrets.patterns import (
    _header as _header,
)
from car_core.secrets.patterns import (
    _is_secret as _is_secret,
)
from car_core.secrets.patterns import (
    _Rule as _Rule,
)
from car_core.secrets.patterns import (
    _strings as _strings,
)
from car_core.secrets.patterns import (
    _unwrap as _unwrap,
)
from car_core.secrets.patterns import (
    userinfo_secrets as userinfo_secrets,
)

# append-only (list.append is atomic): registering never blocks a redaction in progress
_registered: list[str] = []




_rule: _Rule = _Rule((0, ()), (), (), ())  # swapped whole, never changed in place


def register(secret: str | None) -> None:
    """Remember ``secret`` (an API key given to a policy) so every later redaction hides it."""
    if _is_secret(secret) and secret not in _registered:
        assert isinstance(secret, str)
        _registered.append(secret)
        guard_records()  # from now on every log record could quote it


def register_credential(value: str | None) -> None:
    """A credential as a header carries it: the whole value, the part after a scheme
    (``Bearer X``), and the user name and password a ``Basic`` value encodes."""
    if not isinstance(value, str):
        return
    register(value)
    scheme, _, credential = value.strip().partition(" ")
    if not credential:
        return
    register(credential.strip())
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credential.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return
        register(decoded)
        register(decoded.partition(":")[2])




def register_url(url: object) -> None:
    """Remember the secrets of ``url``'s userinfo (``userinfo_secrets``)."""
    for secret in userinfo_secrets(url):
        register(secret)


def register_headers(headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> None:
    """Every header value given to a client, except the public ones (``PUBLIC_HEADERS``)."""
    if headers is None:
        return
    try:
        items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    except Exception:  # an exotic headers object: nothing we can read
        return
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            continue
        name, value = item
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if isinstance(name, str) and name.lower() not in PUBLIC_HEADERS:
            register_credential(_unwrap(value))








def register_from(obj: Any, _depth: int = 0, _seen: set[int] | None = None) -> None:
    """Every key, credential header and URL userinfo a model, client or agent object holds
    (an ``openai`` client, a LangChain or LlamaIndex model, an Agents SDK model or agent, an
    ``httpx`` client), found through the attributes those libraries keep them in, and through
    the clients, models and agents it holds in turn."""
    seen = set() if _seen is None else _seen
    if obj is None or isinstance(obj, _LEAVES) or id(obj) in seen or _depth > 5:
        return
    if _seen is None:
        guard_records()  # the client's own loggers write what it holds
    seen.add(id(obj))
    if isinstance(obj, Mapping | list | tuple | set | frozenset):
        for child in obj.values() if isinstance(obj, Mapping) else obj:
            register_from(child, _depth + 1, seen)
        return
    for name in _KEY_ATTRS:
        value = _unwrap(_attr(obj, name))
        if isinstance(value, str):
            register_credential(value)
    for name in _URL_ATTRS:
        value = _attr(obj, name)
        if value is not None and not callable(value):
            register_url(value)
    for name in _HEADER_ATTRS:
        value = _attr(obj, name)
        if isinstance(value, Mapping) or hasattr(value, "items"):
            register_headers(value)
    for name in _CHILD_ATTRS:
        register_from(_attr(obj, name), _depth + 1, seen)


def names_a_secret(name: str) -> bool:
    """Whether a field or key named ``name`` holds a secret by its name (``api_key``,
    ``github_token``, ``client_secret``, ``password``): such a value is never stored."""
    return bool(_SECRET_FIELD.search(name))


def register_fields(value: Any, _depth: int = 0) -> None:
    """Every string held, at any depth of a JSON value (an app's run context as dumped), under
    a field whose name says it is a secret (``api_key``, ``github_token``, ``client_secret``,
    ``password``), and the userinfo of every URL in it: application state that is stored with
    a run holds keys nobody gave CAR."""
    if _depth > 20:
        return
    if isinstance(value, Mapping):
        for name, child in value.items():
            if isinstance(name, str) and names_a_secret(name):
                for leaf in _strings(child):
                    register_credential(leaf)
            register_fields(child, _depth + 1)
    elif isinstance(value, list | tuple):
        for child in value:
            register_fields(child, _depth + 1)
    elif isinstance(value, str) and "@" in value:
        register_url(value)












def _current() -> _Rule:
    """The rule for what is registered now (rebuilt only when that changed)."""
    global _rule
    rule = _rule
    source = (len(_registered), _environment_secrets())
    if rule.source != source:
        rule = _compile(source, [*_registered[:source[0]], *source[1]])
        _rule = rule  # one assignment: readers see the old rule or the new
    return rule


def known_secrets() -> list[str]:
    """Every secret the rule hides by value (pieces included), longest first."""
    return list(_current().secrets)


def _by_value(rule: _Rule, text: str) -> str:
    if len(text) < rule.shortest:
        return text
    for anchor, regex in rule.entries:
        if anchor in text:
            text = regex.sub(MARK, text)
    for literal in rule.literals:
        if literal in text:
            text = text.replace(literal, MARK)
    return text


def _apply(rule: _Rule, text: str) -> str:
    text = _by_value(rule, text)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with every secret the rule knows (or only ``secrets`` and the patterns)
    replaced by ``MARK``."""
    if not isinstance(text, str) or not text:
        return text
    rule = _current() if secrets is None else _compile((-1, ()), secrets)
    return _apply(rule, text)


def _apply_json(rule: _Rule, value: Any) -> Any:
    if isinstance(value, str):
        return _apply(rule, value) if value else value
    if isinstance(value, dict):
        return {_apply(rule, k) if isinstance(k, str) else k: _apply_json(rule, v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_apply_json(rule, v) for v in value]
    return value


def redact_json(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of a JSON value with ``redact`` applied to every string (keys included)."""
    rule = _current() if secrets is None else _compile((-1, ()), secrets)
    return _apply_json(rule, value)


def scrub(value: Any, memo: dict[str, str] | None = None) -> Any:
    """``value`` (any JSON value) with every registered or environment secret removed, in any
    form, and what the patterns catch (an ``sk-…`` key a tool returned that nobody gave CAR),
    string by string. For recorded content (context, actions, observations, state), which
    must stay what the agent saw unless it holds a secret: the same object comes back when
    nothing matched. ``memo`` (shared across the calls for one run) remembers strings already
    looked at: a run's states repeat the same messages step after step. The patterns were
    once left to output alone, and a trial's tool result put an unregistered key in the
    store 618 times."""
    if isinstance(value, bool | int | float | type(None)):
        return value
    rule = _current()
    if not isinstance(value, str):
        try:  # one pass over the value's JSON text in C, instead of a walk in Python
            if not _holds(rule, json.dumps(value, ensure_ascii=False)):
                return value
        except (TypeError, ValueError):  # not JSON: walk it
            pass
    return _scrub(rule, value, {} if memo is None else memo)


def holds_secret(text: str) -> bool:
    """Whether ``text`` (a JSON encoding, say) holds any form of a registered or environment
    secret, or something a pattern catches: the cheap test before ``scrub``."""
    return _holds(_current(), text)


def _holds(rule: _Rule, text: str) -> bool:
    if bool(rule.secrets) and _found(rule, text):
        return True
    low = text.lower()  # a pattern is searched only where what it needs is there
    return any(any(a in low for a in anchors) and pattern.search(text)
               for (pattern, _), anchors in zip(_PATTERNS, PATTERN_ANCHORS, strict=True))


def _found(rule: _Rule, text: str) -> bool:
    """Whether ``text`` holds any form of any secret (JSON escapes included)."""
    if len(text) < rule.shortest:
        return False
    return (any(anchor in text and regex.search(text) for anchor, regex in rule.entries)
            or any(literal in text for literal in rule.literals))


def _scrub(rule: _Rule, value: Any, memo: dict[str, str]) -> Any:
    if isinstance(value, str):
        done = memo.get(value)
        if done is None:
            done = memo[value] = _apply(rule, value)
        return value if done == value else done  # the same object when nothing matched
    if isinstance(value, dict):
        out = {_scrub(rule, k, memo): _scrub(rule, v, memo) for k, v in value.items()}
        same = all(a is b and ka is kb for (ka, a), (kb, b) in zip(out.items(), value.items(),
                                                                    strict=True))
        return value if same else out
    if isinstance(value, list | tuple):
        items = [_scrub(rule, v, memo) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


class RedactedError(Exception):
    """Stands in for an exception whose text may hold a secret: its type name and redacted
    message, chained to the redacted stand-in of its own cause."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, redacted (for messages built from a caught exception).
    An exception group (anyio's task groups raise one: an MCP server that would not start)
    says the errors inside it, not only "unhandled errors in a TaskGroup (1 sub-exception)"."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = _leaves(exc)
        inner = "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3])
        more = f"; and {len(leaves) - 3} more" if len(leaves) > 3 else ""
        return redact(f"{type(exc).__name__}: {exc} ({inner}{more})")
    text = str(exc)  # anyio's closed-stream errors say nothing: "X: " read as cut off
    return redact(f"{type(exc).__name__}: {text}" if text else
                  f"{type(exc).__name__} (no message)")


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def redacted(exc: BaseException | None, _depth: int = 0) -> RedactedError | None:
    """A stand-in for ``exc`` and its chained causes with every secret removed from their text;
    pass it to ``raise … from`` instead of the original, whose attributes (request headers,
    response bodies) may carry a key."""
    if exc is None or _depth > 16:
        return None
    if isinstance(exc, RedactedError):
        return exc
    # the frames stay (where the user's code raised), the text and attributes go
    out = RedactedError(type(exc).__name__, redact(str(exc))).with_traceback(exc.__traceback__)
    inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    out.__cause__ = redacted(inner, _depth + 1)
    out.__suppress_context__ = True
    return out


class LogFilter(logging.Filter):
    """Redacts a record's message (arguments merged), its traceback and its stack before any
    handler sees it. The exception becomes its redacted stand-in (a handler that reads
    ``exc_info`` itself finds no client attributes holding the request), keeping the frames;
    the formatted traceback is the original's, redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own error path
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            kind, exc, tb = record.exc_info
            try:
                text = "".join(traceback.format_exception(kind, exc, tb)).rstrip("\n")
            except Exception:  # an exception whose text cannot be made: its stand-in only
                text = ""
            stand_in = redacted(exc)
            record.exc_text = redact(text) or None
            record.exc_info = (RedactedError, stand_in, tb) if stand_in else None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = LogFilter()


def guard_records() -> None:
    """Redact every log record made in this process from now on, whatever its logger: a
    filter acts only on its own logger's records, and HTTP clients create their loggers
    (``httpcore.http11``, ``httpx2``…) lazily, under names no list foresees. Installed as
    the record factory, around the one in place (once); a record is made only when its
    level is enabled, so quiet logging costs nothing."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "car_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _FILTER.filter(record)
        return record

    factory.car_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def guard_loggers(*prefixes: str) -> None:
    """Put the filter on every logger created so far under ``prefixes`` (an HTTP client's
    loggers, which log request URLs and errors), and redact every record made from now on
    (``guard_records``), so a logger created later, or a record factory replaced by the
    application, still leaves one guard in place."""
    names = [n for n in list(logging.root.manager.loggerDict)
             if any(n == p or n.startswith(p + ".") for p in prefixes)]
    for name in {*prefixes, *names}:
        logger(name)
    guard_records()


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the redaction filter on it (added once)."""
    log = logging.getLogger(name)
    if not any(isinstance(f, LogFilter) for f in log.filters):
        log.addFilter(LogFilter())
    return log


__all__ = ["MARK", "PUBLIC_HEADERS", "LogFilter", "RedactedError", "describe", "guard_loggers",
           "guard_records",
           "known_secrets", "logger", "redact", "redact_json", "redacted", "register",
           "register_credential", "register_from", "register_headers", "register_url",
           "holds_secret", "scrub", "userinfo_secrets"]
