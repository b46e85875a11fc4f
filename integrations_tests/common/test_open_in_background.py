"""``open_in_background`` names what failed to open in the user's words. A trial's MCP server
command was missing, and the error said only "opening coroutine on CAR's background loop
raised FileNotFoundError(2, ...)": not which call, nor which command."""

from __future__ import annotations

import pytest
from car_adapters.langgraph import open_in_background
from langchain_mcp_adapters.client import MultiServerMCPClient

from car_core.errors import AdapterError


def test_a_missing_mcp_server_command_is_named_with_the_call_that_opened_it() -> None:
    client = MultiServerMCPClient({"orders": {"command": "car-no-such-server-command",
                                              "args": [], "transport": "stdio"}})
    with pytest.raises(AdapterError) as err:
        open_in_background(client.get_tools(), timeout=30)
    said = str(err.value)
    assert "opening MultiServerMCPClient.get_tools() on CAR's background loop" in said
    assert "'car-no-such-server-command' was not found" in said
    assert "server's command" in err.value.hint
