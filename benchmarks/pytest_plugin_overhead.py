"""What the pytest plugin costs a passing agent test suite, against the same suite without it.

The suite is ``--tests`` tests, each running the planted support agent (LangGraph, 4 model
decisions, zero-latency fake model) once and checking its reply. Each row runs the whole suite
in a fresh ``python -m pytest`` process, so interpreter start-up and imports count; rows
alternate, so drift on a shared machine hits all alike; figures are medians over ``--repeats``
of the process's CPU time (user + system, which other load on the machine barely moves) and of
its wall time.

- ``without plugin``: ``-p no:car`` (the baseline);
- ``installed, off``: the plugin loaded as installed, no test uses ``car_recorder``;
- ``recording``: every test takes ``car_recorder`` (its run stored, with the node id);
- ``recording + --car-attribute``: the same with attribution on (nothing fails: no branch runs).

    .venv/bin/python benchmarks/pytest_plugin_overhead.py                # 40 tests, 5 repeats
    .venv/bin/python benchmarks/pytest_plugin_overhead.py --tests 100 --repeats 9
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = '''
import pytest
from langgraph.checkpoint.memory import InMemorySaver

from car_adapters.demo.support_agent import PlantedSupportModel, build_app, inputs, outcome


@pytest.mark.parametrize("i", range({tests}))
def test_ticket(i{fixture}):
    app = build_app(PlantedSupportModel(rng_seed=0), InMemorySaver())
    {watch}result = app.invoke(inputs(), {{"configurable": {{"thread_id": f"t{{i}}"}}}})
    assert "refunded" not in result["messages"][-1].content
'''

ROWS = {
    "without plugin": ("plain", ["-p", "no:car"]),
    "installed, off": ("plain", []),
    "recording": ("recorded", []),
    "recording + --car-attribute": ("recorded", ["--car-attribute"]),
}


def _write(folder: Path, tests: int) -> None:
    (folder / "plain").mkdir()
    (folder / "recorded").mkdir()
    (folder / "plain" / "test_suite.py").write_text(
        SUITE.format(tests=tests, fixture="", watch=""))
    (folder / "recorded" / "test_suite.py").write_text(SUITE.format(
        tests=tests, fixture=", car_recorder",
        watch="car_recorder.watch(app, outcome=outcome)\n    "))


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _run(folder: Path, args: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one pytest process over the suite."""
    cpu, start = _cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
                          cwd=folder, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"the suite did not pass:\n{done.stdout[-2000:]}")
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write(folder, a.tests)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
        for _ in range(a.repeats):
            for name, (suite, args) in ROWS.items():
                times[name].append(_run(folder / suite, args))
    cpu0 = statistics.median(c for c, _ in times["without plugin"])
    wall0 = statistics.median(w for _, w in times["without plugin"])
    print(f"{a.tests} passing LangGraph tests per suite, median of {a.repeats} runs each")
    print(f"{'row':30} {'CPU s':>7} {'ratio':>7} {'wall s':>7} {'ratio':>7}")
    for name, ts in times.items():
        cpu = statistics.median(c for c, _ in ts)
        wall = statistics.median(w for _, w in ts)
        print(f"{name:30} {cpu:7.2f} {cpu / cpu0:7.3f} {wall:7.2f} {wall / wall0:7.3f}")


if __name__ == "__main__":
    main()
