"""The README's pictures of the report, made from the current code: ``python
tests/support/screenshots.py`` attributes planted runs into a fresh store (the demo's failing
run, a late pivot, a no-cause run, the AND game by Shapley, a passing run), writes ``car report
--all`` of it, and has headless Chromium photograph the demo run's report and the index at
1280 px wide into ``docs/report.png`` and ``docs/report-index.png``.

Everything is seeded, so the pages are the same on every run; the PNGs differ only where the
fonts or Chromium do.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
WIDTH = 1280
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _car(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, check=True,
                   capture_output=True, text=True, timeout=600)


def build(folder: Path) -> tuple[Path, Path]:
    """The store and its pages in ``folder``: (the demo run's report, the index)."""
    import car_core as car
    from car_core.report.pages import page_name
    from car_core.store import RunStore
    from car_core.testing import synthetic as syn

    _car("demo", "--policy", "synthetic", "--store", "car.db", "--out", "demo.html", cwd=folder)
    with RunStore(folder / "car.db") as store:
        demo = store.runs()[0]["id"]
        planted = [(syn.late_pivot(), "tests/test_desk.py::test_refund_after_long_chat", False),
                   (syn.no_cause(), "tests/test_desk.py::test_flaky_judge", False),
                   (syn.and_game(), "tests/test_desk.py::test_two_agents_must_agree", True)]
        for model, test, by_shapley in planted:
            run = model.failing_run(seed=0)
            run = replace(run, meta={**run.meta, "test": test})
            store.save(run)
            if by_shapley:
                car.shapley(run, model.agent(), outcome=model.outcome, budget=400, seed=0,
                            store=store)
            else:
                car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=32, seed=0,
                                store=store)
        model = syn.pivot()
        passing = next(r for r in (car.record(model.agent(), context={"scm": "pivot"},
                                              outcome=model.outcome, seed=s)
                                   for s in range(50)) if not r.failed)
        store.save(replace(passing, meta={**passing.meta,
                                          "test": "tests/test_desk.py::test_happy_path"}))
    _car("report", "--all", "--store", "car.db", "-o", "site", cwd=folder)
    return folder / "site" / "runs" / page_name(demo), folder / "site" / "index.html"


def shoot(page: Path, png: Path, height: int, profile: Path) -> None:
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--hide-scrollbars", "--force-device-scale-factor=1",
                    f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}",
                    f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)


def main() -> int:
    DOCS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        report, index = build(folder)
        shoot(report, DOCS / "report.png", 1500, folder / "profile")
        shoot(index, DOCS / "report-index.png", 760, folder / "profile")
    print(f"wrote {DOCS / 'report.png'} and {DOCS / 'report-index.png'} ({WIDTH} px wide)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
