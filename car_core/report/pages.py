"""The pages ``car report`` writes from a store: one run's report, and an index of every run,
attribution, triage and population fix in the store with a page written beside it for each (a
triage's page: ``triage_page``; a population fix's: ``fix_page``).

The index follows the single-run report's rules (``report.py``): one self-contained file, no
script, the same Content-Security-Policy, every value escaped by the template. Its links point
only at files this module names: a page's file name is built from the run or attribution id
with everything but ``[A-Za-z0-9_-]`` replaced and a digest of the id added, so an id (agent
text, possibly hostile) can neither reach an ``href`` as written nor make two pages collide.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from car_core import formatting as fmt
from car_core.errors import CarError, InvalidInput
from car_core.fix_results import FIX_METHOD
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import Answer, AttributionStatus
from car_core.report import _ENV, render_attribution, render_run
from car_core.report.fix_page import fix_row, render_fix
from car_core.report.triage_page import render_triage, triage_row
from car_core.report.verdicts import _answer, shapley_leaders
from car_core.secrets.redact import redact, redact_json
from car_core.store import Attribution, RunStore
from car_core.triage_results import TRIAGE_METHOD


# -- one run -------------------------------------------------------------------------------------
def latest_attribution(attributions: Iterable[Attribution], method: str | None = None
                       ) -> Attribution | None:
    """The attribution (of ``method`` when given) among a run's, oldest first, that finished
    last; a truncated one only when none is complete. Last to finish, not last begun: a
    resumed attribution finishes after ones begun since, and a trial's report showed a
    64-rollout answer beside the 320-rollout one it had just resumed."""
    rows = [a for a in attributions if a.result is not None
            and (method is None or a.method == method)]
    complete = [a for a in rows if a.status == AttributionStatus.COMPLETE]
    pick = complete or rows
    if not pick:
        return None
    return max(enumerate(pick), key=lambda ia: (ia[1].finished_at or 0.0, ia[0]))[1]


def run_page(db: RunStore, run: Trajectory, attribution: str | None = None,
             method: str | None = None, home: str | None = None,
             known: Sequence[Attribution] | None = None) -> tuple[str, str]:
    """The report of ``run``: the attribution chosen by id, else the latest complete one (of
    ``method``), else the run alone. Returns (html, a note saying what the page shows).
    ``known``: the run's attributions already read (the index passes the intact ones, so a
    damaged one it has named does not stop the page)."""
    own = list(db.attributions(run.id) if known is None else known)
    row = (db.attribution(attribution) if attribution else latest_attribution(own, method))
    if row is not None and row.run_id != run.id:
        raise InvalidInput(f"attribution {attribution} belongs to run {row.run_id}",
                           hint=f"run `car report {row.run_id}`")
    if row is not None and method is not None and row.method != method:
        raise InvalidInput(f"attribution {row.id} is a {row.method} attribution, not "
                           f"{method}", hint="drop --method or --attribution")
    if row is not None and row.result is None:
        raise InvalidInput(f"attribution {row.id} has no result yet ({db.status_said(row)})",
                           hint=f"finish it with `car attribute ... --resume {row.id}`")
    if row is None and method is not None:
        raise InvalidInput(f"run {run.id} has no finished {method} attribution",
                           hint=f"run `car attribute {run.id} --method {method} ...`")
    if row is None:
        return (render_run(run, home=home),
                "no attribution yet, wrote the run only (run `car attribute` first)")
    others = [a for a in own if a.id != row.id]
    choice = (f"Showing attribution {row.id} ({row.method}, {row.status}"
              f"{', chosen' if attribution else ', the latest complete one'}) of "
              f"{len(others) + 1} for this run. Pick another with `car report {run.id} "
              f"--attribution ID` or `--method contrastive|shapley`; list them with "
              f"`car attributions {run.id}`.")
    html = render_attribution(row.result, run=run, branches=db.branches(row.id),
                              choice=choice, home=home)
    note = f"attribution {row.id}, {row.method}"
    if others:
        note += f"; {len(others)} other(s): see `car attributions {run.id}`"
    return html, note


# -- the index -----------------------------------------------------------------------------------
def page_name(ident: str) -> str:
    """A file name for the page of ``ident`` that is safe in a path and in an ``href``."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", ident)[:40].strip("_") or "page"
    return f"{slug}-{hashlib.sha256(ident.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}.html"


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return fmt.MISSING
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return fmt.MISSING


_LEADS = {"one": "largest: ", "equal": "tie: ", "overlap": "not told apart: "}


