"""LlamaIndex glue: record agent runs through instrumentation, branch them from any step.

``CarRecorder`` hooks the root instrumentation dispatcher and turns each ``FunctionAgent`` /
``ReActAgent`` / ``AgentWorkflow`` run into a ``car.Trajectory``; ``LlamaIndexAgent`` re-enters
the workflow at step ``k`` with the recorded (or edited) history so ``car.intervene``,
``car.contrastive`` and ``car.shapley`` work on it. ``final_state(run)`` gives a run's final chat
as ``ChatMessage`` objects (and its workflow store), for outcomes written over the app's own
objects. ``ScriptedLLM`` is a seeded fake model for tests and examples.
"""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("car_adapters.llamaindex needs llama-index-core: "
                      "pip install 'causal-agent-replay[llamaindex]'") from exc

from .agent import LlamaIndexAgent
from .fake import ScriptedLLM, step_rng
from .final import final_state
from .recorder import CarRecorder

__all__ = ["CarRecorder", "LlamaIndexAgent", "ScriptedLLM", "final_state", "step_rng"]
