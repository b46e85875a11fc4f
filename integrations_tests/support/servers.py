"""Model servers on loopback for tests and benchmarks: real HTTP, no API key, no network.

- ``llama_server()``: llama.cpp's own OpenAI-compatible server (``python -m llama_cpp.server``)
  over the embedded SmolLM2, in a subprocess on a free port; drive it with ``OpenAIPolicy``.
- ``OllamaServer``: a small server speaking Ollama's protocol (``/api/chat`` streaming and not,
  ``/api/tags``, ``/api/version``) over the same model in this process; drive it with the real
  ``ollama`` client through ``OllamaPolicy``.
- ``StubOpenAIServer``: an OpenAI-shaped endpoint that fails the first requests with chosen
  status codes, or answers slowly, to test retries and timeouts.

Every server is a context manager that always stops what it started.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from car_adapters.models import local

from car_core.errors import ModelUnavailable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, deadline: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ModelUnavailable(f"the server exited with code {proc.returncode} on start",
                                   hint="run it by hand to see its error")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise ModelUnavailable(f"no answer from {url} in time", hint="the machine may be busy; "
                           "raise start_timeout")


# llama_cpp.server, with the model loaded as the embedded policy loads it (weight repacking
# off: its AVX-512/AMX kernels crash on multi-token decodes, see local.without_weight_repacking)
_SERVE = """import runpy, llama_cpp
from car_adapters.models import local
with local.without_weight_repacking(llama_cpp):
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


@contextlib.contextmanager
def llama_server(*, chat_format: str | None = None, start_timeout: float = 90.0,
                 n_threads: int = local.THREADS) -> Iterator[str]:
    """llama.cpp's OpenAI-compatible server over the embedded model; yields its base URL
    (``http://127.0.0.1:PORT/v1``; the model is served as ``local.MODEL``).

    With the default chat format (the model's own template) the server honours ``seed`` and
    makes tool calls when ``tool_choice`` names a function; ``"chatml-function-calling"``
    lets the model choose tools itself but, in llama-cpp-python 0.3, ignores the seed."""
    port = free_port()
    cmd = [sys.executable, "-c", _SERVE, "--model", local.model_path(),
           "--model_alias", local.MODEL, "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", str(local.N_CTX), "--n_threads", str(n_threads),
           "--n_threads_batch", str(n_threads),
           "--verbose", "False"]
    if chat_format:
        cmd += ["--chat_format", chat_format]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", time.monotonic() + start_timeout, proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class _Server:
    """A ThreadingHTTPServer on a free loopback port, run in a daemon thread."""

    handler: type[BaseHTTPRequestHandler]
    server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer

    def __enter__(self) -> _Server:
        self.httpd = self.server_class(("127.0.0.1", 0), self.handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    @property
    def owner(self) -> Any:
        return self.server.owner  # type: ignore[attr-defined]

    def body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None
                  ) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer


def _now() -> str:
    return datetime.now(UTC).isoformat()


