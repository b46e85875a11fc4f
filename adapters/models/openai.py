"""``OpenAIPolicy``: a car policy over the official ``openai`` client (chat completions with
tools). Works against any OpenAI-compatible server through ``base_url`` (vLLM, llama.cpp's
server, Ollama's ``/v1``).

Each decision passes a seed drawn from the branch's noise plus the sampling parameters, and
records the model, token usage, ``system_fingerprint`` and (when asked for) logprobs in the
step's meta. 429 and 5xx answers and dropped connections are retried with jittered backoff
within a bounded total time (``car_adapters.models.server_policy``); what is still failing then
becomes a ``ModelUnavailable`` that says what to do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from car_core.contract import outage_hint, redact
from car_core.errors import InvalidInput, ModelUnavailable, PolicyError

from .chat_agent import Message, make_action
from .ratelimit import Backoff, RateLimiter
from .server_policy import ServerPolicy

try:
    import openai
except ImportError as exc:  # pragma: no cover - part of the default install
    raise ImportError("car_adapters.openai needs the openai client: pip install openai") from exc

# the client's own loggers (request URLs, retried errors) pass the redaction rule too
CLIENT_LOGGERS = ("openai", "httpx", "httpx2", "httpcore", "httpcore2")
RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)


def wire_messages(messages: Sequence[Message]) -> list[Message]:
    """Messages as the chat-completions API takes them (tool results without extra keys)."""
    out = []
    for m in messages:
        if m.get("role") == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id"),
                        "content": m.get("content") or ""})
        elif m.get("role") == "assistant":
            # "" rather than null: chat templates of small local models concatenate it
            msg: Message = {"role": "assistant", "content": m.get("content") or ""}
            if m.get("tool_calls"):
                msg["tool_calls"] = m["tool_calls"]
            out.append(msg)
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


class OpenAIPolicy(ServerPolicy):
    """``policy(history, rng) -> assistant message`` from a chat-completions model.

    ``tool_choice`` is passed through ("auto", "required" or a named function).
    ``prices``: (input, output) price per million tokens; when given, each step's meta carries
    its ``cost`` (otherwise a ``car.Budget(prices=...)`` table prices the tokens). Retries,
    ``limiter`` and pickling: see ``car_adapters.models.server_policy``.
    """

    def __init__(self, model: str, *, client: Any = None, base_url: str | None = None,
                 api_key: str | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                 temperature: float = 1.0, top_p: float | None = None, max_tokens: int = 256,
                 timeout: float = 60.0, max_retries: int = 5, retry_time: float = 60.0,
                 backoff: float | Backoff = 0.5, logprobs: bool = False, tool_choice: Any = None,
                 prices: tuple[float, float] | None = None,
                 limiter: RateLimiter | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidInput("OpenAIPolicy needs a model name", hint='pass model="gpt-4o-mini"')
        super().__init__(client=client, timeout=timeout, max_retries=max_retries,
                         retry_time=retry_time, backoff=backoff, limiter=limiter)
        self.model, self.tools = model, [dict(t) for t in tools or ()]
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.logprobs, self.prices = logprobs, prices
        self.base_url, self.tool_choice = base_url, tool_choice
        # never stored, rendered or printed from here on (a given client's: ServerPolicy)
        redact.register_credential(api_key)
        redact.register_url(base_url)
        redact.guard_loggers(*CLIENT_LOGGERS)
        if client is None:  # built now, so a missing or broken key is said at once
            self._client = self._new_client(api_key)

    def _new_client(self, api_key: str | None = None) -> Any:
        """A client from the settings; the key is ``api_key`` or, where a pickled policy lands,
        the process's ``OPENAI_API_KEY`` (an explicit key is never pickled)."""
        key = api_key or os.environ.get("OPENAI_API_KEY")
        redact.register_credential(key)
        if key is not None and not key.isascii():
            raise InvalidInput("the API key contains a character an HTTP header cannot "
                               "carry (a stray non-ASCII character pasted with it?)",
                               hint="copy the key again, or set OPENAI_API_KEY cleanly")
        if key is None and self.base_url is None:
            raise ModelUnavailable(
                f"no API key for the hosted model {self.model!r} in this process",
                hint="set OPENAI_API_KEY (on every worker too: an api_key= passed in code "
                     "is never sent to other processes), pass api_key=..., or pass base_url= "
                     "for a local OpenAI-compatible server (llama.cpp, vLLM, Ollama's /v1)")
        return openai.OpenAI(api_key=key or "not-needed", base_url=self.base_url,
                             timeout=self.timeout, max_retries=0)

    def _request(self, messages: list[Message], seed: int) -> Any:
        kwargs: dict[str, Any] = {"model": self.model, "messages": wire_messages(messages),
                                  "seed": seed, "temperature": self.temperature,
                                  "max_tokens": self.max_tokens, "timeout": self.timeout}
        if self.top_p is not None:
            kwargs["top_p"] = self.top_p
        if self.tools:
            kwargs["tools"] = self.tools
            if self.tool_choice is not None:
                kwargs["tool_choice"] = self.tool_choice
        if self.logprobs:
            kwargs["logprobs"] = True
        return self.client.chat.completions.create(**kwargs)

    def _transient(self, exc: Exception) -> bool:
        """429s, 5xx and dropped connections are retried; a wrong model or key is said at once;
        any other refusal is the request's fault."""
        if isinstance(exc, openai.NotFoundError):
            raise ModelUnavailable(
                f"the server has no model {self.model!r} ({exc.status_code})",
                hint="check the model name against the server's model list"
                ) from redact.redacted(exc)
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            raise ModelUnavailable(f"the server refused the API key ({exc.status_code})",
                                   hint="set a valid OPENAI_API_KEY or api_key="
                                   ) from redact.redacted(exc)
        if isinstance(exc, RETRYABLE):
            return True
        if isinstance(exc, openai.APIStatusError):
            raise PolicyError(f"the server rejected the request: {_describe(exc)}",
                              hint="check the tools, messages and sampling parameters "
                                   "this server accepts") from redact.redacted(exc)
        return False

    def _still_failing(self, attempts: int, exc: Exception) -> ModelUnavailable:
        return ModelUnavailable(
            f"model {self.model!r} at {self.base_url or 'api.openai.com'} still failing after "
            f"{attempts} tries: {_describe(exc)}",
            hint=outage_hint(exc, "start the server or fix base_url; raise timeout/retry_time "
                                  "for a slow server"))

    def _tokens(self, response: Any) -> int | None:
        usage = getattr(response, "usage", None)
        if usage is None:
            return None
        return int(usage.prompt_tokens or 0) + int(usage.completion_tokens or 0)

    def complete(self, messages: list[Message], seed: int, k: int
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
        resp, retries = self._call(messages, seed)
        choice = resp.choices[0]
        msg = choice.message
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()
                 if getattr(c, "function", None) is not None]
        action = make_action(k, msg.content, calls, choice.finish_reason, self.tools,
                             self.max_tokens)
        meta: dict[str, Any] = {
            "model": self.model,
            "params": {"temperature": self.temperature, "top_p": self.top_p,
                       "max_tokens": self.max_tokens},
            "finish_reason": choice.finish_reason, "retries": retries,
            "served_model": getattr(resp, "model", None),
            "system_fingerprint": getattr(resp, "system_fingerprint", None),
            "tool_call_ids": [c.id for c in msg.tool_calls or ()]}
        if resp.usage is not None:
            meta["usage"] = {"prompt_tokens": resp.usage.prompt_tokens or 0,
                             "completion_tokens": resp.usage.completion_tokens or 0}
            details = getattr(resp.usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None)
            if cached is not None:  # the provider's prompt cache served these
                meta["usage"]["cached_tokens"] = int(cached)
            if self.prices is not None:
                pin, pout = self.prices
                meta["cost"] = (meta["usage"]["prompt_tokens"] * pin
                                + meta["usage"]["completion_tokens"] * pout) / 1e6
        if self.logprobs and choice.logprobs is not None and choice.logprobs.content:
            meta["logprobs"] = [round(float(t.logprob), 6) for t in choice.logprobs.content]
        return action, meta


def _describe(exc: Exception) -> str:
    """The error's type and status, or its redacted text (a server's body may echo the key)."""
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__} {status}" if status else redact.describe(exc)


__all__ = ["OpenAIPolicy", "wire_messages"]
