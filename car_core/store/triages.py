"""A population of runs chosen from the store, and the triage of it kept as an attribution.

``select_runs`` picks recorded runs by agent, time, the test and pytest session that recorded
them and outcome (failed by default). A triage is stored as one sealed row of the
``attributions`` table with method ``"triage"``: it is of many runs, so its ``run_id`` is
``POPULATION`` rather than a run's id (no migration: the column only has to hold text), and
``car attributions`` lists it beside the per-run attributions it was built from.
``load_triage`` reads its result back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from car_core.errors import AttributionNotFound, InvalidInput, RunNotFound
from car_core.model.json_values import dumps, loads
from car_core.model.trajectory import is_failure
from car_core.model.vocabulary import AttributionStatus
from car_core.secrets.redact import redact_json
from car_core.store.runs import RunStore
from car_core.store.seals import attribution_seal
from car_core.triage_results import TRIAGE_METHOD, TriageResult

POPULATION = "(population)"  # the run_id of a triage's row: it is of many runs
OUTCOMES = ("failed", "passed", "any")


def select_runs(store: RunStore, *, ids: Sequence[str] | None = None, agent: str | None = None,
                since: float | None = None, until: float | None = None,
                test: str | None = None, outcome: str = "failed",
                session: str | None = None) -> list[str]:
    """Ids of the recorded runs (not branches) that pass every filter given, oldest first
    (``ids``: in the order given, each checked to exist). ``agent``: the agent's name as
    recorded; ``since``/``until``: recording time in epoch seconds (inclusive); ``test``: the
    test id that recorded it (a substring of it); ``session``: the id of the pytest session
    that recorded it (exactly, as the plugin's summary prints it); ``outcome``: ``"failed"``,
    ``"passed"`` or ``"any"``."""
    if outcome not in OUTCOMES:
        raise InvalidInput(f"outcome={outcome!r} is not one of {OUTCOMES}",
                           hint='use "failed" (the default), "passed" or "any"')
    rows = store.runs()
    by_id = {r["id"]: r for r in rows}
    if ids is not None:
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise RunNotFound(f"no recorded run {missing[0]!r} in {store.path}"
                              + (f" ({len(missing) - 1} more missing)" if len(missing) > 1
                                 else ""), run_id=missing[0],
                              hint="list the stored runs with `car runs`")
        chosen = [by_id[i] for i in dict.fromkeys(ids)]
    else:
        chosen = sorted(rows, key=lambda r: (r.get("created_at") or 0.0))
    return [r["id"] for r in chosen if _keeps(r, agent, since, until, test, outcome)
            and (session is None or r.get("test_session") == session)]


def stored_failed(row: dict[str, Any]) -> bool:
    """Whether a run's row records it failed (its stored outcome at the failure threshold)."""
    value = row.get("outcome")
    return isinstance(value, (int, float)) and is_failure(float(value))


def _keeps(row: dict[str, Any], agent: str | None, since: float | None, until: float | None,
           test: str | None, outcome: str) -> bool:
    when = row.get("created_at")
    failed = stored_failed(row)
    return ((agent is None or row.get("agent") == agent)
            and (since is None or (when is not None and when >= since))
            and (until is None or (when is not None and when <= until))
            and (test is None or test in (row.get("test") or ""))
            and (outcome == "any" or failed == (outcome == "failed")))


def triage_attribution_id(triage_id: str, run_id: str) -> str:
    """The id of run ``run_id``'s attribution within triage ``triage_id``: the same on every
    resume, so a finished one is read back instead of run again."""
    import hashlib
    digest = hashlib.sha256(f"{triage_id}\0{run_id}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def begin_triage(store: RunStore, triage_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """Write the triage's row (``running``) unless it exists, and take its lease (so the
    store's listings say it runs now, and a second triage of the same id is refused with
    ``AttributionBusy``; ``RunStore.release_attribution`` gives it up). An id taken by an
    attribution of one run is refused. Returns the params the triage began with (those
    stored, on a resume), so a resume keeps the rules it started under."""
    existing = _row(store, triage_id)
    if existing is not None and existing["method"] != TRIAGE_METHOD:
        raise InvalidInput(f"attribution {triage_id} is a {existing['method']} attribution "
                           "of one run, not a triage", hint="pass a new triage_id")
    if existing is not None:
        store.claim_lease(triage_id)
        stored = loads(existing["params"] or "{}")
        return stored if isinstance(stored, dict) else {}
    begin_population_row(store, triage_id, TRIAGE_METHOD, params, None)
    return params


def begin_population_row(store: RunStore, ident: str, method: str, params: dict[str, Any],
                         result: str | None) -> None:
    """Take ``ident``'s lease and write its row (``running``) as an attribution of many runs
    (``POPULATION``): a triage's or a population fix's. The lease is given up if the row
    cannot be written."""
    row = {"id": ident, "run_id": POPULATION, "method": method,
           "status": str(AttributionStatus.RUNNING), "params": dumps(redact_json(params)),
           "result": result, "created_at": time.time(), "finished_at": None}
    row["seal"] = attribution_seal(row)
    store.claim_lease(ident)  # the listings say it runs now; a second one is refused
    try:
        with store._write():  # one transaction, as every write of the store
            store.db.table("attributions").insert(row, pk="id")
    except BaseException:
        store.release_attribution(ident)
        raise


def finish_triage(store: RunStore, triage_id: str, result: TriageResult,
                  params: dict[str, Any]) -> None:
    """Store the triage's result and its settings; ``truncated`` when the total budget left
    runs unattributed."""
    status = AttributionStatus.TRUNCATED if result.truncated else AttributionStatus.COMPLETE
    with store._write():
        row = _row(store, triage_id)
        if row is None:
            raise AttributionNotFound(f"no triage {triage_id!r} in {store.path}",
                                      hint="start it with car.triage(..., store=...)")
        row.pop("seal", None)
        row.update(result=dumps(redact_json(result.to_dict())), status=str(status),
                   params=dumps(redact_json(params)), finished_at=time.time())
        row["seal"] = attribution_seal(row)
        store.db.table("attributions").update(triage_id, {
            k: row[k] for k in ("result", "status", "finished_at", "params", "seal")})


def load_triage(store: RunStore, triage_id: str) -> TriageResult:
    """The stored triage's result, its row's seal checked (``CorruptAttribution``)."""
    a = store.attribution(triage_id)  # checks the seal; a triage's result is not decoded there
    if a.method != TRIAGE_METHOD:
        raise InvalidInput(f"attribution {triage_id} is a {a.method} attribution, not a triage",
                           hint="list triages with `car attributions` (method triage)")
    row = _row(store, triage_id)
    if row is None or not row.get("result"):
        raise InvalidInput(f"triage {triage_id} has no result yet (status {a.status})",
                           hint="finish it: run the same `car triage` with --resume "
                                f"{triage_id}")
    return TriageResult.from_dict(loads(row["result"]))


def _row(store: RunStore, triage_id: str) -> dict[str, Any] | None:
    rows = list(store.db.query("SELECT * FROM attributions WHERE id = ?", [triage_id]))
    return dict(rows[0]) if rows else None


__all__ = ["OUTCOMES", "POPULATION", "begin_triage", "finish_triage", "load_triage",
           "select_runs", "triage_attribution_id"]
