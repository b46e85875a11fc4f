"""Whether an error says a server is down: the model's, or the one an LLM judge calls.

Matched by the names model clients give their errors (openai, httpx, requests, aiohttp, and
anyio's for a closed stream), so no client need be installed; the core imports none. An outage
stops an attribution, resumable, instead of failing every later branch on the same dead server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlsplit

# What model clients raise when the server is unreachable, or still failing after the client's
# own retries (openai, httpx, requests, aiohttp name them so), and what anyio raises on a stream
# whose other end is gone (an MCP session whose server process died); matched by name so that
# no client has to be installed for an adapter to work.
_OUTAGE_NAMES = frozenset({
    "APIConnectionError", "APITimeoutError", "RateLimitError", "InternalServerError",
    "ServiceUnavailableError", "TransportError", "ConnectError", "ConnectTimeout",
    "ReadTimeout", "RemoteProtocolError", "ClientConnectionError", "ServerDisconnectedError",
    "ClosedResourceError", "BrokenResourceError", "EndOfStream"})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (its cause, else its context), at most 16."""
    e: BaseException | None = exc
    for _ in range(16):
        if e is None:
            return
        yield e
        e = e.__cause__ or e.__context__


def _statuses(e: BaseException) -> Iterator[object]:
    """The HTTP status ``e`` carries on itself (openai's errors) or on its ``response``
    (httpx's ``HTTPStatusError``, requests' ``HTTPError``, from ``raise_for_status()``)."""
    for o in (e, getattr(e, "response", None)):
        yield getattr(o, "status_code", None)


# what clients raise when the server refuses the credentials (HTTP 401 / 403)
_REFUSED_NAMES = frozenset({"AuthenticationError", "PermissionDeniedError"})


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says a server is down,
    unreachable or overloaded (a refused connection, a timeout, 429 or 5xx), or refuses the
    credentials (401, 403): every later branch would hit it too. A trial's LLM client raised
    httpx's ``HTTPStatusError`` for a 503, whose status is on its response: the triage went on
    through every run; another's server answered 401, and a triage charged 84 rollouts to
    "fix the agent"."""
    if refused_credentials(exc) is not None:
        return True
    for e in _chain(exc):
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if _OUTAGE_NAMES & {c.__name__ for c in type(e).__mro__}:
            return True
        if any(isinstance(s, int) and (s == 429 or 500 <= s < 600) for s in _statuses(e)):
            return True
    return False


def refused_credentials(exc: BaseException) -> int | None:
    """The HTTP status (401 or 403) with which a server refused the credentials ``exc`` (or
    an error it was raised from) was sent with, else None."""
    for e in _chain(exc):
        for status in _statuses(e):
            if status in (401, 403):
                return int(status)
        names = {c.__name__ for c in type(e).__mro__}
        if names & _REFUSED_NAMES:
            return 403 if "PermissionDeniedError" in names else 401
    return None


def is_rate_limit(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a server's HTTP 429: up, but
    refusing more requests for now (openai's ``RateLimitError``, or any client's error whose
    ``status_code``, or its ``response``'s, is 429). Waiting, retrying more or sending fewer
    requests at once helps; starting the server does not."""
    for e in _chain(exc):
        if any(c.__name__ == "RateLimitError" for c in type(e).__mro__):
            return True
        if any(s == 429 for s in _statuses(e)):
            return True
    return False


def server_error(exc: BaseException) -> int | None:
    """The HTTP 5xx status ``exc`` (or an error it was raised from) carries, on itself or its
    ``response``: the server answered, with an error of its own."""
    for e in _chain(exc):
        for status in _statuses(e):
            if isinstance(status, int) and 500 <= status < 600:
                return status
    return None


def server_address(exc: BaseException) -> str | None:
    """``scheme://host:port`` of the server the failed request went to, read from the
    request ``exc`` (or an error it was raised from) carries (openai's and httpx's errors
    do), else None. Only the address: no user, path or query, which may hold a key. A
    trial's "the model server failed ... Connection error" named no server to start."""
    for e in _chain(exc):
        try:
            url = getattr(getattr(e, "request", None), "url", None)
        except RuntimeError:  # httpx: an error whose request was never set
            continue
        if url is None:
            continue
        parts = urlsplit(str(url))
        if parts.scheme and parts.hostname:
            port = f":{parts.port}" if parts.port else ""
            return f"{parts.scheme}://{parts.hostname}{port}"
    return None


