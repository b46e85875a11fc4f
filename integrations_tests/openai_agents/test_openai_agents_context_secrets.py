"""OpenAI Agents SDK: a secret held in the run context (``Runner.run(..., context=obj)``) is
stored with every step's snapshot of that context, so it must be redacted before storage: a
value registered with ``car_core.contract.redact``, and one under a field whose name says it
is a key (``api_key``, ``*_token``, ``password``), at any depth. Neither reaches the SQLite
file, its -wal, nor what ``car show`` prints in another process (which knows no secret)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from car_adapters.common.messages import assistant
from car_adapters.openai_agents import CarRecorder, ScriptedModel
from pydantic import BaseModel

from car_core.contract import redact

set_tracing_disabled(True)

ROOT = Path(__file__).resolve().parents[2]
FIELD_KEY = "ctx-field-key-7f3a9c1e5b2d"  # under api_key: a key form, registered by nobody
NESTED_TOKEN = "ghp_ctxNestedToken4e8a2f60"  # under github_token, one level down
REGISTERED = "acct-registered-91b7e4d2c6"  # a field name that says nothing; registered below
SECRETS = (FIELD_KEY, NESTED_TOKEN, REGISTERED)


class Vault(BaseModel):
    github_token: str
    region: str = "eu"


class Session(BaseModel):
    traveller: str
    api_key: str
    vault: Vault
    billing_ref: str


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    return assistant("done")


def test_a_secret_in_the_run_context_never_reaches_the_store_or_car_show(tmp_path: Path
                                                                          ) -> None:
    redact.register(REGISTERED)
    db = tmp_path / "car.db"
    rec = CarRecorder(store=db)
    agent = Agent[Session](name="Desk", instructions="Help.",
                           model=ScriptedModel(decide, seed=0))
    context = Session(traveller="Ada", api_key=FIELD_KEY, vault=Vault(github_token=NESTED_TOKEN),
                      billing_ref=REGISTERED)
    Runner.run_sync(agent, "Book it.", context=context, hooks=rec)
    run = rec.run
    snap = run.steps[0].meta["run_context"]
    # recorded, less its secrets: the rest of the context is kept as it was
    assert snap["value"]["traveller"] == "Ada" and snap["value"]["vault"]["region"] == "eu"
    assert snap["value"]["api_key"] == redact.MARK
    assert snap["value"]["vault"]["github_token"] == redact.MARK
    assert snap["value"]["billing_ref"] == redact.MARK
    assert context.api_key == FIELD_KEY  # the app's own object is left alone
    rec.store.load(run.id)  # written: the writer thread has reached the file
    for path in (db, Path(f"{db}-wal")):  # the -wal while the store is still open
        if path.exists():
            raw = path.read_bytes()
            for secret in SECRETS:
                assert secret.encode() not in raw, (path.name, secret)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    for extra in (["--full"], ["--json"]):
        shown = subprocess.run([sys.executable, "-m", "car_core.cli", "show", run.id,
                                "--store", str(db), *extra], env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        if extra == ["--json"]:  # the stored context is what is shown, less its secrets
            assert '"traveller": "Ada"' in shown.stdout and redact.MARK in shown.stdout
        for secret in SECRETS:
            assert secret not in shown.stdout + shown.stderr, (extra, secret)
