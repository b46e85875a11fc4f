"""The redaction rule on its own: what it hides, what it keeps, and where car_core applies it."""

from __future__ import annotations

import base64
import gc
import html
import io
import json
import logging
import threading
import traceback
from urllib.parse import quote, quote_plus

import numpy as np
import pytest

import car_core as car
from car_core.errors import BranchesFailed, ModelUnavailable, OutcomeError, PolicyError
from car_core.model.outcome import OutcomeFn
from car_core.report import render_run
from car_core.secrets import forms as _secret_forms
from car_core.secrets import redact as rd
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


# -- by value: the exact secret, in every form a program may write it -------------------------

def _forms(secret: str) -> dict[str, str]:
    """``secret`` as encoders and careless code write it (each must be hidden)."""
    raw = secret.encode()
    return {
        "raw": secret, "json": json.dumps(secret), "json utf-8": json.dumps(secret,
                                                                           ensure_ascii=False),
        "repr": repr(secret), "ascii": ascii(secret), "bytes repr": repr(raw),
        "repr of a JSON body": repr(json.dumps({"error": {"message": secret}})),
        "repr of a dict repr": repr(str({"auth": secret})),
        "url": quote(secret, safe=""), "url, lower hex": quote(secret, safe="").lower(),
        "url plus": quote_plus(secret), "url twice": quote(quote(secret, safe=""), safe=""),
        "html": html.escape(secret), "base64": base64.b64encode(raw).decode(),
        "basic auth": base64.b64encode(b"user:" + raw).decode(),
        "base64url, shifted": base64.urlsafe_b64encode(b"xy" + raw).decode(),
        "jwt-style": base64.urlsafe_b64encode(b'{"k":"' + raw + b'"}').decode().rstrip("="),
    }


def _leaked(secret: str, text: str) -> list[str]:
    """The probe's search: the secret, its base64 and its URL-encoded forms."""
    raw = secret.encode()
    probes = {secret, base64.b64encode(raw).decode().rstrip("="), quote(secret, safe=""),
              quote(secret), quote_plus(secret)}
    return sorted(p for p in probes if p in text)


ODD_KEYS = [
    'k3y;with,delims="and spaces"=tail',   # the delimiters a header or a log line splits on
    "ab+cd/ef==GH.ij-kl_mn/opQR",           # base64 / JWT alphabet
    "sk-uni\u00e9\u043a\u043b\u044e\u0447-12345678",  # non-ASCII
    "p@ss:w!$&'()*+,;=rd1234",              # RFC 3986 sub-delimiters and gen-delimiters
    "tab\tnew\nline\\back\\slash-key1",     # characters every escaper writes differently
    "emoji\U0001f511key-1234567",           # astral: JSON writes a surrogate pair
]


@pytest.mark.parametrize("secret", ODD_KEYS)
def test_a_registered_secret_is_hidden_in_every_encoding(secret: str) -> None:
    rd.register(secret)
    for form, written in _forms(secret).items():
        out = rd.redact(f"before {written} after")
        assert not _leaked(secret, out), (form, out)
        assert rd.MARK in out and out.startswith("before ") and out.endswith(" after"), form


# one layer of each encoder a key passes through on its way to a store or a screen: an error
# body's JSON, a Python repr (the exception, a dict of headers), the report's HTML, a URL
ENCODERS = {
    "json": lambda t: json.dumps(t)[1:-1], "repr": lambda t: repr(t + "'\"")[1:-1],
    "bytes repr": lambda t: repr(t.encode())[2:-1], "html": html.escape,
    "url": lambda t: quote(t, safe=""), "url plus": quote_plus}
SHORT_PIECES = "k1a2b3c,d4e5f6;g7h8'i9j0\"x1y2}z3w4"  # no run of 8 between its delimiters


@pytest.mark.parametrize("first", ENCODERS)
@pytest.mark.parametrize("second", ENCODERS)
def test_a_key_of_short_pieces_is_hidden_through_two_encoders(first: str, second: str) -> None:
    """A key whose delimiters (``,;'"}``) leave no piece long enough to be hidden alone, so
    only the whole key's pattern can catch it: written by one encoder and then another (a
    repr's backslash percent-encoded, a JSON escape HTML-escaped in a report), it is still
    found."""
    written = ENCODERS[second](ENCODERS[first](f"you sent {SHORT_PIECES} to us"))
    out = rd.redact(written, secrets=[SHORT_PIECES])
    pieces = ["k1a2b3c", "d4e5f6", "g7h8", "i9j0", "x1y2", "z3w4"]
    assert [p for p in pieces if p in out] == [], out
    assert rd.MARK in out


def test_a_quoted_piece_of_a_key_with_delimiters_is_hidden_too() -> None:
    secret = "first-piece-1a2b;second-piece-3c4d"
    rd.register(secret)
    out = rd.redact("the server kept only 'second-piece-3c4d' of it")
    assert "second-piece-3c4d" not in out and rd.MARK in out


