"""Glue every framework adapter shares: OpenAI-style messages (``messages``), the branch session
chat adapters run a counterfactual in (``branch``), agent fingerprints (``fingerprint``) and
scoring and storing a recorded run (``run_keeping``).

The message helpers scripted models and outcome functions use are re-exported here.
"""

from .messages import ToolSafety, assistant, describe_action, tool_call

__all__ = ["ToolSafety", "assistant", "describe_action", "tool_call"]
