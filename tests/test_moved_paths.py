"""The flat import paths of 0.1 keep working after car_core's layers became folders: each old
path is the very module at its new home, the documented ones import silently and the others
warn that they moved (car_core._moved)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from car_core import _moved

# the paths README.md, DESIGN.md and the docs name, as users import them
DOCUMENTED_IMPORTS = ["car_core.synthetic", "car_core.synthetic_context", "car_core.vocabulary",
                      "car_core.agent", "car_core.actions", "car_core.pairs",
                      "car_core.interventions", "car_core.trajectory", "car_core.outcome",
                      "car_core.seeding", "car_core.testing", "car_core.contract",
                      "car_core.errors", "car_core.store", "car_core.stats", "car_core.cli",
                      "car_core.report", "car_core.formatting", "car_core.results"]


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_every_moved_path_is_the_module_at_its_new_home(old: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        aliased = importlib.import_module(f"car_core.{old}")
    assert aliased is importlib.import_module(f"car_core.{_moved.MOVED[old]}")


@pytest.mark.parametrize("path", DOCUMENTED_IMPORTS)
def test_a_documented_path_imports_without_a_warning(path: str) -> None:
    # a fresh interpreter: an alias imported once is cached and would not warn again
    code = f"import warnings; warnings.simplefilter('error'); import {path}"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("old", sorted(set(_moved.MOVED) - _moved.DOCUMENTED)[:3])
def test_an_undocumented_old_path_warns_where_it_went(old: str) -> None:
    code = f"import warnings; warnings.simplefilter('error'); import car_core.{old}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert f"car_core.{old} moved to car_core.{_moved.MOVED[old]}" in done.stderr


def test_from_import_of_a_moved_name_works() -> None:
    from car_core.synthetic import pivot

    from car_core.testing.synthetic import pivot as new
    assert pivot is new


def test_importing_every_old_path_leaves_every_public_name_as_it_was() -> None:
    """An alias sets the package's attribute to the module it imports: none may shadow a
    public name (car.context_sources is a function; its old module path is not aliased)."""
    import car_core
    before = {n: getattr(car_core, n) for n in car_core.__all__}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for old in _moved.MOVED:
            importlib.import_module(f"car_core.{old}")
    assert {n: getattr(car_core, n) for n in car_core.__all__} == before
