"""A population fix (``car.fix_population``) kept as an attribution, resumable run by run.

It is one sealed row of the ``attributions`` table with method ``"population-fix"`` and run
``POPULATION`` (as a triage: it is of many runs), listed by ``car attributions``. What each run
measured (the outcome of every rollout of every arm) is written into the row's result under
``measured`` as soon as that run is done, in one transaction, so an interrupted fix resumed
with the same id reads those runs back and draws no branch for them; the finished result is
written beside it. ``load_fix`` reads the result back, its seal checked.
"""

from __future__ import annotations

import time
from typing import Any

from car_core.errors import AttributionNotFound, InvalidInput
from car_core.fix_results import FIX_METHOD, PopulationFix
from car_core.model.json_values import dumps, loads
from car_core.model.vocabulary import AttributionStatus
from car_core.secrets.redact import redact_json
from car_core.store.runs import RunStore
from car_core.store.seals import attribution_seal
from car_core.store.triages import begin_population_row

# settings that must match for a resumed fix to reuse what its runs measured
SAME = ("candidates", "rollouts", "seed", "from_step")


def begin_fix(store: RunStore, fix_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """Write the fix's row (``running``) unless it exists, take its lease (given up with
    ``RunStore.release_attribution``), and return what its runs have measured so far (run id
    -> record). An id taken by another kind of attribution, or a stored fix tried with other
    settings, is refused."""
    existing = _row(store, fix_id)
    if existing is None:
        begin_population_row(store, fix_id, FIX_METHOD, params, dumps({"measured": []}))
        return {}
    store.attribution(fix_id)  # checks the seal before anything stored is trusted
    if existing["method"] != FIX_METHOD:
        raise InvalidInput(f"attribution {fix_id} is a {existing['method']} attribution, not a "
                           "population fix", hint="pass a new fix_id")
    stored = loads(existing["params"] or "{}")
    wanted = loads(dumps(redact_json(params)))
    changed = [k for k in SAME if stored.get(k) != wanted.get(k)]
    if changed:
        # the values, so the caller can tell what to pass (a trial's said "other rollouts")
        said = ", ".join("other fixes" if k == "candidates" else
                         f"{k}={stored.get(k)!r}, not {wanted.get(k)!r}" for k in changed)
        raise InvalidInput(f"population fix {fix_id} was run with {said}",
                           hint="resume it with the same fixes and settings, or pass a new "
                                "fix_id")
    store.claim_lease(fix_id)
    return {r["run_id"]: r for r in _measured(existing)}


def save_fix_run(store: RunStore, fix_id: str, record: dict[str, Any]) -> None:
    """Add one run's measurements to the fix's row (replacing an earlier one of that run)."""
    with store._write():
        row = _row(store, fix_id)
        if row is None:
            raise AttributionNotFound(f"no population fix {fix_id!r} in {store.path}",
                                      hint="start it with car.fix_population(..., store=...)")
        measured = [r for r in _measured(row) if r["run_id"] != record["run_id"]]
        data = loads(row["result"]) if row["result"] else {}
        data["measured"] = [*measured, redact_json(record)]
        _update(store, row, result=dumps(data))


def finish_fix(store: RunStore, fix_id: str, result: PopulationFix,
               params: dict[str, Any]) -> None:
    """Store the result beside the measurements; ``truncated`` when the budget left runs
    untested."""
    status = AttributionStatus.TRUNCATED if result.truncated else AttributionStatus.COMPLETE
    with store._write():
        row = _row(store, fix_id)
        if row is None:
            raise AttributionNotFound(f"no population fix {fix_id!r} in {store.path}",
                                      hint="start it with car.fix_population(..., store=...)")
        data = {**redact_json(result.to_dict()), "measured": _measured(row)}
        _update(store, row, result=dumps(data), status=str(status),
                params=dumps(redact_json(params)), finished_at=time.time())


def load_fix(store: RunStore, fix_id: str) -> PopulationFix:
    """The stored population fix's result, its row's seal checked (``CorruptAttribution``)."""
    a = store.attribution(fix_id)
    if a.method != FIX_METHOD:
        raise InvalidInput(f"attribution {fix_id} is a {a.method} attribution, not a "
                           "population fix",
                           hint="list them with `car attributions` (method population-fix)")
    row = _row(store, fix_id)
    data = loads(row["result"]) if row is not None and row.get("result") else {}
    if "candidates" not in data:
        raise InvalidInput(f"population fix {fix_id} has no result yet (status {a.status})",
                           hint=f"finish it: run the same `car fix` with --resume {fix_id}")
    return PopulationFix.from_dict(data)


def _measured(row: dict[str, Any]) -> list[dict[str, Any]]:
    data = loads(row["result"]) if row.get("result") else {}
    got = data.get("measured") if isinstance(data, dict) else None
    return [r for r in got if isinstance(r, dict)] if isinstance(got, list) else []


def _update(store: RunStore, row: dict[str, Any], **changes: Any) -> None:
    row.pop("seal", None)
    row.update(changes)
    row["seal"] = attribution_seal(row)
    store.db.table("attributions").update(row["id"], {
        k: row[k] for k in ("result", "status", "finished_at", "params", "seal")})


def _row(store: RunStore, fix_id: str) -> dict[str, Any] | None:
    rows = list(store.db.query("SELECT * FROM attributions WHERE id = ?", [fix_id]))
    return dict(rows[0]) if rows else None


__all__ = ["begin_fix", "finish_fix", "load_fix", "save_fix_run"]
