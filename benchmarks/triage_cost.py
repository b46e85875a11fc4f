"""What a triage costs against re-running the failed runs from the start, in one run.

The population is ``TwoModeDesk``'s planted one (``car_core.testing.synthetic_population``):
``--early`` failed runs commit at step 1 (``intake``), ``--late`` at step ``n − 3``
(``refunds``), ``--steps`` steps each. Its model reports tokens the way a chat model's usage
does: step ``k`` reads a prompt of ``PROMPT + PER_STEP·k`` tokens (the history grows) and
writes ``COMPLETION``. Counted on the same population, side by side:

- **held prefix**: ``car.triage`` as shipped, ``search="auto"`` (the default) and
  ``search="full"``, each run's attribution stopping once its locus is decided; a branch
  starts from a held prefix, so the steps before its intervention call no model;
- **as full re-runs**: the same branches, each re-run from step 0 (what a tool that cannot
  resume a run mid-way pays for the same statistical design).

``model calls`` are the policy's calls on branches (counted by a wrapper; recording excluded);
``tokens`` are the usage the branches reported (``result.tokens``: live steps only). A full
re-run of a branch costs every step of the run, so its calls and tokens are exact, not
estimated. The last column is each row over the first (the default triage). Each triage's
answer is checked against the planted modes, so the figures are of triages that got it right.

    .venv/bin/python benchmarks/triage_cost.py                  # 12 + 8 runs of 8 steps, K 16
    .venv/bin/python benchmarks/triage_cost.py --early 20 --late 10 --steps 8 --rollouts 32
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import replace
from typing import Any

import car_core as car
from car_core.testing.synthetic_population import TwoModeDesk

PROMPT, PER_STEP, COMPLETION = 400, 120, 40  # planted usage of step k: PROMPT + PER_STEP·k in


class CountedPolicy:
    """The desk's policy, counting its calls and reporting each decision's planted usage."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self._lock = threading.Lock()
        self._last = threading.local()

    def __call__(self, history: car.History, rng: Any) -> Any:
        with self._lock:
            self.calls += 1
        self._last.k = history.index
        return self.inner(history, rng)

    def step_meta(self) -> dict[str, Any]:
        k = getattr(self._last, "k", 0)
        return {**self.inner.step_meta(), "model": "planted",
                "usage": {"prompt_tokens": PROMPT + PER_STEP * k,
                          "completion_tokens": COMPLETION}}


def full_run_tokens(n: int) -> int:
    """Tokens of one run re-executed from step 0: every step calls the model."""
    return sum(PROMPT + PER_STEP * k + COMPLETION for k in range(n))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--early", type=int, default=12, help="runs of the early mode")
    parser.add_argument("--late", type=int, default=8, help="runs of the late mode")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (6 to 8)")
    parser.add_argument("--rollouts", type=int, default=16, help="K per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    desk = TwoModeDesk(n_steps=args.steps, early_at=1, late_at=args.steps - 3)
    base = desk.agent()
    policy = CountedPolicy(base.policy)
    agent = replace(base, policy=policy)
    runs: list[car.Trajectory] = []
    s = args.seed
    for mode, count in (("early", args.early), ("late", args.late)):
        while sum(r.context["mode"] == mode for r in runs) < count:
            run = car.record(agent, context={"mode": mode}, outcome=desk.outcome, seed=s)
            s += 1
            if run.failed:
                runs.append(run)
    n, total = args.steps, len(runs)

    per_run = full_run_tokens(n)
    rows: list[tuple[str, int, int, int]] = []
    right: dict[str, bool] = {}
    seconds: dict[str, float] = {}
    for search in ("auto", "full"):
        policy.calls = 0
        started = time.perf_counter()
        tri = car.triage(runs, agent, outcome=desk.outcome, rollouts=args.rollouts,
                         seed=args.seed, search=search, executor="sequential")
        seconds[search] = time.perf_counter() - started
        by_step = {g.step: set(g.runs) for g in tri.groups}
        right[search] = (by_step.get(1) == {r.id for r in runs if r.context["mode"] == "early"}
                         and by_step.get(n - 3) == {r.id for r in runs
                                                    if r.context["mode"] == "late"}
                         and not tri.undecided and not tri.no_cause)
        rows += [(f"triage, search={search}: held prefix", tri.rollouts_used, policy.calls,
                  tri.tokens),
                 (f"triage, search={search}: as full re-runs", tri.rollouts_used,
                  tri.rollouts_used * n, tri.rollouts_used * per_run)]
    base_tokens = rows[0][3]
    said = {k: ("recovered both modes, every run accounted for" if v else "MISSED a mode")
            for k, v in right.items()}
    print(f"population: {total} failed runs of {n} steps ({args.early} commit at step 1, "
          f"{args.late} at step {n - 3}); K = {args.rollouts}")
    for search, what in said.items():
        print(f"triage, search={search}: {what} ({seconds[search]:.1f} s)")
    print(f"{'':40}{'rollouts':>10}{'model calls':>13}{'tokens':>12}{'tokens / first row':>20}")
    for name, rollouts, calls, tokens in rows:
        print(f"{name:40}{rollouts:>10}{calls:>13}{tokens:>12}{tokens / base_tokens:>19.2f}x")
    print(f"one full re-run of a {n}-step run: {n} model calls, {per_run} tokens")

if __name__ == "__main__":
    main()
