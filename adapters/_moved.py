"""The flat module paths of 0.1 that moved into ``models/``, ``common/``, ``pytest_plugin/`` and
``demo/`` when ``adapters/`` got its floor plan.

Each old path (``car_adapters.chat_agent``) still imports, for one release, as the very module
at its new home (``car_adapters.models.chat_agent``), with a ``DeprecationWarning`` naming that
home; no file stands in for it, so the top of ``adapters/`` stays the floor plan.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

PACKAGE = "car_adapters"
MOVED = {
    "chat_agent": "models.chat_agent", "local": "models.local",
    "server_policy": "models.server_policy",
    "chat_messages": "common.messages", "chat_branch": "common.branch",
    "fingerprint": "common.fingerprint", "run_keeping": "common.run_keeping",
    "pytest_integrations": "pytest_plugin.integrations",
    "pytest_recording": "pytest_plugin.recording",
    "support_agent": "demo.support_agent",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.target}; import it from there (the old path "
                      "goes in the next release)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module ran when it was imported."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        top, _, leaf = fullname.partition(".")
        if top != PACKAGE or leaf not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"{PACKAGE}.{MOVED[leaf]}"))


def install() -> None:
    """Put the finder last on ``sys.meta_path``: it answers only for an old path no file has."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
