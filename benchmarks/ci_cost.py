"""What leaving CAR on in a test suite costs, three figures side by side in one run.

1. ``python -c "import car_core"`` in a fresh process, against ``python -c pass`` (wall time,
   median of ``--imports`` interleaved pairs; the OS file cache is warm, the interpreter cold).
2. The first ``car_recorder`` use in a process that has already imported LangGraph and built
   its app (a one-node graph over LangChain's fake chat model; CAR not yet imported):
   ``RunRecorder.start()`` + one recorded run + ``finish()``, imports included, minus the same
   run unrecorded (median over ``--imports`` fresh processes).
3. LangGraph recording overhead with the store: the planted support agent (4 decisions, a
   zero-latency model) with ``CarCallback(store=path)`` against the same run without it
   (median of the ratios of ``--runs`` interleaved pairs in one process, which of a pair runs
   first alternating; the writes are flushed at the end, as the durability promise allows).

    .venv/bin/python benchmarks/ci_cost.py                 # 15 processes, 300 pairs
    .venv/bin/python benchmarks/ci_cost.py --imports 30 --runs 500
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIRST_USE = '''
import sys, time
from pathlib import Path
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
import car_adapters.pytest_plugin  # loaded by pytest before any test

model = FakeListChatModel(responses=["done"] * 10)
graph = StateGraph(MessagesState)
graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
graph.add_edge(START, "agent")
app = graph.compile(checkpointer=InMemorySaver())
ask = {"messages": [("user", "hello")]}
app.invoke(ask, {"configurable": {"thread_id": "warm"}})
t = time.perf_counter()
app.invoke(ask, {"configurable": {"thread_id": "plain"}})
plain = time.perf_counter() - t
t = time.perf_counter()
from car_adapters.pytest_plugin.recording import RunRecorder, close_writers
rec = RunRecorder("test_x.py::test_x", Path(sys.argv[1]))
rec.start()
app.invoke(ask, {"configurable": {"thread_id": "recorded"}})
rec.finish()
recorded = time.perf_counter() - t
close_writers()
assert len(rec.runs) == 1
print(recorded - plain)
'''


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def imports(n: int) -> tuple[float, float]:
    bare, car = [], []
    for _ in range(n + 1):  # the first pair warms the file cache and is dropped
        bare.append(_wall([sys.executable, "-c", "pass"]))
        car.append(_wall([sys.executable, "-c", "import car_core"]))
    return statistics.median(bare[1:]), statistics.median(car[1:])


def first_use(n: int, folder: Path) -> float:
    extra = []
    for i in range(n):
        out = subprocess.run([sys.executable, "-c", FIRST_USE, str(folder / f"first-{i}.db")],
                             check=True, capture_output=True, text=True).stdout
        extra.append(float(out.split()[-1]))
    return statistics.median(extra)


def recording(runs: int, folder: Path, store: bool = True) -> tuple[float, float]:
    from car_adapters.demo.support_agent import PlantedSupportModel, build_app, inputs
    from car_adapters.langgraph import CarCallback
    from langgraph.checkpoint.memory import InMemorySaver

    app = build_app(PlantedSupportModel(rng_seed=0), InMemorySaver())
    cb = CarCallback(store=folder / "recorded.db") if store else CarCallback()
    plain, stored = [], []
    def timed(config: dict[str, Any]) -> float:
        t = time.perf_counter()
        app.invoke(inputs(), config)
        return time.perf_counter() - t

    for i in range(runs + 5):  # the first 5 pairs warm caches and are dropped
        plain_cfg = {"configurable": {"thread_id": f"p{i}"}}
        stored_cfg = {"configurable": {"thread_id": f"r{i}"}, "callbacks": [cb]}
        if i % 2:  # which of the pair runs first alternates, so order effects cancel
            t_stored, t_plain = timed(stored_cfg), timed(plain_cfg)
        else:
            t_plain, t_stored = timed(plain_cfg), timed(stored_cfg)
        if i >= 5:
            plain.append(t_plain)
            stored.append(t_stored)
    cb.flush()
    assert len(cb.runs) == runs + 5
    ratios = [s / p for s, p in zip(stored, plain, strict=True)]
    return statistics.median(plain), statistics.median(ratios)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imports", type=int, default=15, help="fresh processes per figure")
    parser.add_argument("--runs", type=int, default=300, help="interleaved LangGraph pairs")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="car-ci-cost-"))
    bare, car = imports(args.imports)
    extra = first_use(args.imports, folder)
    plain, ratio = recording(args.runs, folder)
    bare_plain, bare_ratio = recording(args.runs, folder, store=False)
    print(f"{'figure':<52} {'value':>10} {'baseline':>10} {'ratio':>7}")
    label = 'python -c "import car_core" (wall s)'
    print(f"{label:<52} {car:>10.3f} {bare:>10.3f} {car / bare:>6.2f}x")
    print(f"{'first car_recorder use, LangGraph loaded (extra s)':<52} {extra:>10.3f} "
          f"{'':>10} {'':>7}")
    print(f"{'LangGraph run recorded into the store (ms/run)':<52} {plain * ratio * 1e3:>10.2f} "
          f"{plain * 1e3:>10.2f} {ratio:>6.2f}x")
    print(f"{'LangGraph run recorded, no store (ms/run)':<52} "
          f"{bare_plain * bare_ratio * 1e3:>10.2f} {bare_plain * 1e3:>10.2f} {bare_ratio:>6.2f}x")
    print(f"(medians: {args.imports} processes, {args.runs} interleaved pairs)")


if __name__ == "__main__":
    main()
