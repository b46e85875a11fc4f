"""The report in a real headless Chromium (Debian's chromium + chromium-driver via selenium):
it loads with no console error, shows the verdict and the plots, no plot label overflows its
picture, untested steps are styled apart from tested ones, the store's index links to pages
that open, and hostile transcripts stay text. (The README's screenshots are made by
``tests/support/screenshots.py``, not here: the tests leave the work tree untouched.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _report_data import (
    contrastive_dict,
    hostile_contrastive,
    hostile_run,
    index_store,
    shapley_dict,
)
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from car_core.report import render_attribution
from car_core.report.pages import write_index
from car_core.report.plots import UNTESTED_FILL
from car_core.store import RunStore
from car_core.testing import synthetic as syn

ROOT = Path(__file__).parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1100,1400",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def load(driver: webdriver.Chrome, path: Path) -> list[dict]:
    """Open a file and return what the page logged to the console while loading."""
    driver.get_log("browser")  # drain earlier pages' entries
    driver.get(path.as_uri())
    return driver.get_log("browser")


def severe(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("level") == "SEVERE"]


def test_console_errors_are_captured_at_all(browser, tmp_path):
    """Control for the checks below: a page that logs an error is seen to do so."""
    page = tmp_path / "noisy.html"
    page.write_text("<!DOCTYPE html><script>console.error('control error')</script>")
    assert any("control error" in e["message"] for e in severe(load(browser, page)))


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, "-m", "car_core.cli", "demo", "--policy", "synthetic",
                           "--store", "demo.db", "--out", "report.html"], cwd=folder,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return folder / "report.html"


def test_demo_report_loads_cleanly_shows_verdict_and_plots(browser, demo_report):
    assert severe(load(browser, demo_report)) == []
    verdict = browser.find_element(By.CSS_SELECTOR, "#verdict .headline")
    # the plain sentence every surface opens with: the step, and what re-deciding it does
    assert verdict.is_displayed() and "caused the failure" in verdict.text, verdict.text
    assert "re-deciding it avoids the failure in" in verdict.text, verdict.text
    # The verdict is the first thing on the page.
    first = browser.execute_script("return document.querySelector('main section').id")
    assert first == "verdict"
    for plot in ("rescue-plot", "arms-plot"):
        svg = browser.find_element(By.ID, plot)
        assert svg.is_displayed() and svg.size["width"] > 300 and svg.size["height"] > 100
    marks = browser.find_elements(By.CSS_SELECTOR, "#rescue-plot g.point")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.steps tbody tr")
    assert len(marks) == len(rows) > 0  # one mark per step of the result
    bars = browser.find_elements(By.CSS_SELECTOR, "#arms-plot g.bar rect")
    assert bars and all(b.size["height"] > 0 for b in bars)
    # The demo's LangGraph recorder stored each step's latency and token usage: the table
    # shows them for every step (none reads "—"), and its total row adds them up.
    cells = browser.execute_script(
        "return [...document.querySelectorAll('table.costs tbody tr')].map("
        "r => [...r.querySelectorAll('td')].map(c => c.textContent))")
    steps, total = cells[:-1], cells[-1]
    assert steps and all(re.fullmatch(r"[0-9.]+ (ms|s)", row[2]) for row in steps)
    assert all(row[3].isdigit() and row[4].isdigit() for row in steps)
    assert int(total[3]) == sum(int(row[3]) for row in steps)


def without_csp(html: str) -> str:
    """The page with its Content-Security-Policy cut out, so a missed escape would run."""
    start = html.index('<meta http-equiv="Content-Security-Policy"')
    return html[:start] + html[html.index(">", start) + 1:]


def assert_inert(browser, page) -> None:
    """The page loads cleanly and nothing in it ran or became an element that could run."""
    assert severe(load(browser, page)) == []
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    counts = browser.execute_script(
        "return [document.querySelectorAll('script').length,"
        " document.querySelectorAll('img').length,"
        " document.querySelectorAll('[onerror],[onload]').length]")
    assert counts == [0, 0, 0]


@pytest.mark.parametrize("csp", [True, False], ids=["as-shipped", "without-csp"])
def test_hostile_transcript_shows_as_text_and_runs_nothing(browser, tmp_path, csp):
    """Escaping alone must stop the payloads: the second case strips the page's
    Content-Security-Policy so a missed escape would run."""
    run, branch = hostile_run()
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    if not csp:
        html = without_csp(html)
        assert "Content-Security-Policy" not in html
    page = tmp_path / "hostile.html"
    page.write_text(html, encoding="utf-8")
    assert_inert(browser, page)
    act = browser.find_element(By.CSS_SELECTOR, "#verdict .act").text
    assert "<script>window.__pwned = 1</script>" in act
    body = browser.find_element(By.TAG_NAME, "body").text
    assert '<img src="x" onerror="window.__pwned = 2">' in body
    assert '</pre></div><svg onload="window.__pwned = 3"></svg>' in body


# -- plot labels stay inside their picture ------------------------------------------------------
# Every <text> of every plot, as drawn: its box against its <svg>'s box (both in CSS pixels, so
# the viewBox scaling is included). Half a pixel of slack for anti-aliased edges.
OVERFLOWING = """
const out = [];
for (const svg of document.querySelectorAll('svg.plot')) {
  const box = svg.getBoundingClientRect();
  for (const t of svg.querySelectorAll('text')) {
    const r = t.getBoundingClientRect();
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5
        || r.bottom > box.bottom + 0.5) out.push([svg.id, t.textContent, r.left - box.left,
                                                  box.right - r.right]);
  }
}
return out;"""


def _long_shapley(n: int) -> dict:
    r = shapley_dict(syn.and_game())
    agents = ("account_agent", "ep", "triage_and_routing_agent", "refunds")
    r["values"] = [{"step": k, "label": f"{agents[k % 4]} {k} (its {k // 4 + 1}st decision)",
                    "estimate": 0.3 - 0.02 * k, "ci": [0.25 - 0.02 * k, 0.35 - 0.02 * k],
                    "n": 100} for k in range(n)]
    r["values"][-1]["label"] = ("the customer-service triage agent that reads every incoming "
                               "ticket and WWWWMMMM its routing, last step (its 1st decision)")
    return r


def test_the_overflow_check_sees_a_clipped_label(browser, tmp_path):
    """Control: a label drawn left of its picture is reported."""
    page = tmp_path / "clipped.html"
    page.write_text('<!DOCTYPE html><svg class="plot" id="p" viewBox="0 0 200 50" width="200" '
                    'height="50"><text x="10" y="20" text-anchor="end">ep 4 (its 1st decision)'
                    '</text></svg>')
    load(browser, page)
    assert [o[1] for o in browser.execute_script(OVERFLOWING)] == ["ep 4 (its 1st decision)"]


@pytest.mark.parametrize("n", [3, 40])
@pytest.mark.parametrize("width", [1280, 700])
def test_no_shapley_label_overflows_its_plot(browser, tmp_path, n, width):
    page = tmp_path / "shapley.html"
    page.write_text(render_attribution(_long_shapley(n)), encoding="utf-8")
    browser.set_window_size(width, 1400)
    try:
        assert severe(load(browser, page)) == []
        labels = browser.find_elements(By.CSS_SELECTOR, "#shapley-plot text.label")
        assert len(labels) == n
        assert browser.execute_script(OVERFLOWING) == []
        # the longest label wrapped, and none of its words was dropped
        long = labels[-1]
        lines = [t.get_attribute("textContent") for t in long.find_elements(By.TAG_NAME, "tspan")]
        assert len(lines) > 1
        assert " ".join(lines) == _long_shapley(n)["values"][-1]["label"]
    finally:
        browser.set_window_size(1100, 1400)


def test_no_rescue_or_arm_label_overflows_on_a_long_run(browser, tmp_path):
    model = syn.late_pivot()
    run = model.failing_run()
    page = tmp_path / "long.html"
    page.write_text(render_attribution(contrastive_dict(model, run, untested=(0, 5, 9)),
                                       run=run), encoding="utf-8")
    assert severe(load(browser, page)) == []
    assert browser.execute_script(OVERFLOWING) == []


# -- untested steps --------------------------------------------------------------------------------
def test_untested_steps_are_styled_apart_from_tested_ones(browser, tmp_path, pivot_model,
                                                          pivot_run):
    page = tmp_path / "untested.html"
    page.write_text(render_attribution(contrastive_dict(pivot_model, pivot_run,
                                                        untested=(0, 4)), run=pivot_run),
                    encoding="utf-8")
    assert severe(load(browser, page)) == []
    style = browser.execute_script("""
      const rgb = c => getComputedStyle(c).fill;
      const untested = [...document.querySelectorAll('#rescue-plot g.point.untested')];
      const tested = [...document.querySelectorAll('#rescue-plot g.point:not(.untested)')];
      const plot = document.querySelector('#rescue-plot').getBoundingClientRect();
      return {
        untested: untested.map(g => ({
          fill: rgb(g.querySelector('rect.untested-column')),
          circles: g.querySelectorAll('circle').length,
          mark: g.querySelector('text.untested-mark').textContent,
          height: g.querySelector('rect.untested-column').getBoundingClientRect().height
                  / plot.height})),
        tested: tested.map(g => g.querySelectorAll('circle').length),
        swatch: getComputedStyle(document.querySelector('.swatch.untested')).backgroundColor,
      };""")
    r, g, b = (int(UNTESTED_FILL[i:i + 2], 16) for i in (1, 3, 5))
    colour = f"rgb({r}, {g}, {b})"
    assert len(style["untested"]) == 2 and len(style["tested"]) == pivot_model.n_steps - 2
    for mark in style["untested"]:
        # a shaded column over most of the plot's height, no dot, and a "?"
        assert mark == {"fill": colour, "circles": 0, "mark": "?", "height": mark["height"]}
        assert mark["height"] > 0.6
    assert all(n == 1 for n in style["tested"])  # every tested step has its point
    assert style["swatch"] == colour  # the legend shows the same colour


# -- the index -------------------------------------------------------------------------------------
def test_index_page_loads_cleanly_and_its_links_open_their_reports(browser, tmp_path):
    made = index_store(tmp_path / "car.db")
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        index = write_index(db, tmp_path / "site", "car.db").index
    assert severe(load(browser, index)) == []
    runs = browser.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
    attributions = browser.find_elements(By.CSS_SELECTOR, "table.attributions tbody tr")
    assert len(runs) == len(made["runs"]) and len(attributions) == len(made["attributions"])
    assert all(r.is_displayed() for r in runs + attributions)
    failed = browser.find_elements(By.CSS_SELECTOR, "table.runs tr.failed")
    assert len(failed) == sum(1 for r in made["runs"].values() if r.failed)
    hrefs = [a.get_attribute("href") for a in
             browser.find_elements(By.CSS_SELECTOR, "table.attributions td.id a")]
    assert len(hrefs) == 2 * len(made["attributions"])
    for href in sorted(set(hrefs)):
        browser.get_log("browser")
        browser.get(href)
        assert severe(browser.get_log("browser")) == []
        assert browser.find_element(By.CSS_SELECTOR, "#verdict .headline").is_displayed()
        back = browser.find_element(By.CSS_SELECTOR, "p.nav a")
        assert back.get_attribute("href") == index.as_uri()


@pytest.mark.parametrize("csp", [True, False], ids=["as-shipped", "without-csp"])
def test_hostile_text_on_the_index_runs_nothing(browser, tmp_path, csp):
    payload = '<img src="x" onerror="window.__pwned = 2"><script>window.__pwned = 1</script>'
    index_store(tmp_path / "car.db", hostile=payload)
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        index = write_index(db, tmp_path / "site", "car.db").index
    html = index.read_text(encoding="utf-8")
    if not csp:
        index.write_text(without_csp(html), encoding="utf-8")
    assert_inert(browser, index)
    assert payload in browser.find_element(By.CSS_SELECTOR, "table.runs").text
