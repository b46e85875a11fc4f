"""One redaction rule for secrets, applied before anything is stored, rendered or printed.

What is replaced by ``MARK``:

- every secret registered with ``register`` (the API keys given to model policies) and the value
  of every environment variable whose name says it holds one (``*_API_KEY``, ``*_TOKEN``,
  ``*_SECRET``, ``*PASSWORD``), including each ASCII run of 8+ characters inside such a value, so
  a key with a stray non-ASCII character is caught however it was escaped;
- ``Bearer``/``Basic`` credentials, the value of ``Authorization``, ``api-key``/``x-api-key``
  and ``api_key`` headers or fields, and OpenAI-style ``sk-…`` keys;
- the password (or the whole userinfo) of a URL: ``http://user:KEY@host`` becomes
  ``http://user:[REDACTED]@host``.

``redact(text)`` applies it to a string, ``redact_json(value)`` to every string in a JSON value,
``redacted(exc)`` to an exception and its chained causes (a stand-in exception carrying the
redacted text, safe to chain with ``raise … from``), and ``LogFilter`` to log records. Imports
nothing outside the standard library.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

MARK = "[REDACTED]"
MIN_SECRET = 8  # shorter strings ("test", "none") are placeholders, not keys
_SECRET_ENV = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)
_ASCII_RUN = re.compile(r"[\x21-\x7e]{8,}")  # MIN_SECRET printable ASCII characters

_NOT_DONE = r"(?!\[REDACTED\])"
_VALUE = r"""[^\s"',;}\]]+"""


def _header(m: re.Match[str]) -> str:
    scheme = f"{m.group(3)} " if m.group(3) else ""
    return f"{m.group(1)}{m.group(2)}{scheme}{MARK}"


_PATTERNS: tuple[tuple[re.Pattern[str], Any], ...] = (
    # the value of an Authorization / api-key header or field, with or without its scheme
    (re.compile(r"(?i)((?:proxy-)?authorization|x-api-key|api[-_]?key|access[-_]?token)"
                r"""(["']?\s*[:=]\s*["']?)(?:(bearer|basic|token)\s+)?""" + _NOT_DONE
                + r"(?!(?i:bearer|basic|token)\s)" + _VALUE),
     _header),
    (re.compile(r"(?i)\b(bearer|basic)\s+" + _NOT_DONE + r"""[^\s"',;}\]]{8,}"""),
     r"\1 " + MARK),  # 8+: a credential, not "Bearer of bad news"
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}"), MARK),
    # URL userinfo: keep the user name, drop the password (or a lone token)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/\s:@\"']+):" + _NOT_DONE
                + r"([^/\s@\"']+)@"), r"\1\2:" + MARK + "@"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)" + _NOT_DONE
                + r"([^/\s:@\"']{8,})@"), r"\1" + MARK + "@"),
)

_lock = threading.Lock()
_registered: set[str] = set()


def register(secret: str | None) -> None:
    """Remember ``secret`` (an API key given to a policy) so every later redaction hides it."""
    if isinstance(secret, str) and len(secret) >= MIN_SECRET:
        with _lock:
            _registered.add(secret)


def _variants(secret: str) -> set[str]:
    out = {secret}
    if not secret.isascii():
        out |= {run for run in _ASCII_RUN.findall(secret)}
    return out


def known_secrets() -> list[str]:
    """Every secret the rule hides literally, longest first."""
    found: set[str] = set()
    with _lock:
        for s in _registered:
            found |= _variants(s)
    for name, value in os.environ.items():
        if len(value) >= MIN_SECRET and _SECRET_ENV.search(name):
            found |= _variants(value)
    return sorted((s for s in found if len(s) >= MIN_SECRET), key=len, reverse=True)


def redact(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with every secret the rule knows (or ``secrets``, from ``known_secrets()``)
    replaced by ``MARK``."""
    if not isinstance(text, str) or not text:
        return text
    for secret in known_secrets() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, MARK)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact_json(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of a JSON value with ``redact`` applied to every string (keys included)."""
    secrets = known_secrets() if secrets is None else secrets
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact(k, secrets) if isinstance(k, str) else k: redact_json(v, secrets)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(v, secrets) for v in value]
    return value


class RedactedError(Exception):
    """Stands in for an exception whose text may hold a secret: its type name and redacted
    message, chained to the redacted stand-in of its own cause."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, redacted (for messages built from a caught exception)."""
    return redact(f"{type(exc).__name__}: {exc}")


def redacted(exc: BaseException | None, _depth: int = 0) -> RedactedError | None:
    """A stand-in for ``exc`` and its chained causes with every secret removed from their text;
    pass it to ``raise … from`` instead of the original, whose attributes (request headers,
    response bodies) may carry a key."""
    if exc is None or _depth > 16:
        return None
    if isinstance(exc, RedactedError):
        return exc
    out = RedactedError(type(exc).__name__, redact(str(exc)))
    inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    out.__cause__ = redacted(inner, _depth + 1)
    out.__suppress_context__ = True
    return out


class LogFilter(logging.Filter):
    """Redacts a record's message (arguments merged) before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own error path
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            stand_in = redacted(record.exc_info[1])
            record.exc_text = None
            record.exc_info = (RedactedError, stand_in, None) if stand_in else None
        return True


def guard_loggers(*prefixes: str) -> None:
    """Put the filter on every logger created so far under ``prefixes`` (an HTTP client's
    loggers, which log request URLs and errors): a filter acts only on its own logger's
    records, so each one needs it."""
    names = [n for n in list(logging.root.manager.loggerDict)
             if any(n == p or n.startswith(p + ".") for p in prefixes)]
    for name in {*prefixes, *names}:
        logger(name)


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the redaction filter on it (added once)."""
    log = logging.getLogger(name)
    if not any(isinstance(f, LogFilter) for f in log.filters):
        log.addFilter(LogFilter())
    return log


__all__ = ["MARK", "LogFilter", "RedactedError", "describe", "guard_loggers", "known_secrets",
           "logger",
           "redact", "redact_json", "redacted", "register"]