class _OllamaHandler(_Handler):
    def do_GET(self) -> None:
        if self.path == "/api/version":
            self.send_json(200, {"version": "0.0.0-car-test"})
        elif self.path == "/api/tags":
            self.send_json(200, {"models": [{"name": self.owner.model, "model": self.owner.model,
                                             "modified_at": _now(), "size": 0,
                                             "digest": "", "details": {}}]})
        else:
            self.send_json(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/api/chat":
            self.send_json(404, {"error": f"no route {self.path}"})
            return
        req = self.body()
        model = str(req.get("model", ""))
        if model not in (self.owner.model, self.owner.model.split(":")[0]):
            self.send_json(404, {"error": f"model '{model}' not found, try pulling it first"})
            return
        opts = req.get("options") or {}
        started = time.monotonic_ns()
        out = local.generate(req.get("messages") or [], tools=req.get("tools") or None,
                             seed=int(opts.get("seed", 0)),
                             temperature=float(opts.get("temperature", 0.8)),
                             max_tokens=int(opts.get("num_predict", 128)),
                             top_p=float(opts.get("top_p", 0.95)))
        self.owner.requests += 1
        message: dict[str, Any] = {"role": "assistant", "content": out["content"] or ""}
        if out["calls"]:
            message["tool_calls"] = [{"function": {"name": n, "arguments": a}}
                                     for n, a in out["calls"]]
        final = {"model": model, "created_at": _now(), "done": True,
                 "done_reason": "length" if out["finish_reason"] == "length" else "stop",
                 "total_duration": time.monotonic_ns() - started,
                 "prompt_eval_count": out["usage"]["prompt_tokens"],
                 "eval_count": out["usage"]["completion_tokens"]}
        if not req.get("stream", True):
            self.send_json(200, {**final, "message": message})
            return
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        words = (message["content"] or "").split(" ")
        pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
        for piece in pieces if message["content"] else []:
            self._chunk({"model": model, "created_at": _now(), "done": False,
                         "message": {"role": "assistant", "content": piece}})
        if "tool_calls" in message:
            self._chunk({"model": model, "created_at": _now(), "done": False,
                         "message": {"role": "assistant", "content": "",
                                     "tool_calls": message["tool_calls"]}})
        self._chunk({**final, "message": {"role": "assistant", "content": ""}})
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, payload: Any) -> None:
        data = (json.dumps(payload) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class OllamaServer(_Server):
    """Ollama's chat protocol over the embedded model; ``host`` is what ``ollama.Client``
    takes. ``requests`` counts the chats it answered."""

    handler = _OllamaHandler

    def __init__(self, model: str = local.MODEL + ":latest") -> None:
        self.model = model
        self.requests = 0

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _StubHandler(_Handler):
    def do_GET(self) -> None:
        self.send_json(200, {"object": "list", "data": [{"id": m, "object": "model"}
                                                       for m in self.owner.models]})

    def do_POST(self) -> None:
        req = self.body()
        owner = self.owner
        with owner.lock:
            owner.hits += 1
            owner.authorization = self.headers.get("authorization")
            status = owner.failures.pop(0) if owner.failures else 200
        if owner.delay:
            time.sleep(owner.delay)
        if status != 200:
            said = (f" (you sent Authorization: {owner.authorization})" if owner.echo_auth
                    else "")
            self.send_json(status, {"error": {"message": f"scripted {status}{said}",
                                              "type": "server_error"}},
                           {"retry-after": owner.retry_after} if owner.retry_after else None)
            return
        if req.get("model") not in owner.models:
            self.send_json(404, {"error": {"message": f"model {req.get('model')!r} not found",
                                           "type": "invalid_request_error"}})
            return
        last = next((m.get("content") for m in reversed(req.get("messages") or [])
                     if m.get("role") == "user"), "")
        self.send_json(200, {
            "id": f"chatcmpl-{owner.hits}", "object": "chat.completion", "created": 0,
            "model": req["model"], "system_fingerprint": "stub-fp",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": f"echo: {last}"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})


class StubOpenAIServer(_Server):
    """An OpenAI-shaped chat endpoint that echoes the last user message. ``failures``: status
    codes returned, in order, before it starts answering, with a ``Retry-After`` header when
    ``retry_after`` is given; ``delay``: seconds before each answer; ``hits`` counts requests;
    ``authorization`` is the last request's header; with ``echo_auth`` error bodies quote it
    back, as some servers do."""

    handler = _StubHandler

    def __init__(self, failures: Sequence[int] = (), delay: float = 0.0,
                 models: Sequence[str] = ("stub-model",), retry_after: str | None = None,
                 echo_auth: bool = False) -> None:
        self.failures = list(failures)
        self.echo_auth = echo_auth
        self.retry_after = retry_after
        self.delay = delay
        self.models = list(models)
        self.hits = 0
        self.authorization: str | None = None
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def halfway(order: list[Any], calls: dict[Any, int]) -> tuple[list[Any], int]:
    """The branches (in the order they ran) a server may answer before it dies half-way
    through an attribution, at the start of a branch that needs two or more calls, and the
    calls they spent: the cut a server-down test makes so that one branch dies mid-way."""
    total = sum(calls[key] for key in order)
    done, spent = [], 0
    for key in order:
        if spent >= total // 2 and calls[key] >= 2:
            break
        done.append(key)
        spent += calls[key]
    return done, spent


__all__ = ["OllamaServer", "StubOpenAIServer", "free_port", "halfway", "llama_server"]
