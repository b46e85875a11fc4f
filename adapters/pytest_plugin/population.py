"""The failing tests of a ``--car-attribute`` session as one population: where they commit.

Each failing test's run was attributed on its own while the session ran; at the end the loci
are grouped the way ``car.triage`` groups its own (``car_core.estimators.triage.
group_results``: by step, agent, node and tool, each share with a simultaneous interval), so
nothing is re-run. A test whose run could not be attributed counts as undecided, with why.
Imports ``car_core`` only when called.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def population_lines(found: Mapping[str, Mapping[str, str]], store: Path,
                     session: str | None) -> list[str]:
    """The terminal section's lines for the tests in ``found`` (node id -> the ``car_*``
    properties its report carries), their runs and attributions read from ``store``; empty
    when fewer than two tests failed or they were valued by Shapley (no locus to group)."""
    if len(found) < 2 or any(p.get("car_method") == "shapley" for p in found.values()):
        return []
    from car_core import RunStore
    from car_core.errors import CarError
    from car_core.estimators.triage import group_results
    pairs: list[tuple[Any, Any]] = []
    unattributed: dict[str, str] = {}
    not_failed: dict[str, str] = {}  # tests whose recorded runs all passed
    test_of: dict[str, str] = {}
    try:
        with RunStore(store, readonly=True) as db:
            for nodeid, props in found.items():
                run_id, aid = props.get("car_run"), props.get("car_attribution")
                if not run_id or not aid:
                    apart = not_failed if props.get("car_run_failed") == "no" else unattributed
                    apart[nodeid] = props.get("car_reason") or "no attribution"
                    test_of[nodeid] = nodeid
                    continue
                pairs.append((db.load(run_id), db.attribution(aid).result))
                test_of[run_id] = nodeid
        if not pairs and not unattributed:
            return []  # no test failed in its agent's run: nothing to place
        result = group_results(pairs, unattributed=unattributed, not_failed=not_failed)
    except CarError as exc:
        return [f"could not group the {len(found)} failing tests: {exc}"]
    return _lines(result, test_of, store, session)


def _lines(r: Any, test_of: Mapping[str, str], store: Path, session: str | None) -> list[str]:
    n = r.runs_total
    if r.groups:
        top = r.groups[0]
        lines = [f"{top.n} of {n} failing tests commit at {top.label} ({_pct(top.share)}; "
                 f"{_pct(top.share_ci[0])} to {_pct(top.share_ci[1])} with "
                 f"{_pct(1 - r.alpha)} confidence for every share at once)"]
    else:
        lines = [f"none of the {n} failing tests was traced to a step"]
    for g in r.groups:
        lines.append(f"  {g.label}: {g.n} test(s), {_pct(g.share)} "
                     f"[{_pct(g.share_ci[0])}, {_pct(g.share_ci[1])}]")
        lines += [f"      {test_of.get(i, i)}" for i in g.runs]
    why = {row.run_id: row.reason for row in r.per_run}
    for name, ids in (("undecided", r.undecided), ("no cause", r.no_cause)):
        if ids:
            lines.append(f"  {name}: {len(ids)} test(s), {_pct(len(ids) / n)}")
            lines += [f"      {test_of.get(i, i)}: {why.get(i) or name}" for i in ids]
    if r.not_failed:
        lines.append(f"  left out: {len(r.not_failed)} failing test(s) whose recorded runs all "
                     "passed (the test failed on something else)")
        lines += [f"      {test_of.get(i, i)}" for i in r.not_failed]
    lines.append(f"each share is of all {n} failing tests whose agent failed; intervals: "
                 f"{r.interval}, {_pct(1 - r.alpha)} jointly")
    if session is not None:
        lines.append("triage them again, with a budget of your own: car triage --store "
                     f"{shlex.quote(str(store))} --session {shlex.quote(session)} "
                     "--agent MODULE:FACTORY --outcome MODULE:FUNCTION")
    return lines


__all__ = ["population_lines"]
