"""Import paths that moved when ``car_core``'s layers became folders (0.2).

The flat module names keep importing, as the same module objects as their new homes, so
``import car_core.synthetic`` and ``from car_core.vocabulary import Answer`` work unchanged.
The documented paths (``DOCUMENTED``) stay for good; the others warn (``DeprecationWarning``)
and go in the release after next.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "trajectory": "model.trajectory", "actions": "model.actions",
    "interventions": "model.interventions", "outcome": "model.outcome",
    "vocabulary": "model.vocabulary",
    "seeding": "model.seeding", "budget": "model.budget", "capabilities": "model.capabilities",
    "_json": "model.json_values",
    "agent": "engine.agent", "branching": "engine.branching", "tasks": "engine.tasks",
    "execution": "engine.execution", "replay": "engine.replay", "_ray": "engine.ray_executor",
    "sequential": "stats.sequential",
    "settings": "estimators.settings", "pairs": "estimators.pairs",
    "run_writer": "store.run_writer", "_deps": "store._deps",
    "report_pages": "report.pages", "report_plots": "report.plots",
    "report_context": "report.context",
    "cli_context": "cli.context", "_clikit": "cli.kit",
    "_conformance": "testing._conformance", "capability_checks": "testing.capability_checks",
    "synthetic": "testing.synthetic", "synthetic_context": "testing.synthetic_context",
    "redact": "secrets.redact", "_secret_forms": "secrets.forms",
}
# Not here: car_core.context_sources, the module, whose name is the public function
# car.context_sources; importing an alias sets the package's attribute to the module and would
# shadow the function (its new home is car_core.model.context_sources).
# named in the README, DESIGN.md or the docs: these old paths never warn
DOCUMENTED = frozenset({"synthetic", "synthetic_context", "vocabulary", "agent", "actions",
                        "pairs", "interventions", "trajectory", "outcome", "seeding"})


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str, documented: bool) -> None:
        self.target = target
        self.documented = documented

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if not self.documented:
            warnings.warn(f"{spec.name} moved to {self.target}; import it from there (the old "
                          "path goes in the release after next)", DeprecationWarning,
                          stacklevel=2)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module ran when it was imported."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        top, _, leaf = fullname.partition(".")
        if top != "car_core" or leaf not in MOVED:
            return None
        loader = _Alias(f"car_core.{MOVED[leaf]}", leaf in DOCUMENTED)
        return importlib.machinery.ModuleSpec(fullname, loader)


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
