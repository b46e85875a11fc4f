"""What a run was invoked with besides its input: the user's ``config["configurable"]`` keys and
the runtime ``context=``.

Tools and nodes read them (``config["configurable"]["user_id"]``, ``runtime.context.user_id``,
the pattern of LangGraph's memory docs), so a branch invoked with its thread's keys alone ran
as no user at all: a user trial's branches looked up the "guest" memories, booked the wrong
meal every time, and CAR said no step caused a failure that one step did, or every branch
raised on ``None.user_id``. The callback reads both from the config LangGraph hands the run's
first model or tool call (``captured``), keeps what can be written as JSON and rebuilt (the
plain configurable values, a dataclass, pydantic or dict context), and says what it could not
keep; a branch is invoked with them again (``Invocation.of``). What was not kept must be given
(``LangGraphAgent(context=..., configurable=...)``), or the run is refused before any branch
(``Invocation.refusal``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables.config import var_child_runnable_config

from car_core.contract import Trajectory, redact
from car_core.errors import AdapterError

# LangGraph's own configurable keys (a thread, its checkpoints), never the user's
OWN_KEYS = frozenset({"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint_map",
                      "checkpoint_during", "run_id"})
_RUNTIME = "__pregel_runtime"
NOT_GIVEN: Any = object()


def captured() -> dict[str, Any]:
    """The invocation of the run whose task is running now, as ``run.meta["invocation"]``
    (``{}`` for a run given neither): ``configurable`` (the user's keys whose
    values are plain JSON), ``unrecorded`` (the user's keys that are not, or that name a
    secret), and ``context`` (``{"class", "value"}``, or ``{"class", "unrecorded": why}``)
    where the run was given one."""
    config = var_child_runnable_config.get() or {}
    conf = config.get("configurable") or {}
    kept: dict[str, Any] = {}
    unrecorded: list[str] = []
    for key, value in conf.items():
        key = str(key)
        if key.startswith("__") or key in OWN_KEYS:
            continue
        if redact.names_a_secret(key) or not round_trips(value):  # a secret is never stored
            unrecorded.append(key)
            if isinstance(value, str) and redact.names_a_secret(key):
                redact.register(value)
        else:
            kept[key] = value
    out: dict[str, Any] = {"configurable": kept} if kept else {}
    if unrecorded:
        out["unrecorded"] = sorted(unrecorded)
    context = getattr(conf.get(_RUNTIME), "context", None)
    if context is not None:
        out["context"] = _dumped(context)
    return out


# what LangGraph writes into a checkpoint's metadata for itself (the rest: the run's config
# metadata and its plain configurable values)
_CHECKPOINT_OWN = frozenset({"source", "step", "parents", "writes", "run_id", "thread_id",
                             "checkpoint_ns", "checkpoint_id", "car_fork_of"})


def imported(metadata: Any) -> dict[str, Any]:
    """The invocation of a run imported from a checkpointer, as far as a checkpoint's metadata
    shows it: LangGraph copies the plain configurable values there (``user_id``), among the
    run's metadata, which a branch passes on as harmless keys. The runtime context is not
    there (``context_unknown``: an app that takes one must be given it)."""
    kept = {str(k): v for k, v in dict(metadata or {}).items()
            if str(k) not in _CHECKPOINT_OWN and not str(k).startswith(("langgraph_", "ls_", "__"))
            and not redact.names_a_secret(str(k)) and round_trips(v)}
    return {**({"configurable": kept} if kept else {}), "context_unknown": True}


def round_trips(value: Any) -> bool:
    """Whether ``value`` is JSON that loads back as itself."""
    try:
        return bool(json.loads(json.dumps(value, allow_nan=False)) == value)
    except (TypeError, ValueError):
        return False


def _class(value: Any) -> str:
    return f"{type(value).__module__}:{type(value).__qualname__}"


def _dumped(context: Any) -> dict[str, Any]:
    """A runtime context as JSON that rebuilds it equal, or why it cannot be."""
    name = _class(context)
    try:
        if dataclasses.is_dataclass(context) and not isinstance(context, type):
            value: Any = dataclasses.asdict(context)
        elif hasattr(context, "model_dump"):
            value = context.model_dump(mode="json")
        elif isinstance(context, Mapping):
            value = dict(context)
        else:
            return {"class": name, "unrecorded": "it is neither a dataclass, a pydantic "
                                                 "model nor a dict"}
        if not round_trips(value) or _rebuilt(type(context), value) != context:
            return {"class": name, "unrecorded": "its fields do not load back as JSON"}
    except Exception as exc:  # noqa: BLE001 - any failure to dump is "cannot be recorded"
        return {"class": name, "unrecorded": f"dumping it raised {type(exc).__name__}"}
    redact.register_fields(value)  # api_key=, *_token=, password= fields stay out of the store
    return {"class": name, "value": value}


def _rebuilt(cls: Any, value: Any) -> Any:
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return cls(**value)
    if hasattr(cls, "model_validate"):
        return cls.model_validate(value)
    return dict(value)


@dataclass(frozen=True)
class Invocation:
    """How a branch of a run is invoked: its configurable keys and its context."""

    configurable: dict[str, Any]
    context: Any = NOT_GIVEN

    def kwargs(self) -> dict[str, Any]:
        """``invoke``'s keyword arguments besides the config."""
        return {} if self.context is NOT_GIVEN else {"context": self.context}

    @classmethod
    def of(cls, run: Trajectory | None, schema: Any, context: Any,
           configurable: Mapping[str, Any] | Callable[[Trajectory], Mapping[str, Any]] | None
           ) -> Invocation:
        """What the run was invoked with, the user's ``configurable`` and ``context`` over it
        (each a value, or a function of the run). Refused as ``refusal`` says."""
        why = cls.refusal(run, schema, context, configurable)
        if why is not None:
            raise AdapterError(
                why, run_id=run.id if run is not None else None,
                hint="pass what the run was invoked with: LangGraphAgent(app, ..., context="
                     "Context(...) or a function of the run, configurable={...} or a function "
                     "of the run)")
        recorded = (run.meta.get("invocation") if run is not None else None) or {}
        given = configurable(run) if callable(configurable) and run is not None else (
            configurable if isinstance(configurable, Mapping) else {})
        conf = {**(recorded.get("configurable") or {}), **dict(given)}
        if context is not NOT_GIVEN and not (callable(context) and run is None):
            return cls(conf, context(run) if callable(context) else context)
        held = recorded.get("context")
        if held is not None and "value" in held and schema is not None:
            return cls(conf, _rebuilt(schema, held["value"]))
        return cls(conf)

    @staticmethod
    def refusal(run: Trajectory | None, schema: Any, context: Any,
                configurable: Any) -> str | None:
        """Why a branch of ``run`` cannot be invoked as the run was: the app takes a runtime
        context (``context_schema``) the record does not hold (or holds as another class),
        or the run was given configurable keys the record could not keep."""
        if run is None:
            return None
        recorded = run.meta.get("invocation") or {}
        given = set(configurable) if isinstance(configurable, Mapping) else (
            None if callable(configurable) else set())
        missing = [k for k in recorded.get("unrecorded") or () if given is not None
                   and k not in given]
        if missing:
            return (f"the run was invoked with configurable keys {missing} that the record "
                    "could not keep (not plain JSON, or named as a secret), and a branch "
                    "invoked without them would not run as the run did")
        if context is not NOT_GIVEN or schema is None:
            return None
        held = recorded.get("context")
        name = f"{schema.__module__}:{schema.__qualname__}"
        if held is None and "invocation" in run.meta and not recorded.get("context_unknown"):
            return None  # recorded as invoked without one: so are its branches
        if held is None:
            return (f"the app takes a runtime context (context_schema={schema.__qualname__}) "
                    "that this record does not hold (recorded before CAR kept it, or "
                    "imported from a checkpointer), and a branch invoked without the one the "
                    "run had would not run as it did; pass context=None if it was given none")
        if "value" not in held:
            return (f"the run's runtime context ({held.get('class')}) could not be recorded: "
                    f"{held.get('unrecorded')}")
        if held.get("class") != name and not (held.get("class") == "builtins:dict"
                                              and issubclass(schema, dict)):
            return (f"the run's runtime context was a {held.get('class')}, not the app's "
                    f"context_schema {name}")
        return None


def context_schema(app: Any) -> Any:
    """The runtime context class the compiled app declares (None when it takes none)."""
    schema = getattr(app, "context_schema", None)
    if schema is None:
        schema = getattr(getattr(app, "builder", None), "context_schema", None)
    return schema if isinstance(schema, type) else None
