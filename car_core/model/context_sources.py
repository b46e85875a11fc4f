"""What a step decided from, cut into sources that can be taken out one at a time.

A *source* is one piece of the state step ``k`` decided from: a chat message (system, user or
tool), one part of a message whose content is a list of parts, a key or an item of a
``FunctionAgent`` run's context, or the observation an earlier step got (a tool result). A
user ``splitter(text) -> [segment, …]`` cuts every textual source finer (sentences, retrieved
documents inside one tool result); its segments must appear in the text in order.

The instructions the model was given are sources under names a reader knows: the first system
message of a chat state, or a ``system_prompt`` key of a context, is the ``system prompt``; a
``tools`` key of a context holding tool specs (dicts with a ``name`` and a ``description``)
gives one source per description, ``tool NAME: description``. Only what the state holds is
offered, so an edit of it reaches the model wherever ``do_context`` does. A prompt a framework
adds at the model call, outside the state it keeps (a LangGraph node's ``SystemMessage``), is
recorded in ``meta["prompt"]``; where the step says the model was given that prompt and then
its state (``meta["input"] == PROMPT_INPUT``, written only where the adapter can hand the
model an edited prompt), the step decided from ``prompt + state``, and that is what
``do_context`` edits and what is cut into sources. The tools a framework's model call was
offered are recorded in ``meta["tools"]`` (specs with a ``name`` and a ``description``, written
only where the adapter can bind the call edited descriptions); such a step decided from a
``ChatInput``, its messages with those tools attached (``tools``), and each description is a
source, ``tool NAME: description``, after the messages.

Taking a source out (``ablate``) deletes what it says: a message keeps its place with empty
content (so a tool call stays answered and the history still opens with a user turn, which chat
APIs and frameworks require), a system prompt or a tool's description becomes empty (the tool
stays offered, by name), a message part or a context item is dropped, a segment is cut from its
string, an observation becomes ``None``.
Assistant messages of the run are the agent's own earlier decisions, which the step
estimators blame; they are not sources. Those the run began from (an earlier turn, or an earlier
run that handed this one its history: ``before_run``) are, where they say something: no step of
the run re-decides them, and a user trial's llm-as-judge loop failed on an outline its first
round wrote, which ``car what`` could not name.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from car_core.errors import InvalidInput
from car_core.model.json_values import dumps
from car_core.model.trajectory import History, Step, Trajectory

Path = tuple[Any, ...]
Splitter = Callable[[str], Sequence[str]]
SYSTEM_PROMPT = "system prompt"
SYSTEM_PROMPT_KEY = "system_prompt"  # a context key whose value is the system prompt
TOOLS_KEY = "tools"  # a context key whose value lists the tool specs the model is offered
PROMPT_INPUT = "prompt+state"  # ``meta["input"]``: the model got ``meta["prompt"]``, then state
_GONE = object()  # a removed list item or dict value, dropped when the state is rebuilt


class ChatInput(list[Any]):
    """The messages a model call was given (the list itself) and the tools it was offered
    (``tools``: ``{"name", "description"}`` specs), so a ``do_context`` edit can change a
    description. An edit that returns a plain list leaves the tools as recorded."""

    def __init__(self, messages: Sequence[Any] = (), tools: Sequence[Any] = ()) -> None:
        super().__init__(messages)
        self.tools: list[Any] = list(tools)


def offered_tools(state: Any) -> list[Any] | None:
    """The tool specs ``state`` (what a ``do_context`` edit returned) carries, or ``None``."""
    return state.tools if isinstance(state, ChatInput) else None


@dataclass(frozen=True)
class Source:
    """One removable piece of a step's state: where it sits (``path``; ``span`` when it is a
    segment of the string there), a label a reader can place and the text it carries."""

    index: int
    label: str
    text: str
    path: Path
    span: tuple[int, int] | None = None
    blank: bool = False  # taken out by emptying its content (a tool message), not dropping it

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "text": self.text,
                "path": list(self.path), "span": None if self.span is None else list(self.span)}


def state_of(run: Trajectory, step: int) -> Any:
    """The state step ``step`` decided from, as ``do_context`` hands it to an edit: the
    recorded chat messages for framework agents (after the prompt the framework added at the
    call, where the step records it as part of the input: ``PROMPT_INPUT``), the
    ``car.History`` for a ``FunctionAgent``; a ``ChatInput`` where the step recorded the tools
    its model call was offered (``meta["tools"]``)."""
    recorded = run.step(step).state
    if recorded is None:
        return run.history(step)
    meta = run.step(step).meta
    prompt = meta.get("prompt")
    if (meta.get("input") == PROMPT_INPUT and isinstance(prompt, list)
            and isinstance(recorded, list)):
        recorded = [*copy.deepcopy(prompt), *recorded]
    if isinstance(recorded, list) and _tool_specs(meta.get(TOOLS_KEY)):
        return ChatInput(recorded, copy.deepcopy(meta[TOOLS_KEY]))
    return recorded


def _text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def _root(state: Any) -> Any:
    """The state as one tree of lists and dicts that paths walk into."""
    if isinstance(state, History):
        return {"context": copy.deepcopy(state.context),
                "observation": {s.index: s.observation for s in state.steps}}
    return copy.deepcopy(state)


def before_run(run: Trajectory, step: int) -> int:
    """How many leading messages of ``state_of(run, step)`` came before the run began: the
    prompt the step's call was given, then what the first step's state and this one's share
    (an earlier turn, or an earlier run that handed this one its history)."""
    first, mine = run.step(0).state, run.step(step).state
    if not isinstance(first, list) or not isinstance(mine, list):
        return 0
    shared = 0
    for a, b in zip(first, mine, strict=False):
        if a != b:
            break
        shared += 1
    meta = run.step(step).meta
    prompt = meta.get("prompt")
    added = (len(prompt) if meta.get("input") == PROMPT_INPUT and isinstance(prompt, list)
             else 0)
    return added + shared


def decisions_before(run: Trajectory) -> int:
    """How many of the agent's decisions (assistant messages) the run began from
    (``before_run``): no step of the run re-decides them."""
    if not run.steps:
        return 0
    state = state_of(run, 0)
    return sum(1 for m in list(state)[:before_run(run, 0)]
               if isinstance(m, dict) and m.get("role") == "assistant") \
        if isinstance(state, list) else 0


def _message_sources(messages: Sequence[Any], base: Path, before: int = 0
                     ) -> list[tuple[str, Any, Path, bool]]:
    found: list[tuple[str, Any, Path, bool]] = []
    prompt_seen = False
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            found.append((f"item {i}", msg, (*base, i), False))
            continue
        role = str(msg["role"])
        if role == "assistant" and (i >= before or not msg.get("content")):
            continue  # the run's own decisions (the step estimators blame those)
        content = msg.get("content")
        if role == "system" and not prompt_seen:
            prompt_seen = True
            name = SYSTEM_PROMPT
        elif role == "assistant":
            name = f"assistant message {i} (before this run)"
        else:
            name = f"{role} message {i}" + (f" ({msg['name']})" if msg.get("name") else "")
        if isinstance(content, list) and len(content) > 1:
            for p, part in enumerate(content):
                found.append((f"{name}, part {p}", part, (*base, i, "content", p), False))
        else:
            found.append((name, content, (*base, i, "content"), True))
    return found


def _tool_specs(value: Any) -> bool:
    """Whether a context value lists tool specs: dicts that each name a tool and describe it."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str)
        and isinstance(t.get("description"), str) for t in value)