def attribution_summary(a: Attribution, status: str | None = None) -> dict[str, Any]:
    """What the index shows of one attribution: its answer, the step it names (locus,
    candidate, or the Shapley leader(s)) and that step's interval. ``status``: as the store
    says it (``RunStore.status_said``: "interrupted" for a stopped one), else as stored."""
    status = str(a.status) if status is None else status
    row: dict[str, Any] = {"id": a.id, "run_id": a.run_id, "method": a.method,
                           "status": status, "when": _when(a.created_at),
                           "answer": f"no result yet ({status})", "kind": "pending",
                           "names": fmt.MISSING, "interval": fmt.MISSING,
                           "rollouts": fmt.MISSING, "ts": a.created_at or 0.0}
    if a.result is None:
        return row
    r = redact_json(a.result.to_dict())
    row["rollouts"] = r.get("rollouts_used", fmt.MISSING)
    if a.method == "contrastive":
        answer = _answer(r)
        step = r.get("locus") if answer == Answer.LOCUS else r.get("candidate")
        found: Mapping[str, Any] = next(
            (s for s in r.get("steps") or [] if s.get("step") == step), {})
        kind = str(answer).replace(" ", "-") if answer in set(Answer) else "other"
        row.update(answer=str(answer), kind=kind,
                   names=(f"step {step}" if answer == Answer.LOCUS else
                          f"candidate step {step}" if step is not None else fmt.MISSING),
                   interval=fmt.interval(found.get("ci")))
        return row
    kind, leaders = shapley_leaders(r.get("values") or [])
    labels = [str(v.get("label") or f"step {v.get('step')}") for v in leaders]
    row.update(answer="Shapley values" + (" (truncated)" if r.get("truncated") else ""),
               kind="shapley",
               names=(_LEADS[kind] + ", ".join(labels)) if labels else fmt.MISSING,
               interval=fmt.interval(leaders[0].get("ci")) if leaders else fmt.MISSING)
    return row


@dataclass(frozen=True)
class IndexWritten:
    """What ``write_index`` wrote: the index file, and how many pages beside it."""

    index: Path
    runs: int
    attributions: int
    pages: int
    damaged: list[str] = field(default_factory=list)
    triages: int = 0
    fixes: int = 0


def index_paths(out: Path) -> tuple[Path, Path]:
    """(the index file, the folder its pages go in): ``out`` itself when it names an
    ``.html`` file, else ``out/index.html``; the pages in ``runs/``, ``attributions/`` and
    ``triages/`` beside the index."""
    if out.suffix.lower() in (".html", ".htm"):
        return out, out.parent
    return out / "index.html", out


def render_index(runs: Sequence[Mapping[str, Any]], attributions: Sequence[Mapping[str, Any]],
                 store: str, damaged: Sequence[str] = (),
                 triages: Sequence[Mapping[str, Any]] = (),
                 fixes: Sequence[Mapping[str, Any]] = ()) -> str:
    """The index page from its rows (``write_index`` builds them from a store)."""
    failed = sum(1 for r in runs if r.get("failed"))
    return redact(_ENV.get_template("index.html.j2").render(
        runs=runs, attributions=attributions, store=store, damaged=list(damaged),
        failed=failed, triages=list(triages), fixes=list(fixes)))


@dataclass(frozen=True)
class _Kind:
    """A kind of attribution of many runs that gets a page of its own on the index (a triage,
    a population fix): how to name it, load it, draw its page and its row."""

    name: str
    folder: str
    load: Callable[[RunStore, str], Any]
    # (result, run ids to links, attribution ids to links, home) -> html
    page: Callable[[Any, Mapping[str, str], Mapping[str, str], str], str]
    row: Callable[..., dict[str, Any]]  # (result or None, status, when, ts, href, id)


def _kinds() -> dict[str, _Kind]:
    from car_core.store.fixes import load_fix  # the CLI loads them only for an index
    from car_core.store.triages import load_triage
    return {
        TRIAGE_METHOD: _Kind("triage", "triages", load_triage,
                             lambda r, runs, atts, home: render_triage(
                                 r, run_href=runs, attribution_href=atts, home=home),
                             triage_row),
        FIX_METHOD: _Kind("population fix", "fixes", load_fix,
                          lambda r, runs, atts, home: render_fix(r, run_href=runs, home=home),
                          fix_row)}


