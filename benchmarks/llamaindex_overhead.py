"""What recording costs a LlamaIndex agent, measured with a model that costs nothing.

The same ``FunctionAgent`` (a zero-latency scripted LLM that calls an echo tool ``--steps - 1``
times, then answers) runs in interleaved rounds: plain, with a ``CarRecorder`` attached (no
store), and with a recorder that also writes every run to SQLite. The ratio is recorded time
over plain time per round, reported as the median over rounds. Times are this process's CPU time
(``time.process_time``), so other work on a shared machine does not enter them; interleaving
cancels what drift remains. A real model call takes hundreds of milliseconds, so the per-step
overhead in milliseconds is the figure that matters; the ratio is the worst case. The last row
is a branch from the final step (every earlier step served from the record) for comparison.

    .venv/bin/python benchmarks/llamaindex_overhead.py                 # 10 rounds x 20 runs
    .venv/bin/python benchmarks/llamaindex_overhead.py --rounds 5 --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recording_table import print_recording_table  # noqa: E402

import car_core as car  # noqa: E402


def make_agent(steps: int) -> FunctionAgent:
    def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k < steps - 1:
            return assistant(None, [tool_call(f"call_{k}", "echo", {"text": f"step {k}"})])
        return "done"

    def echo(text: str) -> str:
        """Echo the text."""
        return text

    return FunctionAgent(tools=[echo], llm=ScriptedLLM(decide), system_prompt="bench")


def timed_runs(agent: FunctionAgent, runs: int) -> float:
    async def go() -> None:
        for _ in range(runs):
            await agent.run(user_msg="go")
    gc.collect()
    start = time.process_time()
    asyncio.run(go())
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20, help="agent runs per case per round")
    parser.add_argument("--steps", type=int, default=5, help="LLM decisions per run")
    args = parser.parse_args()
    agent = make_agent(args.steps)
    db = Path(tempfile.mkdtemp()) / "bench.db"
    bare_rec, stored_rec = CarRecorder(), CarRecorder(store=db)
    timed_runs(agent, 2)  # warm imports and caches
    times: dict[str, list[float]] = {"plain": [], "recorded": [], "recorded + SQLite": []}
    for _ in range(args.rounds):
        times["plain"].append(timed_runs(agent, args.runs))
        bare_rec.attach()
        times["recorded"].append(timed_runs(agent, args.runs))
        bare_rec.detach()
        stored_rec.attach()
        times["recorded + SQLite"].append(timed_runs(agent, args.runs))
        stored_rec.detach()
    run = stored_rec.run
    assert len(run.steps) == args.steps and len(stored_rec.runs) == args.rounds * args.runs

    wrapped = LlamaIndexAgent(agent, safe_tools=["echo"])
    start = time.process_time()
    car.intervene(run, wrapped, car.do_resample(args.steps - 1), outcome=lambda r: 0.0,
                  rollouts=args.runs, progress=False)
    branch_s = (time.process_time() - start) / args.runs

    title = (f"LlamaIndex recording overhead: {args.rounds} rounds x {args.runs} runs of "
             f"{args.steps} decisions, zero-latency scripted LLM (CPU time)")
    print_recording_table(title, times, args.runs, args.steps, branch_s)


if __name__ == "__main__":
    main()
