"""What the three server-down tests share: a stub chat server that dies for good after a
number of answers, an executor that counts the model calls each branch cost, and the result
fields two runs of one attribution may differ in.

Each test writes only what its model says: the answer to a request (``DyingServer.respond``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from car_core.engine.execution import Sequential, Task
from integrations_tests.support.servers import _Handler


def chat_completion(message: dict[str, Any], *, completion_id: str, model: str,
                    **extra: Any) -> dict[str, Any]:
    """An OpenAI chat-completion body carrying one assistant ``message``."""
    return {"id": completion_id, "object": "chat.completion", "created": 0, "model": model,
            **extra,
            "choices": [{"index": 0, "logprobs": None, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}


class _DyingHandler(_Handler):
    def setup(self) -> None:
        super().setup()
        with self.owner.lock:
            self.owner.connections.add(self.request)

    def finish(self) -> None:
        with self.owner.lock:
            self.owner.connections.discard(self.request)
        super().finish()

    def do_POST(self) -> None:
        owner: DyingServer = self.owner
        req = self.body()
        with owner.lock:
            up = not owner.down
            if up:
                owner.answered += 1
                if owner.answered == owner.answers:  # the last answer it gives
                    owner.go_down()
        if not up:  # down: hang up without a word, like a process that died
            self.close_connection = True
            return
        self.send_json(200, owner.respond(req))


class DyingServer:
    """A stub on ``127.0.0.1:port``. ``answered`` counts the chat completions it answered;
    after ``answers`` of them (None: never) it dies for good, as a process does: it stops
    listening (later connections are refused) and drops every open connection, the client's
    kept-alive ones included."""

    def __init__(self, port: int, answers: int | None = None) -> None:
        self.port, self.answers = port, answers
        self.answered = 0
        self.down = False
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.connections: set[socket.socket] = set()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _DyingHandler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def respond(self, req: dict[str, Any]) -> dict[str, Any]:
        """The chat-completion body answering ``req`` (what the stub model says)."""
        raise NotImplementedError

    def go_down(self) -> None:
        """Refuse everything from now on (stopping in a helper thread, as a handler may not
        wait for its own server's shutdown)."""
        self.down = True
        threading.Thread(target=self.stop, daemon=True).start()

    def stop(self) -> None:
        self.down = True
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            open_now = list(self.connections)
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        self.stopped.set()


class Counted:
    """Sequential branches, noting how many model calls each one cost."""

    def __init__(self, server: Callable[[], DyingServer]) -> None:
        self.server = server
        self.calls: dict[tuple[str, int], int] = {}

    def run(self, fn: Callable[[Task], Any], tasks: Sequence[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, Any]]:
        before = self.server().answered
        for task, result in Sequential().run(fn, tasks, may_start):
            now = self.server().answered
            self.calls[(task.arm, task.rollout)] = now - before
            before = now
            yield task, result


def comparable(res: Any) -> dict[str, Any]:
    """A result's fields, less those two runs of one attribution differ in (ids are fresh
    uuids)."""
    out: dict[str, Any] = res.to_dict()
    for volatile in ("attribution_id", "example_branch"):
        out.pop(volatile)
    return out
