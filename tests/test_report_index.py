"""The index across a store (``car report --all``): every run and attribution listed with what
it answered, links only to the pages written beside it, hostile text kept as text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _report_data import index_store
from test_hostile_text import HTML

from car_core.report.pages import index_paths, page_name, write_index
from car_core.store import RunStore
from car_core.store.triages import begin_triage


class _Links(HTMLParser):
    """Rows of the two tables (cell texts), the links and every tag and attribute name."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.hrefs: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(n for n, _ in attrs)
        self.hrefs.extend(v or "" for n, v in attrs if n == "href")
        cls = dict(attrs).get("class")
        if tag == "table":
            self._table = cls
            self.tables[cls or ""] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag == "td" and self._table:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._table:
            self.tables[self._table][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture
def written(tmp_path: Path):
    made = index_store(tmp_path / "car.db")
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        result = write_index(db, tmp_path / "out", "car.db")
    return made, result, tmp_path / "out"


def test_index_lists_every_run_newest_first_with_test_agent_steps_and_outcome(written):
    made, result, folder = written
    assert result.index == folder / "index.html" and result.runs == 4
    page = _Links(result.index.read_text(encoding="utf-8"))
    rows = [r for r in page.tables["runs"] if r]
    assert [r[0] for r in rows] == ["passing", "none", "game", "pivot"]  # saved in that order
    pivot = dict(zip(["id", "when", "test", "agent", "steps", "status", "outcome", "latest"],
                     rows[3], strict=True))
    run = made["runs"]["pivot"]
    assert pivot["test"] == "tests/test_desk.py::test_refund" and pivot["agent"] == run.agent
    assert pivot["steps"] == str(len(run.steps)) and pivot["outcome"] == "1.00 failed"
    # the latest complete attribution is the one the run's own page shows
    assert pivot["latest"].startswith("locus step 2 [") and "(2 in all)" in pivot["latest"]
    assert rows[0][6] == "0.00" and rows[0][7] == "none"  # passing, never attributed
    assert "4 run(s), 3 failed · 4 attribution(s)" in "".join(page.text)


def test_index_lists_attributions_with_answer_step_and_interval(written):
    made, result, folder = written
    page = _Links(result.index.read_text(encoding="utf-8"))
    rows = {r[0]: r for r in page.tables["attributions"] if r}
    ids = made["attributions"]
    assert set(rows) == set(ids.values())
    # columns: attribution, run, started, method, answer, step, interval, rollouts
    assert rows[ids["locus"]][3:7] == ["contrastive", "locus", "step 2",
                                       rows[ids["locus"]][6]]
    assert re.fullmatch(r"\[0\.\d\d, 0\.\d\d\]", rows[ids["locus"]][6])
    assert rows[ids["undecided"]][4:6] == ["undecided", "candidate step 2"]
    assert rows[ids["no cause"]][4:7] == ["no cause", "—", "—"]
    # the AND game's two leaders are equal: the index says tie, not "step 0"
    assert rows[ids["shapley"]][4:6] == ["Shapley values", "tie: step 0, step 1"]


def test_every_link_points_at_a_page_that_was_written_and_shows_its_subject(written):
    made, result, folder = written
    page = _Links(result.index.read_text(encoding="utf-8"))
    assert len(page.hrefs) == 4 + 2 * 4  # a run page per run; per attribution its and its run's
    for href in set(page.hrefs):
        assert re.fullmatch(r"(runs|attributions)/[A-Za-z0-9_-]+-[0-9a-f]{8}\.html", href)
        assert (folder / href).is_file()
    assert result.pages == len(set(page.hrefs)) == 4 + 4
    undecided = made["attributions"]["undecided"]
    shown = (folder / "attributions" / page_name(undecided)).read_text(encoding="utf-8")
    assert "Answer: undecided" in shown and f"Attribution {undecided} (contrastive" in shown
    assert '<a href="../index.html">' in shown  # and back
    run_page = (folder / "runs" / page_name("passing")).read_text(encoding="utf-8")
    assert "No attribution yet" in run_page
    # a run's page is what `car report RUN_ID` writes: its latest complete attribution
    pivot = (folder / "runs" / page_name("pivot")).read_text(encoding="utf-8")
    assert f"Showing attribution {made['attributions']['locus']} (contrastive, complete, " \
           "the latest complete one) of 2 for this run." in pivot


def test_index_written_to_a_named_file_puts_the_pages_beside_it(tmp_path: Path):
    index_store(tmp_path / "car.db")
    assert index_paths(tmp_path / "x" / "all.html") == (tmp_path / "x" / "all.html",
                                                        tmp_path / "x")
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        result = write_index(db, tmp_path / "x" / "all.html", "car.db")
    assert result.index == tmp_path / "x" / "all.html"
    assert (tmp_path / "x" / "runs" / page_name("pivot")).is_file()
    back = (tmp_path / "x" / "runs" / page_name("pivot")).read_text(encoding="utf-8")
    assert '<a href="../all.html">' in back


def test_page_names_are_safe_and_distinct():
    names = {page_name(i) for i in ("a/b", "a_b", "../../etc", "javascript:x", "", "ü")}
    assert len(names) == 6
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+-[0-9a-f]{8}\.html", n) for n in names)


@pytest.mark.parametrize("name", list(HTML))
def test_hostile_text_in_ids_agents_tests_and_labels_stays_text(tmp_path: Path, name: str):
    payload = HTML[name]
    index_store(tmp_path / "plain.db", hostile="plain words")
    index_store(tmp_path / "hostile.db", hostile=payload)
    pages = {}
    for which in ("plain", "hostile"):
        with RunStore(tmp_path / f"{which}.db", readonly=True) as db:
            pages[which] = _Links(write_index(db, tmp_path / which, which)
                                  .index.read_text(encoding="utf-8"))
    built, benign = pages["hostile"], pages["plain"]
    assert sorted(built.tags) == sorted(benign.tags)
    assert sorted(built.attrs) == sorted(benign.attrs)
    assert all(re.fullmatch(r"(runs|attributions)/[A-Za-z0-9_-]+-[0-9a-f]{8}\.html", h)
               for h in built.hrefs)
    text = "".join(built.text)
    assert f"pivot{payload}" in text and f"test_refund{payload}" in text
    assert f"step 0{payload}" in text  # the Shapley leader's label


def test_car_report_all_from_the_command_line(tmp_path: Path):
    index_store(tmp_path / "car.db")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "car_core.cli", "report", "--all", "--store",
                           "car.db", "-o", "site"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wrote site/index.html (4 run(s), 4 attribution(s), 8 report(s) beside it)" \
        in proc.stdout
    assert (tmp_path / "site" / "index.html").is_file()
    both = subprocess.run([sys.executable, "-m", "car_core.cli", "report", "pivot", "--all",
                           "--store", "car.db"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "--all writes every run's report" in both.stderr
    neither = subprocess.run([sys.executable, "-m", "car_core.cli", "report", "--store",
                              "car.db"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert neither.returncode == 2 and "needs a RUN_ID, or --all" in neither.stderr


def test_a_damaged_run_or_attribution_is_named_and_the_rest_still_indexed(tmp_path: Path):
    import sqlite3
    made = index_store(tmp_path / "car.db")
    with sqlite3.connect(tmp_path / "car.db") as con:
        con.execute("UPDATE runs SET agent = 'someone else' WHERE id = 'game'")
        con.execute("UPDATE attributions SET result = json_set(result, '$.locus', 4) "
                    "WHERE id = ?", [made["attributions"]["locus"]])
    con.close()
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        result = write_index(db, tmp_path / "out", "car.db")
    assert result.runs == 3  # pivot, none, passing
    assert result.attributions == 2  # the undecided one and no cause (game's run is damaged)
    assert [d.split(":")[0] for d in result.damaged] == ["run game", "attribution "
                                                         + made["attributions"]["locus"]]
    page = _Links(result.index.read_text(encoding="utf-8"))
    assert "2 damaged row(s) left out" in "".join(page.text)


def test_an_empty_store_gets_an_index_that_says_so(tmp_path: Path):
    RunStore(tmp_path / "car.db").close()
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        result = write_index(db, tmp_path / "out", "car.db")
    text = "".join(_Links(result.index.read_text(encoding="utf-8")).text)
    assert result.pages == 0 and "No recorded runs." in text and "No attributions yet" in text


def test_an_attribution_stopped_before_its_result_is_listed_without_a_page(tmp_path: Path):
    """A Ctrl-C or a blocked side effect leaves an attribution row with no result: the index
    lists it, unlinked (it once stopped ``car report --all`` with an internal error)."""
    made = index_store(tmp_path / "car.db")
    with RunStore(tmp_path / "car.db") as db:
        stopped = db.begin_attribution("pivot", "contrastive", {"rollouts": 64})
        begin_triage(db, "stopped-triage", {})
    with RunStore(tmp_path / "car.db", readonly=True) as db:
        result = write_index(db, tmp_path / "out", "car.db")
    page = _Links(result.index.read_text(encoding="utf-8"))
    rows = [" ".join(row) for row in page.tables["attributions"] if stopped in " ".join(row)]
    assert rows and not any(stopped in href for href in page.hrefs)
    # stored as running, no estimate holds it: stopped, as `car attributions` says (a trial's
    # index read "no result yet (running)" after a triage stopped on a model outage)
    assert all("interrupted" in row and "running" not in row for row in rows), rows
    said = [" ".join(row) for row in page.tables["triages"] if "stopped-triage" in " ".join(row)]
    assert said and all("interrupted" in row and "running" not in row for row in said), said
    assert all(a in "".join(page.text) for a in made["attributions"].values())


def test_a_run_page_shows_the_attribution_that_finished_last_not_the_one_begun_last():
    """A resumed attribution finishes after ones begun since: a trial's report showed the
    64-rollout answer begun after it, not the 320-rollout one it had just resumed."""
    from car_core.model.vocabulary import AttributionStatus
    from car_core.report.pages import latest_attribution
    from car_core.store import Attribution

    def row(name: str, begun: float, finished: float | None,
            status: AttributionStatus = AttributionStatus.COMPLETE) -> Attribution:
        return Attribution(name, "r", "contrastive", status, {}, object(),  # type: ignore[arg-type]
                           created_at=begun, finished_at=finished)
    resumed, later = row("resumed", 1.0, 30.0), row("later", 2.0, 10.0)
    assert latest_attribution([resumed, later]) is resumed
    assert latest_attribution([row("a", 1.0, 5.0), row("b", 2.0, 5.0)]).id == "b"  # a tie
    # a complete one still wins over a truncated one that finished after it
    cut = row("cut", 3.0, 40.0, AttributionStatus.TRUNCATED)
    assert latest_attribution([resumed, later, cut]) is resumed
    assert latest_attribution([cut]) is cut
