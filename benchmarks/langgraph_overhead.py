"""What recording and forking cost on a LangGraph app, against the same app run plainly.

Every row runs the support agent (4 model decisions, 3 tool calls) with the same zero-latency
fake chat model, so the ratio column is what CAR adds, not what a model costs. Plain runs and
recorded runs alternate, so drift on a shared machine hits both alike; the figures are medians
over ``--runs`` runs each.

- ``callback``: ``CarCallback()`` in ``config["callbacks"]``, keeping the trajectory in memory;
- ``callback + store``: the same, saving every run to a SQLite ``RunStore``;
- ``fork + resume``: one ``do_resample(1)`` branch: copy the checkpoint into a new thread,
  resume, read the branch back, delete the thread (3 of the 4 decisions run again).

    .venv/bin/python benchmarks/langgraph_overhead.py            # 300 runs per row
    .venv/bin/python benchmarks/langgraph_overhead.py --runs 100
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from car_adapters.demo.support_agent import PlantedSupportModel, build_app, inputs
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import car_core as car
from car_core.interventions import compile_plan
from car_core.seeding import branch_noise


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def recording(saver: Any, runs: int, store: car.RunStore) -> dict[str, float]:
    """Median seconds per run: plain, with the callback, with the callback and a store."""
    app = build_app(CarChatModel(inner=PlantedSupportModel(p_follow=1.0)), saver)
    cb, cb_store = CarCallback(), CarCallback(store=store)
    times: dict[str, list[float]] = {"plain": [], "callback": [], "callback + store": []}
    for i in range(runs + 5):  # the first 5 of each warm caches and are dropped
        for label, callbacks in (("plain", []), ("callback", [cb]),
                                 ("callback + store", [cb_store])):
            config = {"configurable": {"thread_id": f"{label}-{i}"}, "callbacks": callbacks}
            t = _time(lambda config=config: app.invoke(inputs(), config))
            if i >= 5:
                times[label].append(t)
    return {label: statistics.median(ts) for label, ts in times.items()}


def forking(saver: Any, runs: int) -> tuple[float, float]:
    """Median seconds of one plain run and of one fork + resume from step 1."""
    wrapper = CarChatModel(inner=PlantedSupportModel(p_follow=1.0))
    app = build_app(wrapper, saver)
    cb = CarCallback()
    app.invoke(inputs(), {"configurable": {"thread_id": "record"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None
    agent = LangGraphAgent(app, model=wrapper)
    plan = compile_plan(run, car.do_resample(1))
    plain, fork = [], []
    for i in range(runs + 5):
        t_plain = _time(lambda i=i: app.invoke(inputs(), {"configurable": {"thread_id": f"p{i}"}}))
        t_fork = _time(lambda i=i: agent.branch(run, plan, branch_noise(0, i, "bench", True)))
        if i >= 5:
            plain.append(t_plain)
            fork.append(t_fork)
    return statistics.median(plain), statistics.median(fork)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="car-lg-bench-"))
    rows = []
    for name, make in (("InMemorySaver", InMemorySaver),
                       ("SqliteSaver", lambda: SqliteSaver(sqlite3.connect(
                           folder / "cp.db", check_same_thread=False)))):
        store = car.RunStore(folder / f"car-{name}.db")
        rec = recording(make(), args.runs, store)
        store.close()
        base = rec["plain"]
        for label in ("plain", "callback", "callback + store"):
            rows.append((name, label, rec[label], rec[label] / base))
        plain, fork = forking(make(), args.runs)
        rows.append((name, "fork + resume (vs a plain run)", fork, fork / plain))
    print(f"support agent, 4 decisions, zero-latency fake model; median of {args.runs} runs")
    print(f"{'checkpointer':<14} {'row':<32} {'ms/run':>8} {'ratio':>7}")
    for name, label, seconds, ratio in rows:
        print(f"{name:<14} {label:<32} {seconds * 1e3:>8.2f} {ratio:>6.2f}x")


if __name__ == "__main__":
    main()
