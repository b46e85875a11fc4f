"""``OllamaPolicy``: a car policy over the official ``ollama`` client (``chat`` with tools).

Ollama's tool calls carry their arguments as dicts and have no ids; the action gets stable ids
from the step and position (``call_<k>_<i>``) so replays compare equal. The seed, temperature,
``num_ctx`` and ``num_predict`` go in ``options``; token counts come from ``prompt_eval_count``
and ``eval_count``. Busy or failing servers are retried with jittered backoff within a bounded
total time (``car_adapters.models.server_policy``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from car_core.contract import outage_hint, redact
from car_core.errors import InvalidInput, ModelUnavailable, PolicyError

from ..common.messages import parse_arguments
from .chat_agent import Message, make_action
from .ratelimit import Backoff, RateLimiter
from .server_policy import ServerPolicy

try:
    import httpx
    import ollama
except ImportError as exc:  # pragma: no cover - part of the default install
    raise ImportError("car_adapters.ollama needs the ollama client: pip install ollama") from exc


# the client's own loggers (request URLs) pass the redaction rule too
CLIENT_LOGGERS = ("ollama", "httpx", "httpx2", "httpcore", "httpcore2")


def ollama_messages(messages: Sequence[Message]) -> list[Message]:
    """OpenAI-style messages in Ollama's shape: dict arguments, no call ids, ``tool_name``."""
    names: dict[str, str] = {}
    out: list[Message] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            msg: Message = {"role": "assistant", "content": m.get("content") or ""}
            calls = []
            for c in m.get("tool_calls") or ():
                names[c.get("id", "")] = c["function"]["name"]
                calls.append({"function": {"name": c["function"]["name"],
                                           "arguments": parse_arguments(
                                               c["function"].get("arguments") or {})}})
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            out.append({"role": "tool", "content": m.get("content") or "",
                        "tool_name": m.get("name") or names.get(m.get("tool_call_id", ""), "")})
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    return out


class OllamaPolicy(ServerPolicy):
    """``policy(history, rng) -> assistant message`` from a model served by Ollama. Retries,
    ``limiter`` and pickling: see ``car_adapters.models.server_policy``."""

    def __init__(self, model: str, *, host: str | None = None, client: Any = None,
                 tools: Sequence[Mapping[str, Any]] | None = None, temperature: float = 0.8,
                 top_p: float | None = None, num_ctx: int = 2048, max_tokens: int = 256,
                 timeout: float = 60.0, max_retries: int = 5, retry_time: float = 60.0,
                 backoff: float | Backoff = 0.5, stream: bool = False,
                 limiter: RateLimiter | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidInput("OllamaPolicy needs a model name", hint='pass model="llama3.2"')
        super().__init__(client=client, timeout=timeout, max_retries=max_retries,
                         retry_time=retry_time, backoff=backoff, limiter=limiter)
        self.model, self.tools, self.host = model, [dict(t) for t in tools or ()], host
        self.temperature, self.top_p, self.num_ctx = temperature, top_p, num_ctx
        self.max_tokens, self.stream = max_tokens, stream
        redact.register_url(host)  # a host's userinfo (a given client's: ServerPolicy)
        redact.guard_loggers(*CLIENT_LOGGERS)

    def _new_client(self) -> Any:
        return ollama.Client(host=self.host, timeout=self.timeout)

    def _options(self, seed: int) -> dict[str, Any]:
        opts: dict[str, Any] = {"seed": seed, "temperature": self.temperature,
                                "num_ctx": self.num_ctx, "num_predict": self.max_tokens}
        if self.top_p is not None:
            opts["top_p"] = self.top_p
        return opts

    def _request(self, messages: list[Message], seed: int) -> dict[str, Any]:
        resp = self.client.chat(model=self.model, messages=ollama_messages(messages),
                                tools=self.tools or None, options=self._options(seed),
                                stream=self.stream)
        if not self.stream:
            return _reply(resp, resp.message.content or "", list(resp.message.tool_calls or ()))
        content: list[str] = []
        calls: list[ollama.Message.ToolCall] = []
        last: ollama.ChatResponse | None = None
        for chunk in resp:
            content.append(chunk.message.content or "")
            calls.extend(chunk.message.tool_calls or ())
            last = chunk
        return _reply(last, "".join(content), calls)

    def _transient(self, exc: Exception) -> bool:
        """Busy (429), failing (5xx) or unreachable servers are retried; an unknown model or a
        rejected request is said at once."""
        if isinstance(exc, ollama.ResponseError):
            if exc.status_code == 404:
                raise ModelUnavailable(
                    f"the Ollama server has no model {self.model!r}: {exc.error}",
                    hint=f"run `ollama pull {self.model}` or pick one from `ollama list`"
                    ) from redact.redacted(exc)
            if exc.status_code != 429 and exc.status_code < 500:
                raise PolicyError("the Ollama server rejected the request: "
                                  f"{redact.describe(exc)}",
                                  hint="check the tools and options this model accepts"
                                  ) from redact.redacted(exc)
            return True
        return isinstance(exc, ConnectionError | httpx.TransportError)

    def _still_failing(self, attempts: int, exc: Exception) -> ModelUnavailable:
        return ModelUnavailable(
            f"Ollama model {self.model!r} at {self.host or 'localhost:11434'} still failing "
            f"after {attempts} tries: {redact.describe(exc)}",
            hint=outage_hint(exc, "start the server (`ollama serve`) or fix host=; raise "
                                  "timeout/retry_time for a slow server"))

    def _tokens(self, response: Any) -> int | None:
        usage = response.get("usage") or {}
        return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))

    def complete(self, messages: list[Message], seed: int, k: int
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
        reply, retries = self._call(messages, seed)
        action = make_action(k, reply["content"], reply["calls"], reply["finish_reason"],
                             self.tools, self.max_tokens)
        meta = {"model": self.model, "served_model": reply["model"], "retries": retries,
                "params": {"temperature": self.temperature, "top_p": self.top_p,
                           "num_ctx": self.num_ctx, "max_tokens": self.max_tokens},
                "finish_reason": reply["finish_reason"], "usage": reply["usage"]}
        return action, meta


def _reply(resp: Any, content: str, calls: list[Any]) -> dict[str, Any]:
    return {"content": content or None,
            "calls": [(c.function.name, dict(c.function.arguments or {})) for c in calls],
            "finish_reason": getattr(resp, "done_reason", None) or "stop",
            "model": getattr(resp, "model", None),
            "usage": {"prompt_tokens": getattr(resp, "prompt_eval_count", 0) or 0,
                      "completion_tokens": getattr(resp, "eval_count", 0) or 0}}


__all__ = ["OllamaPolicy", "ollama_messages"]
