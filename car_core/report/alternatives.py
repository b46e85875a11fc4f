"""The report's "what the agent did instead" tables, read from a result's ``to_dict()``: one
per tested step that lists its re-drawn actions, the locus (or the undecided candidate) first,
in the words and digits of every other surface (``formatting.alternatives``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core import formatting as fmt

ACTION_CHARS = 90  # the page has room for more of an action than a terminal


def alternatives_tables(r: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One table per step with alternatives: its heading and rows (cells, whether the row is
    the recorded action), the step the answer names first."""
    first = r.get("locus") if r.get("locus") is not None else r.get("candidate")
    steps = [s for s in r.get("steps") or [] if s.get("alternatives")]
    steps.sort(key=lambda s: (s.get("step") != first, s.get("step")))
    return [{"step": s.get("step"), "first": s.get("step") == first,
             "heading": fmt.alternatives_heading(s, r.get("level")),
             "columns": fmt.ALTERNATIVE_COLUMNS,
             "rows": [{"cells": fmt.alternative_cells(s, a, chars=ACTION_CHARS),
                       "recorded": a.get("action") == s.get("recorded_action")}
                      for a in s["alternatives"]]}
            for s in steps]
