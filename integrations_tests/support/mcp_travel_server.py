"""A travel desk's tools on a real MCP server (the ``mcp`` SDK's FastMCP, over stdio).

``python mcp_travel_server.py LEDGER`` serves three tools: ``search_fares`` only reads (annotated
``readOnlyHint: true``); ``book_flight`` and ``send_itinerary`` have real side effects: each call
appends one JSON line to the ledger file, so a test can count what really ran. While a file
``LEDGER.down`` exists the fares service is down: ``search_fares`` raises, which FastMCP sends
back as a result flagged ``isError``. Two more files make it fail without words that blame a
service: while ``LEDGER.flaky`` exists, ``search_fares`` fails every other call (the file counts
them); while ``LEDGER.gone`` exists, every call fails (its credential is gone); while
``LEDGER.die`` exists, a call kills the server process, as a crash does. The server is
started by the MCP client for every session, so the ledger is a file, not memory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

FARES = {"LIS": [{"fare_id": "TP-saver", "price": 89, "refundable": False},
                 {"fare_id": "TP-flex", "price": 412, "refundable": True}]}

server = FastMCP("travel", log_level="WARNING")


def _ledger(kind: str, **fields: object) -> None:
    with Path(sys.argv[1]).open("a", encoding="utf-8") as out:
        out.write(json.dumps({"tool": kind, **fields}) + "\n")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_fares(destination: str, reason: str = "") -> str:
    """The fares to a destination airport, cheapest first (reads only; ``reason`` is a note)."""
    if Path(sys.argv[1] + ".down").exists():
        raise RuntimeError("fares service unavailable")
    if Path(sys.argv[1] + ".die").exists():
        os._exit(1)
    if Path(sys.argv[1] + ".gone").exists():
        raise RuntimeError("the fares backend rejected the API key")
    flaky = Path(sys.argv[1] + ".flaky")
    if flaky.exists():
        n = int(flaky.read_text(encoding="utf-8") or 0) + 1
        flaky.write_text(str(n), encoding="utf-8")
        if n % 2:
            raise RuntimeError("the fares backend dropped the request")
    return json.dumps(FARES.get(destination, []))


@server.tool()
def book_flight(fare_id: str) -> str:
    """Book a fare and charge the traveller's card (a side effect)."""
    _ledger("book_flight", fare_id=fare_id)
    return json.dumps({"booking_id": f"BK-{fare_id}", "charged": True})


@server.tool()
def send_itinerary(booking_id: str) -> str:
    """E-mail the itinerary of a booking to the traveller (a side effect)."""
    _ledger("send_itinerary", booking_id=booking_id)
    return json.dumps({"sent": booking_id})


if __name__ == "__main__":
    server.run("stdio")
