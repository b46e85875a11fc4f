"""The forms a secret takes and where objects keep them: the patterns the redaction rule
matches, the compiled by-value rule, and the walk over a client's attributes. Pure: the
registry and the rule in force live in ``redact``."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from car_core.secrets import forms

MARK = "[REDACTED]"

MIN_SECRET = 8  # shorter strings ("test", "none") are placeholders, not keys

_SECRET_ENV = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)

# a field of an application's own state (a run context) whose name says it holds a secret
_SECRET_FIELD = re.compile(r"(API[-_]?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$",
                           re.IGNORECASE)

_URL_ENV = re.compile(r"(URL|URI|HOST|BASE|ENDPOINT|PROXY)$", re.IGNORECASE)

# headers a client sends that carry no credential; every other header given is a secret
PUBLIC_HEADERS = frozenset({
    "accept", "accept-encoding", "accept-language", "connection", "content-length",
    "content-type", "host", "user-agent", "openai-organization", "openai-project",
    "openai-beta", "openai-version", "x-stainless-arch", "x-stainless-async",
    "x-stainless-lang", "x-stainless-os", "x-stainless-package-version",
    "x-stainless-retry-count", "x-stainless-runtime", "x-stainless-runtime-version",
    "x-stainless-read-timeout", "x-stainless-timeout"})

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

# what each of ``_PATTERNS`` cannot match without, lower-cased and in its order: the cheap test
# run on the lower-cased text before a pattern is searched (recorded content is tested step by
# step, and a long conversation made every sealed branch search megabytes with all five)
PATTERN_ANCHORS: tuple[tuple[str, ...], ...] = (
    ("authorization", "api-key", "api_key", "apikey", "access-token", "access_token",
     "accesstoken"), ("bearer", "basic"), ("sk-",), ("://",), ("://",))
assert len(PATTERN_ANCHORS) == len(_PATTERNS)


@dataclass(frozen=True)
class _Rule:
    """The by-value rule compiled for one state of the registry and the environment."""

    source: tuple[int, tuple[str, ...]]  # (secrets registered, secret environment values)
    secrets: tuple[str, ...]  # every value hidden, pieces included, longest first
    entries: tuple[tuple[str, re.Pattern[str]], ...]  # (anchor, any form of one secret)
    literals: tuple[str, ...]  # their base64 forms, longest first
    shortest: int = 0  # text shorter than this holds no form of any secret

_compiled: dict[str, tuple[str, re.Pattern[str]]] = {}  # per secret; inserts are atomic


def userinfo_secrets(url: object) -> list[str]:
    """The secrets in the userinfo of ``url`` (``scheme://user:password@host``), as written
    and decoded: the password, or a lone token, and the pair when the password is short."""
    if url is None:
        return []
    text = str(url)
    if "://" not in text:
        text = "//" + text  # a host given without a scheme ("user:pw@host:11434")
    after = text.split("//", 1)[1]
    found = {after.rpartition("@")[0] if "@" in after else ""}
    try:
        netloc = urlsplit(text).netloc
        found.add(netloc.rpartition("@")[0] if "@" in netloc else "")
    except ValueError:  # not a URL urllib can split; the rpartition above still applies
        pass
    out = []
    for userinfo in filter(None, found):
        for form in (userinfo, unquote(userinfo)):
            user, colon, password = form.partition(":")
            out.append(password if colon else user)
            if colon and not _is_secret(password):
                out.append(form)  # a short password: the pair is what is recognisable
    return [s for s in out if _is_secret(s)]

_KEY_ATTRS = ("api_key", "_api_key", "openai_api_key", "_stored_api_key", "azure_ad_token",
              "token", "_token", "password", "_password", "_auth_header")

_URL_ATTRS = ("base_url", "_base_url", "api_base", "openai_api_base", "azure_endpoint",
              "host", "_host", "openai_proxy")

_HEADER_ATTRS = ("default_headers", "_custom_headers", "headers", "_headers")

_CHILD_ATTRS = ("client", "_client", "async_client", "_async_client", "root_client",
                "root_async_client", "openai_client", "_openai_client", "inner", "llm",
                "model", "_model", "agents", "handoffs", "auth", "_auth", "model_provider",
                "run_config")

_LEAVES = (str, bytes, int, float, bool, type(None))


def _unwrap(value: Any) -> Any:
    """A secret wrapper's value (pydantic's ``SecretStr`` and the like), else ``value``."""
    reveal = getattr(value, "get_secret_value", None)
    if callable(reveal):
        try:
            return reveal()
        except Exception:
            return None
    return value


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that needs a connection or raises: skip it
        return None


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for child in value.values():
            yield from _strings(child)
    elif isinstance(value, list | tuple):
        for child in value:
            yield from _strings(child)

_env_seen: tuple[dict[Any, Any], tuple[str, ...]] = ({}, ())  # (environ copy, its secrets)


def _environment_secrets() -> tuple[str, ...]:
    """Values of variables named as secrets, and the userinfo of those named as addresses
    (rescanned only when the environment changed: decoding it costs more than a redaction)."""
    global _env_seen
    raw = getattr(os.environ, "_data", None)  # the undecoded mapping, cheap to compare
    seen_raw, seen = _env_seen
    if isinstance(raw, dict) and raw == seen_raw:
        return seen
    found = []
    for name, value in os.environ.items():
        if _SECRET_ENV.search(name):
            found.append(value)
        elif "@" in value and _URL_ENV.search(name):
            found += userinfo_secrets(value)
    secrets = tuple(sorted(v for v in found if _is_secret(v)))
    if isinstance(raw, dict):
        _env_seen = (dict(raw), secrets)  # one assignment, as for the rule
    return secrets


def _entry(secret: str) -> tuple[str, re.Pattern[str]]:
    entry = _compiled.get(secret)
    if entry is None:
        entry = (forms.anchor(secret), re.compile(forms.pattern(secret)))
        _compiled[secret] = entry
    return entry


def _compile(source: tuple[int, tuple[str, ...]], values: Iterable[str]) -> _Rule:
    found: set[str] = set()
    for value in values:
        found |= {value, *forms.pieces(value, MIN_SECRET)}
    secrets = tuple(sorted((s for s in found if _is_secret(s)), key=lambda s: (-len(s), s)))
    encoded = {b for s in secrets for b in forms.base64_forms(s) if len(b) >= MIN_SECRET}
    entries = tuple(_entry(s) for s in secrets)
    shortest = min([len(a) or 1 for a, _ in entries] + [len(b) for b in encoded], default=0)
    return _Rule(source, secrets, entries, tuple(sorted(encoded, key=lambda b: (-len(b), b))),
                 shortest)


def _is_secret(value: object) -> bool:
    return isinstance(value, str) and len(value) >= MIN_SECRET and value not in MARK
