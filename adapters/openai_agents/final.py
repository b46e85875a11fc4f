"""``final_state(run)``: an OpenAI Agents SDK run's final output, input list and run context,
for outcomes.

The recorder keeps, for every model call, the input items it saw, its reply and the tool
results that answered it, and the run context as the call began; a run's end is its last
step's. So an app's own rule over those scores runs and branches as
``outcome=lambda run: rule(final_state(run))``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from car_core.contract import RunStatus, Trajectory

from ..common.final import recorded_meta
from ._items import to_items


def final_state(run: Trajectory) -> dict[str, Any]:
    """What an SDK run ended with, from what its recorder keeps:

    - ``final_output``: the last reply's text when the run completed with a reply that called
      no tool (``RunResult.final_output`` for an agent without ``output_type``; one with an
      ``output_type`` replies in JSON: parse it with that type); for a run the SDK ended at a
      tool call (``tool_use_behavior``: ``"stop_on_first_tool"``, ``StopAtTools``, a
      function's ``ToolsToFinalOutputResult``) the final output it ended with, as the SDK
      hands it to run hooks (a tool's string result is that string; a function's other
      output arrives as its ``str``); else None;
    - ``input_list``: the input items the last model call saw (as recorded), then its reply and
      tool results as plain items (``{"role": "assistant", ...}``, ``function_call``,
      ``function_call_output``): the items ``RunResult.to_input_list()`` holds, in the plain
      forms every SDK model accepts (SDK ``RunItem`` objects are not rebuilt);
    - ``last_agent``: the name of the agent that made the last model call;
    - ``run_context``: the run context (``context=``) as JSON as the last model call began, or
      None where the run had none or it could not be dumped; a tool of the last step that
      changed it afterwards is not in it;
    - ``tripwire``: ``{"kind": "input" | "output", "guardrail": name}`` where a guardrail
      stopped the run (the SDK raised instead of returning: ``final_output`` is then None,
      the reply it stopped is the last step's action), else None.

    A run with no model call gives its input and None for the rest. A new dict each call.
    """
    recorded_meta(run, "openai-agents")
    if not run.steps:
        start = run.context
        items = [{"role": "user", "content": start}] if isinstance(start, str) else list(
            start or ())
        return {"final_output": None, "input_list": items, "last_agent": None,
                "run_context": None, "tripwire": _tripwire(run)}
    last = run.steps[-1]
    action = dict(last.action) if isinstance(last.action, Mapping) else {}
    items = copy.deepcopy(list(last.meta.get("input_items") or ()))
    items += to_items([action, *(last.observation or ())])
    tripwire = _tripwire(run)
    replied = (run.status == RunStatus.COMPLETE and not action.get("tool_calls")
               and tripwire is None)
    context = last.meta.get("run_context")
    final = action.get("content") if replied else None
    if (not replied and run.status == RunStatus.COMPLETE and tripwire is None
            and "final_output" in run.meta):  # ended at a tool call (``CarRecorder``)
        final = copy.deepcopy(run.meta["final_output"])
    return {"final_output": final, "input_list": items,
            "last_agent": last.meta.get("agent"),
            "run_context": (copy.deepcopy(context.get("value")) if isinstance(context, Mapping)
                            else None),
            "tripwire": tripwire}


def _tripwire(run: Trajectory) -> dict[str, Any] | None:
    got = run.meta.get("tripwire")
    return dict(got) if isinstance(got, Mapping) else None
