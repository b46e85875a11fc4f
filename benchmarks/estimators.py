"""Our estimators against the paper's, on the same planted models at equal budgets.

    .venv/bin/python benchmarks/estimators.py [--seeds 50]

Prints one table: locus accuracy at matched rollouts (noisy-judge pivot, 24-step late pivot),
rollouts needed for 95% locus accuracy on the late pivot (smallest per-arm cap in a grid that
reaches it; ours counts the rollouts it actually used), and Shapley RMSE at equal budget.
Seed ``s`` records ``model.failing_run(s)`` and runs both estimators with seed ``s``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_baseline import paper_contrastive, paper_shapley  # noqa: E402

import car_core as car  # noqa: E402
from car_core import synthetic as syn  # noqa: E402

PAPER_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32)
OURS_GRID = (8, 12, 16, 24, 32, 48, 64)


def ours_locus(model: syn.SyntheticSCM, seed: int, **kw: Any) -> tuple[int | None, int]:
    res = car.contrastive(model.failing_run(seed), model.agent(), outcome=model.outcome,
                          seed=seed, progress=False, **kw)
    return res.locus, res.rollouts_used


def paper_locus(model: syn.SyntheticSCM, seed: int, rollouts: int) -> tuple[int | None, int]:
    res = paper_contrastive(model.failing_run(seed), model.agent(), outcome=model.outcome,
                            rollouts=rollouts, seed=seed)
    return res.locus, res.rollouts_used


def accuracy(fn: Any, model: syn.SyntheticSCM, seeds: int, **kw: Any) -> tuple[float, float]:
    hits, used = 0, 0
    for s in range(seeds):
        locus, n = fn(model, s, **kw)
        hits += locus == model.locus
        used += n
    return hits / seeds, used / seeds


def needed(fn: Any, model: syn.SyntheticSCM, seeds: int, grid: tuple[int, ...],
           target: float = 0.95) -> tuple[int | None, float | None, float]:
    acc = 0.0
    for k in grid:
        acc, used = accuracy(fn, model, seeds, rollouts=k)
        if acc >= target:
            return k, used, acc
    return None, None, acc


def shapley_rmse(model: syn.SyntheticSCM, seeds: int, budget: int) -> tuple[float, float]:
    truth = model.shapley()
    err_ours, err_paper, count = 0.0, 0.0, 0
    for s in range(seeds):
        run = model.failing_run(s)
        ours = car.shapley(run, model.agent(), outcome=model.outcome, budget=budget, seed=s,
                           progress=False)
        paper = paper_shapley(run, model.agent(), outcome=model.outcome, budget=budget, seed=s)
        for i, t in enumerate(truth):
            err_ours += (ours.values[i].estimate - t) ** 2
            err_paper += (paper.values[i] - t) ** 2
            count += 1
    return math.sqrt(err_ours / count), math.sqrt(err_paper / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--shapley-budget", type=int, default=400)
    args = parser.parse_args()
    n, started = args.seeds, time.monotonic()
    rows: list[tuple[str, str, str, str]] = []

    noisy = syn.noisy_pivot()
    k = 32
    matched = len(noisy.bad_prob) * k
    pa, pu = accuracy(paper_locus, noisy, n, rollouts=k)
    oa, ou = accuracy(ours_locus, noisy, n, rollouts=2 * k, budget=matched)
    rows.append(("noisy-judge pivot (6 steps, flip 0.1): locus accuracy",
                 f"{oa:.0%} ({ou:.0f} rollouts)", f"{pa:.0%} ({pu:.0f} rollouts)",
                 f"budget {matched} each"))

    late = syn.late_pivot()
    k = 8
    matched = late.n_steps * k
    pa, pu = accuracy(paper_locus, late, n, rollouts=k)
    oa, ou = accuracy(ours_locus, late, n, rollouts=32, budget=matched)
    rows.append(("late pivot (24 steps): locus accuracy", f"{oa:.0%} ({ou:.0f} rollouts)",
                 f"{pa:.0%} ({pu:.0f} rollouts)", f"budget {matched} each"))

    pk, pused, pacc = needed(paper_locus, late, n, PAPER_GRID)
    ok, oused, oacc = needed(ours_locus, late, n, OURS_GRID)
    ratio = f"ratio {oused / pused:.2f}" if pused and oused else "target not reached"
    rows.append(("late pivot: rollouts for 95% accuracy",
                 f"{oused:.0f} (cap K={ok}, {oacc:.0%})" if oused else f"> grid ({oacc:.0%})",
                 f"{pused:.0f} (K={pk}, {pacc:.0%})" if pused else f"> grid ({pacc:.0%})",
                 ratio))

    for model in (syn.and_game(), syn.or_game(), syn.three_way()):
        ours, paper = shapley_rmse(model, n, args.shapley_budget)
        rows.append((f"Shapley RMSE, {model.name} game", f"{ours:.4f}", f"{paper:.4f}",
                     f"ratio {ours / paper:.2f} at budget {args.shapley_budget}"))

    headers = ("measure", "ours", "paper", "note")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(f"seeds: {n}; elapsed {time.monotonic() - started:.0f}s")
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)))


if __name__ == "__main__":
    main()
