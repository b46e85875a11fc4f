"""The pytest plugin: record the agent runs a test makes, and attribute a failing test's run.

Registered by entry point (``pytest11``), so installing the package enables it; it imports no
framework and not even ``car_core`` until a test asks for the ``car_recorder`` fixture.

- ``car_recorder`` records every run the test makes through the frameworks it has loaded (see
  ``car_adapters.pytest_plugin.integrations``) into the session's SQLite store, each with the test's
  node id in ``run.meta["test"]`` and the session's id in ``run.meta["test_session"]`` (so
  ``car triage --session`` can pick one session's runs from a store that keeps several).
  ``car_recorder.watch(app_or_agent, outcome=...)`` names the agent to branch with and scores
  the runs the recorder could not score itself.
- ``--car-attribute`` (off by default): when a test that used the fixture fails, its latest
  failed run is attributed (contrastive unless ``--car-method shapley``), within
  ``--car-budget`` rollouts and ``--car-wall-time`` seconds (branches run as
  ``--car-executor`` says, else as chosen for the agent), and the locus with its interval
  and the HTML report's path go into the failure report (how it was measured too with
  ``--car-explain``). An attribution that cannot run says
  why in one line; the test's outcome is never changed. With more than one failing test, the
  end-of-session summary groups where they commit (``population``), with intervals.
- ``@pytest.mark.car(safe_tools=[...], side_effect_tools=[...], simulators={...}, outcome=fn)``
  sets the same options per test (every tool of the agent must be classified, as for the
  adapters; ``unclassified="live"`` is the sandbox opt-out). Under pytest-xdist each worker
  writes its own store; the controller merges them into one at the end of the session.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from .recording import NoRunFailed, RunRecorder, close_writers

__all__ = ["RunRecorder"]

STORE_NAME = "runs.db"
MARKER = ("car(safe_tools=(), side_effect_tools=(), simulators=None, outcome=None, "
          "**adapter_options): "
          "options for CAR's recording and attribution of this test's agent runs")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("car", "Causal Agent Replay")
    group.addoption("--car-attribute", action="store_true", default=False,
                    help="attribute the recorded run of each failing test that used car_recorder")
    group.addoption("--car-method", choices=("contrastive", "shapley"), default="contrastive",
                    help="estimator for --car-attribute (default: contrastive)")
    group.addoption("--car-budget", type=int, default=256, metavar="N",
                    help="most rollouts one attribution may spend (default: 256)")
    group.addoption("--car-rollouts", type=int, default=16, metavar="K",
                    help="rollouts per arm for contrastive attribution (default: 16)")
    group.addoption("--car-wall-time", type=float, default=60.0, metavar="S",
                    help="most seconds one attribution may take (default: 60)")
    group.addoption("--car-executor", choices=("sequential", "async", "ray"), default=None,
                    help="how one attribution runs its branches (default: chosen for the "
                         "agent: at once when its model waits on a server)")
    group.addoption("--car-explain", action="store_true", default=False,
                    help="with --car-attribute: also print how each answer was measured (the "
                         "test, its level, the sample sizes, the pairing); the report has it "
                         "either way")
    group.addoption("--car-store", default=None, metavar="PATH",
                    help="SQLite store for the session's runs (default: runs.db in pytest's "
                         "cache folder, replaced each session)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    given = getattr(config, "workerinput", {}).get("car_session")
    config.stash[_SESSION] = given or (time.strftime("%Y%m%dT%H%M%S", time.gmtime())
                                       + "-" + secrets.token_hex(3))
    if config.getoption("car_attribute"):
        config.pluginmanager.register(_Attributor(config), "car-attributor")


_SESSION = pytest.StashKey[str]()  # this session's id: the controller's, passed to workers


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
def pytest_configure_node(node: Any) -> None:
    """Every xdist worker tags its runs with the controller's session id."""
    node.workerinput["car_session"] = node.config.stash[_SESSION]


def store_path(config: pytest.Config) -> Path:
    """This process's store: the session store, or under xdist this worker's own file."""
    chosen = config.getoption("car_store")
    if chosen:
        main = Path(chosen).resolve()
    elif config.pluginmanager.has_plugin("cacheprovider"):
        main = Path(config.rootpath, config.getini("cache_dir"), "d", "car", STORE_NAME)
    else:
        main = config.rootpath / ".car-pytest" / STORE_NAME
    worker = getattr(config, "workerinput", {}).get("workerid")
    return main.with_name(f"{main.stem}-{worker}{main.suffix}") if worker else main


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _worker_files(main: Path) -> list[Path]:
    return sorted(main.parent.glob(f"{main.stem}-gw*{main.suffix}"))


