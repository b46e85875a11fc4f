"""Framework glue for Causal Agent Replay, imported as ``car_adapters``.

Each submodule is optional and imports its framework lazily; a missing framework raises an
ImportError that names the pip extra to install.
"""
