"""What the policies over a model server share: retries with jittered backoff, an optional
rate limiter, and a client that is rebuilt where the policy lands instead of being pickled.

Retries. A failure the subclass calls transient (429, 5xx, a dropped connection) is tried again
after ``Backoff.delay``: the server's ``Retry-After`` when it sent one (capped at 30 s), else
full jitter over ``backoff · 2^attempt``, so branches that failed together do not come back
together. Retrying stops after ``max_retries`` retries or when the next wait would end past
``retry_time`` seconds from the first try; what is still failing becomes the subclass's
``ModelUnavailable``.

Rate limits. With ``limiter=`` (a ``car_adapters.models.ratelimit.RateLimiter``, one per
model, shared by every policy object that calls it) each request waits for a slot, counts the
tokens the server reported, and a 429 pauses the limiter for the wait, so the other branches do
not pile on.

Pickling (Ray ships the agent to its workers). A client holds sockets and locks, and a client
built from an explicit ``api_key`` holds the key: neither is pickled. A policy that built its
own client rebuilds it on first use in the worker, from the settings and the worker's
environment (``OPENAI_API_KEY``); a client the user passed in, or a limiter (it counts calls in
one process only), cannot travel, and pickling says so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from car_core.contract import redact
from car_core.errors import InvalidInput, ModelUnavailable

from .chat_agent import ChatPolicy, Message
from .ratelimit import Backoff, RateLimiter, is_rate_limited

RETRY_AFTER_CAP_S = 30.0  # one server answer may not stall a branch longer than this


class ServerPolicy(ChatPolicy):
    """A ``ChatPolicy`` whose decisions are requests to a model server (see module doc).

    Subclasses implement ``_new_client()``, ``_request(messages, seed)``, ``_transient(exc)``
    (True: retry; False: re-raised as is; or raise a typed error itself, chained to
    ``redact.redacted(exc)``),
    ``_still_failing(attempts, exc)`` (the ``ModelUnavailable`` to raise when retrying ends)
    and ``_tokens(response)`` (what the server reported, for the limiter)."""

    remote = True
    sleep = staticmethod(time.sleep)  # how a retry waits (a test may give a fake clock's)

    def __init__(self, *, client: Any, timeout: float, max_retries: int, retry_time: float,
                 backoff: float | Backoff, limiter: RateLimiter | None) -> None:
        super().__init__()
        if timeout <= 0 or retry_time < 0 or max_retries < 0:
            raise InvalidInput("timeout must be positive and retries non-negative",
                               hint="e.g. timeout=60, max_retries=5, retry_time=60")
        if limiter is not None and not isinstance(limiter, RateLimiter):
            raise InvalidInput(f"limiter={limiter!r} is not a RateLimiter",
                               hint="pass car_adapters.models.ratelimit.RateLimiter("
                                    "requests_per_minute=..., tokens_per_minute=..., "
                                    "concurrency=...)")
        self.timeout, self.max_retries, self.retry_time = timeout, max_retries, retry_time
        self.backoff = backoff if isinstance(backoff, Backoff) else Backoff(
            max_attempts=max_retries + 1, base=backoff, cap=RETRY_AFTER_CAP_S)
        self.limiter = limiter
        redact.register_from(client)  # a given client's key, headers and URL userinfo
        self._own_client = client is None
        self._client = client

    # -- what subclasses provide -------------------------------------------------------------
    def _new_client(self) -> Any:
        raise NotImplementedError

    def _request(self, messages: list[Message], seed: int) -> Any:
        raise NotImplementedError

    def _transient(self, exc: Exception) -> bool:
        raise NotImplementedError

    def _still_failing(self, attempts: int, exc: Exception) -> ModelUnavailable:
        raise NotImplementedError

    def _tokens(self, response: Any) -> int | None:
        return None

    # -- the shared mechanism ----------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The model client, built on first use (in this process) when the policy owns it."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _estimate(self, messages: Sequence[Message]) -> int:
        """Tokens a request may spend before the server says: ~4 characters a token plus the
        completion cap (the limiter replaces it with the reported count afterwards)."""
        chars = sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or ""))
                    for m in messages)
        return chars // 4 + int(getattr(self, "max_tokens", 0))

    def _once(self, messages: list[Message], seed: int) -> Any:
        if self.limiter is None:
            return self._request(messages, seed)
        with self.limiter.slot(tokens=self._estimate(messages)) as slot:
            response = self._request(messages, seed)
            used = self._tokens(response)
            if used is not None:
                slot.used(used)
            return response

    def _call(self, messages: list[Message], seed: int) -> tuple[Any, int]:
        """The response and the number of retries it took (see module doc)."""
        deadline = time.monotonic() + self.retry_time
        attempt = 0
        while True:
            try:
                return self._once(messages, seed), attempt
            except Exception as exc:
                if not self._transient(exc):
                    raise
                delay = self.backoff.delay(attempt, exc)
                if attempt >= self.max_retries or time.monotonic() + delay > deadline:
                    raise self._still_failing(attempt + 1, exc) from redact.redacted(exc)
                if self.limiter is not None and is_rate_limited(exc):
                    self.limiter.pause(delay)
                self.sleep(delay)
                attempt += 1

    def __getstate__(self) -> dict[str, Any]:
        if not self._own_client:
            raise InvalidInput(
                f"{type(self).__name__} was given its own client, which cannot be sent to "
                "another process (it holds connections, and maybe the API key)",
                hint="let the policy build its client (pass base_url=/host= instead of "
                     "client=), or run branches in this process (executor='async')")
        if self.limiter is not None:
            raise InvalidInput(
                f"{type(self).__name__} has a RateLimiter, which counts calls in one process "
                "only: on separate workers each would allow the whole quota",
                hint="run branches in this process (executor='async'), or drop limiter= and "
                     "let the 429 backoff pace the workers")
        state = super().__getstate__()
        state["_client"] = None  # rebuilt on first use where the policy lands
        return state


__all__ = ["RETRY_AFTER_CAP_S", "ServerPolicy"]