def _remove_db(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)


@pytest.hookimpl(tryfirst=True)  # before xdist starts workers that write new stores
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not _controller(config) or config.getoption("car_store"):
        return  # a store the user named accumulates runs
    main = store_path(config)
    if main.parent.is_dir():  # nothing to clear (and nothing created) before the first use
        for stale in [main, *_worker_files(main)]:
            _remove_db(stale)
        for report in (main.parent / "reports").glob("*.html"):
            report.unlink()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    problems = close_writers()  # every run this process recorded is stored from here on
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in problems:
            reporter.write_line(f"CAR: {line}")
    if not _controller(config):
        return
    main = store_path(config)
    workers = _worker_files(main) if main.parent.is_dir() else []
    if not workers:
        return
    from car_core import RunStore
    with RunStore(main) as store:
        for part in workers:
            store.merge(part)
            _remove_db(part)


@pytest.fixture
def car_recorder(request: pytest.FixtureRequest) -> Any:
    """Records every agent run this test makes into the session's CAR store (see
    ``RunRecorder``); with ``--car-attribute`` a failing test's run is attributed."""
    marker = request.node.get_closest_marker("car")
    recorder = RunRecorder(request.node.nodeid, store_path(request.config),
                           options=dict(marker.kwargs) if marker else {},
                           session=request.config.stash.get(_SESSION, None))
    request.node.stash[_RECORDER] = recorder
    recorder.start()
    yield recorder
    recorder.finish()


_RECORDER = pytest.StashKey[RunRecorder]()


