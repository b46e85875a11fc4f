"""No API key reaches the store, the report, the terminal or the logs.

A canary key is planted in every place a key can enter CAR: the ``api_key`` argument, the
``OPENAI_API_KEY`` environment variable, the userinfo of ``base_url``, and a key with a stray
non-ASCII character (which the HTTP layer cannot encode: its ``UnicodeEncodeError`` quotes
``Bearer <key>``), against a server that echoes the request's ``Authorization`` header in its
error bodies. Each case is attributed through the ``car`` command and in-process; then every
byte of the SQLite files (``-wal`` included), each HTML report, the captured stdout/stderr of
every command, the log records (DEBUG and up, the HTTP clients' included) and the formatted
tracebacks of the errors raised are searched for every canary.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import openai
import pytest
from car_adapters.chat_agent import ChatAgent
from car_adapters.openai import OpenAIPolicy
from servers import StubOpenAIServer, free_port

import car_core as car
from car_core.errors import CarError
from car_core.store import RunStore

# the ASCII cores the search looks for: any one of them found anywhere is a leak
CORES = {"arg": "9f1c7e3b5a2d4068", "env": "2b8d6f0a4c1e3957", "url": "7d3f9b1e5a60c2",
         "unicode": "4e6a8c0b2d1f97"}
KEYS = {"arg": f"sk-canaryARG{CORES['arg']}", "env": f"sk-canaryENV{CORES['env']}",
        "url": f"canaryURL{CORES['url']}", "unicode": f"sk-canaryUNI{CORES['unicode']}é1357"}
FACTORY = textwrap.dedent('''
    import os
    import openai
    from car_adapters.chat_agent import ChatAgent
    from car_adapters.openai import OpenAIPolicy

    def make():
        case, url = os.environ["CANARY_CASE"], os.environ["STUB_URL"]
        kw = dict(max_retries=1, backoff=0.01, retry_time=0.5, timeout=5)
        if case == "arg":
            policy = OpenAIPolicy("stub-model", base_url=url, api_key=os.environ["CANARY"], **kw)
        elif case == "env":  # the key comes from OPENAI_API_KEY
            policy = OpenAIPolicy("stub-model", base_url=url, **kw)
        elif case == "url":  # a dead address with the key in its userinfo
            policy = OpenAIPolicy("stub-model", api_key="placeholder-key", **kw,
                                  base_url=os.environ["DEAD_URL"])
        else:
            client = openai.OpenAI(api_key=os.environ["CANARY"], base_url=url, max_retries=0)
            policy = OpenAIPolicy("stub-model", client=client, **kw)
        return ChatAgent(policy, name="canary-chat", max_steps=2)

    def outcome(run):
        return float("echo" in (run.steps[-1].action.get("content") or ""))
''')


def _env(case: str, stub_url: str, dead_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update({"COLUMNS": "200", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")]),
        "CANARY_CASE": case, "STUB_URL": stub_url, "DEAD_URL": dead_url})
    if case == "env":
        env["OPENAI_API_KEY"] = KEYS["env"]
    elif case in ("arg", "unicode"):
        env["CANARY"] = KEYS[case]
    return env


def _car(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=300)


def _leaks(blob: bytes) -> list[str]:
    text = blob.decode("utf-8", "replace")
    return [case for case, core in CORES.items()
            if core in text or core.encode("utf-16-le") in blob]


@pytest.mark.slow
def test_no_canary_key_leaks_into_store_report_terminal_or_logs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "canary_agent.py").write_text(FACTORY)
    db = tmp_path / "car.db"
    dead_url = f"http://user:{KEYS['url']}@127.0.0.1:{free_port()}/v1"
    places: dict[str, bytes] = {}
    with StubOpenAIServer(echo_auth=True) as stub:
        healthy = OpenAIPolicy("stub-model", base_url=stub.base_url, api_key="placeholder-key")
        run = car.record(ChatAgent(healthy, name="canary-chat", max_steps=2), context="hi",
                         outcome=lambda r: 1.0)
        with RunStore(db) as store:
            store.save(run)

        for case in CORES:  # the command line: attribute, report, show, runs
            stub.failures = [400 if case != "env" else 500] * 10_000
            env = _env(case, stub.base_url, dead_url)
            report = tmp_path / f"report-{case}.html"
            procs = [_car("attribute", run.id, "--store", str(db), "--agent",
                          "canary_agent:make", "--outcome", "canary_agent:outcome",
                          "--rollouts", "2", "--no-progress", cwd=tmp_path, env=env),
                     _car("report", run.id, "--store", str(db), "--out", str(report),
                          cwd=tmp_path, env=env)]
            assert procs[0].returncode != 0 and procs[1].returncode == 0, procs[1].stderr
            places[f"cli {case}"] = b"".join(p.stdout + p.stderr for p in procs)
            places[f"report {case}"] = report.read_bytes()
        env = _env("arg", stub.base_url, dead_url)
        procs = [_car("show", run.id, "--store", str(db), "--full", cwd=tmp_path, env=env),
                 _car("runs", "--store", str(db), cwd=tmp_path, env=env)]
        places["cli show, runs"] = b"".join(p.stdout + p.stderr for p in procs)
        # the server was sent the keys (the last: from OPENAI_API_KEY) and echoed them back
        assert stub.authorization == f"Bearer {KEYS['env']}"

        caplog.set_level(logging.DEBUG)
        for case in CORES:  # in-process, with every logger at DEBUG
            stub.failures = [400 if case != "env" else 500] * 10_000
            kw = {"max_retries": 1, "backoff": 0.01, "retry_time": 0.5, "timeout": 5.0}
            if case == "env":
                monkeypatch.setenv("OPENAI_API_KEY", KEYS["env"])
                policy = OpenAIPolicy("stub-model", base_url=stub.base_url, **kw)
            elif case == "url":
                policy = OpenAIPolicy("stub-model", base_url=dead_url, api_key="placeholder",
                                      **kw)
            elif case == "arg":
                policy = OpenAIPolicy("stub-model", base_url=stub.base_url, api_key=KEYS[case],
                                      **kw)
            else:
                client = openai.OpenAI(api_key=KEYS[case], base_url=stub.base_url,
                                       max_retries=0)
                policy = OpenAIPolicy("stub-model", client=client, **kw)
            agent = ChatAgent(policy, name="canary-chat", max_steps=2)
            shown = ""
            with RunStore(db) as store:
                try:
                    res = car.contrastive(run, agent, outcome=lambda r: 1.0, rollouts=2,
                                          store=store, progress=False)
                    shown = str(res) + repr(res.failures)
                except CarError as exc:
                    shown = str(exc) + "".join(traceback.format_exception(exc))
            places[f"errors {case}"] = shown.encode()
            monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with pytest.raises(car.errors.InvalidInput, match="non-ASCII"):
            OpenAIPolicy("stub-model", base_url=stub.base_url, api_key=KEYS["unicode"])
    log_text = "\n".join(
        logging.Formatter("%(name)s %(message)s").format(r) for r in caplog.records)
    places["logs"] = log_text.encode()
    assert any(r.name.startswith(("httpx", "openai")) for r in caplog.records)

    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(f"{db}{suffix}")
        if path.exists():
            places[f"sqlite {path.name}"] = path.read_bytes()

    found = {place: _leaks(blob) for place, blob in places.items()}
    assert {place: cases for place, cases in found.items() if cases} == {}
    # the redaction did happen where a key would have been printed
    assert b"user:[REDACTED]@127.0.0.1" in places["cli url"]
    print(f"canary leaks: 0 of {len(places)} places x {len(CORES)} canaries")
