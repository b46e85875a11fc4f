"""What testing a fix on a population costs against re-running every run from the start K
times, in one run.

The population is ``TwoModeDesk``'s planted one (``car_core.testing.synthetic_population``):
``--early`` failed runs commit at step 1, ``--late`` at step ``n − 3``, ``--steps`` steps
each, with the planted usage of ``benchmarks/triage_cost.py`` (step ``k`` reads
``PROMPT + PER_STEP·k`` tokens). The fix is the planted instruction, which rescues the early
mode only (planted pooled rescue ``early · 0.3 / (early + late)``). For each K, side by side:

- **from the locus**: ``car.fix_population`` as ``car fix --failed`` runs it after a
  ``car triage``: each run branched at its locus, K rollouts with the fix and K without;
- **the same, with the triage**: plus the triage that found the loci (``K_triage`` per step);
- **from the start**: ``car.fix_population(from_step=0)``: each run re-run from step 0 K times
  with the fix and K times without — what re-running an eval set with repetitions costs.

``model calls`` are the policy's calls on the branches (counted by a wrapper), ``tokens`` the
usage their live steps reported; the last column is each row's tokens over the "from the
start" row of the same K. Both designs estimate the same rescue here (the steps before the
locus do not matter in this world), so the intervals are printed beside the cost.

    .venv/bin/python benchmarks/population_fix_cost.py          # 12 + 8 runs of 8 steps
    .venv/bin/python benchmarks/population_fix_cost.py --early 20 --late 10 --rollouts 16 64
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from triage_cost import CountedPolicy  # the planted usage and the call counter

import car_core as car
from car_core.testing.synthetic_population import TwoModeDesk


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--early", type=int, default=12, help="runs of the early mode")
    parser.add_argument("--late", type=int, default=8, help="runs of the late mode")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (6 to 8)")
    parser.add_argument("--rollouts", type=int, nargs="+", default=[16, 32, 64],
                        help="K: pairs per run")
    parser.add_argument("--triage-rollouts", type=int, default=16, help="K per step of the "
                                                                         "triage")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    desk = TwoModeDesk(n_steps=args.steps, early_at=1, late_at=args.steps - 3)
    base = desk.agent()
    policy = CountedPolicy(base.policy)
    agent = replace(base, policy=policy)
    runs = _first_failures(desk, agent, args.early, args.late, args.seed)
    n, total = args.steps, len(runs)
    planted = args.early * (desk.p_bad - desk.p_fixed) / total
    policy.calls = 0
    tri = car.triage(runs, agent, outcome=desk.outcome, rollouts=args.triage_rollouts,
                     seed=args.seed, executor="sequential")
    triage_calls, triage_tokens = policy.calls, tri.tokens
    print(f"population: {total} failed runs of {n} steps ({args.early} commit at step 1, "
          f"{args.late} at step {n - 3}); planted pooled rescue {planted:.3f}")
    print(f"triage (K = {args.triage_rollouts} per step): {tri.rollouts_used} rollouts, "
          f"{triage_calls} model calls, {triage_tokens} tokens")
    print(f"{'K':>4} {'design':34}{'rollouts':>10}{'model calls':>13}{'tokens':>11}"
          f"{'rescue [interval]':>24}{'tokens / start':>16}")
    for k in args.rollouts:
        rows = []
        for name, kwargs in (("from the locus", {"triage": tri}),
                             ("from the start", {"from_step": 0})):
            policy.calls = 0
            res = car.fix_population(runs, agent, outcome=desk.outcome, rollouts=k,
                                     seed=args.seed, executor="sequential",
                                     candidates=[car.Fix.instruction(desk.fix)], **kwargs)
            c = res.candidates[0]
            assert c.rescue is not None and c.rescue_ci is not None
            span = f"{c.rescue:.3f} [{c.rescue_ci[0]:.3f}, {c.rescue_ci[1]:.3f}]"
            rows.append((name, res.cost.rollouts, policy.calls, res.cost.tokens, span))
        start_tokens = rows[1][3]
        _, rollouts, calls, tokens, span = rows[0]
        rows.insert(1, ("from the locus, with the triage", rollouts + tri.rollouts_used,
                        calls + triage_calls, tokens + triage_tokens, span))
        for name, rollouts, calls, tokens, span in rows:
            print(f"{k:>4} {name:34}{rollouts:>10}{calls:>13}{tokens:>11}{span:>24}"
                  f"{tokens / start_tokens:>15.2f}x")


def _first_failures(desk: TwoModeDesk, agent: car.FunctionAgent, early: int, late: int,
                    seed: int) -> list[car.Trajectory]:
    """The first failing run of each mode from successive seeds (recorded with ``agent``)."""
    runs: list[car.Trajectory] = []
    s = seed
    for mode, count in (("early", early), ("late", late)):
        while sum(r.context["mode"] == mode for r in runs) < count:
            run = car.record(agent, context={"mode": mode}, outcome=desk.outcome, seed=s)
            s += 1
            if run.failed:
                runs.append(run)
    return runs


if __name__ == "__main__":
    main()
