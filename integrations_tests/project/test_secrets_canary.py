"""No secret, in any form, reaches a byte CAR writes, prints, logs or hands back.

A canary secret enters each way a key reaches CAR: the ``api_key`` argument (plain, with
base64/JWT characters, with the delimiters ``; , = "`` and spaces), ``OPENAI_API_KEY``, a
client built with a non-ASCII key, an ``Authorization`` or ``X-Api-Key`` header, and the
userinfo of ``base_url`` / ``host`` (plain, with RFC 3986 sub-delimiters, percent-encoded), over
``OpenAIPolicy`` and ``OllamaPolicy`` (the server policies) and through LangGraph (``ChatOpenAI``
in ``CarChatModel``), LlamaIndex (a ``FunctionAgent`` whose LLM holds an ``openai`` client:
LlamaIndex's own ``OpenAI`` LLM needs ``openai<3``, which the Agents SDK's ``openai>=3``
excludes) and the OpenAI Agents SDK (``OpenAIChatCompletionsModel``). A loopback server answers
normally, then with 401 / 429 / 500 whose bodies echo the request's credential headers, with
malformed JSON echoing them, and by hanging past a short client timeout. Each case records a
run, attributes it in every server mode, and runs every command of the ``car`` CLI on it
(``runs``, ``show --full``, ``--json``, ``attributions``, ``report``, ``attribute``,
``intervene``). Then the SQLite file and its -wal, the report, every CLI output, the log
records (DEBUG, every logger) and the errors handed back are searched for each canary, its
base64 and its URL-encoded forms (and the ``Basic`` credential built from a userinfo).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import io
import json
import logging
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import ollama
import openai
import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from car_adapters.llamaindex import CarRecorder as LlamaRecorder
from car_adapters.llamaindex import LlamaIndexAgent
from car_adapters.llamaindex._messages import from_dict, to_dicts
from car_adapters.models.chat_agent import ChatAgent
from car_adapters.ollama import OllamaPolicy
from car_adapters.openai import OpenAIPolicy, wire_messages
from car_adapters.openai_agents import CarRecorder as AgentsRecorder
from car_adapters.openai_agents import OpenAIAgentsAgent
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.bridge.pydantic import PrivateAttr

import car_core as car
from car_core import cli
from car_core.errors import CarError
from car_core.store import RunStore
from integrations_tests.support.llamaindex_stub import AsyncReplyLLM
from integrations_tests.support.servers import _Server

set_tracing_disabled(True)  # the SDK would export traces to the hosted API
MODES = ("ok", "401", "429", "500", "malformed", "hang")
TIMEOUT = 0.3  # seconds a client waits on the hanging server
USER = "canaryuser"


# -- the loopback server --------------------------------------------------------------------

class _Echo(BaseHTTPRequestHandler):
    """OpenAI's ``/v1/chat/completions`` and Ollama's ``/api/chat``, in the owner's mode; error
    bodies quote every credential header the request carried."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, status: int, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out first

    def do_GET(self) -> None:
        self._send(200, json.dumps({"object": "list", "data": [{"id": "stub-model"}],
                                    "models": [], "version": "0.0.0"}).encode())

    def do_POST(self) -> None:
        owner: EchoServer = self.server.owner  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("content-length") or 0))
        sent = {k: v for k, v in self.headers.items()
                if k.lower() in ("authorization", "x-api-key", "proxy-authorization")}
        owner.sent.append(sent)
        mode = owner.mode
        said = f"you sent {sent} (as JSON: {json.dumps(sent)})"
        ollama_api = self.path.startswith("/api/")
        if mode == "hang":
            owner.released.wait()
            return
        if mode == "malformed":
            self._send(200, f'{{"choices": [{{"message": {said}'.encode())
        elif mode != "ok":
            body = ({"error": f"scripted {mode}: {said}"} if ollama_api else
                    {"error": {"message": f"scripted {mode}: {said}", "type": "server_error"}})
            self._send(int(mode), json.dumps(body).encode())
        elif ollama_api:
            self._send(200, json.dumps({
                "model": "stub-model", "created_at": "2026-01-01T00:00:00Z", "done": True,
                "done_reason": "stop", "message": {"role": "assistant", "content": "echo"},
                "prompt_eval_count": 3, "eval_count": 1}).encode())
        else:
            self._send(200, json.dumps({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                "model": "stub-model", "system_fingerprint": "fp",
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": "echo"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                          "total_tokens": 4}}).encode())


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True  # a handler still hanging when the server stops is not waited for

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is one of the modes, not a failure


class EchoServer(_Server):
    handler = _Echo
    server_class = _Quiet

    def __init__(self) -> None:
        self.mode = "ok"
        self.sent: list[dict[str, str]] = []
        self.released = threading.Event()  # lets hanging handlers go when the server stops

    def __exit__(self, *exc: Any) -> None:
        self.released.set()
        super().__exit__(*exc)

    def url(self, userinfo: str = "", path: str = "/v1") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def server() -> Iterator[EchoServer]:
    """One server per module (per xdist worker); each test sets its mode and reads ``sent``."""
    with EchoServer() as s:
        yield s


# -- the canaries ---------------------------------------------------------------------------

@dataclass
class Canary:
    """A secret and the forms the search looks for. ``userinfo``: it is a URL password, so the
    ``Basic`` credential built from it is searched too."""

    value: str
    userinfo: bool = False
    core: str = field(init=False)

    def __post_init__(self) -> None:
        self.core = "".join(ch for ch in self.value if ch.isascii() and ch.isalnum())[-14:]

    def forms(self) -> set[bytes]:
        raw = self.value.encode()
        found = {self.value, self.core, base64.b64encode(raw).decode().rstrip("="),
                 base64.urlsafe_b64encode(raw).decode().rstrip("="), quote(self.value, safe=""),
                 quote(self.value), quote_plus(self.value), json.dumps(self.value)[1:-1]}
        # escaped as a store, a repr or the report writes it, and escaped twice
        escaped = {json.dumps(self.value)[1:-1], repr(self.value + "'\"")[1:-2],
                   json.dumps(json.dumps(self.value))[3:-3]}
        found |= escaped | {html.escape(e) for e in escaped} | {
            quote(e, safe="") for e in escaped}
        if self.userinfo:
            basic = f"{USER}:{self.value}".encode()
            found.add(base64.b64encode(basic).decode().rstrip("="))
        return {f.encode() for f in found} | {self.value.encode("utf-16-le")}


def canary(tag: str, shape: str = "{tag}{core}", userinfo: bool = False) -> Canary:
    core = base64.b16encode(tag.encode()).decode().lower()[:6]
    return Canary(shape.format(tag=f"cnry{tag}", core=f"{core}9f1c7e3b"), userinfo)


PLAIN = canary("Plain", "sk-{tag}{core}")
JWT = canary("Jwt", "eyJhbGciOi.{tag}+{core}/x_y-z==")
DELIMS = canary("Delim", '{tag};{core},k="v w"=x')
# every delimiter a server may echo, and no run of 8 between them: only the whole key's
# pattern can hide it (a long piece would be hidden on its own and hide a miss)
QUOTES = Canary("cq7,a1b2;c3d'4e\"5f}6g7h")
ENV = canary("Env", "sk-{tag}{core}")
UNICODE = canary("Uni", "sk-{tag}{core}\u00e9\u043a")
HEADER = canary("Hdr", "{tag}.{core}")
URL_PLAIN = canary("UrlP", "{tag}{core}", userinfo=True)
URL_SUBDELIMS = canary("UrlS", "{tag}!$&'()*+,;={core}", userinfo=True)
URL_ENCODED = canary("UrlE", "{tag};,@/ {core}", userinfo=True)


def userinfo(c: Canary) -> str:
    return f"{USER}:{quote(c.value, safe='') if c is URL_ENCODED else c.value}"


KW: dict[str, Any] = {"max_retries": 1, "backoff": 0.01, "retry_time": 1.0, "timeout": TIMEOUT}


@dataclass
class Case:
    name: str
    canaries: tuple[Canary, ...]
    make: Callable[[EchoServer, pytest.MonkeyPatch], Any]  # -> (agent, recorder)
    sends: Canary | None = None  # the canary the server must have been sent (and echoed)
    shown: bool = True  # False: CAR never has the canary to print (the client alone reads it)


def _chat(policy: Any) -> Any:
    return ChatAgent(policy, name="canary-chat", max_steps=2)


def _openai(**kw: Any) -> Callable[[EchoServer, pytest.MonkeyPatch], Any]:
    def make(s: EchoServer, mp: pytest.MonkeyPatch) -> Any:
        args = {"base_url": s.url(), **kw}
        if "userinfo" in args:
            args["base_url"] = s.url(args.pop("userinfo"))
        if "client" in args:
            client = args.pop("client")
            args = {"client": openai.OpenAI(base_url=args["base_url"], max_retries=0,
                                            timeout=TIMEOUT, **client)}
        return _chat(OpenAIPolicy("stub-model", **args, **KW)), None
    return make


def _with_env(name: str, value: Callable[[EchoServer], str],
              then: Callable[[EchoServer, pytest.MonkeyPatch], Any]
              ) -> Callable[[EchoServer, pytest.MonkeyPatch], Any]:
    def make(s: EchoServer, mp: pytest.MonkeyPatch) -> Any:
        mp.setenv(name, value(s))
        return then(s, mp)
    return make


def _ollama(**kw: Any) -> Callable[[EchoServer, pytest.MonkeyPatch], Any]:
    def make(s: EchoServer, mp: pytest.MonkeyPatch) -> Any:
        args = dict(kw)
        if "userinfo" in args:
            args["host"] = s.url(args.pop("userinfo"), path="")
        elif "headers" in args:
            args["client"] = ollama.Client(host=s.url(path=""), timeout=TIMEOUT,
                                           headers=args.pop("headers"))
        elif "env" not in args:
            args["host"] = s.url(path="")
        args.pop("env", None)
        return _chat(OllamaPolicy("stub-model", **args, **KW)), None
    return make


POLICY_CASES = [
    Case("openai api_key plain", (PLAIN,), _openai(api_key=PLAIN.value), PLAIN),
    Case("openai api_key jwt", (JWT,), _openai(api_key=JWT.value), JWT),
    Case("openai api_key delimiters", (DELIMS,), _openai(api_key=DELIMS.value), DELIMS),
    Case("openai api_key quotes and braces", (QUOTES,), _openai(api_key=QUOTES.value), QUOTES),
    Case("openai OPENAI_API_KEY", (ENV,),
         _with_env("OPENAI_API_KEY", lambda s: ENV.value, _openai()), ENV),
    Case("openai client non-ascii key", (UNICODE,), _openai(client={"api_key": UNICODE.value})),
    Case("openai Authorization header", (HEADER,), _openai(client={
        "api_key": "placeholder-key", "default_headers": {
            "Authorization": f"Bearer {HEADER.value}"}}), HEADER),
    Case("openai userinfo plain", (URL_PLAIN,),
         _openai(api_key="placeholder-key", userinfo=userinfo(URL_PLAIN)), URL_PLAIN),
    Case("openai userinfo sub-delimiters", (URL_SUBDELIMS,),
         _openai(api_key="placeholder-key", userinfo=userinfo(URL_SUBDELIMS)), URL_SUBDELIMS),
    Case("openai userinfo percent-encoded", (URL_ENCODED,),
         _openai(api_key="placeholder-key", userinfo=userinfo(URL_ENCODED)), URL_ENCODED),
    Case("ollama host userinfo plain", (URL_PLAIN,), _ollama(userinfo=userinfo(URL_PLAIN))),
    Case("ollama host userinfo sub-delimiters", (URL_SUBDELIMS,),
         _ollama(userinfo=userinfo(URL_SUBDELIMS))),
    Case("ollama host userinfo percent-encoded", (URL_ENCODED,),
         _ollama(userinfo=userinfo(URL_ENCODED))),
    Case("ollama OLLAMA_HOST userinfo", (URL_SUBDELIMS,),
         _with_env("OLLAMA_HOST", lambda s: s.url(userinfo(URL_SUBDELIMS), path=""),
                   _ollama(env=True)), shown=False),
    Case("ollama Authorization header", (DELIMS,),
         _ollama(headers={"Authorization": f"Bearer {DELIMS.value}"}), DELIMS),
]


# -- the frameworks -------------------------------------------------------------------------

def _recorded(go: Callable[[], Any], read: Callable[[], car.Trajectory]) -> car.Trajectory:
    """Run the app, then read what its recorder kept: a run that failed at the server is
    recorded with its error (the framework's own exception is not CAR's to hand back)."""
    try:
        go()
    except Exception as exc:
        try:
            return read()
        except CarError:
            raise exc from None
    return read()


def _async_client(s: EchoServer, key: Canary | None, header: Canary | None,
                  url: Canary | None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=key.value if key else "placeholder-key", max_retries=0, timeout=TIMEOUT,
        base_url=s.url(userinfo(url) if url else ""),
        default_headers={"X-Api-Key": header.value} if header else None)


def _langgraph(key: Canary | None, header: Canary | None, url: Canary | None
               ) -> Callable[[EchoServer, pytest.MonkeyPatch], Any]:
    def make(s: EchoServer, mp: pytest.MonkeyPatch) -> Any:
        model = CarChatModel(inner=ChatOpenAI(
            model="stub-model", api_key=key.value if key else "placeholder-key",  # type: ignore[arg-type]
            base_url=s.url(userinfo(url) if url else ""), max_retries=0, timeout=TIMEOUT,
            default_headers={"X-Api-Key": header.value} if header else None))
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_edge(START, "agent")
        app = graph.compile(checkpointer=InMemorySaver())

        def record(store: RunStore, thread: str) -> car.Trajectory:
            cb = CarCallback(store=store)
            return _recorded(lambda: app.invoke(
                {"messages": [("user", "hi")]},
                {"configurable": {"thread_id": thread}, "callbacks": [cb]}), lambda: cb.run)
        return LangGraphAgent(app), record
    return make


class CanaryLLM(AsyncReplyLLM):
    """A LlamaIndex function-calling LLM over an ``openai.AsyncOpenAI`` client it holds (as
    LlamaIndex's ``OpenAI`` LLM does)."""

    _client: Any = PrivateAttr(default=None)

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        super().__init__()
        self._client = client

    async def _reply(self, messages: Sequence[ChatMessage]) -> ChatResponse:
        resp = await self._client.chat.completions.create(
            model="stub-model", messages=wire_messages(to_dicts(messages)))  # type: ignore[arg-type]
        msg = resp.choices[0].message
        return ChatResponse(message=from_dict({"role": "assistant", "content": msg.content,
                                               "tool_calls": []}))


def lookup_order(order_id: str) -> str:
    """Look up the status of an order."""
    return f"order {order_id} shipped"


def _llamaindex(key: Canary | None, header: Canary | None, url: Canary | None
                ) -> Callable[[EchoServer, pytest.MonkeyPatch], Any]:
    def make(s: EchoServer, mp: pytest.MonkeyPatch) -> Any:
        agent = FunctionAgent(tools=[lookup_order], system_prompt="Answer briefly.",
                              llm=CanaryLLM(_async_client(s, key, header, url)))

        async def main() -> Any:
            return await agent.run(user_msg="hi")

        def record(store: RunStore, thread: str) -> car.Trajectory:
            rec = LlamaRecorder(store=store).attach()
            try:
                return _recorded(lambda: asyncio.run(main()), lambda: rec.run)
            finally:
                rec.detach()
        return LlamaIndexAgent(agent, safe_tools=["lookup_order"]), record
    return make


def _agents(key: Canary | None, header: Canary | None, url: Canary | None
            ) -> Callable[[EchoServer, pytest.MonkeyPatch], Any]:
    def make(s: EchoServer, mp: pytest.MonkeyPatch) -> Any:
        agent = Agent(name="canary", instructions="Answer briefly.",
                      model=OpenAIChatCompletionsModel(
                          model="stub-model", openai_client=_async_client(s, key, header, url)))

        def record(store: RunStore, thread: str) -> car.Trajectory:
            rec = AgentsRecorder(store=store)
            return _recorded(lambda: Runner.run_sync(agent, "hi", hooks=rec, max_turns=2),
                             lambda: rec.run)
        return OpenAIAgentsAgent(agent, max_turns=2), record
    return make


FRAMEWORK_CASES = [
    Case(f"{name} {kind}", tuple(c for c in canaries if c), build(*canaries),
         canaries[0] or canaries[1])
    for name, build in (("langgraph ChatOpenAI", _langgraph),
                        ("llamaindex openai LLM", _llamaindex),
                        ("openai-agents chat-completions model", _agents))
    for kind, canaries in (("key with delimiters + header", (DELIMS, JWT, None)),
                           ("key with quotes and braces", (QUOTES, None, None)),
                           ("userinfo sub-delimiters", (None, None, URL_SUBDELIMS)))
]


# -- what the CLI's --agent loads ------------------------------------------------------------

CURRENT: dict[str, Any] = {}


def current_agent() -> Any:
    return CURRENT["agent"]


def always_failed(run: car.Trajectory) -> float:
    return 1.0


def run_cli(*args: str) -> str:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(args))
    return f"$ car {' '.join(args)} -> {code}\n{stdout.getvalue()}{stderr.getvalue()}"


# -- the probe ------------------------------------------------------------------------------

def _attribute_in_every_mode(server: EchoServer, run: car.Trajectory, agent: Any,
                             store: RunStore) -> str:
    shown = []
    for mode in MODES:
        server.mode = mode
        try:
            res = car.contrastive(run, agent, outcome=always_failed, rollouts=2, store=store,
                                  progress=False)
            shown.append(f"{res}\n{res.failures!r}")
        except CarError as exc:
            shown.append(str(exc) + "".join(traceback.format_exception(exc)))
    return "\n".join(shown)


def _cli_everything(server: EchoServer, run_id: str, db: Path, report: Path) -> str:
    store = ("--store", str(db))
    agent = ("--agent", f"{__name__}:current_agent", "--outcome", f"{__name__}:always_failed")
    out = []
    for mode in ("ok", "401"):  # the other modes: in process, above
        server.mode = mode
        out.append(run_cli("attribute", run_id, *store, *agent, "--rollouts", "2",
                           "--no-progress"))
        out.append(run_cli("intervene", run_id, *store, *agent, "--do", "resample:0",
                           "--rollouts", "2", "--no-progress"))
    server.mode = "ok"
    for args in (("runs",), ("runs", "--branches", "--json"), ("show", run_id, "--full"),
                 ("show", run_id, "--json", "--full"), ("attributions",),
                 ("attributions", run_id, "--json"), ("report", run_id, "--out", str(report))):
        out.append(run_cli(*args, *store))
    return "\n".join(out)


def _probe(case: Case, server: EchoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
           monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    server.mode, server.sent[:] = "ok", []
    db, report = tmp_path / "car.db", tmp_path / "report.html"
    places: dict[str, bytes] = {}
    agent, record = case.make(server, monkeypatch)
    with RunStore(db) as store:
        if record is None:  # a policy: record through ChatAgent
            def record(store: RunStore, thread: str) -> car.Trajectory:
                return car.record(agent, context="hi", outcome=always_failed, seed=0)
        errors = []
        try:
            run = record(store, "t-ok")
        except CarError as exc:  # the non-ASCII key: the client cannot send it
            errors.append(str(exc) + "".join(traceback.format_exception(exc)))
            run = car.record(_chat(OpenAIPolicy("stub-model", base_url=server.url(),
                                                api_key="placeholder-key", **KW)),
                             context="hi", outcome=always_failed, seed=0)
        store.save(run)
        server.mode = "401"  # a run recorded while the server refuses, kept with its error
        with contextlib.suppress(Exception):  # or, where none was kept, nothing to store
            store.save(record(store, "t-401"))
        errors.append(_attribute_in_every_mode(server, run, agent, store))
    places["errors handed back"] = "\n".join(errors).encode()
    CURRENT["agent"] = agent
    places["cli"] = _cli_everything(server, run.id, db, report).encode()
    places["report"] = report.read_bytes()
    places["logs"] = "\n".join(logging.Formatter("%(name)s %(levelname)s %(message)s").format(r)
                               for r in caplog.records).encode()
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(f"{db}{suffix}")
        if path.exists():
            places[f"sqlite {path.name}"] = path.read_bytes()

    if case.sends is not None:  # the canary did go out, and came back in the error bodies
        assert any(case.sends.value in v or base64.b64encode(
            f"{USER}:{case.sends.value}".encode()).decode() in v
            for sent in server.sent for v in sent.values()), server.sent[-3:]
    if case.shown:  # the redaction did happen where the canary would have been printed
        assert b"[REDACTED]" in places["errors handed back"] + places["cli"] + places["logs"]
    assert b"$ car attribute" in places["cli"] and b"-> 0" in places["cli"]
    leaks = {(place, c.value, form.decode("utf-8", "replace"))
             for place, blob in places.items() for c in case.canaries for form in c.forms()
             if form in blob}
    assert leaks == set(), sorted(leaks)[:10]


@pytest.mark.parametrize("case", POLICY_CASES, ids=lambda c: c.name)
def test_no_policy_canary_leaks(case: Case, server: EchoServer, tmp_path: Path,
                                caplog: pytest.LogCaptureFixture,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    _probe(case, server, tmp_path, caplog, monkeypatch)


@pytest.mark.parametrize("case", FRAMEWORK_CASES, ids=lambda c: c.name)
def test_no_framework_canary_leaks(case: Case, server: EchoServer, tmp_path: Path,
                                   caplog: pytest.LogCaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _probe(case, server, tmp_path, caplog, monkeypatch)
