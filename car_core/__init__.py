"""Causal Agent Replay: find the step that caused an agent's failure by intervening on it.

The public API is exactly ``__all__``. Adapter authors also use ``car_core.contract`` (the agent
protocol and what a branch is given), ``car_core.errors`` and ``car_core.testing``; everything
else is internal and may change.
"""

from __future__ import annotations

import typing as _typing

from car_core import _moved
from car_core import results as _results
from car_core.assertions import assert_locus, assert_no_locus, assert_rescues
from car_core.engine.agent import Agent, FunctionAgent
from car_core.engine.execution import AsyncioExecutor, Sequential
from car_core.engine.replay import action_match_rate, intervene, record
from car_core.estimators import contrastive, shapley
from car_core.estimators.context import ContextAttribution, context_attribution, context_sources
from car_core.estimators.fixes import Fix
from car_core.estimators.pairs import export_pairs
from car_core.estimators.population_fix import fix_population
from car_core.estimators.repairs import (
    Candidate,
    RepairRanking,
    add_instruction,
    guard_observation,
    remove_sources,
    repairs,
)
from car_core.estimators.settings import ContrastiveSettings, ShapleySettings
from car_core.estimators.triage import triage
from car_core.model.budget import Budget
from car_core.model.interventions import (
    Intervention,
    do_action,
    do_context,
    do_observation,
    do_policy,
    do_resample,
)
from car_core.model.json_values import JSON
from car_core.model.trajectory import History, Lineage, Outcome, Step, Trajectory
from car_core.stats import Interval

if _typing.TYPE_CHECKING:
    from car_core.engine.ray_executor import RayExecutor
    from car_core.store import RunStore

Action = JSON
Observation = JSON

__version__ = "0.2.0"


def _render_html(result: dict[str, _typing.Any]) -> str:
    """A result's HTML report. The report sits on the top floor, above the results it renders,
    so the package wires it into them; jinja2 loads with the first report, not with the import."""
    from car_core.report import render_attribution
    return str(render_attribution(result))


_results.render_html_with(_render_html)


def __getattr__(name: str) -> _typing.Any:
    """``RunStore`` and ``RayExecutor`` load on first use: the store brings sqlite-utils, which
    ``import car_core`` (a recorder in a test suite, ``car --help``) should not pay for, and the
    Ray executor is for clusters (Ray itself loads only when it first runs branches)."""
    if name == "RunStore":
        from car_core.store.runs import RunStore
        globals()["RunStore"] = RunStore
        return RunStore
    if name == "RayExecutor":
        from car_core.engine.ray_executor import RayExecutor
        globals()["RayExecutor"] = RayExecutor
        return RayExecutor
    raise AttributeError(f"module 'car_core' has no attribute {name!r}")

__all__ = [
    "Action",
    "Agent",
    "AsyncioExecutor",
    "Budget",
    "Candidate",
    "ContextAttribution",
    "ContrastiveSettings",
    "Fix",
    "FunctionAgent",
    "History",
    "Interval",
    "Intervention",
    "Lineage",
    "Observation",
    "Outcome",
    "RayExecutor",
    "RepairRanking",
    "RunStore",
    "Sequential",
    "ShapleySettings",
    "Step",
    "Trajectory",
    "action_match_rate",
    "add_instruction",
    "assert_locus",
    "assert_no_locus",
    "assert_rescues",
    "context_attribution",
    "context_sources",
    "contrastive",
    "do_action",
    "do_context",
    "do_observation",
    "do_policy",
    "do_resample",
    "export_pairs",
    "fix_population",
    "guard_observation",
    "intervene",
    "record",
    "remove_sources",
    "repairs",
    "shapley",
    "triage",
]

_moved.install()  # the flat module paths of 0.1 keep importing
