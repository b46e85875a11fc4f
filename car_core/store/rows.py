"""How runs and attributions become rows and back.

A run is one ``runs`` row (its lineage and outcome as columns, the rest in a sealed header) and
one ``steps`` row per step; an attribution is one sealed ``attributions`` row. Reading a row
back checks its seal and its types: anything that does not check raises an error saying the
database was edited by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from car_core.errors import CarError, CorruptAttribution, CorruptRun, InvalidInput
from car_core.fix_results import FIX_METHOD
from car_core.model.json_values import dumps, loads
from car_core.model.run_input import run_input
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import AttributionStatus
from car_core.results import Result, result_from_dict
from car_core.secrets.redact import redact, redact_json
from car_core.store.seals import attribution_seal, run_seal
from car_core.triage_results import TRIAGE_METHOD


@dataclass(frozen=True)
class Attribution:
    """A stored attribution: the run and method, how far it got (``status``), the parameters
    it was run with, and its result (None until one is stored)."""

    id: str
    run_id: str
    method: str
    status: AttributionStatus
    params: dict[str, Any]
    result: Result | None
    created_at: float | None = None
    finished_at: float | None = None




def run_rows(run: Trajectory, attribution_id: str | None = None
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The sealed ``runs`` row of ``run`` and its ``steps`` rows (meta and error redacted)."""
    lineage = run.lineage
    header = {"outcome": run.outcome.to_dict() if run.outcome else None,
              "lineage": lineage.to_dict() if lineage else None,
              "meta": redact_json(run.meta),  # error texts and meta may quote a key
              "error": redact(run.error) if run.error else run.error}
    asked = run_input(run.context)
    if asked is not None:  # what ``car runs`` lists it by, sealed with the row
        header["input"] = redact(asked)
    row = {"id": run.id, "parent_id": lineage.parent_id if lineage else None,
           "attribution_id": attribution_id or (lineage.attribution_id if lineage else None),
           "arm": lineage.arm if lineage else None,
           "rollout": lineage.rollout if lineage else None,
           "branch_step": lineage.branch_step if lineage else None, "agent": run.agent,
           "status": run.status, "outcome": run.outcome.value if run.outcome else None,
           "n_steps": len(run.steps), "digest": run.digest, "seed": run.seed,
           "created_at": run.created_at, "context": dumps(run.context),
           "header": dumps(header)}
    header["seal"] = run_seal(row, header)
    row["header"] = dumps(header)
    steps = [{"run_id": run.id, "idx": s.index, "digest": s.digest, "action": dumps(s.action),
              "observation": dumps(s.observation), "observed": int(s.observed),
              "state": dumps(s.state), "meta": dumps(s.meta)} for s in run.steps]
    return row, steps


def run_from_rows(row: dict[str, Any], steps: Iterable[dict[str, Any]]) -> Trajectory:
    """The run a ``runs`` row and its ``steps`` rows (in order) hold, seal and digests
    verified: ``CorruptRun`` when anything was changed after saving."""
    run_id = row["id"]
    try:
        header = loads(row["header"] or "{}")
        steps_data = [{"index": s["idx"], "digest": s["digest"], "action": loads(s["action"]),
                       "observation": loads(s["observation"]), "observed": bool(s["observed"]),
                       "state": loads(s["state"]), "meta": loads(s["meta"])} for s in steps]
        data = {"id": row["id"], "context": loads(row["context"]), "steps": steps_data,
                "outcome": header.get("outcome"), "seed": row["seed"],
                "agent": row["agent"] or "", "status": row["status"],
                "error": header.get("error"), "lineage": header.get("lineage"),
                "meta": header.get("meta") or {}, "created_at": row["created_at"]}
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptRun.edited_by_hand(f"stored run does not parse: {str(exc)[:160]}",
                                        run_id=run_id) from None
    if not isinstance(header, dict):
        raise CorruptRun.edited_by_hand("the stored header is not an object", run_id=run_id)
    seal = header.pop("seal", None)  # every save writes one: a missing seal was removed
    if seal != run_seal(row, header):
        raise CorruptRun.edited_by_hand("the stored header (outcome, lineage, status …) was "
                                        "changed after saving", run_id=run_id)
    try:
        run = Trajectory.from_dict(data)
    except CorruptRun:
        raise
    except (CarError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptRun.edited_by_hand(f"stored run does not parse: {str(exc)[:160]}",
                                        run_id=run_id) from None
    if len(run.steps) != row["n_steps"] or run.digest != row["digest"]:
        raise CorruptRun.edited_by_hand("stored run is incomplete or its digest changed",
                                        run_id=run_id)
    return run


def attribution_from_row(row: dict[str, Any], *, sealed: bool = True) -> Attribution:
    """The attribution an ``attributions`` row holds, its seal checked unless the store
    predates seals (``sealed=False``) and its result read back as the estimator's result."""
    attribution_id = row["id"]
    seal = row.pop("seal", None)
    if sealed and seal != attribution_seal(row):
        raise CorruptAttribution.edited_by_hand(f"attribution {attribution_id} was changed "
                                                "after it was stored")
    for key in ("id", "run_id", "method", "status"):
        if not isinstance(row[key], str):
            raise CorruptAttribution.edited_by_hand(
                f"attribution {attribution_id} has {key} {row[key]!r}, not text", then=None)
    params = loads(row["params"] or "{}")
    data = loads(row["result"]) if row["result"] else None
    if not isinstance(params, dict) or not isinstance(data, (dict, type(None))):
        raise CorruptAttribution.edited_by_hand(
            f"attribution {attribution_id} holds a malformed result", then=None)
    try:
        status = AttributionStatus(row["status"])
        # a triage's or a population fix's result is many runs' (``store.triages`` and
        # ``store.fixes`` read them), not one estimate's
        result = (None if data is None or row["method"] in (TRIAGE_METHOD, FIX_METHOD)
                  else result_from_dict(data))
    except (ValueError, InvalidInput) as exc:
        raise CorruptAttribution.edited_by_hand(
            f"attribution {attribution_id} holds a malformed result: {str(exc)[:160]}"
        ) from None
    return Attribution(id=row["id"], run_id=row["run_id"], method=row["method"],
                       status=status, params=params, result=result,
                       created_at=row["created_at"], finished_at=row["finished_at"])


__all__ = ["Attribution", "attribution_from_row", "run_from_rows", "run_rows"]
