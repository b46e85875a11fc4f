"""CAR's estimators against the paper's rules, an oracle and shapiq, on planted models.

    .venv/bin/python benchmarks/estimators.py [--seeds 200] [--fwer-seeds 2000]
        [--shapley-seeds 100] [--rescue 0.3 ...] [--steps 8 ...] [--flip 0 ...] [--skip ...]

Locus grid: a pivot (``synthetic.pivot``) at step ``⌊2n/3⌋`` of an ``n``-step run whose
resampling rescues the run with probability ``rescue`` (before the judge; behind a judge that
flips the outcome w.p. ``flip`` the rescue seen is ``(1 − 2·flip)·rescue``), branches coupled.
For each row: locus accuracy at the paper's budget ``n·K`` (K = 32) and the rollouts needed for
90% accuracy, for

- CAR: ``car_core.estimators.search`` (the search ``car.contrastive`` runs) on
  ``synthetic.SampledArms``, the planted model's arms drawn vectorised with the engine's law;
  its rollouts to 90% are the mean rollouts it used (to decide; the re-estimate after the stop
  is not counted) at the smallest budget of ``BUDGETS`` that reaches 90%;
- the paper's rule (``paper_baseline.paper_contrastive``: ``K`` independent rollouts per step
  against the one observed outcome, percentile bootstrap, no multiplicity control), drawn from
  the same law; its bootstrap interval excludes zero exactly when fewer than 2.5% of resamples
  are all failures, i.e. ``ȳ^K < 0.025``, which is what the simulation applies; its rollouts
  to 90% are ``n·K`` at the smallest ``K`` of ``PAPER_K`` that reaches 90%;
- the oracle: knows the pivot and runs one exact two-sided McNemar test at α = 0.05 on
  ``N`` coupled pairs of its two arms; its power is computed exactly (no simulation).

Then: family-wise error over ``--fwer-seeds`` seeds of models with no cause and of models whose
steps after the pivot are free, irrelevant draws (independent arms, or a judge that is not
seeded); bias of the rescue after the early stop (raw vs re-estimated) and coverage of the
reported interval; a check that ``car.contrastive`` through the real engine matches the
simulation; Shapley RMSE at equal budget against the paper's estimator and shapiq's
approximators on the same noisy games, with our interval coverage. Seed ``s`` draws the
simulation's noise from ``s`` (and records ``model.failing_run(s)`` where the engine runs).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binom

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_baseline import paper_shapley  # noqa: E402

import car_core as car  # noqa: E402
from car_core import synthetic as syn  # noqa: E402
from car_core.estimators.search import search  # noqa: E402

K = 32
ALPHA = 0.05
TARGET = 0.90
BUDGETS = (16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280,
           1536, 2048, 3072, 4096)
PAPER_K = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def grid_model(n: int, rescue: float, flip: float) -> syn.SyntheticSCM:
    return syn.pivot(n_steps=n, at=(2 * n) // 3, p_bad=1.0 - rescue, flip=flip)


# -- CAR on the simulator ----------------------------------------------------------------------
def car_runs(model: syn.SyntheticSCM, seeds: range, budget: int, coupling: str = "full",
             intervals: bool = False) -> list[tuple[Any, int]]:
    out = []
    for s in seeds:
        src = syn.SampledArms(model, s, budget, coupling)
        d = search(src, model.n_steps, budget, ALPHA, intervals=intervals)
        out.append((d, d.decided_spent))
    return out


def car_accuracy(model: syn.SyntheticSCM, seeds: range, budget: int) -> tuple[float, float]:
    runs = car_runs(model, seeds, budget)
    hits = sum(d.significant and d.candidate == model.locus for d, _ in runs)
    return hits / len(runs), float(np.mean([u for _, u in runs]))


def car_needed(model: syn.SyntheticSCM, seeds: range, oracle: int
               ) -> tuple[float | None, int | None]:
    """Scan the budgets from half the oracle's rollouts up (no row needed fewer)."""
    for b in (b for b in BUDGETS if b >= oracle // 2):
        acc, used = car_accuracy(model, seeds, b)
        if acc >= TARGET:
            return used, b
    return None, None


# -- the paper's rule, same law ----------------------------------------------------------------
def paper_accuracy(model: syn.SyntheticSCM, seeds: int, k: int, rng: np.random.Generator
                   ) -> float:
    n = model.n_steps
    h = np.array([model.arm(j) for j in range(n)])           # arm of step j resamples j
    fails = rng.binomial(k, h[None, :], size=(seeds, n))     # rollouts that still failed
    significant = (fails < k) & ((fails / k) ** k < 0.025)
    latest = np.where(significant.any(axis=1), n - 1 - np.argmax(significant[:, ::-1], axis=1),
                      -1)
    return float(np.mean(latest == (model.locus if model.locus is not None else -1)))


def paper_needed(model: syn.SyntheticSCM, seeds: int, rng: np.random.Generator) -> int | None:
    for k in PAPER_K:
        if paper_accuracy(model, seeds, k, rng) >= TARGET:
            return model.n_steps * k
    return None


# -- the oracle, exact -------------------------------------------------------------------------
def oracle_power(pairs: int, up: float, down: float, alpha: float = ALPHA) -> float:
    """Power of the exact two-sided McNemar test on ``pairs`` pairs that disagree upward with
    probability ``up`` and downward with ``down``, counted when it rejects upward."""
    if pairs <= 0:
        return 0.0
    disc = up + down
    total = 0.0
    for m in range(1, pairs + 1):
        pm = binom.pmf(m, pairs, disc)
        if pm < 1e-12:
            continue
        ks = np.arange(m + 1)
        pval = np.minimum(1.0, 2 * binom.sf(ks - 1, m, 0.5))  # P(X >= k) doubled
        reject_up = (pval <= alpha) & (ks * 2 > m)
        total += pm * float(binom.pmf(ks[reject_up], m, up / disc).sum())
    return total


def oracle_needed(up: float, down: float) -> int:
    lo, hi = 1, 1
    while oracle_power(hi, up, down) < TARGET:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if oracle_power(mid, up, down) >= TARGET else (mid, hi)
    return 2 * hi


def locus_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(12345)
    seeds = range(args.seeds)
    for rescue in args.rescue:
        for n in args.steps:
            for flip in args.flip:
                model = grid_model(n, rescue, flip)
                up, down = rescue * (1 - flip), rescue * flip
                budget = n * K
                c_acc, c_used = car_accuracy(model, seeds, budget)
                o_acc = oracle_power(budget // 2, up, down)
                o_need = oracle_needed(up, down)
                c_need, c_budget = car_needed(model, seeds, o_need)
                rows.append({
                    "rescue": rescue, "n": n, "flip": flip, "budget": budget,
                    "car_acc": c_acc, "car_used": c_used, "car_need": c_need,
                    "car_need_budget": c_budget,
                    "paper_acc": paper_accuracy(model, args.seeds, K, rng),
                    "paper_need": paper_needed(model, args.seeds, rng),
                    "oracle_acc": o_acc, "oracle_need": o_need})
                print_row(rows[-1], first=len(rows) == 1)
    return rows


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "never" if x is None else format(x, spec)


def print_row(r: dict[str, Any], first: bool) -> None:
    if first:
        print("| rescue | n | flip | n·K | CAR acc (rollouts) | paper acc | oracle acc "
              "| CAR to 90% | paper to 90% | oracle to 90% | CAR/oracle | targets |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratio = r["car_need"] / r["oracle_need"] if r["car_need"] else None
    acc_target = None
    if r["oracle_acc"] >= 0.95:
        acc_target = 0.95 if r["flip"] == 0 else 0.90
    ok_acc = acc_target is None or r["car_acc"] >= acc_target
    ok_need = ratio is not None and ratio <= 2.5
    verdict = ("ok" if ok_acc and ok_need else
               ", ".join(x for x, bad in (("acc", not ok_acc), ("rollouts", not ok_need)) if bad)
               + " missed")
    if acc_target is None:
        verdict += " (oracle < 95% at n·K)"
    print(f"| {r['rescue']} | {r['n']} | {r['flip']} | {r['budget']} | {r['car_acc']:.1%} "
          f"({r['car_used']:.0f}) | {r['paper_acc']:.1%} | {r['oracle_acc']:.1%} "
          f"| {_fmt(r['car_need'])} | {_fmt(r['paper_need'], 'd')} | {r['oracle_need']} "
          f"| {_fmt(ratio, '.2f')} | {verdict} |", flush=True)


# -- family-wise error -------------------------------------------------------------------------
def noise_after(n: int, at: int, rescue: float, flip: float) -> syn.SyntheticSCM:
    """A pivot whose later steps are free draws the outcome never reads (not copies)."""
    probs = [0.5] * n
    probs[at] = 1.0 - rescue
    return syn.SyntheticSCM(name="noise-after", n_steps=n, bad_prob=tuple(probs),
                            relevant=(at,), rule="all", flip=flip)


def fwer_table(args: argparse.Namespace) -> None:
    cases: list[tuple[str, syn.SyntheticSCM, str]] = [
        ("no cause, 8 steps, independent arms", syn.no_cause(8, 0.5), "none"),
        ("no cause, 24 steps, independent arms", syn.no_cause(24, 0.3), "none"),
        ("pure noise after the pivot, 8 steps, independent arms",
         noise_after(8, 2, 0.5, 0.0), "none"),
        ("pure noise after the pivot, 24 steps, unseeded judge (flip 0.2)",
         noise_after(24, 8, 0.5, 0.2), "steps"),
    ]
    print(f"\nFamily-wise error at α = {ALPHA} over {args.fwer_seeds} seeds, budget n·{K} "
          "(a false locus: a step named whose rescue is 0)")
    print("| model | coupling | false loci | FWER | 95% upper bound |")
    print("|---|---|---|---|---|")
    for name, model, coupling in cases:
        false = 0
        truth = model.locus
        for s in range(args.fwer_seeds):
            src = syn.SampledArms(model, 10_000 + s, model.n_steps * K, coupling)
            d = search(src, model.n_steps, model.n_steps * K, ALPHA, intervals=False)
            false += d.significant and d.candidate != truth
        rate = false / args.fwer_seeds
        upper = _clopper_upper(false, args.fwer_seeds)
        print(f"| {name} | {coupling} | {false} | {rate:.2%} | {upper:.2%} |", flush=True)


def _clopper_upper(k: int, n: int, level: float = 0.95) -> float:
    from scipy.stats import beta
    return 1.0 if k == n else float(beta.ppf(level, k + 1, n - k))


# -- bias after stopping and coverage ----------------------------------------------------------
def bias_table(args: argparse.Namespace) -> None:
    print(f"\nRescue at the locus after the early stop ({args.bias_seeds} seeds each, budget n·{K};"
          " truth = (1 − 2·flip)·rescue; coverage of the reported 95% interval)")
    print("| rescue | n | flip | truth | raw mean (bias) | re-estimated (bias) | coverage |")
    print("|---|---|---|---|---|---|---|")
    for rescue, n, flip in ((0.3, 8, 0.0), (0.3, 8, 0.1), (0.5, 24, 0.0), (0.15, 24, 0.1)):
        model = grid_model(n, rescue, flip)
        truth = model.rescue(model.locus)
        raw, refit, cover, found = [], [], 0, 0
        for d, _ in car_runs(model, range(20_000, 20_000 + args.bias_seeds), n * K,
                             intervals=True):
            if d.candidate == model.locus and d.interval is not None:
                cover += d.interval.ci[0] <= truth <= d.interval.ci[1]
                found += 1
            if d.significant and d.candidate == model.locus:
                raw.append(d.raw)
                if d.refit is not None:
                    refit.append(d.refit)
        rm, fm = float(np.mean(raw)), float(np.mean(refit)) if refit else float("nan")
        print(f"| {rescue} | {n} | {flip} | {truth:.3f} | {rm:.3f} ({rm - truth:+.3f}) | "
              f"{fm:.3f} ({fm - truth:+.3f}, {len(refit)} of {len(raw)}) | "
              f"{cover / max(found, 1):.1%} |", flush=True)


def coupling_table(args: argparse.Namespace) -> None:
    """The grid assumes the engine's coupled branches; accuracy when arms share less noise (a
    judge that is not seeded, or independent arms: a hosted model that ignores its seed)."""
    print(f"\nAccuracy at n·{K} by how much noise the arms share ({args.seeds} seeds each)")
    print("| rescue | n | flip | full (steps and judge) | steps (judge not seeded) | none |")
    print("|---|---|---|---|---|---|")
    for rescue, n, flip in ((0.3, 8, 0.1), (0.5, 8, 0.0), (0.3, 24, 0.0), (0.5, 24, 0.1)):
        model = grid_model(n, rescue, flip)
        cells = []
        for coupling in ("full", "steps", "none"):
            hits = 0
            for s in range(args.seeds):
                src = syn.SampledArms(model, s, n * K, coupling)
                d = search(src, n, n * K, ALPHA, intervals=False)
                hits += d.significant and d.candidate == model.locus
            cells.append(f"{hits / args.seeds:.1%}")
        print(f"| {rescue} | {n} | {flip} | " + " | ".join(cells) + " |", flush=True)


def engine_check(args: argparse.Namespace) -> None:
    """``car.contrastive`` through the replay engine on the same models, fewer seeds."""
    print(f"\nEngine vs simulator (car.contrastive, {args.engine_seeds} seeds, K = {K})")
    print("| model | engine accuracy (rollouts) | simulator accuracy (rollouts) |")
    print("|---|---|---|")
    for rescue, n, flip in ((0.3, 8, 0.1), (0.5, 24, 0.0)):
        model = grid_model(n, rescue, flip)
        hits, used = 0, 0
        for s in range(args.engine_seeds):
            res = car.contrastive(model.failing_run(s), model.agent(), outcome=model.outcome,
                                  rollouts=K, seed=s, progress=False)
            hits += res.locus == model.locus
            used += res.rollouts_used
        runs = car_runs(model, range(args.engine_seeds), n * K)
        sim_hits = sum(d.significant and d.candidate == model.locus for d, _ in runs)
        sim_used = np.mean([src_total(d) for d, _ in runs])
        print(f"| rescue {rescue}, {n} steps, flip {flip} | {hits / args.engine_seeds:.0%} "
              f"({used / args.engine_seeds:.0f}) | {sim_hits / args.engine_seeds:.0%} "
              f"({sim_used:.0f}) |", flush=True)


def src_total(d: Any) -> int:
    return int(d.decided_spent + 2 * d.refit_pairs)


# -- Shapley -----------------------------------------------------------------------------------
def shapiq_estimate(name: str, model: syn.SyntheticSCM, budget: int, seed: int) -> np.ndarray:
    """A shapiq approximator on the noisy game, at ``budget`` rollouts in all: it picks its
    coalitions without looking at values, so a dry run counts its evaluations and each then
    averages ``budget / evaluations`` rollouts (the rest go to the first ones)."""
    import shapiq
    p = model.n_steps
    values = np.array([model.value([i for i in range(p) if m >> i & 1]) for m in range(1 << p)])
    weights = 1 << np.arange(p)

    def make() -> Any:
        cls = getattr(shapiq, name)
        return cls(n=p, random_state=seed)

    calls: list[int] = []

    def count(coalitions: np.ndarray) -> np.ndarray:
        coalitions = np.atleast_2d(coalitions)
        calls.append(len(coalitions))
        return np.zeros(len(coalitions))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make().approximate(budget=budget, game=count)
        evaluations = sum(calls)
        rng = np.random.default_rng([seed, 31])
        per, extra = divmod(budget, evaluations)
        seen = [0]

        def noisy(coalitions: np.ndarray) -> np.ndarray:
            idx = np.atleast_2d(coalitions).astype(int) @ weights
            reps = np.full(len(idx), per)
            first = seen[0]
            reps[: max(0, extra - first)] += 1
            seen[0] += len(idx)
            return np.asarray(rng.binomial(np.maximum(reps, 1), values[idx]) / np.maximum(reps, 1))

        iv = make().approximate(budget=budget, game=noisy)
    return np.asarray(iv.get_n_order_values(1), dtype=float)


SHAPIQ = ("KernelSHAP", "UnbiasedKernelSHAP", "SVARM", "StratifiedSamplingSV",
          "PermutationSamplingSV")


def shapley_table(args: argparse.Namespace) -> None:
    budget = args.shapley_budget
    print(f"\nShapley RMSE at equal budget ({budget} rollouts, {args.shapley_seeds} seeds; "
          "ours and the paper's through the engine, shapiq on the same noisy game)")
    head = ["game", "CAR", "CAR coverage", "paper", "CAR/paper", *SHAPIQ, "CAR/best shapiq"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for model in (syn.and_game(), syn.or_game(), syn.three_way()):
        truth = np.array(model.shapley())
        ours, paper, cover = [], [], 0
        peers: dict[str, list[np.ndarray]] = {n: [] for n in SHAPIQ}
        for s in range(args.shapley_seeds):
            run = model.failing_run(s)
            res = car.shapley(run, model.agent(), outcome=model.outcome, budget=budget, seed=s,
                              progress=False)
            est = np.array([v.estimate for v in res.values])
            ours.append(est)
            cover += sum(v.ci[0] <= t <= v.ci[1] for v, t in zip(res.values, truth, strict=True))
            paper.append(np.array(paper_shapley(run, model.agent(), outcome=model.outcome,
                                                budget=budget, seed=s).values))
            for name in SHAPIQ:
                peers[name].append(shapiq_estimate(name, model, budget, s))

        def rmse(xs: list[np.ndarray], truth: np.ndarray = truth) -> float:
            return float(np.sqrt(np.mean((np.array(xs) - truth[None, :]) ** 2)))

        r_ours, r_paper = rmse(ours), rmse(paper)
        r_peers = {n: rmse(v) for n, v in peers.items()}
        best = min(r_peers.values())
        cells = [model.name, f"{r_ours:.4f}", f"{cover / (len(ours) * len(truth)):.1%}",
                 f"{r_paper:.4f}", f"{r_ours / r_paper:.2f}",
                 *(f"{r_peers[n]:.4f}" for n in SHAPIQ), f"{r_ours / best:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)


SECTIONS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "locus": locus_table, "fwer": fwer_table, "bias": bias_table, "coupling": coupling_table,
    "engine": engine_check,
    "shapley": shapley_table}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds per locus-grid cell")
    parser.add_argument("--fwer-seeds", type=int, default=2000)
    parser.add_argument("--bias-seeds", type=int, default=200)
    parser.add_argument("--engine-seeds", type=int, default=20)
    parser.add_argument("--shapley-seeds", type=int, default=100)
    parser.add_argument("--shapley-budget", type=int, default=400)
    parser.add_argument("--rescue", type=float, nargs="+", default=[0.15, 0.3, 0.5])
    parser.add_argument("--steps", type=int, nargs="+", default=[4, 8, 24, 64])
    parser.add_argument("--flip", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(SECTIONS))
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(f"seeds {args.seeds} per cell; K = {K}; alpha = {ALPHA}\n")
    for name, section in SECTIONS.items():
        if name not in args.skip:
            section(args)
    print(f"\nelapsed {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
