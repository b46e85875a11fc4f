"""``final_state(run)``: a LlamaIndex agent run's final chat and workflow store, for outcomes.

The recorder keeps, for every step, the messages its model call saw and the workflow store it
decided from, and the step's reply and tool results; a run's end is its last step's. So an
app's own rule over ``ChatMessage`` objects scores runs and branches as
``outcome=lambda run: rule(final_state(run))``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from car_core.contract import RunStatus, Trajectory

from ..common.final import recorded_meta
from ._messages import from_dicts
from .store_state import STORE_KEY


def final_state(run: Trajectory) -> dict[str, Any]:
    """What a LlamaIndex agent run ended with, from what its recorder keeps:

    - ``messages``: llama_index ``ChatMessage`` objects: the chat the last model call saw (the
      agent's system prompt where it has one, the history, the user message), then that call's
      reply and the tool results that answered it (tool results as text, as recorded);
    - ``response``: what the final ``AgentOutput.response`` held: the last reply's text when
      the run completed with a reply that called no tool, or, for a run a ``return_direct``
      tool ended (it completed at a step that called tools), that tool's result; else None;
    - ``store``: the workflow ``Context`` store's own keys (JSON) as the last step began, or
      None where it was not recorded (a durable store); a tool of the last step that wrote the
      store after it began is not in it;
    - ``agent``: the name of the agent that took the last step.

    A run with no step gives its start (the context as messages) and None for the rest. A new
    dict each call."""
    recorded_meta(run, "llama-index")
    if not run.steps:
        start = run.context
        dicts = [{"role": "user", "content": start}] if isinstance(start, str) else list(
            start or ())
        return {"messages": from_dicts(dicts), "response": None, "store": None, "agent": None}
    last = run.steps[-1]
    action = dict(last.action) if isinstance(last.action, Mapping) else {}
    dicts = [*(last.state or ()), action, *(last.observation or ())]
    done = run.status == RunStatus.COMPLETE
    results = [m for m in last.observation or () if isinstance(m, Mapping)]
    response = (action.get("content") if done and not action.get("tool_calls")
                else results[-1].get("content") if done and results else None)
    store = last.meta.get(STORE_KEY)
    return {"messages": from_dicts(dicts), "response": response,
            "store": copy.deepcopy(dict(store)) if isinstance(store, Mapping) else None,
            "agent": last.meta.get("agent")}
