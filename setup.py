"""Package discovery, so that a new subpackage cannot be left out of the wheel.

The folder ``adapters/`` is imported as ``car_adapters`` (the bare name ``adapters`` belongs to
another library on PyPI), which ``[tool.setuptools.packages.find]`` cannot express: every
package with an ``__init__.py`` under ``car_core/`` and ``adapters/`` is found here instead.
Everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

core = find_packages(include=["car_core", "car_core.*"])
adapters = ["car_adapters" + name[len("adapters"):]
            for name in find_packages(include=["adapters", "adapters.*"])]

# _car_entry: the console script's entry point, importable before car_core (see its docstring)
setup(packages=core + adapters, py_modules=["_car_entry"])
