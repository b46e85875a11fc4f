"""What a run was asked, in a few words: the last user message of its context.

``car runs`` lists runs by id, time and outcome; thirty runs of an eval set recorded at once
share a second, and a user trial had to open each with ``car show`` to find which input it
was. A run is saved with it in its sealed header, and the store's run summaries carry it as
``input`` (None for a run saved before). The last user message, not the first: a turn of a
conversation starts from the history before it (an OpenAI Agents session, a chat thread), and
a user trial's three turns of one session all showed the first turn's message."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

INPUT_CHARS = 200  # kept in a summary; the table shortens it further

# keys under which frameworks and users keep the request in a run's context
_REQUEST_KEYS = ("input", "user_msg", "query", "question", "task", "prompt", "message")


def run_input(context: Any) -> str | None:
    """The request a run started from: a string context itself, else the last user message
    (OpenAI-style dicts, in a list or under ``messages``), else a string under a usual key;
    a context none of these fits is shown as compact JSON. At most ``INPUT_CHARS``."""
    text = _request(context)
    if text is None:
        if context is None:
            return None
        text = json.dumps(context, separators=(",", ":"), default=str)
    text = " ".join(text.split())
    return text[:INPUT_CHARS - 1] + "…" if len(text) > INPUT_CHARS else text


def _request(context: Any) -> str | None:
    if isinstance(context, str):
        return context
    if isinstance(context, list):
        for m in reversed(context):
            if isinstance(m, Mapping) and m.get("role") == "user":
                return _content(m.get("content"))
        return None
    if isinstance(context, Mapping):
        if context.get("role") == "user":
            return _content(context.get("content"))
        if isinstance(context.get("messages"), list):
            return _request(context["messages"])
        for key in _REQUEST_KEYS:
            value = context.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, (list, Mapping)):
                found = _request(value)
                if found is not None:
                    return found
    return None


def _content(content: Any) -> str | None:
    """A message's text: its string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        texts = [p for p in parts if isinstance(p, str)]
        return " ".join(texts) if texts else None
    return None
