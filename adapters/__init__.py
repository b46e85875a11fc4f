"""Framework glue for Causal Agent Replay, imported as ``car_adapters`` (the folder is
``adapters/``; the bare import name ``adapters`` belongs to another PyPI project).

Each submodule is optional and imports its framework lazily; a missing framework raises an
ImportError that names the pip extra to install. Adapters use the core only through its public
API, ``car_core.contract`` (what an adapter implements and is given), ``car_core.errors`` and
``car_core.testing`` (the conformance suite each adapter passes).
"""

from . import _moved

_moved.install()  # the flat module paths of 0.1 import, with a warning, for one more release
