"""The pytest plugin: record the agent runs a test makes, and attribute a failing test's run.

Registered by entry point (``pytest11``), so installing the package enables it; it imports no
framework and not even ``car_core`` until a test asks for the ``car_recorder`` fixture.

- ``car_recorder`` records every run the test makes through the frameworks it has loaded (see
  ``car_adapters.pytest_integrations``) into the session's SQLite store, each with the test's
  node id in ``run.meta["test"]``. ``car_recorder.watch(app_or_agent, outcome=...)`` names the
  agent to branch with and scores the runs the recorder could not score itself.
- ``--car-attribute`` (off by default): when a test that used the fixture fails, its latest
  failed run is attributed (contrastive unless ``--car-method shapley``), within
  ``--car-budget`` rollouts and ``--car-wall-time`` seconds, and the locus with its interval
  and the HTML report's path go into the failure report. An attribution that cannot run says
  why in one line; the test's outcome is never changed.
- ``@pytest.mark.car(side_effect_tools=[...], simulators={...}, outcome=fn)`` sets the same
  options per test. Under pytest-xdist each worker writes its own store; the controller merges
  them into one at the end of the session.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import pytest

from .pytest_recording import RunRecorder

__all__ = ["RunRecorder"]

STORE_NAME = "runs.db"
MARKER = ("car(side_effect_tools=(), simulators=None, outcome=None, **adapter_options): "
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
    group.addoption("--car-store", default=None, metavar="PATH",
                    help="SQLite store for the session's runs (default: runs.db in pytest's "
                         "cache folder, replaced each session)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    if config.getoption("car_attribute"):
        config.pluginmanager.register(_Attributor(config), "car-attributor")


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
                           options=dict(marker.kwargs) if marker else {})
    request.node.stash[_RECORDER] = recorder
    recorder.start()
    yield recorder
    recorder.finish()


_RECORDER = pytest.StashKey[RunRecorder]()


class _Attributor:
    """Registered only with ``--car-attribute``: attributes failing tests' runs."""

    def __init__(self, config: pytest.Config) -> None:
        self.method = config.getoption("car_method")
        self.budget = config.getoption("car_budget")
        self.rollouts = config.getoption("car_rollouts")
        self.wall_time = config.getoption("car_wall_time")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        report = yield
        recorder = item.stash.get(_RECORDER, None)
        if recorder is None or report.when != "call" or not report.failed:
            return report
        report.sections.append(("CAR attribution", self.attribute(recorder, item)))
        return report

    def attribute(self, recorder: RunRecorder, item: pytest.Item) -> str:
        started = time.monotonic()
        try:
            found = recorder.attribute(method=self.method, budget=self.budget,
                                       rollouts=self.rollouts, wall_time=self.wall_time,
                                       report=_report_path(recorder.path, item.nodeid))
        except Exception as exc:  # never let CAR turn a failure into an error
            first = str(exc).splitlines()[0] if str(exc) else ""
            return f"not attributed: {type(exc).__name__}: {first}"
        if isinstance(found, str):
            return f"not attributed: {found}"
        return found.summary(time.monotonic() - started)


def _report_path(store: Path, nodeid: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[-80:]
    tag = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return store.parent / "reports" / f"{slug}-{tag}.html"
