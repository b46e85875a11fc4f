"""How often ``make demo`` finds its locus on the embedded model, and how long it takes.

Runs the local-model demo (``car_adapters.demo.run_demo``) with ``--seeds`` seeds (the seed
picks the tickets' model seeds and the attribution's noise) and prints, per seed, the locus,
the rescue of removing the injection, the rollouts and the seconds; then the rate of seeds with
a locus, with its Wilson 95% interval.

    .venv/bin/python benchmarks/demo_seeds.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from car_adapters.demo import run_demo
from car_adapters.models.local import load_model

from car_core.stats import wilson


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args(argv)
    load_model()
    found = 0
    print(f"{'seed':>4} {'locus':>5} {'P(fail|resampled)':>17} {'P(fail|no injection)':>20} "
          f"{'rollouts':>8} {'truncated':>9} {'seconds':>7}")
    for seed in range(args.seeds):
        folder = Path(tempfile.mkdtemp(prefix="car-demo-seed-"))
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            r = run_demo(policy="local", store=str(folder / "car.db"), report=None,
                         progress=False, seed=seed)
        seconds = time.perf_counter() - started
        found += r["locus"] is not None
        print(f"{seed:4d} {str(r['locus']):>5} {r.get('resampled', float('nan')):17.2f} "
              f"{r.get('rescued', float('nan')):20.2f} {r.get('rollouts_used', 0):8d} "
              f"{str(r.get('truncated', '-')):>9} {seconds:7.0f}", flush=True)
    low, high = wilson(found / args.seeds, args.seeds, 0.95)
    print(f"locus found in {found} of {args.seeds} seeds ({found / args.seeds:.0%}, "
          f"95% interval [{low:.2f}, {high:.2f}])")


if __name__ == "__main__":
    main()
