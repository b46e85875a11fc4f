"""Which tool results a branch counts as errors (``car_adapters.common.sources``): those with an
error status, and a result returned as text that opens as an error and blames its service."""

from __future__ import annotations

import pytest
from car_adapters.common.sources import reads_as_outage, tool_errors


@pytest.mark.parametrize(("text", "outage"), [
    ("Error: hotel search service unavailable (503)", True),
    ("  failed: connection refused by fares.example", True),
    ("Exception: upstream timed out", True),
    ("Error: no hotel named 'Plaza' in Paris", False),  # blames the call: the agent's doing
    ("Found 3 hotels; the booking site returned 503 for one of them earlier", False),
    ("Flight 502 departs at 09:10, gate unavailable until 08:30", False),
])
def test_only_a_result_that_opens_as_an_error_and_blames_its_service_is_an_outage(
        text: str, outage: bool) -> None:
    assert reads_as_outage(text) is outage


def test_tool_errors_takes_error_statuses_and_outage_text_but_not_answers() -> None:
    messages = [
        {"tool_call_id": "a", "status": "error", "content": "no such order"},
        {"tool_call_id": "b", "content": "Error: orders service unavailable (503)"},
        {"tool_call_id": "c", "content": "order A1 refunded; the 503 earlier was retried"},
        {"tool_call_id": "d", "content": '[{"type": "text", "text": "Error: 502 bad gateway"}]'},
    ]
    assert tool_errors(messages) == {"a": "no such order",
                                     "b": "Error: orders service unavailable (503)",
                                     "d": "Error: 502 bad gateway"}
