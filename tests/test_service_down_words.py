"""Which error texts blame the service rather than the call (``says_service_down``): a branch
whose tool answered so is left out as an outage, one whose tool refused what the call asked is
scored. A status code counts only where the text speaks of a status: a refund tool's "amount 500
exceeds the refund limit" is the agent's doing, and leaving that branch out would drop exactly
the branches its decision failed."""

from __future__ import annotations

import pytest

from car_core.contract import says_service_down


@pytest.mark.parametrize("text", [
    "503 Service Unavailable",
    "502 Bad Gateway",
    "429 Too Many Requests",
    "Error code: 503 - {'error': 'overloaded'}",
    "Server error '500 Internal Server Error' for url 'http://orders/api'",
    "504 Server Error: Gateway Timeout for url: http://orders",
    "HTTP 500 from the orders API",
    "orders API returned status 502",
    "model server returned 500",
    "upstream model 500: flaky",
    "503 from the careful model's server",
    "Error: orders lookup failed (500)",
    "Error: hotel search service unavailable (503)",
    "status_code=429",
])
def test_a_status_code_said_as_a_status_blames_the_service(text: str) -> None:
    assert says_service_down(text)


@pytest.mark.parametrize("text", [
    "order 500 not found",
    "refund amount 500 exceeds the refund limit of 200",
    "Error: amount 503.00 is above what this customer may be refunded",
    "no invoice 429 for this customer",
    "Flight 502 departs at 09:10",
    "Error: cannot refund order 501 twice",
])
def test_a_number_that_is_an_id_or_an_amount_does_not(text: str) -> None:
    assert not says_service_down(text)
