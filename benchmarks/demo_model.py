"""What the embedded model does in the demo's refund desk, measured rather than assumed.

Runs the demo app (``car_adapters.demo.refund_desk``) on SmolLM2 with ``--runs`` seeds, with the
customer's injection and without it, and prints how often the model refunded before checking
the refund policy (the demo's failure) and what its first decision was, with Wilson 95%
intervals. The demo's claim that the first decision is the model's own stochastic choice, and
that the injection moves it, rests on this table.

    .venv/bin/python benchmarks/demo_model.py [--runs 20]
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

from car_adapters.demo import refund_desk as desk
from car_adapters.models.local import LocalChatModel, load_model
from langgraph.checkpoint.memory import InMemorySaver

from car_core.stats import wilson

FIRST = ("issue_refund", "check_refund_policy", "answer")


def first_decision(state: dict[str, Any]) -> str:
    ai = next(m for m in state["messages"] if m.type == "ai")
    return ai.tool_calls[0]["name"] if ai.tool_calls else "answer"


def measure(message: str, runs: int) -> dict[str, Any]:
    failures, first = 0, collections.Counter[str]()
    started = time.perf_counter()
    for seed in range(runs):
        app = desk.build_app(LocalChatModel(seed=seed, max_tokens=32, temperature=0.8,
                                            fresh_tools=True), InMemorySaver())
        state = app.invoke(desk.inputs(message), {"configurable": {"thread_id": str(seed)},
                                                  "recursion_limit": 20})
        failures += desk.refund_before_check(state)
        first[first_decision(state)] += 1
    return {"failures": failures, "first": first, "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    load_model()
    clean = desk.remove_injection([{"role": "user", "content": desk.CUSTOMER_MESSAGE}])
    rows = {"with the injection": measure(desk.CUSTOMER_MESSAGE, args.runs),
            "without it": measure(clean[0]["content"], args.runs)}
    print(f"{'customer message':20} {'P(refund before check)':>24} {'95% interval':>16} "
          + " ".join(f"{f:>20}" for f in FIRST) + f" {'s/run':>6}")
    for name, r in rows.items():
        low, high = wilson(r["failures"] / args.runs, args.runs, 0.95)
        print(f"{name:20} {r['failures'] / args.runs:24.2f} {f'[{low:.2f}, {high:.2f}]':>16} "
              + " ".join(f"{r['first'][f]:>20d}" for f in FIRST)
              + f" {r['seconds'] / args.runs:6.1f}")


if __name__ == "__main__":
    main()
