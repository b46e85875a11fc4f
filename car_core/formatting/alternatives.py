"""What the agent did instead at a re-drawn step, as every surface shows it: one heading and
one row per group of actions (``StepEffect.alternatives``), the recorded action marked, and
"too few to tell" where too few branches took an action to give its failure rate."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from car_core.formatting.actions import ACTION_CHARS, _clip
from car_core.formatting.numbers import MISSING, level, prob, prob_interval

SHARE, TOO_FEW, RECORDED = "share", "too few to tell", "(recorded)"
ALTERNATIVE_COLUMNS = ("action", SHARE, "interval", "P(fail)", "interval", "n")


def _get(x: Any, name: str, default: Any = None) -> Any:
    return x.get(name, default) if isinstance(x, Mapping) else getattr(x, name, default)


def alternatives_heading(s: Any, lvl: Any = None) -> str:
    """``What the agent did instead at step 3 (40 branch(es) re-drew it, earlier steps
    held):``, with the intervals' level where the method is shown (``lvl``); ``s`` is a
    ``StepEffect`` or its stored dict."""
    total = sum(int(_get(a, "n", 0) or 0) for a in _get(s, "alternatives", ()) or ())
    at = f"; intervals at {level(lvl)} each" if lvl is not None else ""
    return (f"What the agent did instead at step {_get(s, 'step')} ({total} branch(es) re-drew "
            f"it, earlier steps held{at}):")


def alternative_cells(s: Any, a: Any, *, chars: int = ACTION_CHARS) -> list[str]:
    """The cells of one group (``ALTERNATIVE_COLUMNS``): the action (marked when it is what
    the run recorded), its share and the failure rate of the branches that took it."""
    action = str(_get(a, "action"))
    others = [str(_get(o, "action")) for o in _get(s, "alternatives", ()) or ()]
    said = _shown(action, others, chars) + (f" {RECORDED}" if action == _get(s, "recorded_action")
                                            else "")
    p_fail = _get(a, "p_fail")
    n = int(_get(a, "n", 0) or 0)
    return [said, prob(_get(a, "share")), prob_interval(_get(a, "share_ci")),
            prob(p_fail) if p_fail is not None else (TOO_FEW if n else MISSING),
            prob_interval(_get(a, "p_fail_ci")) if p_fail is not None else "", str(n)]


def _shown(action: str, others: list[str], chars: int) -> str:
    """``action`` clipped to ``chars``; where another group's action clips to the same text
    (two reports that differ past their first 60 characters), its start and then the part
    where it differs, so the rows can be told apart."""
    said = _clip(action, chars)
    flat = " ".join(action.split())
    twins = [" ".join(o.split()) for o in others if o != action and _clip(o, chars) == said]
    if not twins:
        return said
    differs = max(len(os.path.commonprefix([flat, t])) for t in twins)
    head = chars // 2
    return flat[:head - 1].rstrip() + "…" + _clip(flat[max(head, differs - 8):], chars - head)