def _population_pages(db: RunStore, kind: _Kind, rows: Sequence[Attribution],
                      links: tuple[Mapping[str, str], Mapping[str, str]], home: str,
                      pages: dict[Path, str], folder: Path, damaged: list[str]
                      ) -> list[dict[str, Any]]:
    """A page per stored attribution of ``kind`` (into ``pages``) and its row on the index,
    newest first; one without a result yet is listed without a page, a damaged one named.
    ``links``: run ids, then attribution ids, to their pages, relative to the index."""
    runs, atts = ({k: f"../{v}" for k, v in m.items()} for m in links)  # from kind's folder
    listed: list[dict[str, Any]] = []
    for a in rows:
        when, ts = _when(a.created_at), a.created_at or 0.0
        if a.status == AttributionStatus.RUNNING:
            listed.append(kind.row(None, db.status_said(a), when, ts, None, a.id))
            continue
        try:
            result = kind.load(db, a.id)
        except CarError as exc:
            damaged.append(f"{kind.name} {a.id}: {exc}")
            continue
        href = f"{kind.folder}/{page_name(a.id)}"
        pages[folder / href] = kind.page(result, runs, atts, home)
        listed.append(kind.row(result, str(a.status), when, ts, href, a.id))
    listed.sort(key=lambda r: r["ts"], reverse=True)
    return listed


def write_index(db: RunStore, out: Path, store: str) -> IndexWritten:
    """Write the index of every recorded run (newest first) and every attribution (newest
    first), a report per run (what ``car report RUN_ID`` writes) and one per attribution with a
    result. A damaged run or attribution is named on the index and skipped."""
    index, folder = index_paths(out)
    summaries, bad = db.scan()
    damaged = [f"run {ident}: {why}" for ident, why in bad]
    by_run: dict[str, list[Attribution]] = {}
    for aid in db.attribution_ids():
        try:
            a = db.attribution(aid)
        except CarError as exc:
            damaged.append(f"attribution {aid}: {exc}")
            continue
        by_run.setdefault(a.run_id, []).append(a)
    pages: dict[Path, str] = {}
    runs, rows = [], []
    for summary in summaries:
        try:
            run = db.load(summary["id"])
        except CarError as exc:
            damaged.append(f"run {summary['id']}: {exc}")
            continue
        own = by_run.get(run.id, [])
        latest = latest_attribution(own)
        link = f"runs/{page_name(run.id)}"
        pages[folder / link] = run_page(db, run, home="../" + index.name, known=own)[0]
        for a in own:
            row = attribution_summary(a, db.status_said(a))
            row["href"] = None  # no page for an attribution stopped before its result
            if a.result is not None:
                row["href"] = f"attributions/{page_name(a.id)}"
                pages[folder / row["href"]] = render_attribution(
                    a.result, run=run, branches=db.branches(a.id), home="../" + index.name,
                    choice=f"Attribution {a.id} ({a.method}, {row['status']}) of run {run.id}, "
                           f"one of {len(own)} for this run.")
            row["run_href"] = link
            rows.append(row)
        runs.append({"id": run.id, "href": link, "when": _when(summary.get("created_at")),
                     "test": summary.get("test") or "", "agent": run.agent or fmt.MISSING,
                     "status": fmt.status_word(run.status, run.error, run.meta),
                     "ending": fmt.ending_line(run.status, run.error, run.meta,
                                               [s.action for s in run.steps]),
                     "n_steps": len(run.steps),
                     "outcome": fmt.num(run.outcome.value) if run.outcome else fmt.MISSING,
                     "failed": run.failed, "attributions": len(own),
                     "latest": attribution_summary(latest, db.status_said(latest))
                     if latest else None})
    rows.sort(key=lambda r: r["ts"], reverse=True)
    stored = [a for rows_of in by_run.values() for a in rows_of]
    links = ({str(r["id"]): str(r["href"]) for r in runs},
             {str(r["id"]): str(r["href"]) for r in rows if r.get("href")})
    triages, fixes = (
        _population_pages(db, kind, [a for a in stored if a.method == method], links,
                          "../" + index.name, pages, folder, damaged)
        for method, kind in _kinds().items())
    html = render_index(runs, rows, store, damaged, triages, fixes)
    try:
        for path, page in pages.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(page, encoding="utf-8")
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write the index to {index}: {exc.strerror}",
                           hint="pass --out a writable folder or .html file") from None
    return IndexWritten(index=index, runs=len(runs), attributions=len(rows),
                        pages=len(pages), damaged=damaged, triages=len(triages),
                        fixes=len(fixes))


__all__ = ["IndexWritten", "attribution_summary", "index_paths", "latest_attribution",
           "page_name", "render_index", "run_page", "write_index"]
