"""Replay throughput against a model server that takes a fixed time per call.

Starts, on loopback, a stand-in OpenAI-compatible chat-completions server (asyncio, its own
process) that answers every call after ``--latency`` seconds, records one run of ``--steps``
steps with a small chat policy over the official ``openai`` client, then runs ``--branches``
branches that resample every step (so each branch makes ``--steps`` model calls) through
``car_core.engine.execution.execute`` at each concurrency, and prints wall time against the ideal
``branches × steps × latency / concurrency``, CPU time per branch and peak memory of the
process that runs the attribution (for Ray rows: the driver; workers are separate processes).
Each row runs in a fresh process, so peak memory is that row's own. Rows with client "none"
replace the HTTP call by a plain wait of the same latency: what the engine costs on its own.

    .venv/bin/python benchmarks/throughput.py                        # the full table
    .venv/bin/python benchmarks/throughput.py --branches 200 --c1-branches 20   # quick

At concurrency 1 the ideal for 1,000 branches is 1,000 s; ``--c1-branches`` scales that row
down (the table states the branches of every row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any


# -- the stand-in server -------------------------------------------------------------------
def completion(body: bytes, step: int) -> dict[str, Any]:
    return {"id": f"cmpl-{step}", "object": "chat.completion", "created": 0, "model": "stand-in",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"step {step}"}}],
            "usage": {"prompt_tokens": 10 + len(body) // 4, "completion_tokens": 3,
                      "total_tokens": 13 + len(body) // 4}}


async def serve(latency: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                length = 0
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = header.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length) if length else b""
                await asyncio.sleep(latency)
                step = json.loads(body or b"{}").get("messages", [None]).__len__()
                payload = json.dumps(completion(body, step)).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- the agent -----------------------------------------------------------------------------
class ChatPolicy:
    """A chat policy over the ``openai`` client: the history as messages, one completion per
    step, seeded from the branch's noise. The client is made lazily, so the policy ships to
    Ray workers as plain data."""

    def __init__(self, base_url: str, steps: int) -> None:
        self.base_url, self.steps = base_url, steps
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "steps": self.steps, "_client": None}

    def client(self) -> Any:
        if self._client is None:
            import httpx
            import openai
            self._client = openai.OpenAI(
                base_url=self.base_url, api_key="stand-in", max_retries=0, timeout=60,
                http_client=httpx.Client(limits=httpx.Limits(max_connections=256,
                                                             max_keepalive_connections=256)))
        return self._client

    def __call__(self, history: Any, rng: Any) -> dict[str, Any]:
        messages = [{"role": "user", "content": str(history.context)}]
        for s in history.steps:
            messages.append({"role": "assistant", "content": s.action["content"]})
        reply = self.client().chat.completions.create(
            model="stand-in", messages=messages, seed=int(rng.integers(0, 2**31 - 1)))
        k = history.index
        return {"content": reply.choices[0].message.content, "step": k,
                "final": k == self.steps - 1}


class WaitPolicy:
    """The same decisions without an HTTP client: each call just waits ``latency`` seconds.
    Measures what the engine and executor cost on their own."""

    def __init__(self, latency: float, steps: int) -> None:
        self.latency, self.steps = latency, steps

    def __call__(self, history: Any, rng: Any) -> dict[str, Any]:
        time.sleep(self.latency)
        k = history.index
        return {"content": f"step {k}", "step": k, "final": k == self.steps - 1}


def outcome(run: Any) -> float:
    return 1.0 if len(run.steps) >= 5 else 0.0


# -- one measured row ----------------------------------------------------------------------
def measure(port: int, executor: str, concurrency: int, branches: int, steps: int,
            latency: float, client: str) -> dict[str, Any]:
    import car_core as car
    from car_core.engine.agent import OutcomeFn
    from car_core.engine.execution import AsyncioExecutor, Task, brancher, execute
    from car_core.model.budget import BudgetMeter
    from car_core.model.interventions import compile_plan
    from car_core.model.seeding import branch_noise

    policy: Any = (ChatPolicy(f"http://127.0.0.1:{port}/v1", steps) if client == "openai"
                   else WaitPolicy(latency, steps))
    agent = car.FunctionAgent(policy=policy, is_final=lambda a: bool(a["final"]),
                              max_steps=steps, name="bench-chat")
    run = car.record(agent, context="plan a trip", outcome=outcome, seed=0)
    plan = compile_plan(run, car.do_resample(0))  # every step live: `steps` calls a branch
    tasks = [Task("resample@0", r, plan, branch_noise(0, r, "resample@0", True))
             for r in range(branches)]
    if executor == "ray":
        import ray

        from car_core.engine.ray_executor import RayExecutor
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        runner: Any = RayExecutor(concurrency=concurrency)
    else:
        runner = AsyncioExecutor(concurrency)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results = execute(tasks, brancher(run, agent, OutcomeFn(outcome)), BudgetMeter(None),
                      executor=runner, progress=False, keep=lambda t: t.outcome.value)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    assert len(results) == branches and not results.failures, results.failures[:3]
    ideal = branches * steps * latency / concurrency
    return {"executor": executor, "client": client, "concurrency": concurrency,
            "branches": branches,
            "wall_s": wall, "ideal_s": ideal, "ratio": wall / ideal,
            "cpu_ms_per_branch": 1000 * cpu / branches,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def row(port: int, executor: str, concurrency: int, branches: int, client: str,
        args: Any) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", str(port), "--executor", executor,
         "--client", client,
         "--concurrency", str(concurrency), "--branches", str(branches),
         "--steps", str(args.steps), "--latency", str(args.latency)],
        capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"row {executor}/{concurrency} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--branches", type=int, default=1000)
    ap.add_argument("--c1-branches", type=int, default=None,
                    help="branches at concurrency 1 (default: --branches)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--ray-concurrency", default="16,64", help="'' to skip Ray")
    ap.add_argument("--executor", default="async")
    ap.add_argument("--client", default="openai", help=argparse.SUPPRESS)
    ap.add_argument("--engine-only", default="64",
                    help="concurrencies to also run without the HTTP client ('' to skip)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--measure", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve(args.latency))
        return
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.executor, int(args.concurrency),
                                 args.branches, args.steps, args.latency, args.client)))
        return

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--latency",
                               str(args.latency)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        plan = [("async", int(c), "openai") for c in args.concurrency.split(",") if c]
        plan += [("ray", int(c), "openai") for c in args.ray_concurrency.split(",") if c]
        plan += [("async", int(c), "none") for c in args.engine_only.split(",") if c]
        print(f"# {sys.executable} {' '.join(sys.argv)}")
        print(f"# stand-in server on 127.0.0.1:{port}, {args.latency * 1000:.0f} ms a call, "
              f"{args.steps} calls a branch, {os.cpu_count()} CPUs")
        print(f"{'executor':<8} {'client':<7} {'conc':>5} {'branches':>8} {'wall s':>8} "
              f"{'ideal s':>8} "
              f"{'ratio':>6} {'CPU ms/branch':>14} {'peak MB':>8}")
        for executor, conc, client in plan:
            n = args.c1_branches if conc == 1 and args.c1_branches else args.branches
            r = row(port, executor, conc, n, client, args)
            print(f"{r['executor']:<8} {r['client']:<7} {r['concurrency']:>5} "
                  f"{r['branches']:>8} "
                  f"{r['wall_s']:>8.1f} {r['ideal_s']:>8.1f} {r['ratio']:>6.2f} "
                  f"{r['cpu_ms_per_branch']:>14.1f} {r['peak_rss_mb']:>8.0f}", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
