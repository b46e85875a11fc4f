"""The rate limiter holds its configured rate in every 60-second window, from threads and from
coroutines, and 429s back off instead of failing. Time is an injected clock: waiting advances
it, so no test depends on real sleeping."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from car_adapters.models.ratelimit import (
    Backoff,
    RateLimiter,
    acall_with_backoff,
    call_with_backoff,
    is_rate_limited,
    retry_after,
)

from car_core.errors import InvalidInput, ModelUnavailable
from car_core.testing import FakeClock


def limiter(clock: FakeClock, **kw: Any) -> RateLimiter:
    return RateLimiter(clock=clock, sleep=clock.sleep, asleep=clock.asleep, **kw)


def max_in_window(times: list[float], weights: list[float] | None = None) -> float:
    """The largest total over any half-open 60-second window [t, t + 60)."""
    weights = weights or [1.0] * len(times)
    pairs = sorted(zip(times, weights, strict=True))
    return max(sum(w for u, w in pairs if t <= u < t + 60.0) for t, _ in pairs)


def test_requests_per_minute_hold_in_every_window_and_no_slower() -> None:
    clock = FakeClock()
    lim = limiter(clock, requests_per_minute=30)
    grants = []
    for _ in range(100):
        with lim.slot():
            grants.append(clock())
    assert max_in_window(grants) == 30
    # 100 calls at 30 a minute: batches start at 0, 60, 120 and 180 s, not later
    assert grants[-1] == 180.0
    assert grants.count(0.0) == 30


def test_tokens_per_minute_hold_and_used_replaces_the_estimate() -> None:
    clock = FakeClock()
    lim = limiter(clock, tokens_per_minute=1000)
    grants, spent = [], []
    for i in range(20):
        with lim.slot(tokens=300) as slot:
            grants.append(clock())
            actual = 100 if i % 2 else 300  # the server reports what was really used
            slot.used(actual)
            spent.append(actual)
    assert max_in_window(grants, spent) <= 1000
    # 20 calls averaging 200 tokens = 4000 tokens at 1000/min: needs at least 3 more minutes
    assert 180.0 <= grants[-1] <= 240.0


def test_a_call_larger_than_the_token_budget_still_goes_alone() -> None:
    clock = FakeClock()
    lim = limiter(clock, tokens_per_minute=100)
    with lim.slot(tokens=500):
        first = clock()
    with lim.slot(tokens=10):
        second = clock()
    assert (first, second) == (0.0, 60.0)


def test_threads_sharing_one_limiter_never_exceed_the_rate() -> None:
    clock = FakeClock()
    lim = limiter(clock, requests_per_minute=20)
    grants: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            with lim.slot():
                with lock:
                    grants.append(clock())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(grants) == 90
    assert max_in_window(grants) <= 20


def test_coroutines_sharing_one_limiter_never_exceed_the_rate() -> None:
    clock = FakeClock()
    lim = limiter(clock, requests_per_minute=12, tokens_per_minute=600)
    grants: list[float] = []

    async def call() -> None:
        async with lim.aslot(tokens=40):
            grants.append(clock())

    async def main() -> None:
        await asyncio.gather(*(call() for _ in range(50)))

    asyncio.run(main())
    assert len(grants) == 50
    assert max_in_window(grants) <= 12
    assert max_in_window(grants, [40.0] * 50) <= 600


def test_concurrency_cap_blocks_until_a_slot_is_released() -> None:
    lim = RateLimiter(concurrency=2)
    polled = threading.Event()
    granted = threading.Event()

    def poll(seconds: float) -> None:
        polled.set()
        time.sleep(0.001)  # only to yield the CPU while polling; no assertion depends on it

    lim.sleep = poll
    a, b = lim.acquire(), lim.acquire()
    assert lim.in_flight == 2

    def third() -> None:
        with lim.slot():
            granted.set()

    t = threading.Thread(target=third)
    t.start()
    assert polled.wait(30)  # the third call is waiting…
    assert not granted.is_set()  # …and has not been let through
    lim.release()
    t.join(30)
    assert granted.is_set() and lim.in_flight == 1
    del a, b


def test_peak_in_flight_never_exceeds_the_cap() -> None:
    lim = RateLimiter(concurrency=3, sleep=lambda s: time.sleep(0))
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def worker() -> None:
        for _ in range(50):
            with lim.slot():
                with lock:
                    state["now"] += 1
                    state["peak"] = max(state["peak"], state["now"])
                with lock:
                    state["now"] -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= state["peak"] <= 3 and lim.in_flight == 0


@pytest.mark.parametrize("bad", [{"requests_per_minute": 0}, {"tokens_per_minute": -5},
                                 {"concurrency": 0}])
def test_limits_that_let_nothing_through_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(InvalidInput, match="would let nothing through"):
        RateLimiter(**bad)  # type: ignore[arg-type]


def rate_limit_error(retry: str | None = None) -> openai.RateLimitError:
    headers = {"retry-after": retry} if retry is not None else {}
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(429, headers=headers, request=request)
    return openai.RateLimitError("Rate limit reached", response=response, body=None)


class Server:
    """Answers 429 ``busy`` times, then "ok"."""

    def __init__(self, busy: int, retry: str | None = None) -> None:
        self.busy, self.retry, self.calls = busy, retry, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.busy:
            raise rate_limit_error(self.retry)
        return "ok"


def test_openai_429_is_recognised_with_its_retry_after() -> None:
    err = rate_limit_error("7")
    assert is_rate_limited(err) and retry_after(err) == 7.0
    assert not is_rate_limited(ValueError("no")) and retry_after(ValueError("no")) is None


def test_429s_back_off_by_retry_after_and_pause_the_whole_limiter() -> None:
    clock = FakeClock()
    lim = limiter(clock, requests_per_minute=1000)
    server = Server(busy=2, retry="3")
    assert call_with_backoff(server, limiter=lim, tokens=10) == "ok"
    assert server.calls == 3
    assert clock.waits == [3.0, 3.0]  # the server's Retry-After, twice
    lim.pause(5)
    with lim.slot():
        assert clock() == 11.0  # a paused limiter makes every caller wait out the pause


def test_429s_without_retry_after_back_off_exponentially_with_jitter() -> None:
    clock = FakeClock()
    server = Server(busy=4)
    policy = Backoff(max_attempts=8, base=1.0, cap=60.0, rng=random.Random(0))
    assert call_with_backoff(server, backoff=policy, sleep=clock.sleep) == "ok"
    assert len(clock.waits) == 4
    assert all(0.0 <= w <= 2.0 ** i for i, w in enumerate(clock.waits))


def test_429s_that_never_stop_give_up_with_model_unavailable() -> None:
    clock = FakeClock()
    server = Server(busy=100)
    with pytest.raises(ModelUnavailable, match="429"):
        call_with_backoff(server, backoff=Backoff(max_attempts=3, rng=random.Random(1)),
                          sleep=clock.sleep)
    assert server.calls == 3


def test_other_errors_pass_through_unchanged() -> None:
    def broken() -> str:
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError, match="refused"):
        call_with_backoff(broken, sleep=lambda s: None)


def test_async_backoff_and_slot() -> None:
    clock = FakeClock()
    lim = limiter(clock, requests_per_minute=2)
    server = Server(busy=1, retry="4")

    async def call() -> str:
        return server()

    async def main() -> list[str]:
        return [await acall_with_backoff(call, limiter=lim) for _ in range(3)]

    assert asyncio.run(main()) == ["ok"] * 3
    # call 1: attempt 1 (429) at t=0, Retry-After 4, attempt 2 at t=4. The 429 counted too,
    # so the window is full: call 2 waits for t=0 to leave it (t=60), call 3 for t=4 (t=64)
    assert clock() == 64.0