def _tool_sources(specs: Sequence[Any], base: Path) -> list[tuple[str, Any, Path, bool]]:
    return [(f"tool {t['name']}: description", t["description"], (*base, i, "description"), True)
            for i, t in enumerate(specs)]


def _context_sources(context: Any) -> list[tuple[str, Any, Path, bool]]:
    if isinstance(context, list):
        return _message_sources(context, ("context",))
    if isinstance(context, dict):
        found: list[tuple[str, Any, Path, bool]] = []
        for key, value in context.items():
            if key == SYSTEM_PROMPT_KEY and isinstance(value, str):
                found.append((SYSTEM_PROMPT, value, ("context", key), True))
            elif key == TOOLS_KEY and _tool_specs(value):
                found += _tool_sources(value, ("context", key))
            elif isinstance(value, list) and len(value) > 1:
                found += [(f"{key}[{i}]", item, ("context", key, i), False)
                          for i, item in enumerate(value)]
            else:
                found.append((str(key), value, ("context", key), False))
        return found
    return [("context", context, ("context",), True)] if context is not None else []


def split(state: Any, splitter: Splitter | None = None, before: int = 0
          ) -> tuple[Source, ...]:
    """The sources of ``state`` (see the module docstring), numbered in reading order.
    ``before``: how many leading messages came before the run (``before_run``): an assistant
    message among them with content is a source, a decision no step of the run re-decides."""
    if isinstance(state, History):
        pieces = _context_sources(state.context)
        pieces += [(f"tool result at step {s.index}", s.observation, ("observation", s.index),
                    True) for s in state.steps if s.observed]
    elif isinstance(state, list):
        pieces = _message_sources(state, (), before)
        if isinstance(state, ChatInput) and _tool_specs(state.tools):
            pieces += _tool_sources(state.tools, (TOOLS_KEY,))
    else:
        raise InvalidInput(f"cannot split a state of type {type(state).__name__} into sources",
                           hint="context attribution reads chat messages or a car.History")
    sources: list[Source] = []
    for label, value, path, blank in pieces:
        text = _text(value)
        segments = _segments(text, splitter) if splitter is not None else None
        if segments is None or len(segments) < 2 or not isinstance(value, str):
            sources.append(Source(len(sources), label, text, path, None, blank))
            continue
        for s, (start, end) in enumerate(segments):
            sources.append(Source(len(sources), f"{label}, segment {s}", text[start:end], path,
                                  (start, end)))
    return tuple(sources)


