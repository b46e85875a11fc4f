"""OpenAI Agents SDK glue: record runs through the SDK's run hooks, branch them from any step.

``CarRecorder`` is a ``RunHooks`` that turns each ``Runner.run`` / ``run_sync`` /
``run_streamed`` run into a ``car.Trajectory``; ``OpenAIAgentsAgent`` re-enters the app at step
``k`` with the input items that step saw (edited by ``do_context``), under the agent active at
``k``, so ``car.intervene``, ``car.contrastive`` and ``car.shapley`` work on it.
``final_state(run)`` gives a run's final output, input list and run context, for outcomes.
``ScriptedModel`` is a seeded fake ``agents.Model`` for tests and examples.
``connect_in_background(server)`` keeps an MCP server connected for code with no ``async with``
block (an agent factory the ``car`` CLI calls).
"""

from __future__ import annotations

try:
    import agents  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("car_adapters.openai_agents needs openai-agents: "
                      "pip install 'causal-agent-replay[openai-agents]'") from exc

from .agent import OpenAIAgentsAgent
from .fake import ScriptedModel, step_rng
from .final import final_state
from .mcp_tools import connect_in_background
from .recorder import CarRecorder, RunStillOpen

__all__ = ["CarRecorder", "OpenAIAgentsAgent", "RunStillOpen", "ScriptedModel",
           "connect_in_background", "final_state", "step_rng"]