class _Attributor:
    """Registered only with ``--car-attribute``: attributes failing tests' runs, tells the
    terminal while it does, adds what it found to the test's report (a section, and
    ``car_*`` properties that JUnit XML carries) and lists every attributed test at the end.
    Under pytest-xdist the workers attribute and the controller lists what their reports say."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.method = config.getoption("car_method")
        self.budget = config.getoption("car_budget")
        self.rollouts = config.getoption("car_rollouts")
        self.wall_time = config.getoption("car_wall_time")
        self.executor = config.getoption("car_executor")
        self.explain = config.getoption("car_explain")
        self.found: dict[str, dict[str, str]] = {}  # node id -> its car_* properties

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        report = yield
        recorder = item.stash.get(_RECORDER, None)
        if recorder is None or report.when != "call" or not report.failed:
            return report
        text, properties = self.attribute(recorder, item)
        report.sections.append(("CAR attribution", text))
        # the teardown report, which JUnit XML reads properties from, copies the item's
        item.user_properties.extend(properties.items())
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            props = {k: str(v) for k, v in report.user_properties if k.startswith("car_")}
            if props:
                self.found[report.nodeid] = props

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not _controller(self.config) or not self.found:
            return
        terminalreporter.section("CAR attribution summary")
        for nodeid, props in self.found.items():
            terminalreporter.write_line(summary_line(nodeid, props))
        from .population import population_lines
        lines = population_lines(self.found, store_path(self.config),
                                 self.config.stash.get(_SESSION, None))
        if lines:
            # no count here: the section's first line says of how many (a test whose runs all
            # passed is listed apart, out of them)
            terminalreporter.section("CAR: where the failing tests commit")
            for line in lines:
                terminalreporter.write_line(line)

    def attribute(self, recorder: RunRecorder, item: pytest.Item) -> tuple[str, dict[str, str]]:
        started = time.monotonic()
        progress = _Progress(self.config, item.nodeid, self.budget, self.wall_time)
        try:
            found = recorder.attribute(method=self.method, budget=self.budget,
                                       rollouts=self.rollouts, wall_time=self.wall_time,
                                       report=_report_path(recorder.path, item.nodeid),
                                       progress=progress, executor=self.executor)
        except KeyboardInterrupt:
            raise  # the user stopping the session, as in any test
        except BaseException as exc:  # noqa: B036 - skip(), exit() from user code on a branch
            # never let CAR turn a failure into an error or end the session
            why = one_line(exc)
            if not isinstance(exc, Exception):  # skip(), exit(): not CAR's error, say whose
                why += " raised on a branch (by the outcome, the agent or a tool it called)"
            progress.done(f"not attributed: {why}")
            return f"not attributed: {why}", {"car_answer": "not attributed", "car_reason": why}
        if isinstance(found, str):
            progress.done(f"not attributed: {found}")
            return f"not attributed: {found}", {"car_answer": "not attributed",
                                                "car_reason": str(found),
                                                **({"car_run_failed": "no"}
                                                   if isinstance(found, NoRunFailed) else {})}
        progress.done(found.headline())
        return (found.summary(time.monotonic() - started, self.explain),
                found.properties())


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type, its first line and the hint that says what to do,
    with the attribution a resume names where the stop left one (the hint's ``ID``)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    hint = getattr(exc, "hint", None)
    aid = (getattr(exc, "context", None) or {}).get("attribution_id")
    if aid and hint:
        first = first.replace("--resume ID", f"--resume {aid}")
        hint = hint.replace("--resume ID", f"--resume {aid}")
    line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    line += f" ({hint})" if hint and hint not in line else ""
    return line if not aid or str(aid) in line else f"{line} (attribution {aid})"


def summary_line(nodeid: str, props: dict[str, str]) -> str:
    """One attributed test in the end-of-session list."""
    if props.get("car_answer") == "not attributed":
        return f"{nodeid}: not attributed: {props.get('car_reason', '')}"
    said = props.get("car_headline", props.get("car_answer", ""))
    if props.get("car_report"):  # the answer is a sentence: the report's path follows it
        return f"{nodeid}: {said.rstrip('.')}; report {props['car_report']}"
    return f"{nodeid}: {said}"


class _Progress:
    """The estimator's progress hook (``update(n)`` / ``close()``): a line on the terminal when
    an attribution starts, every few seconds while it runs and when it ends, so a failing test
    never sits silent while its branches run. Quiet under xdist workers, which have no terminal,
    and with ``-qq``."""

    EVERY_S = 5.0

    def __init__(self, config: pytest.Config, nodeid: str, budget: int, wall_time: float) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        quiet = config.get_verbosity() < -1 or not _controller(config)
        self.reporter = None if quiet else reporter
        self.capture = config.pluginmanager.get_plugin("capturemanager")
        self.nodeid, self.budget = nodeid, budget
        self.rollouts = 0
        self.started = self.last = time.monotonic()
        self._write(f"CAR: attributing {nodeid} (at most {budget} rollouts, {wall_time:g} s)")

    def update(self, n: int = 1) -> None:
        self.rollouts += n
        now = time.monotonic()
        if now - self.last >= self.EVERY_S:
            self.last = now
            self._write(f"CAR: {self.nodeid}: {self.rollouts} of at most {self.budget} "
                        f"rollouts, {now - self.started:.0f} s")

    def close(self) -> None:
        pass  # ``done`` says how it ended

    def done(self, what: str) -> None:
        self._write(f"CAR: {self.nodeid}: {what} ({self.rollouts} of at most {self.budget} "
                    f"rollouts, {time.monotonic() - self.started:.1f} s)")

    def _write(self, line: str) -> None:
        if self.reporter is None:
            return
        if self.capture is not None:
            with self.capture.global_and_fixture_disabled():
                _own_line(self.reporter, line)
        else:
            _own_line(self.reporter, line)


def _own_line(reporter: Any, line: str) -> None:
    """``line`` on a line of its own: under ``-q`` pytest's result letters leave the current
    line open without telling ``write_line`` (a user trial read "FCAR: ...")."""
    writer = getattr(reporter, "_tw", None)
    if writer is not None and int(getattr(writer, "width_of_current_line", 0) or 0):
        writer.line()
    reporter.write_line(line)


def _report_path(store: Path, nodeid: str) -> Path:
    """A test's report file: its id without the parameters (the last 80 characters, the
    function's name among them), then the parameters' first 24, then a digest of the whole
    id. Cut from the whole id, a long parametrized one kept only parameters (a trial's
    "ooking_stays_within_budget_Oslo…")."""
    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")
    base, _, params = nodeid.partition("[")
    slug = clean(base)[-80:] + (f"_{clean(params)[:24].strip('_')}" if clean(params) else "")
    tag = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return store.parent / "reports" / f"{slug}-{tag}.html"
