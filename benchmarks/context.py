"""Context attribution: accuracy against budget, CAR against two baselines at equal budget.

    python benchmarks/context.py [--seeds 100] [--budgets 16,32,64,128] [--null-seeds 1000]

Every method runs its branches through the engine (``do_context`` ablations of the planted
worlds in ``car_core.testing.synthetic_context``, one rollout each) and spends the same number:

- **CAR**: ``car.context_attribution`` (antithetic screen + lasso that stops once its top
  source is clear, then leave-one-out confirmation of the candidates with Holm at α = 0.05).
- **LOO**: leave-one-out ablation: the full context and each source left out alone, the budget
  split evenly over the ``m + 1`` arms; a source is named when Boschloo's one-sided test (the
  one CAR's unpaired confirmation runs) against the full arm rejects at α / m (Bonferroni).
- **linear fit**: ContextCite's recipe: random ablations (each source kept with probability
  1/2), a lasso fit of the outcome on the kept-indicators, the top-weighted sources named (as
  many as there are causes; no test, so it always names something).

Columns: *named* = seeds in which every causal source was named; *false* = seeds in which a
non-causal source was named (on the no-cause world, any source). The linear fit names as many
sources as there are causes by construction, so on the no-cause world its false rate is 100%.

After the table, CAR's false-source rate on the no-cause world over ``--null-seeds`` seeds at
each budget, with shared noise and with its own, beside a Wilson 95% interval: the family-wise
error the table's 100 seeds can only roughly show.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import car_core as car  # noqa: E402
from car_core.estimators._arms import StepArms  # noqa: E402
from car_core.estimators.context import boschloo_greater, lasso  # noqa: E402
from car_core.model.context_sources import keep_all, remover  # noqa: E402
from car_core.stats import wilson  # noqa: E402
from car_core.testing.synthetic_context import (  # noqa: E402
    ContextWorld,
    injected,
    interaction,
    no_cause,
    poisoned_tool,
)

ALPHA = 0.05


def worlds() -> dict[str, ContextWorld]:
    return {
        "injected, m=10": injected(10),
        "tool result, m=10": poisoned_tool(10),
        "injected, m=10, own noise, judge 10%": injected(10, shared_noise=False, flip=0.1),
        "AND pair, m=10": interaction(10),
        "injected, m=30": injected(30, at=15),
        "no cause, m=10": no_cause(10, p=0.5, flip=0.1, shared_noise=False),
    }


def car_named(world: ContextWorld, run: car.Trajectory, budget: int, seed: int) -> set[int]:
    result = car.context_attribution(run, world.agent(), step=world.decide_at,
                                     outcome=world.outcome, rollouts=budget, seed=seed)
    return {s.source.index for s in result.named}


def loo_named(world: ContextWorld, run: car.Trajectory, budget: int, seed: int) -> set[int]:
    k = world.decide_at
    sources = car.context_sources(run, k)
    m = len(sources)
    per = max(1, budget // (m + 1))
    arms = StepArms(run, world.agent(), world.outcome, step=k, seed=seed, budget=budget,
                    executor=None, force_agent=False)
    jobs: list[tuple[str, int, Any]] = [("full", r, car.do_context(k, keep_all))
                                        for r in range(per)]
    jobs += [(f"w{j}", r, car.do_context(k, remover(sources, [j])))
             for j in range(m) for r in range(per)]
    got = arms.run_arms(jobs)
    full = [got[("full", r)].value for r in range(per)]
    named = set()
    for j in range(m):
        without = [got[(f"w{j}", r)].value for r in range(per) if (f"w{j}", r) in got]
        if without and boschloo_greater(sum(v >= 0.5 for v in full), len(full),
                                        sum(v >= 0.5 for v in without),
                                        len(without)) <= ALPHA / m:
            named.add(j)
    return named


def linear_named(world: ContextWorld, run: car.Trajectory, budget: int, seed: int) -> set[int]:
    k = world.decide_at
    sources = car.context_sources(run, k)
    m = len(sources)
    rng = np.random.default_rng(seed + 10_000)
    masks = rng.random((budget, m)) < 0.5
    arms = StepArms(run, world.agent(), world.outcome, step=k, seed=seed, budget=budget,
                    executor=None, force_agent=False)
    got = arms.run_arms([(f"m{r}", r, car.do_context(k, remover(
        sources, [j for j in range(m) if not masks[r, j]]))) for r in range(budget)])
    y = np.array([got[(f"m{r}", r)].value for r in range(budget)])
    x = masks.astype(float)
    x = x - x.mean(axis=0)
    beta = lasso(x, y - y.mean(), penalty=0.01)  # ContextCite's default regularisation
    top = max(1, len(world.causal))
    return {int(j) for j in np.argsort(-beta)[:top]}


METHODS = {"CAR": car_named, "LOO": loo_named, "linear fit": linear_named}


def table(seeds: int, budgets: list[int]) -> None:
    print(f"Context attribution, {seeds} seeds per cell; named / false, % of seeds")
    header = "| world | budget | " + " | ".join(f"{m} named | {m} false" for m in METHODS) + " |"
    print(header)
    print("|" + "---|" * (2 + 2 * len(METHODS)))
    for name, world in worlds().items():
        runs = [world.failing_run(s) for s in range(seeds)]
        for budget in budgets:
            cells = []
            for method in METHODS.values():
                named = false = 0
                for s, run in enumerate(runs):
                    got = method(world, run, budget, s)
                    causal = set(world.causal)
                    named += bool(causal) and causal <= got
                    false += bool(got - causal)
                cells += ["—" if not world.causal else f"{100 * named / seeds:.0f}",
                          f"{100 * false / seeds:.0f}"]
            print(f"| {name} | {budget} | " + " | ".join(cells) + " |", flush=True)


def null_rates(seeds: int, budgets: list[int]) -> None:
    print(f"\nCAR on the no-cause world (m=10, judge 10%), {seeds} seeds: seeds with a false "
          f"source, % (Wilson 95%)")
    print("| noise | " + " | ".join(f"budget {b}" for b in budgets) + " |")
    print("|" + "---|" * (1 + len(budgets)))
    for label, shared in (("shared", True), ("own", False)):
        world = no_cause(10, p=0.5, flip=0.1, shared_noise=shared)
        runs = [world.failing_run(s) for s in range(seeds)]
        cells = []
        for budget in budgets:
            false = sum(bool(car_named(world, run, budget, s)) for s, run in enumerate(runs))
            lo, hi = wilson(false / seeds, seeds)
            cells.append(f"{100 * false / seeds:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--budgets", default="16,32,64,128")
    parser.add_argument("--null-seeds", type=int, default=1000)
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    if any(b < 8 for b in budgets) or not math.isfinite(args.seeds):
        parser.error("budgets must be at least 8")
    table(args.seeds, budgets)
    if args.null_seeds > 0:
        null_rates(args.null_seeds, budgets)


if __name__ == "__main__":
    main()
