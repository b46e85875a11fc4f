"""Check the store against the lowest sqlite-utils that pyproject.toml allows (4.0).

The project venv holds one sqlite-utils (the newest 4.x); this script installs 4.0 into a
throwaway folder and, with it first on ``sys.path``, writes a store and reads one back, then
does the same across versions (written with 4.0, opened with the installed one, and back):
the store must accept everything it wrote, whichever supported version wrote it.

    .venv/bin/python tests/support/sqlite_utils_floor.py      (or: make lowest-deps)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

FLOOR = "4.0"
ROOT = Path(__file__).resolve().parents[2]

WRITE = """
import importlib.metadata as md, car_core as car
from car_core.testing import synthetic as syn
model = syn.pivot()
run = model.failing_run(0)
store = car.RunStore(DB)
store.save(run)
car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4, store=store,
                attribution_id=AID)
print(md.version("sqlite-utils"), run.id)
"""

READ = """
import importlib.metadata as md, car_core as car
store = car.RunStore(DB)
for row in store.runs():
    store.load(row["id"]).verify()
for aid in AIDS:
    assert store.attribution(aid).status == "complete", aid
print(md.version("sqlite-utils"), len(store.runs()))
"""


def run(code: str, floor_dir: str | None, **names: object) -> str:
    env = dict(os.environ)
    if floor_dir:
        env["PYTHONPATH"] = floor_dir + os.pathsep + env.get("PYTHONPATH", "")
    head = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    out = subprocess.run([sys.executable, "-c", head + code], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        floor_dir = os.path.join(tmp, "floor")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", floor_dir, f"sqlite-utils=={FLOOR}"], check=True)
        old, new = os.path.join(tmp, "floor.db"), os.path.join(tmp, "current.db")
        wrote_old = run(WRITE, floor_dir, DB=old, AID="a-floor")
        assert wrote_old.startswith(FLOOR + " "), wrote_old
        wrote_new = run(WRITE, None, DB=new, AID="a-current")
        print(f"wrote with sqlite-utils {wrote_old.split()[0]} and {wrote_new.split()[0]}")
        print("floor reads floor:", run(READ, floor_dir, DB=old, AIDS=["a-floor"]))
        print("current reads floor:", run(READ, None, DB=old, AIDS=["a-floor"]))
        print("floor reads current:", run(READ, floor_dir, DB=new, AIDS=["a-current"]))
        # a store migrated under one version keeps taking writes under the other
        run(WRITE, None, DB=old, AID="a-current")
        print("floor reads both:", run(READ, floor_dir, DB=old, AIDS=["a-floor", "a-current"]))
    print("ok: every supported sqlite-utils opens what the store wrote")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