def _segments(text: str, splitter: Splitter) -> list[tuple[int, int]]:
    spans, at = [], 0
    for piece in splitter(text):
        if not isinstance(piece, str):
            raise InvalidInput(f"the splitter returned {type(piece).__name__}, not a string",
                               hint="a splitter takes a source's text and returns its segments")
        if not piece.strip():
            continue
        found = text.find(piece, at)
        if found < 0:
            raise InvalidInput(f"the splitter's segment {piece[:40]!r} is not in the text after "
                               "the previous one",
                               hint="return segments of the text, in order (e.g. its sentences)")
        spans.append((found, found + len(piece)))
        at = found + len(piece)
    return spans


def _walk(tree: Any, path: Path) -> tuple[Any, Any]:
    """The container holding ``path``'s last key, and that key (a path into a ``ChatInput``'s
    tools opens with ``"tools"``)."""
    node = tree
    for key in path[:-1]:
        node = node.tools if isinstance(node, ChatInput) and key == TOOLS_KEY else node[key]
    return node, path[-1]


def _compact(node: Any) -> Any:
    if isinstance(node, list):
        return [_compact(v) for v in node if v is not _GONE]
    if isinstance(node, dict):
        return {k: _compact(v) for k, v in node.items() if v is not _GONE}
    return node


def ablate(state: Any, sources: Sequence[Source], removed: Sequence[int]) -> Any:
    """``state`` with the sources numbered in ``removed`` taken out (the state is not changed)."""
    gone = {int(i) for i in removed}
    if not gone:
        return state
    tree = _root(state)
    cuts: dict[Path, list[tuple[int, int]]] = {}
    for source in sources:
        if source.index not in gone:
            continue
        if source.span is not None:
            cuts.setdefault(source.path, []).append(source.span)
            continue
        node, key = _walk(tree, source.path)
        if source.path[0] == "observation" and isinstance(state, History):
            node[key] = None
        elif source.blank:
            node[key] = "" if source.path[0] != "context" or len(source.path) > 1 else None
        else:
            node[key] = _GONE
    for path, spans in cuts.items():
        node, key = _walk(tree, path)
        if node[key] is _GONE or not isinstance(node[key], str):
            continue
        text = node[key]
        for start, end in sorted(spans, reverse=True):
            text = text[:start] + text[end:]
        node[key] = text
    if isinstance(state, History):
        context = _compact(tree["context"]) if tree["context"] is not _GONE else None
        steps = tuple(Step(s.index, s.action, tree["observation"][s.index], s.observed, s.state,
                           s.meta) for s in state.steps)
        return History(context, steps, state.index)
    if isinstance(tree, ChatInput):
        return ChatInput(_compact(list(tree)), _compact(tree.tools))
    return _compact(tree)


def remover(sources: Sequence[Source], removed: Sequence[int]) -> Callable[[Any], Any]:
    """A ``do_context`` edit that takes the sources numbered in ``removed`` out."""
    chosen = tuple(sorted(int(i) for i in removed))

    def edit(state: Any) -> Any:
        return ablate(state, sources, chosen)
    labels = [s.label for s in sources if s.index in chosen]
    edit.__name__ = ("remove " + ", ".join(labels)) if labels else "remove nothing"
    return edit


def keep_all(state: Any) -> Any:
    """The identity edit: the step re-decides from exactly what it saw (the full arm)."""
    return state
