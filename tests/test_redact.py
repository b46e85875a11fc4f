"""The redaction rule on its own: what it hides, what it keeps, and where car_core applies it."""

from __future__ import annotations

import io
import logging

import pytest

import car_core as car
from car_core import redact as rd
from car_core.errors import BranchesFailed, ModelUnavailable, PolicyError
from car_core.report import render_run
from car_core.store import RunStore

KEY = "sk-unitCANARY8c1d5e9f03ab"


@pytest.mark.parametrize("text, hidden, kept", [
    ("Authorization: Bearer abc.def-123_XYZ", "abc.def-123_XYZ", "Authorization: Bearer "),
    ("{'authorization': 'Bearer tok_1234567890'}", "tok_1234567890", "'authorization': "),
    ("proxy-authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA", "Basic "),
    ("x-api-key: k_9876543210", "k_9876543210", "x-api-key: "),
    ('{"api_key": "hunter2hunter2"}', "hunter2hunter2", '"api_key": '),
    ("key sk-proj-abcdefghijklmnop1234 here", "abcdefghijklmnop1234", "key "),
    ("http://bob:s3cretPassw0rd@host:8080/v1", "s3cretPassw0rd", "http://bob:"),
    ("https://tokentokentoken@host/v1", "tokentokentoken", "@host/v1"),
])
def test_patterns_hide_the_secret_and_keep_the_context(text: str, hidden: str, kept: str
                                                       ) -> None:
    out = rd.redact(text)
    assert hidden not in out and kept in out and rd.MARK in out
    assert rd.redact(out) == out  # idempotent: redacting twice changes nothing more


@pytest.mark.parametrize("text", ["max_tokens=256, temperature=0.7", "order 42 has shipped",
                                  "http://127.0.0.1:8080/v1", "the token budget is spent",
                                  "Bearer of bad news:"])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert rd.redact(text) == text


def test_registered_and_environment_secrets_are_hidden_in_every_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rd.register(KEY + "é42")  # a key with a stray non-ASCII character
    monkeypatch.setenv("SOME_SERVICE_API_KEY", "envsecretvalue123")
    monkeypatch.setenv("HOME_DIRECTORY", "/root/not-a-secret")
    text = (f"repr: {KEY + 'é42'!r}; json escaped: {KEY}\\u00e942; "
            "env: envsecretvalue123; home: /root/not-a-secret")
    out = rd.redact(text)
    assert "unitCANARY8c1d5e9f03ab" not in out and "envsecretvalue123" not in out
    assert "/root/not-a-secret" in out
    rd.register("short")  # placeholders below the minimum length are not secrets
    assert rd.redact("a short test") == "a short test"


def test_redact_json_reaches_every_string() -> None:
    value = {"error": f"Bearer {KEY}", "nested": [{"url": "http://u:pw123456789@h/v1"}],
             "n": 3, "none": None}
    out = rd.redact_json(value)
    assert KEY not in repr(out) and "pw123456789" not in repr(out)
    assert out["n"] == 3 and out["none"] is None


def test_car_errors_and_their_chained_causes_are_redacted() -> None:
    try:
        try:
            raise UnicodeEncodeError("ascii", f"Bearer {KEY}é", 10, 11, "ordinal not in range")
        except UnicodeEncodeError as inner:
            raise RuntimeError(f"server said: Authorization: Bearer {KEY}") from inner
    except RuntimeError as exc:
        err = PolicyError(f"the policy raised {exc!r}", step=2)
        stand_in = rd.redacted(exc)
    assert KEY not in str(err) and rd.MARK in str(err)
    assert isinstance(stand_in, rd.RedactedError) and KEY not in str(stand_in)
    assert stand_in.__cause__ is not None and "UnicodeEncodeError" in str(stand_in.__cause__)
    assert KEY not in str(stand_in.__cause__)
    mu = ModelUnavailable("model at http://user:" + KEY + "@host/v1 still failing")
    assert KEY not in str(mu) and "http://user:[REDACTED]@host/v1" in str(mu)


def test_a_policy_that_raises_a_key_is_stored_and_rendered_without_it(tmp_path) -> None:
    def policy(history: car.History, rng) -> int:
        if history.index >= 1:
            raise ValueError(f"refused Authorization: Bearer {KEY}")
        return 0

    agent = car.FunctionAgent(policy=policy, max_steps=3)
    run = car.Trajectory.new(context=None, steps=[car.Step(index=0, action=0),
                                                  car.Step(index=1, action=1)],
                             error=f"stopped: Bearer {KEY}", meta={"auth": f"Bearer {KEY}"})
    db = tmp_path / "car.db"
    with RunStore(db) as store:
        store.save(run)
        with pytest.raises(BranchesFailed) as info:  # every branch from step 1 failed
            car.contrastive(run, agent, outcome=lambda r: 1.0, rollouts=2, store=store,
                            search="full")
        shown = str(info.value) + "".join(f.error for f in info.value.failures)
        html = render_run(run)
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("car.db"))
    assert KEY.encode() not in blob and KEY not in html and KEY not in shown
    assert rd.MARK in shown


def test_log_filter_redacts_message_arguments_and_exceptions() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    log = rd.logger("car_core.tests.redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        try:
            raise RuntimeError(f"Bearer {KEY}")
        except RuntimeError:
            log.exception("call failed with %s", f"api_key={KEY}")
    finally:
        log.removeHandler(handler)
    assert KEY not in stream.getvalue() and rd.MARK in stream.getvalue()
    assert "RuntimeError" in stream.getvalue()
