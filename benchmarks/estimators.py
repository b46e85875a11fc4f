"""CAR's estimators against the paper's rules and an oracle, through the engine, on planted
agents at three levels of shared noise; Shapley against the paper and shapiq.

    nice -n 10 .venv/bin/python benchmarks/estimators.py [--seeds 100] [--long-seeds 40]
        [--fwer-seeds 2000] [--fwer-sim-seeds 2000] [--workers 2] [--quick]
        [--rescue 0.3 ...] [--steps 8 ...] [--flip 0 ...]
        [--coupling none ...] [--resume-seeds 100] [--resume-fwer-seeds 500]
        [--resume-steps 4 8] [--pool-seeds 300]
        [--limit-seeds 200] [--limit-engine-seeds 20] [--limit-k 32]
        [--skip grid fwer fwer-sim resume pooling limit shapley]

Locus grid. Each row is a ``synthetic.PlantedDesk``: an ``n``-step ``car.FunctionAgent`` whose
step ``⌊2n/3⌋`` denies a refund (the recorded failure) and approves w.p. ``rescue`` when
resampled, judged by an LLM-judge-like outcome that errs w.p. ``flip``, so the rescue the
estimators can see is ``(1 − 2·flip)·rescue``. ``coupling``: ``full`` (policy, tool and judge
draw from CAR's noise), ``steps`` (the judge draws its own), ``none`` (nothing draws from
CAR's noise). The agent never tells CAR which. A judge that never errs draws nothing, so at
``flip = 0`` the ``steps`` desk is the ``full`` one and its row reuses those runs. Seed ``s``
records the desk's first failing run from ``s`` on and runs every estimator with ``seed=s``.
Per row, over ``--seeds`` seeds (``--long-seeds`` for rows of more than 8 steps, which cost
several times more), with 95% Wilson intervals:

- CAR: ``car.contrastive(run, agent, outcome=judge, rollouts=K)`` with its defaults (budget
  ``n·K``, K = 32): accuracy (locus = the pivot), wrong step (another step named), undecided
  (the budget ran out first), mean rollouts used, median ``|effect − truth|`` over the seeds
  that named the pivot;
- the paper's fixed-K rule (``paper_baseline.paper_contrastive``, ``K`` rollouts per step
  against the one observed outcome, percentile bootstrap, no multiplicity control) through the
  same engine on the uncoupled desk: its rollouts never share noise, so its law is the same at
  every coupling and it is run once per (rescue, n, flip). Only the pivot and the steps after it
  are run: the others cannot change whether the latest significant step is the pivot. Median
  ``|effect − truth|`` is its estimate at the pivot over every seed;
- the oracle (``oracle.matched_power``): knows the pivot and spends ``n·K`` rollouts on its two
  arms, one-sided at α: exact sign test on coupled pairs at ``full``, Fisher's exact test at
  ``steps`` and ``none`` (nothing it compares shares noise there); exact power, no noise;
- the located design (``oracle.locating_power``): what the budget buys when the pivot is not
  known — the best of a family of fixed designs that knows the rates and the coupling but not
  the pivot (every arm tested against the held arm at once, by Bonferroni or in fixed
  sequence), each naming a step without rescue w.p. ``≤ α``; exact power, no noise.

Targets per row: accuracy ≥ min(95%, oracle) − 3 points; wrong step ≤ α; undecided ≤ 5% where
the oracle reaches 95%; CAR's median ``|effect − truth|`` ≤ the paper's. A miss is marked ``*``
when the 95% interval still reaches the target (the seeds cannot tell). Beside them, "vs
located" says where CAR's accuracy is more than 3 points below the located design's: the gap
to the oracle that a search which must find the pivot cannot be blamed for is the one down to
that design.

Family-wise error: desks with no cause (``rescue = 0``: the judge's error is the only thing
that varies the outcome), through the engine at every coupling over ``--fwer-seeds`` seeds
(from 10000); ``fwer-sim`` repeats it over ``--fwer-sim-seeds`` on the vectorised simulator
(``synthetic.SampledArms``: the search ``car.contrastive`` runs, on arms drawn with the
engine's law; a no-cause desk and ``synthetic.no_cause`` are the same coin at every coupling)
for the seed counts and run lengths the engine cannot afford.

What the continue hint buys (``resume``): on the grid's desks of ``--resume-steps`` and the
no-cause desks above, ``--resume-seeds`` (``--resume-fwer-seeds``) seeds, each attributed with a
store and, where undecided, resumed once with ``budget=car.Budget(**res.larger_budget())`` (the
store reads the branches already run back; the cap doubled, or raised by the rollouts the result
says would decide it). Resuming is a second look at the data: the table
gives the answers after it, the share of stored branches the resumed search asked for again,
and the family-wise error of the two looks together; ``fwer-sim`` adds the same two-look error
on the simulator (the search at twice the budget on the same seed reads every draw of the first
back, as the journal does).

The re-estimate (``pooling``): on the simulator's 4- and 8-step rows, ``--pool-seeds`` seeds
each, the estimate CAR reports (the confirmation's pairs but the one it stopped on, pooled with
the fresh rollouts) against the fresh rollouts alone, from the same decisions: error, bias,
coverage of the truth and half-width over the seeds that named the pivot.

Cost against the information limit (``limit``, ``limit_table.py``): on one-rise rows and
two-rise rows (an AND pair, the later rescue smaller than, equal to or larger than the earlier
one), arms sharing no noise, ``--limit-seeds`` seeds a row on the simulator and
``--limit-engine-seeds`` through the engine at ``--limit-k`` rollouts a step: accuracy (the
latest rise named; the whole claim made and true) and mean rollouts when the first step was
confirmed and when the claim was decided, over the fixed-confidence lower bounds
``T*·kl(α, 1 − α)`` for a told pivot and for the claim itself (``oracle.told_pivot``,
``oracle.pivot_unknown``).

Shapley RMSE at equal budget against the paper's estimator and shapiq's approximators on the
same noisy games, with our interval coverage.

Every section prints its CPU seconds per seed; ``--workers 2`` spreads seeds over processes
(niced to at least 10, as the command should be).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from limit_table import table as limit_table  # noqa: E402
from oracle import locating_power, matched_power  # noqa: E402
from paper_baseline import paper_contrastive, paper_shapley  # noqa: E402

import car_core as car  # noqa: E402
from car_core.errors import OutcomeMismatch  # noqa: E402
from car_core.estimators import refit as refit_mod  # noqa: E402
from car_core.estimators import search as search_mod  # noqa: E402
from car_core.model.budget import MOST_MORE, larger_budget  # noqa: E402
from car_core.model.vocabulary import Answer  # noqa: E402
from car_core.stats import wilson  # noqa: E402
from car_core.stats.sequential import Prior  # noqa: E402
from car_core.store import RunStore  # noqa: E402
from car_core.testing import synthetic as syn  # noqa: E402

K = 32
ALPHA = 0.05
CHUNK = 5          # seeds per job handed to a worker
LONG = 8           # rows with more steps than this cost ~7x more a seed (``--long-seeds``)
FWER_BASE = 10_000  # first seed of the family-wise error runs


@dataclass(frozen=True)
class Cell:
    """One (rescue, n, flip) of the grid: a desk whose pivot is step ``⌊2n/3⌋``."""

    rescue: float
    n: int
    flip: float

    @property
    def at(self) -> int:
        return (2 * self.n) // 3

    @property
    def truth(self) -> float:
        return (1 - 2 * self.flip) * self.rescue

    def desk(self, coupling: str, seed: int) -> syn.PlantedDesk:
        return syn.PlantedDesk(self.n, self.at, self.rescue, self.flip, coupling, seed)


# -- one seed of each estimator, through the engine --------------------------------------------
def checked(run: car.Trajectory, desk: syn.PlantedDesk, **kwargs: Any
            ) -> car.ContrastiveResult | None:
    """``car.contrastive`` on the desk's run, or None where it refuses the judge before any
    branch: a judge that errs w.p. ``e`` scores the record on the wrong side all three times
    w.p. ``e³`` (``outcome.check_on_record``), and the user gets no answer — counted as
    undecided, and as ``refused``."""
    try:
        return car.contrastive(run, desk.agent(), outcome=desk.judge, rollouts=K, alpha=ALPHA,
                               progress=False, **kwargs)
    except OutcomeMismatch:
        return None


def car_seed(cell: Cell, coupling: str, seed: int) -> dict[str, Any]:
    desk = cell.desk(coupling, seed)
    run = desk.failing_run()
    res = checked(run, desk, seed=seed)
    if res is None:
        return {"hit": False, "wrong": False, "undecided": True, "used": 0, "err": None,
                "refused": True}
    hit = res.locus == desk.locus
    effect = res.steps[cell.at].effect if hit else None
    return {"hit": hit, "wrong": res.locus is not None and not hit,
            "undecided": res.answer == Answer.UNDECIDED, "used": res.rollouts_used,
            "err": abs(effect - cell.truth) if effect is not None else None}


def paper_seed(cell: Cell, coupling: str, seed: int) -> dict[str, Any]:
    desk = cell.desk(coupling, seed)
    run = desk.failing_run()
    res = paper_contrastive(run, desk.agent(), outcome=desk.judge, rollouts=K, seed=seed,
                            steps=range(cell.at, cell.n))
    effect = res.effects[res.tested.index(cell.at)]
    return {"hit": res.locus == cell.at, "err": abs(effect - cell.truth)}


def fwer_seed(cell: Cell, coupling: str, seed: int) -> dict[str, Any]:
    desk = cell.desk(coupling, seed)
    res = checked(desk.failing_run(), desk, seed=seed)
    if res is None:
        return {"false": False, "undecided": True, "used": 0, "refused": True}
    return {"false": res.locus is not None, "undecided": res.answer == Answer.UNDECIDED,
            "used": res.rollouts_used}


def fwer_sim_seed(cell: Cell, coupling: str, seed: int) -> dict[str, Any]:
    """The simulator's arms give each (arm, rollout) the same draw whatever the budget, so the
    search at the hint's larger budget (``larger_budget``, as ``car.contrastive`` words it) on
    the same seed is the resume the continue hint asks for: every branch the first search ran
    is read back, as the store's journal does."""
    from car_core.estimators.search import search
    model = syn.no_cause(cell.n, 0.5)
    budget = cell.n * K
    d = search(syn.SampledArms(model, seed, budget, coupling), cell.n, budget, ALPHA,
               intervals=False)
    # undecided: the budget ran out, or no rise was seen but a cause not ruled out
    out = {"false": bool(d.significant), "undecided": bool(d.exhausted or d.open_cause),
           "used": d.decided_spent, "r_false": bool(d.significant), "r_undecided": False}
    if d.exhausted or d.open_cause:
        larger = larger_budget(None, None, budget, d.more_rollouts)["rollouts"]
        again = search(syn.SampledArms(model, seed, larger, coupling), cell.n, larger, ALPHA,
                       intervals=False)
        out.update(r_false=bool(again.significant),
                   r_undecided=bool(again.exhausted or again.open_cause))
    return out