def outage_hint(exc: BaseException, down: str, *, who: str = "the model server") -> str:
    """What to do about the outage ``exc`` of ``who``: for a 429, wait or send fewer requests;
    for a 5xx, wait for the server to recover (starting a server that is up helps neither);
    else ``down``, the caller's words for a server that is down or unreachable. A trial's
    server answered "500 upstream overloaded" and was told to start it."""
    refused = refused_credentials(exc)
    if refused is not None:
        return (f"{who} refused the credentials (HTTP {refused}): set a valid key (the "
                "client's api_key=, or the environment variable it reads)")
    if is_rate_limit(exc):
        return (f"{who} is rate-limiting (429), not down: wait, raise the client's "
                "max_retries, or run fewer branches at once (--concurrency, or an executor's "
                "concurrency=)")
    status = server_error(exc)
    if status is not None:
        return (f"{who} answered HTTP {status}, an error of its own: it is up but failing; "
                "its logs say why; wait for it to recover or raise the client's max_retries")
    return down


# what a tool's or server's error text says when the service, not the call, is at fault (HTTP
# 429 and 5xx, a timeout, a refused or reset connection): the words of HTTP clients and servers;
# and of the tool's own world where the estimate runs: a database locked or failing to operate,
# a credential refused or missing, a host not found, a full or read-only disk (a trial's
# read-only lookup, which the record never called, answered "database is locked" on every
# branch, and each was scored as the agent's doing)
_CODE = r"(?:429|50[0-4])(?![\d.,]\d|\d)"
# a status code only where the text speaks of a status: said after "HTTP", "status", "code",
# "error", "returned" or the server's name, before its reason phrase or "from the ... server",
# or alone in brackets. A bare number is an id or an amount ("order 500 not found", "amount 500
# exceeds the refund limit"): the call's error, which the branch is scored with
_STATUS = (
    rf"\b(?:https?|status(?:[ _]?code)?|code|error|returned|responded(?: with)?|answered|"
    rf"server|upstream|model|api|gateway|backend)\W{{0,3}}{_CODE}|"
    rf"\b{_CODE}\W{{0,3}}(?:too many|internal|bad gateway|service|gateway|server|"
    rf"not implemented)\b|"
    rf"\b{_CODE} from (?:the |its |an? )?(?:[\w'-]+ ){{0,3}}"
    rf"(?:server|api|service|upstream|gateway|host|endpoint)\b|\({_CODE}\)")
_SERVICE_DOWN = re.compile(
    _STATUS + r"|service unavailable|temporarily unavailable|unreachable|"
    r"timed? ?out\b|connection (?:refused|reset|error|aborted)|too many requests|rate.?limit|"
    r"database is locked|operationalerror|disk i/o error|no space left|read-only file system|"
    r"401 unauthori[sz]ed|403 forbidden|authentication (?:failed|required)|not authenticated|"
    r"(?:invalid|missing|no) (?:api[ _-]?key|credentials)|credentials not found|"
    r"name or service not known|nodename nor servname|no such host",
    re.IGNORECASE)


def says_service_down(text: str) -> bool:
    """Whether an error's text blames its service rather than the call: a tool that answered
    so on a branch was down where the estimate ran, not answering what the agent asked."""
    return bool(_SERVICE_DOWN.search(text))


# an object of an async client (a pooled connection's lock or event) made on an event loop
# that is gone or is another: the client's, not the branch's, state
_STALE_LOOP = re.compile(r"bound to a different event loop|event loop is closed", re.IGNORECASE)


def is_stale_loop(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) says an async client reused something
    made on another event loop: a user who recorded with ``run_sync`` and attributes in the same
    process has an HTTP pool whose first connection on CAR's loop fails so, once, whatever the
    branch's path; the pool drops it and the next call works."""
    # the client's RuntimeError, or CAR's error naming it
    return any(_STALE_LOOP.search(str(e)) for e in _chain(exc))
