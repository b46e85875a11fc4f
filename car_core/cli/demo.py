"""``car demo``: record a failing agent run, find the step that caused it and write the report.
The support-desk demo of ``car_adapters`` when it is installed; else a planted model that
works anywhere."""

from __future__ import annotations

import importlib
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

import car_core as car
from car_core import defaults
from car_core.cli import kit
from car_core.cli.app import ProgressOpt, StoreOpt, err, errors, out
from car_core.cli.attribute import print_result
from car_core.errors import InvalidInput
from car_core.report import render_attribution
from car_core.store import RunStore


class DemoPolicy(StrEnum):
    local = "local"
    synthetic = "synthetic"


def _builtin_demo(store: str, report_path: Path, progress: Any) -> Any:
    """A failing run of the planted pivot model, attributed and reported: works anywhere."""

    from car_core.testing import synthetic
    model = synthetic.pivot()
    with RunStore(store) as db:
        run = model.failing_run()
        db.save(run)
        out.print(Text(f"recorded failing run {run.id} of the synthetic pivot model "
                       f"({len(run.steps)} steps) in {store}"))
        bar = kit.make_progress(progress, "contrastive", len(run.steps) * defaults.ROLLOUTS,
                                 None)
        started = time.monotonic()
        try:
            result = car.contrastive(run, model.agent(), outcome=model.outcome,
                                     rollouts=defaults.ROLLOUTS,
                                     seed=0, store=db, progress=bar or False)
            if bar:
                bar.done()
        finally:
            if bar:
                bar.close()
        print_result(result, time.monotonic() - started, store, run)
        aid = result.attribution_id
        branches = list(db.branches(aid)) if aid else None
    report_path.write_text(render_attribution(result, run=run, branches=branches),
                           encoding="utf-8")
    out.print(Text(f"wrote {report_path}; re-run it with: car attribute {run.id} "
                   f"--agent car_core.synthetic:pivot --store {store}"))
    return result


@errors
def demo(policy: Annotated[DemoPolicy, typer.Option(
             "--policy", help="local: the embedded model; synthetic: a planted model.")]
         = DemoPolicy.local,
         store: StoreOpt = "car.db",
         out_path: Annotated[Path, typer.Option("--out", help="HTML report to write.")] = Path(
             "report.html"),
         progress: ProgressOpt = None) -> None:
    """Record a failing agent run, find the step that caused it, write the report."""
    try:
        module = importlib.import_module("car_adapters.demo")
    except ModuleNotFoundError as exc:
        if exc.name not in ("car_adapters", "car_adapters.demo"):
            raise InvalidInput(f"the demo needs {exc.name!r}, which is not installed",
                               hint="pip install 'causal-agent-replay[all]', or run "
                                    "`car demo --policy synthetic`") from None
        module = None
    if module is None:
        if policy is DemoPolicy.local:
            err.print("the local-model demo is not installed; running the synthetic demo")
        _builtin_demo(store, out_path, progress)
        return
    show_bar = progress if progress is not None else sys.stderr.isatty()
    module.run_demo(policy=policy.value, store=store, report=str(out_path), progress=show_bar)
