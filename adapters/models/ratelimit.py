"""One model's rate limits, shared by every branch that calls it.

``RateLimiter(requests_per_minute=, tokens_per_minute=, concurrency=)`` grants a call a slot
when, counting it, no sliding 60-second window holds more requests or tokens than allowed and
fewer than ``concurrency`` calls are in flight. The same object works from threads
(``with limiter.slot(tokens=est): ...``) and from coroutines (``async with
limiter.aslot(tokens=est): ...``); the decision is taken under one lock, so the limits hold
however branches are scheduled. ``slot.used(n)`` replaces the estimate with the tokens the
server reported.

A server that answers 429 anyway is handled by ``call_with_backoff`` / ``acall_with_backoff``:
they wait (the server's ``Retry-After`` when given, else exponential backoff with jitter), pause
the whole limiter meanwhile so other branches do not pile on, and try again; only after
``max_attempts`` do they raise ``ModelUnavailable``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from car_core.contract import is_rate_limit
from car_core.errors import InvalidInput, ModelUnavailable

T = TypeVar("T")
WINDOW_S = 60.0
POLL_S = 0.01  # how often a call waiting for a free concurrency slot looks again


def _positive(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise InvalidInput(f"{name}={value!r} would let nothing through",
                           hint=f"give {name} a positive value, or None for no limit")


class Slot:
    """A granted call. ``used(tokens)`` records what it really spent."""

    def __init__(self, limiter: RateLimiter, entry: list[float]) -> None:
        self._limiter = limiter
        self._entry = entry

    def used(self, tokens: int) -> None:
        with self._limiter._lock:
            self._limiter._tokens += tokens - self._entry[1]
            self._entry[1] = float(tokens)


class RateLimiter:
    """Requests and tokens per minute and a concurrency cap for one model (see module doc).
    ``clock`` and ``sleep`` are injectable so tests measure the rate without real waiting."""

    def __init__(self, requests_per_minute: float | None = None,
                 tokens_per_minute: float | None = None, concurrency: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 asleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        _positive("requests_per_minute", requests_per_minute)
        _positive("tokens_per_minute", tokens_per_minute)
        _positive("concurrency", concurrency)
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.concurrency = concurrency
        self.clock, self.sleep, self.asleep = clock, sleep, asleep
        self._lock = threading.Lock()
        self._grants: deque[list[float]] = deque()  # [time, tokens] of calls in the window
        self._tokens = 0.0
        self._in_flight = 0
        self._paused_until = 0.0

    # -- the decision ----------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        while self._grants and self._grants[0][0] <= now - WINDOW_S:
            self._tokens -= self._grants.popleft()[1]

    def _try_acquire(self, tokens: float) -> tuple[float, list[float] | None]:
        """(0, entry) when granted; else (seconds to wait, None)."""
        with self._lock:
            now = self.clock()
            if now < self._paused_until:
                return self._paused_until - now, None
            self._expire(now)
            if self.concurrency is not None and self._in_flight >= self.concurrency:
                return POLL_S, None
            rpm, tpm = self.requests_per_minute, self.tokens_per_minute
            if rpm is not None and len(self._grants) + 1 > rpm:
                return self._grants[0][0] + WINDOW_S - now, None
            if tpm is not None and self._grants and self._tokens + tokens > tpm:
                # wait until enough old calls leave the window (a call larger than the whole
                # budget still goes through alone, or it would wait forever)
                freed, wait = self._tokens + tokens - tpm, 0.0
                for at, spent in self._grants:
                    freed -= spent
                    wait = at + WINDOW_S - now
                    if freed <= 0:
                        break
                return max(wait, 0.0), None
            entry = [now, float(tokens)]
            self._grants.append(entry)
            self._tokens += tokens
            self._in_flight += 1
            return 0.0, entry

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _check_tokens(self, tokens: int) -> None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise InvalidInput(f"tokens={tokens!r} must be a non-negative int",
                               hint="pass the call's estimated prompt + completion tokens")

    # -- the two ways to take a slot -------------------------------------------------------
    def acquire(self, tokens: int = 0) -> Slot:
        """Block until the call may go; the caller must ``release()`` (or use ``slot``)."""
        self._check_tokens(tokens)
        while True:
            wait, entry = self._try_acquire(tokens)
            if entry is not None:
                return Slot(self, entry)
            self.sleep(wait)

    async def aacquire(self, tokens: int = 0) -> Slot:
        self._check_tokens(tokens)
        while True:
            wait, entry = self._try_acquire(tokens)
            if entry is not None:
                return Slot(self, entry)
            await self.asleep(wait)

    def release(self) -> None:
        self._release()

    @contextmanager
    def slot(self, tokens: int = 0) -> Iterator[Slot]:
        """``with limiter.slot(tokens=est) as s: ...; s.used(actual)`` around one model call."""
        granted = self.acquire(tokens)
        try:
            yield granted
        finally:
            self._release()

    @asynccontextmanager
    async def aslot(self, tokens: int = 0) -> AsyncIterator[Slot]:
        granted = await self.aacquire(tokens)
        try:
            yield granted
        finally:
            self._release()

    def pause(self, seconds: float) -> None:
        """Grant nothing for ``seconds`` (a server said it is overloaded)."""
        with self._lock:
            self._paused_until = max(self._paused_until, self.clock() + seconds)

    @property
    def in_flight(self) -> int:
        return self._in_flight


# -- 429 backoff ---------------------------------------------------------------------------
def is_rate_limited(exc: BaseException) -> bool:
    """True for an HTTP 429 from any client (``car_core.model.outages.is_rate_limit``: the
    status on the error or its ``response``, openai's ``RateLimitError``, or either as the
    error's cause): the one rule the backoff and the stop's hint share."""
    return is_rate_limit(exc)


def retry_after(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` in seconds, when it sent one as a number."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


class Backoff:
    """How long to wait after the n-th 429: the server's word, else ``base · 2^n`` capped at
    ``cap``, with full jitter so branches that hit the limit together do not retry together."""

    def __init__(self, max_attempts: int = 8, base: float = 0.5, cap: float = 60.0,
                 rng: random.Random | None = None) -> None:
        if max_attempts < 1:
            raise InvalidInput(f"max_attempts={max_attempts}: need at least 1")
        self.max_attempts, self.base, self.cap = max_attempts, base, cap
        self.rng = rng or random.Random()

    def delay(self, attempt: int, exc: BaseException) -> float:
        told = retry_after(exc)
        if told is not None:
            return min(told, self.cap)
        return self.rng.uniform(0, min(self.cap, self.base * 2 ** attempt))


def _gave_up(exc: BaseException, attempts: int) -> ModelUnavailable:
    return ModelUnavailable(f"the model server kept answering 429 (rate limited) after "
                            f"{attempts} attempts: {exc}",
                            hint="lower the concurrency or the limiter's requests/tokens per "
                                 "minute, or raise the server's quota")


def _wait_after(exc: Exception, attempt: int, policy: Backoff,
                limiter: RateLimiter | None) -> float:
    """How long to wait after a failed attempt: re-raise what is not a rate limit, give up after
    the last attempt, else pause every branch sharing ``limiter`` for the backoff delay."""
    if not is_rate_limited(exc):
        raise exc
    if attempt + 1 == policy.max_attempts:
        raise _gave_up(exc, policy.max_attempts) from exc
    wait = policy.delay(attempt, exc)
    if limiter is not None:
        limiter.pause(wait)
    return wait


def call_with_backoff(call: Callable[[], T], *, limiter: RateLimiter | None = None,
                      tokens: int = 0, backoff: Backoff | None = None,
                      sleep: Callable[[float], None] | None = None) -> T:
    """``call()`` inside a limiter slot; a 429 waits and retries (see ``Backoff``), pausing
    the limiter meanwhile. Other errors pass through unchanged."""
    policy = backoff or Backoff()
    nap = sleep or (limiter.sleep if limiter is not None else time.sleep)
    for attempt in range(policy.max_attempts):
        try:
            if limiter is None:
                return call()
            with limiter.slot(tokens):
                return call()
        except Exception as exc:
            nap(_wait_after(exc, attempt, policy, limiter))
    raise AssertionError("unreachable")


async def acall_with_backoff(call: Callable[[], Awaitable[T]], *,
                             limiter: RateLimiter | None = None, tokens: int = 0,
                             backoff: Backoff | None = None,
                             asleep: Callable[[float], Awaitable[Any]] | None = None) -> T:
    """The coroutine twin of ``call_with_backoff``: ``call`` returns an awaitable."""
    policy = backoff or Backoff()
    nap = asleep or (limiter.asleep if limiter is not None else asyncio.sleep)
    for attempt in range(policy.max_attempts):
        try:
            if limiter is None:
                return await call()
            async with limiter.aslot(tokens):
                return await call()
        except Exception as exc:
            await nap(_wait_after(exc, attempt, policy, limiter))
    raise AssertionError("unreachable")