def resume_seed(cell: Cell, coupling: str, seed: int) -> dict[str, Any]:
    """CAR as a user runs it with a store: an undecided answer resumed once with the budget
    its continue hint names (``res.larger_budget()``), the branches already run read back."""
    desk = cell.desk(coupling, seed)
    run = desk.failing_run()
    with tempfile.TemporaryDirectory() as tmp, RunStore(Path(tmp) / "car.db") as store:
        first = checked(run, desk, seed=seed, store=store)
        if first is None:  # no answer, nothing to resume
            return {"undecided": False, "hit": False, "named": False, "refused": True}
        out: dict[str, Any] = {"undecided": first.answer == Answer.UNDECIDED,
                               "hit": first.locus == desk.locus,
                               "named": first.locus is not None}
        if not out["undecided"]:
            return out
        kept = len(store.branches(first.attribution_id))
        budget = first.larger_budget()
        grown = checked(run, desk, seed=seed, store=store,
                        attribution_id=first.attribution_id, budget=car.Budget(**budget))
        if grown is None:  # the resume checks the judge again, and it may refuse this time
            return {**out, "kept": kept, "more": first.more_rollouts,
                    "added": budget["rollouts"] - first.rollouts_used, "refused": True,
                    "r_hit": False, "r_named": False, "r_undecided": True}
        drawn = len(store.branches(first.attribution_id)) - kept
    return {**out, "kept": kept, "drawn": drawn, "reused": grown.rollouts_used - drawn,
            "added": budget["rollouts"] - first.rollouts_used, "more": first.more_rollouts,
            "r_hit": grown.locus == desk.locus, "r_named": grown.locus is not None,
            "r_undecided": grown.answer == Answer.UNDECIDED}


