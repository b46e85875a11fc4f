"""The triage page of the store index (``car report --all``): a planted population triaged
into a store, its page and its row on the index, and hostile text kept as text.

Ground truth. ``TwoModeDesk`` plants two failure modes: early runs commit at step 1 (a
``read_policy`` call by ``intake``), late runs at step 4 (``issue_refund`` by ``refunds``).
With ``K = 16`` per step each run's locus confirms (rescue 0.7 on a deterministic outcome; see
``test_triage.py``), so each group's runs are asserted exactly; a passing run put in the
population did not fail: it is listed apart, with why, and left out of every count. The page
is checked against the result the triage returned, and every link against the files written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_hostile_text import HTML
from test_report_index import _Links

import car_core as car
from car_core.report.pages import page_name, write_index
from car_core.report.triage_page import render_triage
from car_core.stats import Interval
from car_core.store import RunStore
from car_core.store.triages import begin_triage, finish_triage
from car_core.testing.synthetic_population import TwoModeDesk
from car_core.triage_results import TriageGroup, TriageResult, TriageRun

DESK = TwoModeDesk()
N_EARLY, N_LATE, K = 4, 3, 16
PAGE = re.compile(r"\.\./(runs|attributions)/[A-Za-z0-9_-]+-[0-9a-f]{8}\.html")


@pytest.fixture(scope="module")
def triaged(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("triage")
    runs = DESK.population(N_EARLY, N_LATE, seed=0, ids="triagepage")
    passed = next(r for r in (car.record(DESK.agent(), context={"mode": "late"},
                                         outcome=DESK.outcome, seed=s) for s in range(50))
                  if not r.failed)
    with RunStore(folder / "car.db") as store:
        for r in [*runs, passed]:
            store.save(r)
        res = car.triage([*runs, passed], DESK.agent(), outcome=DESK.outcome, rollouts=K,
                         store=store, triage_id="t-page")
    with RunStore(folder / "car.db", readonly=True) as db:
        written = write_index(db, folder / "site", "car.db")
    return runs, passed, res, written, folder / "site"


def test_the_index_lists_the_triage_and_links_its_page(triaged):
    runs, passed, res, written, site = triaged
    assert written.triages == 1
    index = _Links(written.index.read_text(encoding="utf-8"))
    row = index.tables["triages"][1]
    assert row[0] == "t-page" and row[2] == "complete"
    assert row[3:5] == [str(N_EARLY + N_LATE), "2"]  # failed runs, places
    assert row[5].startswith("step 1, agent intake, tool read_policy: 57% [")
    assert row[6:8] == ["0", "0"]  # none undecided, none with no cause: the passing run apart
    href = f"triages/{page_name('t-page')}"
    assert href in index.hrefs and (site / href).is_file()
    # the per-run attributions are listed as attributions of their runs, as before
    assert {r.attribution_id for r in res.per_run if r.locus is not None} <= {
        r[0] for r in index.tables["attributions"] if r}


def test_the_page_says_the_answer_first_then_each_group_with_its_bar_and_interval(triaged):
    runs, passed, res, written, site = triaged
    html = (site / "triages" / page_name("t-page")).read_text(encoding="utf-8")
    page = _Links(html)
    text = " ".join("".join(page.text).split())
    # the plain answer comes before any table
    assert text.index(res.summary()) < text.index("Where the runs commit")
    assert res.summary().startswith(f"{N_EARLY} of {N_EARLY + N_LATE} failed run(s) "
                                    "commit at step 1")
    rows = [r for r in page.tables["groups"] if r]
    for g, row in zip(res.groups, rows, strict=False):
        assert row[:6] == [g.label, str(g.step), g.agent, g.node, g.tool, str(g.n)]
        assert row[7] == f"{100 * g.share:.0f}%"
        assert row[8] == f"{100 * g.share_ci[0]:.0f}%–{100 * g.share_ci[1]:.0f}%"
    assert len(rows) == 2  # the two places; the passing run is no category
    # one bar per category, its width the share and its interval line the interval's
    widths = re.findall(r'class="fill[^"]*" style="width: ([0-9.]+)%"', html)
    shares = [g.share for g in res.groups]
    assert [float(w) for w in widths] == pytest.approx([100 * s for s in shares], abs=0.06)
    lefts = re.findall(r'class="ci" style="left: ([0-9.]+)%', html)
    assert [float(x) for x in lefts] == pytest.approx(
        [100 * g.share_ci[0] for g in res.groups], abs=0.06)
    assert '<a href="../index.html">' in html
    # no price was given: the cost is unknown, not 0 (which would read as free)
    assert res.cost == 0 and "<li>cost" not in html


def test_a_priced_triage_shows_its_cost():
    from dataclasses import replace
    html = render_triage(replace(_planted("plain"), cost=0.125))
    assert "<li>cost <b>0.125</b></li>" in html


def test_the_runs_behind_each_bar_link_their_run_and_attribution_pages(triaged):
    runs, passed, res, written, site = triaged
    html = (site / "triages" / page_name("t-page")).read_text(encoding="utf-8")
    page = _Links(html)
    early = {r.id for r in runs if r.context["mode"] == "early"}
    late = {r.id for r in runs if r.context["mode"] == "late"}
    by_step = {g.step: g for g in res.groups}
    assert set(by_step[1].runs) == early and set(by_step[4].runs) == late
    aid = {r.run_id: r.attribution_id for r in res.per_run}
    for run in runs:
        assert f"../runs/{page_name(run.id)}" in page.hrefs
        assert f"../attributions/{page_name(aid[run.id])}" in page.hrefs
    for href in page.hrefs:
        if not href.startswith("#"):
            assert PAGE.fullmatch(href) or href == "../index.html", href
            assert (site / "triages" / href).resolve().is_file()
    # each group's section lists exactly its runs, in the order of the result
    for i, g in enumerate(res.groups, start=1):
        section = html.split(f'id="group-{i}"')[1].split("</ul>")[0]
        assert re.findall(r">([0-9a-f]{16,})</a> · locus", section) == list(g.runs)
    # the passing run: apart, with why, and linked to its run page (no attribution)
    assert "unlocated" not in page.tables
    apart = [r for r in page.tables["not-failed"] if r]
    assert apart == [[passed.id, apart[0][1]]] and "the run did not fail" in apart[0][1]
    assert f"../runs/{page_name(passed.id)}" in page.hrefs


def _planted(text: str) -> TriageResult:
    """A triage whose every text field carries ``text``: groups, run ids, reasons, its id."""
    ids = [f"run-{i}{text}" for i in range(5)]
    iv = Interval(0.1, 0.8, 0.983)
    groups = (TriageGroup(f"label{text}", 2, f"agent{text}", f"node{text}", f"tool{text}",
                          0.4, iv, tuple(ids[:2])),
              TriageGroup(f"other{text}", 5, None, None, None, 0.2, iv, (ids[2],)))
    rows = (TriageRun(ids[0], "locus", 2, f"label{text}", None, f"a0{text}"),
            TriageRun(ids[1], "locus", 2, f"label{text}", None, f"a1{text}"),
            TriageRun(ids[2], "locus", 5, f"other{text}", None, f"a2{text}"),
            TriageRun(ids[3], "undecided", None, None, f"budget{text}", f"a3{text}"),
            TriageRun(ids[4], "no cause", None, None, f"flat{text}", f"a4{text}"))
    return TriageResult(f"t{text}", 5, groups, (ids[3],), (ids[4],), rows, 0.05, 1 - 0.05 / 4,
                        "Wilson", ("step",), 10, 0, 0.0, False)


@pytest.mark.parametrize("name", list(HTML))
def test_hostile_text_in_labels_ids_and_reasons_stays_text(name: str):
    payload = HTML[name]
    hrefs = {f"run-{i}": f"../runs/r{i}-0000000{i}.html" for i in range(5)}
    pages = {}
    for which, text in (("plain", "plain words"), ("hostile", payload)):
        r = _planted(text)
        pages[which] = _Links(render_triage(
            r, run_href={f"run-{i}{text}": h for i, h in enumerate(hrefs.values())},
            attribution_href={f"a0{text}": "../attributions/a0-00000000.html"},
            home="../index.html"))
    built, benign = pages["hostile"], pages["plain"]
    assert sorted(built.tags) == sorted(benign.tags)
    assert sorted(built.attrs) == sorted(benign.attrs)
    assert built.hrefs == benign.hrefs
    text = "".join(built.text)
    for field in ("label", "agent", "node", "tool", "run-3", "budget", "flat", "a4", "t"):
        assert f"{field}{payload}" in text, field


def test_hostile_triage_in_a_store_reaches_the_index_as_text(tmp_path: Path):
    payload = HTML["attribute-breakout"]
    pages = {}
    for which, text in (("plain", "plain words"), ("hostile", payload)):
        r = _planted(text)
        with RunStore(tmp_path / f"{which}.db") as store:
            begin_triage(store, str(r.triage_id), {})
            finish_triage(store, str(r.triage_id), r, {})
        with RunStore(tmp_path / f"{which}.db", readonly=True) as db:
            written = write_index(db, tmp_path / which, which)
        assert written.triages == 1 and not written.damaged
        pages[which] = _Links(written.index.read_text(encoding="utf-8"))
    assert sorted(pages["hostile"].tags) == sorted(pages["plain"].tags)
    assert sorted(pages["hostile"].attrs) == sorted(pages["plain"].attrs)
    assert all(re.fullmatch(r"triages/[A-Za-z0-9_-]+-[0-9a-f]{8}\.html", h)
               for h in pages["hostile"].hrefs)
    assert f"label{payload}" in "".join(pages["hostile"].text)


def test_car_report_all_says_how_many_triages_it_wrote(triaged):
    import os
    import subprocess
    import sys
    runs, passed, res, written, site = triaged
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "car_core.cli", "report", "--all", "--store",
                           "car.db", "-o", "again"], cwd=site.parent, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (f"({N_EARLY + N_LATE + 1} run(s), {written.attributions} attribution(s), "
            f"1 triage(s), {written.pages} report(s) beside it)") in proc.stdout
    assert (site.parent / "again" / "triages" / page_name("t-page")).is_file()
