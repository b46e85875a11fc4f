"""Which client errors stop an estimate as a server outage (``car_core.model.outages``), with
the real exception types of the HTTP clients users build on (httpx: openai's transport)."""

from __future__ import annotations

import httpx
import pytest

from car_core.model.outages import (
    is_outage,
    is_rate_limit,
    outage_hint,
    server_address,
    server_error,
)

URL = "http://127.0.0.1:8000/v1/chat/completions"


def raised_for(status: int) -> httpx.HTTPStatusError:
    """What ``response.raise_for_status()`` raises: the status is on its ``response``."""
    request = httpx.Request("POST", URL)
    response = httpx.Response(status, request=request)
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return exc
    raise AssertionError(f"{status} raised nothing")


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_5xx_raised_for_status_is_an_outage_with_its_status_said(status: int) -> None:
    # a trial's LLM client raised this for a 503: the triage went on through every run
    exc = raised_for(status)
    assert is_outage(exc) and server_error(exc) == status and not is_rate_limit(exc)
    assert f"answered HTTP {status}" in outage_hint(exc, "start it")


def test_a_429_raised_for_status_is_a_rate_limit() -> None:
    exc = raised_for(429)
    assert is_outage(exc) and is_rate_limit(exc) and server_error(exc) is None
    assert "rate-limiting (429)" in outage_hint(exc, "start it")


@pytest.mark.parametrize("status", [400, 404, 422])
def test_a_4xx_is_the_call_s_error_not_an_outage(status: int) -> None:
    exc = raised_for(status)
    assert not is_outage(exc) and server_error(exc) is None and not is_rate_limit(exc)


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_stop_the_estimate_and_say_to_fix_the_key(status: int) -> None:
    """A trial's server answered 401 on every call: the triage went through every run and
    charged 84 rollouts to "fix the agent". Every later call would be refused too."""
    exc = raised_for(status)
    assert is_outage(exc) and not is_rate_limit(exc) and server_error(exc) is None
    assert f"refused the credentials (HTTP {status}): set a valid key" in outage_hint(
        exc, "start it")


def test_the_status_is_found_down_the_cause_chain() -> None:
    try:
        try:
            raise raised_for(503)
        except httpx.HTTPStatusError as inner:
            raise RuntimeError("the LLM call failed") from inner
    except RuntimeError as outer:
        assert is_outage(outer) and server_error(outer) == 503


def test_a_refused_connection_is_an_outage_and_its_hint_is_the_callers() -> None:
    exc = httpx.ConnectError("connection refused", request=httpx.Request("POST", URL))
    assert is_outage(exc) and outage_hint(exc, "start the server") == "start the server"


def test_the_server_address_is_read_from_the_request_without_user_path_or_query() -> None:
    request = httpx.Request("POST", "http://user:sk-secret@10.0.0.5:8000/v1/chat?key=sk-1")
    exc = httpx.ConnectError("connection refused", request=request)
    assert server_address(exc) == "http://10.0.0.5:8000"
    try:
        try:
            raise exc
        except httpx.ConnectError as inner:
            raise RuntimeError("the model call failed") from inner
    except RuntimeError as outer:
        assert server_address(outer) == "http://10.0.0.5:8000"
    assert server_address(raised_for(503)) == "http://127.0.0.1:8000"
    # no request to read (httpx raises on .request then) or none at all: no address
    assert server_address(httpx.ConnectError("refused")) is None
    assert server_address(ValueError("nope")) is None
