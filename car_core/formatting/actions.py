"""What a recorded step did, in a few words (``action_summary``): the answer quotes it and
results keep one per step (``step_actions``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ACTION_CHARS = 60  # how much of a recorded action the answer quotes
CALLS_CHARS = 90   # ... of a step of several tool calls, so each keeps some of its arguments


def _clip(text: str, limit: int = ACTION_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _clip_value(value: str, limit: int) -> str:
    """An argument's JSON cut to ``limit``; a string keeps its closing quote, so the next
    argument does not read as inside it (a trial read ``body="Hello Alice,…, to="alice@…``)."""
    if len(value) <= limit or not (value.startswith('"') and value.endswith('"')):
        return _clip(value, limit)
    return value[:max(limit - 2, 1)].rstrip() + '…"'


def _json(value: Any) -> str:
    import json
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _call(name: Any, args: Any, limit: int = ACTION_CHARS) -> str:
    """``refund(order="A7", amount=120)`` from a tool name and its arguments (a dict or the
    JSON string chat APIs send), at most ``limit`` characters with "called "."""
    if isinstance(args, str):
        import json
        try:
            args = json.loads(args)
        except ValueError:
            return _clip(f"called {name}({args})", limit)
    if isinstance(args, Mapping):
        said = [(str(k), _json(v)) for k, v in args.items()]
        inner = ", ".join(f"{k}={v}" for k, v in said)
        room = limit - len(f"called {name}()")
        if len(inner) > room and len(said) > 1:
            # each value clipped to a fair share of the room, so a long first argument (an
            # e-mail's body) does not push the others (its recipient) out of the cell
            left = room - sum(len(k) + 3 for k, _ in said)
            shares: dict[int, int] = {}
            for rank, i in enumerate(sorted(range(len(said)), key=lambda i: len(said[i][1]))):
                fair = max(8, left // (len(said) - rank))  # short values keep what they need
                shares[i] = min(len(said[i][1]), fair)
                left -= shares[i]
            inner = ", ".join(f"{k}={_clip_value(v, shares[i])}"
                              for i, (k, v) in enumerate(said))
    elif args is None:
        inner = ""
    else:
        inner = _json(args)
    return _clip(f"called {name}({inner})", limit)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # content blocks: the text ones, in order
        return " ".join(str(b.get("text", "")) if isinstance(b, Mapping) else str(b)
                        for b in content)
    return ""


def _calls(calls: Sequence[Any]) -> str:
    """``called a(x=1) and b(y=2)``: every call of a step in ``CALLS_CHARS``, each shortened
    to its share of the room (a short call keeps only what it needs), its arguments each
    shortened within it, so the one that mattered is named with what it did (a step that
    looked an invoice up and charged a card read "called lookup_invoice(…) and 1 more
    call(s)"; one that checked a balance and transferred 100 read "transfer(account="ACC-9…",
    the amount cut off)."""
    said = []
    for call in calls:
        first = call if isinstance(call, Mapping) else {}
        inner = first.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else first
        said.append((fn.get("name", "?"), fn.get("arguments", fn.get("args"))))
    if len(said) == 1:
        return _call(*said[0])
    whole = [len(_call(name, args, 10**6)) - 7 for name, args in said]
    left = CALLS_CHARS - 7 - 5 * (len(said) - 1)
    shares: dict[int, int] = {}
    for rank, i in enumerate(sorted(range(len(said)), key=whole.__getitem__)):
        shares[i] = min(whole[i], max(12, left // (len(said) - rank)))
        left -= shares[i]
    return "called " + " and ".join(_call(name, args, shares[i] + 7).removeprefix("called ")
                                    for i, (name, args) in enumerate(said))


def action_summary(action: Any) -> str:
    """What a recorded action did, in a few words: ``called refund(order="A7")`` for a tool
    call (every call of a step, each shortened), ``replied "Sure, I can…"`` for a reply, else
    ``chose {...}`` with the action's JSON, shortened."""
    if isinstance(action, Mapping):
        calls = action.get("tool_calls")
        if isinstance(calls, Sequence) and not isinstance(calls, str) and calls:
            return _calls(calls)
        if action.get("name") and any(k in action for k in ("arguments", "args", "input")):
            args = next(action[k] for k in ("arguments", "args", "input") if k in action)
            return _call(action["name"], args)
        said = _text(action.get("content")).strip()
        if said:
            return f'replied "{_clip(said, ACTION_CHARS - 10)}"'
    elif isinstance(action, str) and action.strip():
        return f'replied "{_clip(action, ACTION_CHARS - 10)}"'
    return "chose " + _clip(_json(action), ACTION_CHARS - 6)


def step_actions(run: Any) -> tuple[str, ...]:
    """``action_summary`` of every recorded step of ``run``, in order (kept with results)."""
    return tuple(action_summary(s.action) for s in run.steps)