KINDS: dict[str, Callable[[Cell, str, int], dict[str, Any]]] = {
    "car": car_seed, "paper": paper_seed, "fwer": fwer_seed, "fwer-sim": fwer_sim_seed,
    "resume": resume_seed}
Job = tuple[str, Cell, str, tuple[int, ...]]


def run_job(job: Job) -> tuple[Job, list[dict[str, Any]], float]:
    kind, cell, coupling, seeds = job
    started = time.process_time()
    out = [KINDS[kind](cell, coupling, s) for s in seeds]
    return job, out, time.process_time() - started


def _niced() -> None:
    os.nice(max(0, 10 - os.nice(0)))


Cpu = dict[tuple[str, int, str, Cell], float]


def run_jobs(jobs: list[Job], workers: int) -> tuple[dict[tuple[str, Cell, str], list[Any]], Cpu]:
    """Every job's results by (kind, cell, coupling), and CPU seconds by (kind, n, coupling,
    cell)."""
    results: dict[tuple[str, Cell, str], list[Any]] = defaultdict(list)
    cpu: Cpu = defaultdict(float)
    done, started = 0, time.monotonic()
    if workers > 1:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_niced)
        stream: Iterable[tuple[Job, list[Any], float]] = pool.imap_unordered(run_job, jobs)
    else:
        pool, stream = None, map(run_job, jobs)
    try:
        for (kind, cell, coupling, _seeds), out, seconds in stream:
            results[(kind, cell, coupling)].extend(out)
            cpu[(kind, cell.n, coupling, cell)] += seconds
            done += 1
            if sys.stderr.isatty():
                print(f"\r  {done}/{len(jobs)} jobs, {time.monotonic() - started:.0f}s ",
                      end="", file=sys.stderr, flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return results, cpu


def chunks(kind: str, cell: Cell, coupling: str, seeds: range) -> list[Job]:
    return [(kind, cell, coupling, tuple(seeds[i:i + CHUNK])) for i in range(0, len(seeds), CHUNK)]


# -- formatting --------------------------------------------------------------------------------
def rate(k: int, n: int) -> tuple[float, float, float]:
    lo, hi = wilson(k / n, n)
    return k / n, lo, hi


def pct(k: int, n: int) -> str:
    p, lo, hi = rate(k, n)
    return f"{p:.0%} [{lo:.0%}, {hi:.0%}]"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def cost_table(cpu: Cpu, seeds: Callable[[str, int], int]) -> None:
    print("\nCPU seconds per seed (mean over the rows of each n; one core)")
    print("| estimator | n | coupling | s/seed |")
    print("|---|---|---|---|")
    rows: dict[tuple[str, int, str], float] = defaultdict(float)
    cells: dict[tuple[str, int, str], int] = defaultdict(int)
    for (kind, n, coupling, _cell), seconds in cpu.items():
        rows[(kind, n, coupling)] += seconds
        cells[(kind, n, coupling)] += 1
    for (kind, n, coupling), seconds in sorted(rows.items()):
        per = seconds / (seeds(kind, n) * cells[(kind, n, coupling)])
        print(f"| {kind} | {n} | {coupling} | {per:.3f} |")


# -- the locus grid ----------------------------------------------------------------------------
def grid(args: argparse.Namespace) -> None:
    """The table, printed a run length at a time (shortest first) so a long run that is
    stopped still leaves whole rows behind."""
    long = f"; {args.long_seeds} (0–{args.long_seeds - 1}) where n > {LONG}" if any(
        n > LONG for n in args.steps) and args.long_seeds != args.seeds else ""
    print(f"Locus grid through the engine: {args.seeds} seeds (0–{args.seeds - 1}) per row"
          f"{long}, K = {K}, budget n·K, α = {ALPHA}; rates with 95% Wilson intervals. Without a "
          "judge error the judge draws nothing, so `steps` is `full` there (the same runs).")
    print("| n | rescue | flip | coupling | CAR accuracy | wrong step | undecided "
          "| CAR rollouts | CAR med \\|err\\| | paper accuracy | paper med \\|err\\| | oracle "
          "| targets | located | vs located |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    misses: dict[str, int] = defaultdict(int)
    cpu: Cpu = defaultdict(float)
    for n in sorted(args.steps):
        cells = [Cell(r, n, f) for r in args.rescue for f in args.flip]
        jobs = [job for cell in cells for coupling in args.coupling
                if not same_as_full(cell, coupling, args)
                for job in chunks("car", cell, coupling, seeds_of(cell, args))]
        jobs += [job for cell in cells
                 for job in chunks("paper", cell, "none", seeds_of(cell, args))]
        results, spent = run_jobs(jobs, args.workers)
        cpu.update(spent)
        for cell in cells:
            if same_as_full(cell, "steps", args):
                results[("car", cell, "steps")] = results[("car", cell, "full")]
            grid_rows(cell, results, args, misses)
    total = len(args.steps) * len(args.rescue) * len(args.flip) * len(args.coupling)
    print(f"\nRows missing a target (of {total}): "
          + ", ".join(f"{name} {misses[name]}" for name in ("accuracy", "wrong", "undecided",
                                                              "error"))
          + f"; below the located design by more than 3 points: {misses['located']}")
    print(f"Seeds whose judge the outcome check refused before any branch (counted undecided): "
          f"{misses['refused']}")
    cost_table(cpu, lambda kind, n: (args.long_seeds if n > LONG else args.seeds))


def grid_rows(cell: Cell, results: dict[tuple[str, Cell, str], list[Any]],
              args: argparse.Namespace, misses: dict[str, int]) -> None:
    paper = results[("paper", cell, "none")]
    p_hits = sum(r["hit"] for r in paper)
    p_err = median([r["err"] for r in paper])
    for coupling in args.coupling:
        rows = results[("car", cell, coupling)]
        s = len(rows)
        hits = sum(r["hit"] for r in rows)
        wrong = sum(r["wrong"] for r in rows)
        und = sum(r["undecided"] for r in rows)
        misses["refused"] += sum(bool(r.get("refused")) for r in rows)
        err = median([r["err"] for r in rows if r["err"] is not None])
        oracle = matched_power(coupling, cell.n * K, cell.rescue, cell.flip, ALPHA)
        verdict = targets(hits, wrong, und, s, err, p_err, oracle, misses)
        located, _design = locating_power(coupling, cell.n, cell.n * K, cell.rescue, cell.flip,
                                          ALPHA)
        versus = against_located(hits, s, located, misses)
        print(f"| {cell.n} | {cell.rescue} | {cell.flip} | {coupling} | {pct(hits, s)} "
              f"| {pct(wrong, s)} | {pct(und, s)} "
              f"| {np.mean([r['used'] for r in rows]):.0f} of {cell.n * K} | {_num(err)} "
              f"| {pct(p_hits, len(paper))} | {_num(p_err)} | {oracle:.1%} | {verdict} "
              f"| {located:.1%} | {versus} |", flush=True)


def same_as_full(cell: Cell, coupling: str, args: argparse.Namespace) -> bool:
    """A judge that never errs draws nothing, so its own stream changes nothing: the
    ``steps`` desk runs exactly the ``full`` desk's branches, and they are run once."""
    return coupling == "steps" and cell.flip == 0 and "full" in args.coupling


def seeds_of(cell: Cell, args: argparse.Namespace) -> range:
    return range(args.long_seeds if cell.n > LONG else args.seeds)


def targets(hits: int, wrong: int, und: int, s: int, err: float | None, p_err: float | None,
            oracle: float, misses: dict[str, int]) -> str:
    """The row's misses; ``*`` where the 95% interval still reaches the target."""
    out = []
    want = min(0.95, oracle) - 0.03
    checks = [("accuracy", hits, want, True), ("wrong", wrong, ALPHA, False)]
    if oracle >= 0.95:
        checks.append(("undecided", und, 0.05, False))
    for name, k, bound, at_least in checks:
        p, lo, hi = rate(k, s)
        if (p < bound) if at_least else (p > bound):
            misses[name] += 1
            noise = (hi >= bound) if at_least else (lo <= bound)
            out.append(f"{name}{'*' if noise else ''}")
    if err is None or (p_err is not None and err > p_err):
        misses["error"] += 1
        out.append("error")
    return "ok" if not out else "missed: " + ", ".join(out)


def against_located(hits: int, s: int, located: float, misses: dict[str, int]) -> str:
    """CAR's accuracy beside the best fixed design that does not know the pivot: "below"
    where it is more than 3 points under it (``*`` where the interval still reaches it)."""
    p, _lo, hi = rate(hits, s)
    if p >= located - 0.03:
        return "ok"
    misses["located"] += 1
    return "below*" if hi >= located - 0.03 else "below"


# -- family-wise error -------------------------------------------------------------------------
# the judge a fair coin, or wrong 20% of the time; 4-step desks, the length at which the engine
# affords 2000 seeds a coupling level on the shared machine (longer runs: ``fwer-sim``)
FWER_CELLS = (Cell(0.0, 4, 0.5), Cell(0.0, 4, 0.2))
FWER_SIM_CELLS = (Cell(0.0, 8, 0.5), Cell(0.0, 24, 0.5))


def _fwer(args: argparse.Namespace, kind: str, cells: tuple[Cell, ...], what: str,
          count: int) -> None:
    seeds = range(FWER_BASE, FWER_BASE + count)
    # the simulator's no-cause outcome reads only the judge's draws, which ``steps`` does not
    # share either: those arms are the ``none`` arms, draw for draw, so they are run once
    reuse = kind == "fwer-sim" and "none" in args.coupling
    jobs = [job for cell in cells for coupling in args.coupling
            if not (reuse and coupling == "steps")
            for job in chunks(kind, cell, coupling, seeds)]
    results, cpu = run_jobs(jobs, args.workers)
    for cell in cells:
        if reuse:
            results[(kind, cell, "steps")] = results[(kind, cell, "none")]
    print(f"\nFamily-wise error at α = {ALPHA} on models with no cause, {what}, "
          f"{count} seeds each ({FWER_BASE}–{FWER_BASE + count - 1}), "
          f"budget n·{K}: a locus named at all is a false one")
    if reuse:
        print("(`steps` is `none` here, the same runs: only the judge draws, and neither "
              "shares it)")
    resumed = kind == "fwer-sim"
    more = (" | after one resume: false loci | FWER | still undecided", "---|---|---")
    print("| model | coupling | false loci | FWER [95% Wilson] | undecided | rollouts | ≤ α"
          f"{more[0] if resumed else ''} |")
    print(f"|---|---|---|---|---|---|---{'|' + more[1] if resumed else ''}|")
    for cell in cells:
        for coupling in args.coupling:
            rows = results[(kind, cell, coupling)]
            s = len(rows)
            false = sum(r["false"] for r in rows)
            und = sum(r["undecided"] for r in rows)
            judge = f"judge errs {cell.flip:.0%}" if kind == "fwer" else "base rate 0.5"
            refused = sum(bool(r.get("refused")) for r in rows)
            if refused:
                judge += f", {refused} refused by the outcome check (counted undecided)"
            line = (f"| {cell.n} steps, {judge} | {coupling} | {false} | {pct(false, s)} "
                    f"| {pct(und, s)} | {np.mean([r['used'] for r in rows]):.0f} "
                    f"| {within_alpha(false, s)}")
            if resumed:
                r_false = sum(r["r_false"] for r in rows)
                line += (f" | {r_false} | {pct(r_false, s)} "
                         f"| {pct(sum(r['r_undecided'] for r in rows), s)}")
            print(line + " |", flush=True)
    cost_table(cpu, lambda kind, n: count)


def within_alpha(false: int, s: int) -> str:
    """``yes`` if the rate is at most α, ``no*`` if only its interval reaches α."""
    _, lo, _ = rate(false, s)
    return "yes" if false / s <= ALPHA else ("no*" if lo <= ALPHA else "no")


def fwer(args: argparse.Namespace) -> None:
    _fwer(args, "fwer", FWER_CELLS, "through the engine (planted desks)", args.fwer_seeds)


def fwer_sim(args: argparse.Namespace) -> None:
    _fwer(args, "fwer-sim", FWER_SIM_CELLS,
          "on the simulator (synthetic.no_cause on SampledArms, the search car.contrastive runs)",
          args.fwer_sim_seeds)


# -- what the continue hint buys ---------------------------------------------------------------
def resume_section(args: argparse.Namespace) -> None:
    """Every undecided seed resumed once from its store, as the hint says, on the grid's desks
    and on the no-cause desks of the FWER section."""
    steps = [n for n in args.steps if n in args.resume_steps]
    cells = [Cell(r, n, f) for n in steps for r in args.rescue for f in args.flip]
    seeds = range(args.resume_seeds)
    fwer_seeds = range(FWER_BASE, FWER_BASE + args.resume_fwer_seeds)
    jobs = [job for cell in cells for coupling in args.coupling
            if not same_as_full(cell, coupling, args)
            for job in chunks("resume", cell, coupling, seeds)]
    jobs += [job for cell in FWER_CELLS for coupling in args.coupling
             for job in chunks("resume", cell, coupling, fwer_seeds)]
    results, cpu = run_jobs(jobs, args.workers)
    for cell in cells:
        if same_as_full(cell, "steps", args):
            results[("resume", cell, "steps")] = results[("resume", cell, "full")]
    print(f"Undecided seeds resumed once through the engine with a store, as the continue hint "
          f"says (`budget=car.Budget(**res.larger_budget())`: the n·{K} cap doubled, or raised "
          f"by the \"about N more\" the result printed, up to {1 + MOST_MORE}·n·{K}), "
          f"{args.resume_seeds} seeds (0–{args.resume_seeds - 1}) per row; rows with no "
          "undecided seed left out. \"asked again\": of the branches the first attempt "
          "stored, the share the resumed search read back (the larger budget can send it "
          "another way); \"run\": rollouts the resume ran, against the rollouts it added.")
    print("| n | rescue | flip | coupling | accuracy first | undecided | → pivot | → undecided "
          "| → wrong step | → no cause | accuracy after | added (mean) | asked again "
          "| run of added "
          "| \"about N more\" given | decided where N ≤ added |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cell in cells:
        for coupling in args.coupling:
            resume_row(cell, coupling, results[("resume", cell, coupling)])
    print(f"\nFamily-wise error of attributing and, where undecided, resuming once, through "
          f"the engine on the FWER section's no-cause desks, {args.resume_fwer_seeds} seeds "
          f"each ({FWER_BASE}–{FWER_BASE + args.resume_fwer_seeds - 1}): a locus named at "
          "either look is a false one")
    print("| model | coupling | false at first | undecided | false after resume "
          "| FWER after one resume | still undecided | ≤ α |")
    print("|---|---|---|---|---|---|---|---|")
    for cell in FWER_CELLS:
        for coupling in args.coupling:
            rows = results[("resume", cell, coupling)]
            n = len(rows)
            first = sum(r["named"] for r in rows)
            und = [r for r in rows if r["undecided"]]
            false = first + sum(r["r_named"] for r in und)
            print(f"| {cell.n} steps, judge errs {cell.flip:.0%} | {coupling} | {first} "
                  f"| {pct(len(und), n)} | {false - first} | {pct(false, n)} "
                  f"| {pct(sum(r['r_undecided'] for r in und), n)} | {within_alpha(false, n)} |",
                  flush=True)
    everyone = [r for rows in results.values() for r in rows]
    print(f"\nRefused by the outcome check (a judge that scored the record fine three times; "
          f"counted no answer at the first look, still undecided at the resume): "
          f"{sum(bool(r.get('refused')) and not r['undecided'] for r in everyone)} first looks, "
          f"{sum(bool(r.get('refused')) and r['undecided'] for r in everyone)} resumes")
    cost_table(cpu, lambda kind, n: args.resume_seeds)


def resume_row(cell: Cell, coupling: str, rows: list[dict[str, Any]]) -> None:
    und = [r for r in rows if r["undecided"]]
    if not und:
        return
    s = len(rows)
    hit = sum(r["r_hit"] for r in und)
    still = sum(r["r_undecided"] for r in und)
    wrong = sum(r["r_named"] and not r["r_hit"] for r in und)
    given = [r for r in und if r["more"]]
    within = [r for r in given if r["more"] <= r["added"]]
    first = sum(r["hit"] for r in rows)
    ran_again = [r for r in und if not r.get("refused")]  # a refused resume ran nothing
    asked = sum(r["reused"] for r in ran_again) / max(sum(r["kept"] for r in ran_again), 1)
    ran = sum(r["drawn"] for r in ran_again) / max(sum(r["added"] for r in ran_again), 1)
    print(f"| {cell.n} | {cell.rescue} | {cell.flip} | {coupling} | {pct(first, s)} "
          f"| {len(und)} of {s} | {hit} | {still} | {wrong} | {len(und) - hit - still - wrong} "
          f"| {pct(first + hit, s)} | {np.mean([r['added'] for r in und]):.0f} | {asked:.0%} "
          f"| {ran:.0%} | {len(given)} of {len(und)} "
          f"| {sum(not r['r_undecided'] for r in within)} of {len(within)} |", flush=True)


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



# -- the re-estimate: the test's pairs pooled with fresh ones, or fresh ones alone --------------
def _fresh_only(src: syn.SampledArms, d: search_mod.Decision) -> tuple[float, tuple[float, float]]:
    """The estimate and interval from the re-estimate's fresh rollouts alone (what CAR
    reported before it pooled the test's pairs), read back from the simulator's draws."""
    c, at = d.candidate or 0, search_mod.REFIT
    paired = src.drawn(c + 1, range(at, at + refit_mod.REFIT_APART)).size > 0
    first = at if paired else at + refit_mod.REFIT_APART
    hi = src.drawn(c + 1, range(first, first + refit_mod.REFIT_APART))
    lo = src.drawn(c, range(at, at + refit_mod.REFIT_APART))
    # the search's own interval, on these rollouts alone
    est, cs = refit_mod.reported_interval(np.zeros(0), np.array([0.0]), ALPHA, paired, True,
                                   Prior(), True, hi, lo)
    assert cs is not None
    return est, cs.ci


def pooling(args: argparse.Namespace) -> None:
    """Pooled against fresh-only re-estimates on the simulator, the same seeds and decisions:
    over the seeds that named the pivot with a re-estimate, median and mean error, coverage of
    the truth by the interval, median half-width."""
    print(f"Re-estimate on the simulator (synthetic.pivot on SampledArms, the search "
          f"car.contrastive runs), {args.pool_seeds} seeds per row, budget n·{K}: pooled (the "
          "test's pairs but the one it stopped on, with the fresh ones: what CAR reports) "
          "against the fresh rollouts alone, over the seeds that named the pivot and "
          "re-estimated it.")
    print("| n | rescue | flip | coupling | re-estimated | med \\|err\\| pooled | fresh | "
          "mean err pooled | fresh | coverage pooled | fresh | med half-width pooled | fresh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for n in sorted(s for s in args.steps if s <= LONG):
        for cell in (Cell(r, n, f) for r in args.rescue for f in args.flip):
            for coupling in args.coupling:
                if same_as_full(cell, coupling, args):
                    continue
                model = syn.pivot(n, cell.at, 1 - cell.rescue, cell.flip)
                rows: dict[str, list[tuple[float, tuple[float, float]]]] = {"p": [], "f": []}
                for seed in range(args.pool_seeds):
                    src = syn.SampledArms(model, seed, n * K, coupling)
                    d = search_mod.search(src, n, n * K, ALPHA, k=K)
                    if not (d.significant and d.candidate == cell.at and d.refit is not None
                            and d.interval is not None and d.refit_pairs > d.refit_pooled):
                        continue
                    rows["p"].append((d.estimate or 0.0, d.interval.ci))
                    rows["f"].append(_fresh_only(src, d))
                cells = [str(n), str(cell.rescue), str(cell.flip), coupling, str(len(rows["p"]))]
                stats: dict[str, list[str]] = {"med": [], "mean": [], "cov": [], "hw": []}
                for key in ("p", "f"):
                    errs = [est - cell.truth for est, _ in rows[key]]
                    stats["med"].append(_num(median([abs(e) for e in errs])))
                    stats["mean"].append(f"{statistics.fmean(errs):+.3f}" if errs else "—")
                    covered = sum(lo <= cell.truth <= hi for _, (lo, hi) in rows[key])
                    stats["cov"].append(pct(covered, len(errs)) if errs else "—")
                    stats["hw"].append(_num(median([(hi - lo) / 2 for _, (lo, hi) in rows[key]])))
                print("| " + " | ".join(cells + [v for k in stats for v in stats[k]]) + " |",
                      flush=True)


def limit(args: argparse.Namespace) -> None:
    limit_table(sorted(args.steps), args.rescue, args.flip, args.limit_seeds,
                args.limit_engine_seeds, args.limit_k, ALPHA, args.workers)


SECTIONS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "grid": grid, "fwer": fwer, "fwer-sim": fwer_sim, "resume": resume_section,
    "pooling": pooling, "limit": limit, "shapley": shapley_table}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="seeds per grid row")
    parser.add_argument("--long-seeds", type=int, default=None,
                        help=f"seeds per grid row of more than {LONG} steps (default --seeds)")
    parser.add_argument("--fwer-seeds", type=int, default=2000, help="engine FWER seeds")
    parser.add_argument("--fwer-sim-seeds", type=int, default=2000, help="simulator FWER seeds")
    parser.add_argument("--resume-seeds", type=int, default=100,
                        help="seeds per row of the resume section")
    parser.add_argument("--resume-fwer-seeds", type=int, default=500,
                        help="no-cause seeds per coupling of the resume section")
    parser.add_argument("--resume-steps", type=int, nargs="+", default=[4, 8],
                        help="run lengths of the resume section (of --steps)")
    parser.add_argument("--pool-seeds", type=int, default=300,
                        help="simulator seeds per row of the pooling section")
    parser.add_argument("--limit-seeds", type=int, default=200,
                        help="simulator seeds per row of the limit section")
    parser.add_argument("--limit-engine-seeds", type=int, default=20,
                        help="engine seeds per row of the limit section")
    parser.add_argument("--limit-k", type=int, default=K,
                        help="rollouts per step of the limit section's budget (n·k)")
    parser.add_argument("--shapley-seeds", type=int, default=100)
    parser.add_argument("--shapley-budget", type=int, default=400)
    parser.add_argument("--rescue", type=float, nargs="+", default=[0.15, 0.3, 0.5])
    parser.add_argument("--steps", type=int, nargs="+", default=[4, 8, 24])
    parser.add_argument("--flip", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--coupling", nargs="+", default=list(syn.COUPLINGS),
                        choices=syn.COUPLINGS)
    parser.add_argument("--workers", type=int, default=1,
                        help="processes (niced to at least 10); 2 on the shared machine")
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(SECTIONS))
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 6 seeds, 60 FWER seeds, 4 and 8 steps, no Shapley")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.fwer_seeds = min(args.seeds, 6), min(args.fwer_seeds, 60)
        args.fwer_sim_seeds = min(args.fwer_sim_seeds, 200)
        args.resume_seeds = min(args.resume_seeds, 6)
        args.resume_fwer_seeds = min(args.resume_fwer_seeds, 20)
        args.pool_seeds = min(args.pool_seeds, 20)
        args.limit_seeds = min(args.limit_seeds, 40)
        args.limit_engine_seeds = min(args.limit_engine_seeds, 4)
        args.steps = [n for n in args.steps if n <= 8] or [4]
        args.skip = sorted({*args.skip, "shapley"})
    if args.long_seeds is None:
        args.long_seeds = args.seeds
    started = time.monotonic()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; command: "
          f"estimators.py {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    for name, section in SECTIONS.items():
        if name not in args.skip:
            t = time.monotonic()
            section(args)
            print(f"({name}: {time.monotonic() - t:.0f}s wall)\n", flush=True)
    print(f"elapsed {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
