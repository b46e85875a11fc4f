"""The replay engine's own cost per step, measured on a policy that costs nothing.

Every row runs the same zero-cost policy; the baseline calls it in a bare Python loop with no
CAR machinery, so the ratio column is what CAR adds per step (per-step random streams, JSON
checks, chained digests, lineage, outcome scoring). Peak memory is for ``branches`` branches of
``steps`` steps kept in one ``OutcomeDistribution``, measured with tracemalloc in a separate run
so its overhead does not distort the timings.

    .venv/bin/python benchmarks/replay_overhead.py            # 10k branches of 20 steps
    .venv/bin/python benchmarks/replay_overhead.py --branches 1000
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import car_core as car
from car_core.engine.replay import drive
from car_core.model.interventions import Plan
from car_core.model.seeding import Noise


def make_agent(steps: int) -> car.FunctionAgent:
    last = steps - 1

    def policy(history: car.History, rng: np.random.Generator) -> dict[str, Any]:
        return {"step": history.index, "final": history.index == last}

    return car.FunctionAgent(policy=policy, is_final=lambda a: a["final"], max_steps=steps,
                             name="zero-cost")


def outcome(run: car.Trajectory) -> float:
    return 0.0


def bare_loop(agent: car.FunctionAgent, branches: int, steps: int) -> None:
    """The same policy calls without CAR: one shared generator, a plain list as history."""
    rng = np.random.default_rng(0)
    for _ in range(branches):
        taken: list[Any] = []
        history = car.History(None, (), 0)
        for k in range(steps):
            action = agent.policy(history, rng)
            taken.append(action)
            history = car.History(None, (), k + 1)
            if agent.finished(action):
                break


def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    n, steps = args.branches, args.steps
    agent = make_agent(steps)
    run = car.record(agent, context={"bench": True}, outcome=outcome, seed=0)
    assert len(run) == steps

    rows: list[tuple[str, int, float]] = []   # (case, steps executed, seconds)
    rows.append(("bare Python loop (baseline)", n * steps,
                 timed(lambda: bare_loop(agent, n, steps))))
    live = Plan(start=0)
    rows.append(("drive: every step live", n * steps, timed(
        lambda: [drive(agent, run, live, Noise(0, (1, r))) for r in range(n)])))
    rows.append(("intervene: do_resample(0), all live", n * steps, timed(
        lambda: car.intervene(run, agent, car.do_resample(0), outcome=outcome, rollouts=n,
                              progress=False))))
    rows.append((f"intervene: do_resample({steps - 1}), {steps - 1} held", n * steps, timed(
        lambda: car.intervene(run, agent, car.do_resample(steps - 1), outcome=outcome,
                              rollouts=n, progress=False))))
    rows.append(("intervene: everything held (replay)", n * steps, timed(
        lambda: car.intervene(run, agent, [], outcome=outcome, rollouts=n, progress=False))))

    gc.collect()
    tracemalloc.start()
    dist = car.intervene(run, agent, car.do_resample(0), outcome=outcome, rollouts=n,
                         progress=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(dist.trajectories) == n

    base = rows[0][2] / rows[0][1]
    print(f"replay overhead: {n} branches x {steps} steps, zero-cost policy")
    print(f"{'case':<42} {'steps/s':>12} {'us/step':>9} {'x baseline':>11}")
    for case, count, seconds in rows:
        per = seconds / count
        print(f"{case:<42} {count / seconds:>12,.0f} {per * 1e6:>9.2f} {per / base:>11.1f}")
    print(f"peak memory, {n} branches of {steps} steps kept in the result: "
          f"{peak / 2**20:.1f} MiB ({peak / n / 1024:.1f} KiB per branch)")


if __name__ == "__main__":
    main()
