"""Decisions per second and faithfulness of the embedded model on each backend.

The same seeded tool-calling chat agent (SmolLM2-135M, grammar-constrained tool calls) runs
in-process, through llama.cpp's OpenAI-compatible server (``OpenAIPolicy``, the server's own
chat template with ``tool_choice`` naming the tool) and through our Ollama-protocol server
(``OllamaPolicy`` with the real ``ollama`` client). For each backend it records ``--runs`` runs,
reports decisions per second (model calls over wall time, HTTP included), then re-decides every
recorded state ``--replays`` times with the run's own seed and reports ``car.action_match_rate``.

Then the embedded model's prefix cache: ``--branches`` branches re-decide the last step of a
recorded four-tool run (``do_resample``), with the cache off (every call evaluates its whole
prompt, as before the cache) and on, and the action-match rate of the run in both modes.

    .venv/bin/python benchmarks/models.py [--runs 4] [--replays 2] [--branches 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from car_adapters.models.chat_agent import ChatAgent, tool_schema
from car_adapters.models.local import MODEL, LocalPolicy, PrefixCache, load_model
from car_adapters.ollama import OllamaPolicy
from car_adapters.openai import OpenAIPolicy

import car_core as car

# the loopback model servers live with the integration tests that own them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations_tests" / "support"))
from servers import OllamaServer, llama_server  # noqa: E402

TOOLS = [tool_schema("lookup_order", "Look up the status of an order",
                     {"order_id": {"type": "string"}})]
CONTEXT = [{"role": "system", "content": "You are a support agent. Use tools to answer."},
           {"role": "user", "content": "Where is order 42?"}]
ORDERS = {"lookup_order": lambda order_id: {"order_id": order_id, "status": "shipped"}}
SAFE = ["lookup_order"]  # a lookup: safe to run on a branch
MAX_TOKENS = 40


def measure(name: str, make_policy: Callable[[], Any], runs: int, replays: int
            ) -> dict[str, Any]:
    agent = ChatAgent(make_policy(), ORDERS, safe_tools=SAFE, max_steps=2)
    started = time.perf_counter()
    recorded = [car.record(agent, context=CONTEXT, outcome=lambda r: 0.0, seed=s)
                for s in range(runs)]
    elapsed = time.perf_counter() - started
    decisions = sum(len(r.steps) for r in recorded)
    rates = [car.action_match_rate(r, agent, replays=replays) for r in recorded]
    per_step = [x for m in rates for x in m.per_step]
    return {"backend": name, "decisions": decisions, "seconds": elapsed,
            "per_s": decisions / elapsed, "match": sum(per_step) / len(per_step),
            "states": len(per_step)}


DESK_TOOLS = [tool_schema(name, doc, {"order_id": {"type": "string"}}) for name, doc in [
    ("lookup_order", "Look up an order: amount, delivery date, items"),
    ("check_refund_policy", "Check whether an order may be refunded"),
    ("lookup_customer", "Look up the customer who placed an order"),
    ("open_ticket", "Open a support ticket about an order")]]
DESK = {t["function"]["name"]: (lambda order_id, n=t["function"]["name"]: {
    "tool": n, "order_id": order_id, "note": "delivered 95 days ago; refunds within 30 days, "
    "customer since 2019, two earlier tickets, both closed"}) for t in DESK_TOOLS}
DESK_CONTEXT = [{"role": "system", "content": "You are a support agent for an online shop. "
                 "Use every tool once on the customer's order, then answer."},
                {"role": "user", "content": "My order A1001 arrived late. Please refund it."}]


def prefix_cache(branches: int, replays: int) -> list[dict[str, Any]]:
    """Branch decisions per second from the last step of a long run, cache off and on."""
    # the lookups are safe; opening a ticket is a write, answered on branches by the same fake
    agent = ChatAgent(LocalPolicy(DESK_TOOLS, max_tokens=MAX_TOKENS, fresh_tools=True), DESK,
                      safe_tools=["lookup_order", "check_refund_policy", "lookup_customer"],
                      simulators={"open_ticket": lambda a: DESK["open_ticket"](**a)},
                      max_steps=5)
    run = car.record(agent, context=DESK_CONTEXT, outcome=lambda r: 0.0, seed=1)
    late = len(run.steps) - 1
    rows = []
    for enabled in (False, True):
        PrefixCache.enabled = enabled
        started = time.perf_counter()
        dist = car.intervene(run, agent, car.do_resample(late), outcome=lambda r: 0.0,
                             rollouts=branches, seed=0, progress=False)
        elapsed = time.perf_counter() - started
        decisions = sum(1 for t in dist.trajectories for s in t.steps[late:])
        match = car.action_match_rate(run, agent, replays=replays)
        rows.append({"cache": "on" if enabled else "off", "decisions": decisions,
                     "seconds": elapsed, "per_s": decisions / elapsed, "match": match.rate,
                     "step": late, "prompt": run.steps[late].meta["usage"]["prompt_tokens"]})
    PrefixCache.enabled = True
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--replays", type=int, default=2)
    parser.add_argument("--branches", type=int, default=8)
    parser.add_argument("--only-cache", action="store_true", help="skip the backends table")
    args = parser.parse_args(argv)
    load_model()  # load once, outside the timings
    cache = prefix_cache(args.branches, args.replays)
    off = cache[0]["per_s"]
    print(f"branches from step {cache[0]['step']} ({cache[0]['prompt']} prompt tokens), "
          f"embedded model:")
    print(f"{'prefix cache':12} {'decisions':>9} {'seconds':>8} {'dec/s':>7} {'speed-up':>8} "
          f"{'action match':>12}")
    for r in cache:
        print(f"{r['cache']:12} {r['decisions']:9d} {r['seconds']:8.1f} {r['per_s']:7.2f} "
              f"{r['per_s'] / off:7.2f}x {r['match']:12.3f}")
    if args.only_cache:
        return cache
    print()
    rows = [measure("embedded, in-process", lambda: LocalPolicy(TOOLS, max_tokens=MAX_TOKENS),
                    args.runs, args.replays)]
    with OllamaServer() as server:
        rows.append(measure("Ollama protocol (ollama client)",
                            lambda: OllamaPolicy(MODEL, host=server.host, tools=TOOLS,
                                                 max_tokens=MAX_TOKENS), args.runs,
                            args.replays))
    with llama_server() as url:
        rows.append(measure("llama.cpp server (openai client)",
                            lambda: OpenAIPolicy(MODEL, base_url=url, tools=TOOLS,
                                                 tool_choice={"type": "function", "function": {
                                                     "name": "lookup_order"}},
                                                 temperature=0.8, max_tokens=MAX_TOKENS),
                            args.runs, args.replays))
    base = rows[0]["per_s"]
    print(f"{'backend':34} {'decisions':>9} {'seconds':>8} {'dec/s':>7} {'vs embedded':>11} "
          f"{'action match':>12}")
    for r in rows:
        print(f"{r['backend']:34} {r['decisions']:9d} {r['seconds']:8.1f} {r['per_s']:7.2f} "
              f"{r['per_s'] / base:10.2f}x {r['match']:8.3f} ({r['states']} states x "
              f"{args.replays})")
    return rows


if __name__ == "__main__":
    main()
