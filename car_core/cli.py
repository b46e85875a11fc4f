"""The ``car`` command (grown by the CLI work; this is the minimal entry point)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from . import synthetic as syn
        from .replay import intervene
        from .interventions import do_resample
        m = syn.pivot()
        run = m.failing_run()
        print(f"recorded run {run.id}: {[s.action['choice'] for s in run.steps]}")
        print(intervene(run, m.agent(), do_resample(m.locus or 0), outcome=m.outcome, rollouts=64))
        return 0
    print("usage: car demo", file=sys.stderr)
    return 2
