"""The table the adapters' recording benchmarks print: per run and per step, the overhead over
the plain runs, the median ratio of the rounds, and one branch's cost."""

from __future__ import annotations

import statistics


def print_recording_table(title: str, times: dict[str, list[float]], runs: int, steps: int,
                          branch_s: float) -> None:
    """``times[case]`` holds each round's CPU seconds for ``runs`` runs of ``steps`` decisions;
    ``times["plain"]`` is the baseline every ratio is taken against, round by round."""
    plain = times["plain"]
    print(title)
    print(f"{'case':<36} {'ms/run':>8} {'ms/step':>8} {'overhead ms/step':>17} "
          f"{'x plain (median)':>17}")
    for case, ts in times.items():
        per_run = statistics.median(ts) / runs
        ratio = statistics.median(t / p for t, p in zip(ts, plain, strict=True))
        extra = (statistics.median(ts) - statistics.median(plain)) / runs / steps
        print(f"{case:<36} {per_run * 1e3:>8.2f} {per_run / steps * 1e3:>8.2f} "
              f"{extra * 1e3:>17.3f} {ratio:>17.2f}")
    print(f"{'branch at the last step (' + str(steps - 1) + ' held)':<36} "
          f"{branch_s * 1e3:>8.2f}")