@pytest.mark.parametrize("url, password", [
    ("http://alice:pa%3Bss%2Cw%40rd!@127.0.0.1:8080/v1", "pa;ss,w@rd!"),
    ("http://alice:s!$&'()*+,;=d1@127.0.0.1/v1", "s!$&'()*+,;=d1"),
    ("https://lone-token-7f3a9c@host/v1", "lone-token-7f3a9c"),
    ("bob:hostpass-77aa1@10.0.0.2:11434", "hostpass-77aa1"),   # an Ollama host, no scheme
])
def test_url_userinfo_is_hidden_written_or_decoded(url: str, password: str) -> None:
    rd.register_url(url)
    text = f"{url} | {password} | {quote(password, safe='')} | " \
           f"Basic {base64.b64encode(f'alice:{password}'.encode()).decode()}"
    out = rd.redact(text)
    assert not _leaked(password, out), out


def test_headers_hide_every_value_but_the_public_ones() -> None:
    rd.register_headers({"Authorization": "Bearer hdr;tok=en,1234", "X-Tenant-Key": "tenant-77c1e2",
                         "User-Agent": "my-app/1.2.3-public", "Proxy-Authorization":
                         "Basic " + base64.b64encode(b"proxyuser:proxy-pass-99").decode()})
    out = rd.redact("hdr;tok=en,1234 tenant-77c1e2 my-app/1.2.3-public proxy-pass-99")
    assert out == f"{rd.MARK} {rd.MARK} my-app/1.2.3-public {rd.MARK}"


class _SecretStr:
    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "SecretStr('**********')"


class _Client:  # shaped like the clients register_from reads (openai, httpx, langchain)
    def __init__(self, **attrs: object) -> None:
        self.__dict__.update(attrs)


def test_register_from_finds_keys_headers_and_userinfo_through_nested_clients() -> None:
    inner = _Client(api_key="nested;client=key-1", base_url="http://u:nested-pw-55@h/v1",
                    _custom_headers={"X-Api-Token": "nested-header-66"})
    model = _Client(openai_api_key=_SecretStr("wrapped-key-4421"), root_client=inner,
                    agents={"a": _Client(model=_Client(_client=_Client(api_key="deep-key-8812")))})
    model.root_client.inner = model  # a cycle: walked once
    rd.register_from(model)
    hidden = {"nested;client=key-1", "nested-pw-55", "nested-header-66", "wrapped-key-4421",
              "deep-key-8812"}
    assert hidden <= set(rd.known_secrets())


def test_environment_addresses_and_keys_are_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "http://ops:env-host-pw-31@10.1.1.1:11434")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "env;token,with=delims")
    out = rd.redact("env-host-pw-31 " + quote("env;token,with=delims", safe=""))
    assert out == f"{rd.MARK} {rd.MARK}"
    monkeypatch.delenv("MY_SERVICE_TOKEN")
    assert rd.redact("env;token,with=delims") == "env;token,with=delims"  # no longer a secret


def test_recorded_content_is_scrubbed_by_value_before_it_is_sealed() -> None:
    secret = "step;secret=value-9911"
    rd.register(secret)
    plain = {"role": "tool", "content": "nothing to hide"}
    run = car.Trajectory.new(context=[{"role": "user", "content": f"key {secret}"}], steps=[
        car.Step(index=0, action=plain, observation=f"echo {json.dumps(secret)}",
                 meta={"err": quote(secret)})])
    assert secret not in run.to_json() and quote(secret) not in run.to_json()
    assert run.steps[0].action is plain  # nothing matched: the very same object
    run.verify()  # the digests cover what is kept, not what was hidden
    assert rd.scrub(plain) is plain


def test_a_key_nobody_registered_is_caught_by_the_patterns_before_it_is_sealed() -> None:
    """A tool returned a config holding an ``sk-…`` key the user never gave CAR: the patterns
    applied to output only, and the store kept the key (618 times in a trial). They apply to
    recorded content too, string by string; content they do not match is the same object."""
    key = "sk-test-UNREGISTERED-4242"
    plain = {"role": "assistant", "content": "looked the order up"}
    run = car.Trajectory.new(context=[{"role": "user", "content": "load the config"}], steps=[
        car.Step(index=0, action=plain, observation=f"config loaded with key {key}",
                 state=[{"role": "tool", "content": f"Authorization: Bearer {key}"}])])
    text = run.to_json()
    assert key not in text and "config loaded with key [REDACTED]" in text
    assert run.steps[0].action is plain
    run.verify()
    assert rd.scrub(plain) is plain and rd.scrub(["nothing", 3]) == ["nothing", 3]


# -- no redaction path takes a lock that logging can re-enter ---------------------------------

