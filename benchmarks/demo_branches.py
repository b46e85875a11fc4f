"""Where the demo's seconds go: the cost of one branch of each contrastive arm, run to the end
and stopped where the outcome is settled, on the embedded model.

Records the first failing refund-desk ticket (as ``car demo`` does with seed 0), then runs
``--rollouts`` branches of each arm ``H_j`` (steps ``< j`` held, the rest live) both ways and
prints seconds per branch, model calls, prompt / cached / completion tokens per branch, and the
failure count, which must agree between the two ways (same noise per rollout).

    .venv/bin/python benchmarks/demo_branches.py [--rollouts 6]
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from car_adapters.demo import refund_desk as desk
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from car_adapters.models import local
from car_adapters.models.local import LocalChatModel, load_model
from langgraph.checkpoint.sqlite import SqliteSaver

from car_core.model.interventions import compile_plan, do_resample
from car_core.model.seeding import Noise

COUNTS: collections.Counter[str] = collections.Counter()
_generate = local.generate


def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
    out = _generate(*args, **kwargs)
    COUNTS["calls"] += 1
    for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        COUNTS[key] += out["usage"][key]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=6)
    args = parser.parse_args(argv)
    load_model()
    local.generate = counted  # type: ignore[assignment]
    folder = Path(tempfile.mkdtemp(prefix="car-demo-branches-"))
    conn = sqlite3.connect(folder / "checkpoints.db", check_same_thread=False)
    base = LocalChatModel(max_tokens=32, temperature=0.8, fresh_tools=True)
    wrapper = CarChatModel(inner=base)
    app = desk.build_app(wrapper, SqliteSaver(conn))
    cb = CarCallback()
    for i in range(12):  # the demo's tickets for seed 0
        wrapper.inner = base.model_copy(update={"seed": i})
        app.invoke(desk.inputs(), {"configurable": {"thread_id": f"ticket-{i}"},
                                   "callbacks": [cb], "recursion_limit": 20})
        if desk.outcome(cb.run):
            break
    wrapper.inner = base
    run = cb.run
    assert run is not None and desk.outcome(run), "no ticket failed"
    agent = LangGraphAgent(app, model=wrapper, safe_tools=desk.SAFE_TOOLS,
                           side_effect_tools=desk.SIDE_EFFECT_TOOLS,
                           simulators={"issue_refund": desk.simulated_refund})
    n = len(run.steps)
    print(f"failing run: {n} steps; {args.rollouts} branches per arm and way")
    print(f"{'arm':>4} {'way':>10} {'s/branch':>8} {'calls':>6} {'prompt':>7} {'cached':>7} "
          f"{'compl':>6} {'fails':>6}")
    for j in range(n + 1):
        plan = compile_plan(run, [do_resample(j)] if j < n else [])
        for way in ("to the end", "settled"):
            COUNTS.clear()
            fails = 0
            started = time.perf_counter()
            for r in range(args.rollouts):
                noise = Noise(0, (1, r))
                b = (agent.branch(run, plan, noise) if way == "to the end"
                     else agent.branch(run, plan, noise, stop=desk.outcome.settled))
                fails += bool(desk.outcome(b))
            per = (time.perf_counter() - started) / args.rollouts
            print(f"H_{j:<2} {way:>10} {per:8.2f} {COUNTS['calls'] / args.rollouts:6.1f} "
                  f"{COUNTS['prompt_tokens'] / args.rollouts:7.0f} "
                  f"{COUNTS['cached_tokens'] / args.rollouts:7.0f} "
                  f"{COUNTS['completion_tokens'] / args.rollouts:6.0f} "
                  f"{fails:3d}/{args.rollouts}", flush=True)
    conn.close()


if __name__ == "__main__":
    main()
