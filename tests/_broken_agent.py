"""An agent module for the CLI's ``--agent`` that fails at every decision, written to disk."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_raising_agent(folder: Path, message: str, module: str = "broken") -> None:
    """``folder/module.py`` with ``make()``, the pivot agent whose policy raises
    ``RuntimeError(message)`` at every decision, and ``outcome``, the pivot's."""
    (folder / f"{module}.py").write_text(textwrap.dedent(f'''
        import car_core.testing.synthetic as syn

        def make():
            agent = syn.pivot().agent()

            def policy(history, rng):
                raise RuntimeError({message!r})

            agent.policy = policy
            return agent

        outcome = syn.pivot().outcome
    '''))
