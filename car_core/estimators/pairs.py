"""What a repair ranking learned, as JSON lines: one preference pair per validated repair.

Each line is a ``car.pair/1`` record (docs/what-and-fix.md, "Exporting what was learned", is the
schema's documentation)::

    {"schema": "car.pair/1", "run_id": …, "step": k,
     "state": the state step k decided from (chat messages, or {"context", "steps"}),
     "failing_action": the action the run took at step k,
     "rescue": {"label", "kind", "interventions": [...],
                "action": an action step k took on a branch the repair rescued, or null},
     "p_fail": {"unrepaired": {"estimate", "ci"}, "repaired": {"estimate", "ci"}},
     "rescue_estimate": P(fail | unrepaired) − P(fail | repaired), "rescue_ci": [low, high],
     "level": each interval's level, "alpha": the ranking's simultaneous error rate,
     "validated": the rescue interval is above zero, "rank": 1 = best}

Tuning on a preference pair wants a rescuing action: ``rescue.action`` is one the step really
took under the repair (or null when the repair changes what the step saw, not what it did, and
no branch rescued). Only validated repairs are written unless ``validated_only=False``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from car_core.errors import InvalidInput
from car_core.estimators.repairs import RepairRanking
from car_core.model.context_sources import state_of
from car_core.model.json_values import dumps
from car_core.model.trajectory import History, Trajectory

SCHEMA = "car.pair/1"


def _state_json(state: Any) -> Any:
    if isinstance(state, History):
        return {"context": state.context,
                "steps": [{"action": s.action, "observation": s.observation}
                          for s in state.steps]}
    return state


def pairs(run: Trajectory, ranking: RepairRanking, *, validated_only: bool = True
          ) -> list[dict[str, Any]]:
    """The ``car.pair/1`` records of ``ranking`` (a ``car.repairs`` result on ``run``)."""
    if ranking.run_id != run.id:
        raise InvalidInput(f"the ranking is of run {ranking.run_id}, not of run {run.id}",
                           hint="pass the run the repairs were ranked on")
    k = ranking.step
    u = ranking.unrepaired
    out = []
    for rank, r in enumerate(ranking.ranked, 1):
        if validated_only and not r.validated:
            continue
        assert r.rescue_ci is not None
        out.append({
            "schema": SCHEMA, "run_id": run.id, "step": k,
            "state": _state_json(state_of(run, k)),
            "failing_action": run.steps[k].action,
            "rescue": {**r.candidate.to_dict(), "action": r.example_action},
            "p_fail": {"unrepaired": {"estimate": u.p_fail, "ci": list(u.ci)},
                       "repaired": {"estimate": r.p_fail, "ci": list(r.ci)}},
            "rescue_estimate": r.rescue, "rescue_ci": list(r.rescue_ci),
            "level": ranking.level, "alpha": ranking.alpha, "validated": r.validated,
            "rank": rank})
    return out


def export_pairs(items: Iterable[tuple[Trajectory, RepairRanking]], to: str | Path | TextIO, *,
                 validated_only: bool = True) -> int:
    """Write the pairs of every ``(run, ranking)`` as JSON lines to ``to`` (a path or an open
    text file); returns how many lines were written."""
    lines = [dumps(p) for run, ranking in items
             for p in pairs(run, ranking, validated_only=validated_only)]
    text = "".join(line + "\n" for line in lines)
    if isinstance(to, (str, Path)):
        Path(to).write_text(text, encoding="utf-8")
    else:
        to.write(text)
    return len(lines)


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """The records of a pairs file (each checked to be ``car.pair/1``)."""
    records = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("schema") != SCHEMA:
                raise InvalidInput(f"{path}:{n} is not a {SCHEMA} record",
                               hint="read files written by car.export_pairs / car export pairs")
        records.append(record)
    return records