def test_a_collection_inside_redaction_whose_finalizers_log_does_not_hang(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped client's ``__del__`` logging at DEBUG, run by a collection that lands inside
    a redaction (here forced at the point where the rule is rebuilt), comes back into the
    rule through the log filter; nothing may wait there for the outer call."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    log = rd.logger("car_core.tests.redact.gc")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    pattern = _secret_forms.pattern

    class DroppedClient:
        count = 0

        def __init__(self) -> None:
            self.cycle = self  # only the cyclic collector frees it

        def __del__(self) -> None:
            DroppedClient.count += 1
            if DroppedClient.count <= 5:  # the rule changes again, inside the rebuild
                rd.register(f"finalizer-key-{DroppedClient.count:04d}")
            log.debug("closing client, Authorization: Bearer %s", KEY)

    collections = iter(range(12))  # bounded: every rebuild would otherwise collect again

    def collecting_pattern(secret: str) -> str:
        if next(collections, None) is not None:
            DroppedClient()
            gc.collect()  # inside redact, while the rule is being rebuilt
        return pattern(secret)

    monkeypatch.setattr(_secret_forms, "pattern", collecting_pattern)
    outcome: list[str] = []

    def work() -> None:
        for i in range(8):
            DroppedClient()
            rd.register(f"worker-key-{i:04d}-abcdef")
            outcome.append(rd.redact(f"Bearer {KEY} worker-key-{i:04d}-abcdef"))

    worker = threading.Thread(target=work, daemon=True)
    try:
        worker.start()
        worker.join(timeout=60)
    finally:
        log.removeHandler(handler)
    assert not worker.is_alive(), "redaction deadlocked under a collection that logs"
    assert len(outcome) == 8 and all(KEY not in o for o in outcome)
    assert DroppedClient.count > 0 and KEY not in stream.getvalue()
    assert "closing client" in stream.getvalue()


def test_every_log_record_is_redacted_whatever_logger_made_it() -> None:
    """An HTTP client creates loggers lazily (``httpcore.http11``…): no filter is on them, so
    the guard sits where every record is made. The traceback keeps its frames."""
    secret = "lazy;logger=key-5150"
    rd.register(secret)  # registering installs the guard
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("car_core.tests.never.guarded.before")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False

    def request() -> None:
        raise ConnectionError(f"POST http://user:{quote(secret)}@host/v1 failed")

    try:
        try:
            request()
        except ConnectionError:
            log.debug("request to %s", f"http://user:{secret}@host/v1", exc_info=True,
                      stack_info=True)
    finally:
        log.removeHandler(handler)
    out = stream.getvalue()
    assert secret not in out and quote(secret) not in out and rd.MARK in out
    assert "in request" in out and "ConnectionError" in out  # the frames are still there


def test_a_run_error_and_meta_hand_back_no_registered_secret() -> None:
    secret = "run;error=secret-4411"
    rd.register(secret)
    run = car.Trajectory.new(context="hi", steps=[], error=f"AuthenticationError({secret!r})",
                             meta={"final_state": {"body": json.dumps(secret)}})
    assert secret not in run.error and rd.MARK in run.error
    assert secret not in json.dumps(run.meta) and "final_state" in run.meta


def test_an_exception_group_is_described_by_the_errors_inside_it() -> None:
    # a LangGraph branch whose MCP server would not start failed with only "ExceptionGroup:
    # unhandled errors in a TaskGroup (1 sub-exception)": the cause was inside the group
    inner = FileNotFoundError(f"no such file: /srv/server.py (token {KEY})")
    group = BaseExceptionGroup("unhandled errors in a TaskGroup",
                               [ExceptionGroup("nested", [inner, ValueError("second")])])
    said = rd.describe(group)
    assert said.startswith("ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception) (")
    assert "FileNotFoundError: no such file: /srv/server.py" in said
    assert "ValueError: second" in said
    assert KEY not in said


def test_an_outcome_errors_chain_holds_no_secret_but_keeps_its_frames() -> None:
    """An ``OutcomeError``'s message was redacted but its ``__cause__`` was the outcome's own
    exception, so a printed traceback (``CAR_DEBUG=1``, a test's failure report) showed the key.
    The cause is the redacted stand-in, with the frames of the outcome's code kept."""
    key = "judge-key-5f4e3d2c1b0a"
    rd.register(key)

    def judge(run: car.Trajectory) -> float:
        raise RuntimeError(f"judge server said: bad key {key}")

    run = car.Trajectory.new(context={"t": 1}, steps=[car.Step(index=0, action={"a": 1})])
    with pytest.raises(OutcomeError) as raised:
        OutcomeFn(judge)(run, np.random.default_rng(0))
    text = "".join(traceback.format_exception(raised.value))
    assert key not in text and "judge server said: bad key [REDACTED]" in text
    assert "in judge" in text  # where the outcome raised is still shown
