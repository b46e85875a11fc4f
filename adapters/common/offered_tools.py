"""What a ``do_context`` edit may change of the tools a step was offered: their descriptions,
nothing else. Every chat adapter records the tools a model call was offered in
``step.meta["tools"]`` (``[{"name", "description"}]``) and hands an edit the specs back; this
is the one rule for what the edit returned. Imports no framework."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core.contract import Trajectory
from car_core.errors import InvalidIntervention


def edited_descriptions(run: Trajectory, k: int, given: Any) -> dict[str, str]:
    """``{tool name: description}`` for the tools whose description a ``do_context`` edit of
    step ``k`` changed (``given``: the specs it returned, ``None`` when it left them as
    recorded). Refused where it changed anything else of them — renamed, added, dropped or
    reordered a tool, or touched a field but the description (also tools added to a step that
    recorded none): the branch would offer tools the app does not have."""
    recorded = run.step(k).meta.get("tools")
    if given is None or given == recorded:
        return {}
    recorded = recorded if isinstance(recorded, list) else []
    names = [t.get("name") if isinstance(t, Mapping) else None for t in given]
    if names != [t["name"] for t in recorded] or not all(
            isinstance(t.get("description"), str) and set(t) == set(r)
            for t, r in zip(given, recorded, strict=True)):
        raise InvalidIntervention(
            f"the do_context edit changes step {k}'s tools other than by their descriptions",
            run_id=run.id, step=k, hint="edit only each tool's 'description' (a string); the "
                                        "tools offered and their names stay as recorded")
    return {t["name"]: t["description"] for t, r in zip(given, recorded, strict=True)
            if t["description"] != r["description"]}
