"""The population-fix page of the store index (``car report --all``): a planted population's
fix stored, its page and its row on the index, a fix still running listed without a page, and
a hostile fix label kept as text.

Ground truth (``TwoModeDesk``, as ``test_population_fix.py``): the instruction ``DESK.fix``
rescues an early run by 0.3 and a late run by 0; the page is checked against the result
``car.fix_population`` returned, and every link against the files written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_hostile_text import HTML
from test_report_index import _Links

import car_core as car
from car_core.report.fix_page import render_fix
from car_core.report.pages import page_name, write_index
from car_core.store import RunStore
from car_core.store.fixes import begin_fix
from car_core.testing.synthetic_population import TwoModeDesk

DESK = TwoModeDesk()


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("fix")
    runs = DESK.population(3, 2, seed=0, ids="fixpage")
    with RunStore(folder / "car.db") as store:
        for r in runs:
            store.save(r)
        res = car.fix_population(runs, DESK.agent(), outcome=DESK.outcome, rollouts=16,
                                 candidates=[car.Fix.instruction(DESK.fix)], store=store,
                                 fix_id="f-page")
        begin_fix(store, "f-running", {})
    with RunStore(folder / "car.db", readonly=True) as db:
        written = write_index(db, folder / "site", "car.db")
    return runs, res, written, folder / "site"


def test_the_index_lists_each_fix_and_links_a_finished_ones_page(fixed):
    runs, res, written, site = fixed
    assert written.fixes == 2
    index = _Links(written.index.read_text(encoding="utf-8"))
    rows = {r[0]: r for r in index.tables["fixes"] if r}
    assert rows["f-page"][2:5] == ["complete", "5", "1"]
    assert rows["f-page"][5] == res.summary() and rows["f-page"][6] == str(res.rollouts_used)
    # begun, and its store closed with no estimate holding it: stopped, as `car attributions`
    # says, not running
    assert rows["f-running"][2] == "interrupted" and rows["f-running"][5] == "no result yet"
    href = f"fixes/{page_name('f-page')}"
    assert href in index.hrefs and (site / href).is_file()
    assert not (site / "fixes" / page_name("f-running")).exists()


def test_the_page_says_the_answer_first_then_each_fix_run_by_run(fixed):
    runs, res, written, site = fixed
    html = (site / "fixes" / page_name("f-page")).read_text(encoding="utf-8")
    page = _Links(html)
    text = " ".join("".join(page.text).split())
    assert text.index(res.summary()) < text.index("The fixes")
    (c,) = res.candidates
    (row,) = [r for r in page.tables["fixes"] if r]
    assert row[0] == c.label and row[3] == f"{100 * c.rescue:.0f}"
    assert row[4] == f"{100 * c.rescue_ci[0]:.0f} to {100 * c.rescue_ci[1]:.0f}"
    assert row[5:8] == [str(c.runs_tested), str(len(c.rescued)), str(len(c.not_rescued))]
    per_run = [r for r in page.tables["runs"] if r]
    assert [r[0] for r in per_run] == [r.run_id for r in c.per_run]
    assert [r[6] for r in per_run] == ["yes" if r.rescued else "no" for r in c.per_run]
    for href in (h for h in page.hrefs if not h.startswith("#fix-")):
        assert re.fullmatch(r"\.\./runs/[A-Za-z0-9_-]+-[0-9a-f]{8}\.html", href) \
            or href == "../index.html", href
        assert (site / "fixes" / href).resolve().is_file()
    assert {f"../runs/{page_name(r.id)}" for r in runs} <= set(page.hrefs)


@pytest.mark.parametrize("name", list(HTML))
def test_a_hostile_fix_label_stays_text(fixed, name: str):
    from dataclasses import replace
    runs, res, written, site = fixed
    pages = {}
    for which, text in (("plain", "plain words"), ("hostile", HTML[name])):
        c = replace(res.candidates[0], label=f"fix{text}")
        pages[which] = _Links(render_fix(replace(res, candidates=(c,)), home="../index.html"))
    assert sorted(pages["hostile"].tags) == sorted(pages["plain"].tags)
    assert sorted(pages["hostile"].attrs) == sorted(pages["plain"].attrs)
    assert f"fix{HTML[name]}" in "".join(pages["hostile"].text)


def test_car_report_all_says_how_many_population_fixes_it_wrote(fixed):
    runs, res, written, site = fixed
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "car_core.cli", "report", "--all", "--store",
                           "car.db", "-o", "again"], cwd=site.parent, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ", 2 population fix(es), " in proc.stdout
    assert (site.parent / "again" / "fixes" / page_name("f-page")).is_file()
