"""Attribution wall time on a model with a hosted model's latency: the default executor against
one branch at a time, and against the ideal.

Every row attributes one failing run of a travel desk (``car_adapters.demo.travel_desk`` for
LangGraph: step 1 books the over-budget fare with probability 0.25, so the answer is step 1)
with ``car.contrastive(..., rollouts=R, seed=S)``, twice: with no ``executor=`` (what CAR picks
for the agent) and with ``executor="sequential"``. The planted model sleeps ``--latency``
seconds per call (``asyncio.sleep`` on the async path, ``time.sleep`` on the sync one), says it
waits on a server (``remote=True``) and draws from CAR's noise, so a seed fixes the answer.

- ``model calls``: real model calls of the default run (held steps call no model);
- ``ideal``: model calls × latency / 16, every call in flight 16 at a time and nothing else
  costing anything; ``default/ideal`` is the overhead over that bound (tools, the framework,
  CAR, the rounds of the search that must wait for the one before);
- ``same``: the default run's locus and every step's estimate and interval equal the
  sequential run's.

Rows: LangGraph ``create_agent`` with plain tools, and with the same tools served by a real MCP
server (``integrations_tests/support/mcp_travel_server.py``, FastMCP over stdio, loaded with
langchain-mcp-adapters, which starts the server for every tool session), then the rows of
``benchmarks/_hosted_frameworks.py`` (LlamaIndex, the OpenAI Agents SDK) when it is there.
Side-effect tools are answered from the record or a simulator on branches, never run.

    .venv/bin/python benchmarks/hosted_latency.py                 # 32 rollouts, 300 ms
    .venv/bin/python benchmarks/hosted_latency.py --rollouts 32 --latency 0.3 --seed 0
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from car_adapters.demo import travel_desk as td
from car_adapters.langgraph import CarCallback, CarMiddleware, LangGraphAgent
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core import defaults

HERE = Path(__file__).resolve().parent
MCP_SERVER = HERE.parent / "integrations_tests" / "support" / "mcp_travel_server.py"
Row = Callable[[float, int, int], dict[str, Any]]


def answer(res: Any) -> tuple[Any, ...]:
    """What must not depend on the executor: the locus and every step's estimate."""
    return (res.locus, tuple((s.step, s.effect, s.ci) for s in res.steps))


def mcp_tools(ledger: Path) -> list[Any]:
    from langchain_mcp_adapters.client import MultiServerMCPClient
    client = MultiServerMCPClient({"travel": {"command": sys.executable,
                                              "args": [str(MCP_SERVER), str(ledger)],
                                              "transport": "stdio"}})
    return asyncio.run(client.get_tools())


def _langgraph(tools_kind: str) -> Row:
    def row(latency_s: float, rollouts: int, seed: int) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            ledger = Path(tmp) / "ledger.jsonl"
            tools = td.sync_tools(ledger) if tools_kind == "sync" else mcp_tools(ledger)
            model = td.TravelModel(rng_seed=seed, remote=True)
            mw = CarMiddleware()
            app = create_agent(model, tools, middleware=[mw], checkpointer=InMemorySaver())
            cb = CarCallback()
            for i in range(200):  # record without latency: only the attribution is timed
                asyncio.run(app.ainvoke(td.inputs(), {"configurable": {"thread_id": f"t{i}"},
                                                      "callbacks": [cb]}))
                if cb.run is not None and td.booked_flex(cb.run):
                    break
            run = cb.run
            assert run is not None and td.booked_flex(run), "no failing run recorded"
            written = ledger.read_text().count("\n") if ledger.exists() else 0
            model.latency_s = latency_s
            agent = LangGraphAgent(app, model=mw, side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                                   safe_tools=list(td.SAFE_TOOLS), simulators=td.simulators())
            timed = []
            for executor in (None, "sequential"):
                before, start = model.calls, time.perf_counter()
                res = car.contrastive(run, agent, outcome=td.booked_flex, rollouts=rollouts,
                                      seed=seed, executor=executor, progress=False)
                timed.append((res, time.perf_counter() - start, model.calls - before))
            assert (ledger.read_text().count("\n") if ledger.exists() else 0) == written
        (default, wall, calls), (sequential, wall_seq, _) = timed
        return {"framework": "LangGraph", "tools": "sync" if tools_kind == "sync" else "MCP stdio",
                "model_calls": calls, "wall_default_s": wall, "wall_sequential_s": wall_seq,
                "ideal_s": calls * latency_s / defaults.CONCURRENCY,
                "same_answer": answer(default) == answer(sequential), "locus": default.locus}
    return row


ROWS: list[Row] = [_langgraph("sync"), _langgraph("mcp")]


def other_rows() -> list[Row]:
    """The other frameworks' rows, from ``benchmarks/_hosted_frameworks.py`` where it exists."""
    path = HERE / "_hosted_frameworks.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("_hosted_frameworks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.ROWS)


def table(rows: list[dict[str, Any]], latency_s: float, rollouts: int, seed: int) -> str:
    head = (f"{'framework':<18} {'tools':<10} {'calls':>6} {'default':>9} {'sequential':>11} "
            f"{'ideal':>8} {'default/ideal':>14} {'same':>5} {'locus':>6}")
    lines = [f"contrastive, rollouts={rollouts}, seed={seed}, {latency_s * 1000:.0f} ms per model "
             f"call, ideal at {defaults.CONCURRENCY} concurrent", head, "-" * len(head)]
    for r in rows:
        ratio = r["wall_default_s"] / r["ideal_s"] if r["ideal_s"] else float("nan")
        same = "yes" if r["same_answer"] else "NO"
        lines.append(f"{r['framework']:<18} {r['tools']:<10} {r['model_calls']:>6} "
                     f"{r['wall_default_s']:>8.1f}s {r['wall_sequential_s']:>10.1f}s "
                     f"{r['ideal_s']:>7.1f}s {ratio:>13.1f}x {same:>5} {r['locus']!s:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=defaults.ROLLOUTS)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds per model call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import scipy.stats  # noqa: F401  # the first estimate would load it: neither timed run pays
    rows = []
    for row in ROWS + other_rows():
        rows.append(row(args.latency, args.rollouts, args.seed))
        print(f"  done: {rows[-1]['framework']} / {rows[-1]['tools']}", file=sys.stderr)
    print(table(rows, args.latency, args.rollouts, args.seed))
    return rows


if __name__ == "__main__":
    main()
