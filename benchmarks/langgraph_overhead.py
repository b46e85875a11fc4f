"""What recording and forking cost on a LangGraph app, against the same app run plainly.

Two apps, each with a zero-latency fake chat model, so the ratio column is what CAR adds, not
what a model costs: the support agent (4 model decisions, 3 tool calls) and the supervisor app
(``langgraph-supervisor`` over two ``create_agent`` workers: 8 decisions in three subgraphs).
Plain runs and recorded runs alternate, so drift on a shared machine hits both alike; the
figures are medians over ``--runs`` runs each.

- ``callback``: ``CarCallback()`` in ``config["callbacks"]``, keeping the trajectory in memory;
- ``callback + store``: the same, saving every run to a SQLite ``RunStore``;
- ``fork + resume``: one ``do_resample`` branch at the decision (support: step 1, 3 of the 4
  decisions run again; supervisor: step 4 inside the account worker, 4 of 8 run again): copy
  the checkpoints into a new thread, resume, read the branch back, delete the thread.

    .venv/bin/python benchmarks/langgraph_overhead.py            # 300 runs per row
    .venv/bin/python benchmarks/langgraph_overhead.py --runs 100 --app supervisor
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from car_adapters.demo import supervisor_app, support_agent
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import car_core as car
from car_core.model.interventions import compile_plan
from car_core.model.seeding import branch_noise


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


APPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[], Any], Callable[[], Any], int]] = {
    "support": (support_agent.build_app, lambda: support_agent.PlantedSupportModel(p_follow=1.0),
                support_agent.inputs, 1),
    "supervisor": (supervisor_app.build_app,
                   lambda: supervisor_app.PlantedAgentModel(p_follow=1.0),
                   supervisor_app.inputs, 4),
}


def build(which: str, model: Any, saver: Any) -> Any:
    with warnings.catch_warnings():  # create_supervisor uses the deprecated create_react_agent
        warnings.simplefilter("ignore", DeprecationWarning)
        return APPS[which][0](model, saver)


def recording(which: str, saver: Any, runs: int, store: car.RunStore
              ) -> dict[str, tuple[float, float]]:
    """``(median, amortised)`` seconds per run: plain, with the callback, with the callback
    and a store. Amortised adds the callback's final ``flush()`` (the sealing it deferred, the
    store's writes) to the runs' total before dividing, so no work is left out."""
    _, fake, inputs, _ = APPS[which]
    app = build(which, CarChatModel(inner=fake()), saver)
    cb, cb_store = CarCallback(), CarCallback(store=store)
    times: dict[str, list[float]] = {"plain": [], "callback": [], "callback + store": []}
    for i in range(runs + 5):  # the first 5 of each warm caches and are dropped
        for label, callbacks in (("plain", []), ("callback", [cb]),
                                 ("callback + store", [cb_store])):
            config = {"configurable": {"thread_id": f"{label}-{i}"}, "callbacks": callbacks}
            t = _time(lambda config=config: app.invoke(inputs(), config))
            if i >= 5:
                times[label].append(t)
        if i == 4:  # the warm-up runs' deferred work is not the measured runs'
            cb.flush()
            cb_store.flush()
    flushed = {"plain": 0.0, "callback": _time(cb.flush), "callback + store": _time(cb_store.flush)}
    return {label: (statistics.median(ts), (sum(ts) + flushed[label]) / len(ts))
            for label, ts in times.items()}


def forking(which: str, saver: Any, runs: int) -> tuple[float, float]:
    """Median seconds of one plain run and of one fork + resume from the decision."""
    _, fake, inputs, step = APPS[which]
    wrapper = CarChatModel(inner=fake())
    app = build(which, wrapper, saver)
    cb = CarCallback()
    app.invoke(inputs(), {"configurable": {"thread_id": "record"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None
    module = support_agent if which == "support" else supervisor_app
    # every tool classified, as the product requires: the side effect is answered on the branch
    agent = LangGraphAgent(app, model=wrapper, safe_tools=module.SAFE_TOOLS,
                           side_effect_tools=module.SIDE_EFFECT_TOOLS)
    plan = compile_plan(run, car.do_resample(step))
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
    parser.add_argument("--app", choices=["support", "supervisor", "both"], default="both")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="car-lg-bench-"))
    rows = []
    for which in (("support", "supervisor") if args.app == "both" else (args.app,)):
        for name, make in (("InMemorySaver", InMemorySaver),
                           ("SqliteSaver", lambda which=which: SqliteSaver(sqlite3.connect(
                               folder / f"cp-{which}.db", check_same_thread=False)))):
            store = car.RunStore(folder / f"car-{which}-{name}.db")
            rec = recording(which, make(), args.runs, store)
            store.close()
            base, base_total = rec["plain"]
            for label in ("plain", "callback", "callback + store"):
                median, amortised = rec[label]
                rows.append((which, name, label, median, median / base, amortised / base_total))
            plain, fork = forking(which, make(), args.runs)
            rows.append((which, name, "fork + resume (vs a plain run)", fork, fork / plain,
                         None))
    print(f"zero-latency fake models; median of {args.runs} runs; amortised: the runs' total "
          f"and the final flush over the plain runs' total")
    print(f"{'app':<11} {'checkpointer':<14} {'row':<32} {'ms/run':>8} {'ratio':>7} "
          f"{'amortised':>10}")
    for which, name, label, seconds, ratio, amortised in rows:
        spread = f"{amortised:>9.2f}x" if amortised is not None else ""
        print(f"{which:<11} {name:<14} {label:<32} {seconds * 1e3:>8.2f} {ratio:>6.2f}x "
              f"{spread:>10}")


if __name__ == "__main__":
    main()
