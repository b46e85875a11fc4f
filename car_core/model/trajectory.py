"""The record of one agent run: context, steps, outcome, lineage, with chained digests.

A run is ``τ = [s0, (a0, o0), …, (a_{n-1}, o_{n-1}), y]``. Each ``Step`` keeps the action the
policy chose, the observation the environment returned (if any), optionally the state it decided
from (chat messages for framework agents; for ``FunctionAgent`` the state is the prefix itself),
and free-form metadata (model, seed, tokens, latency, framework ids). Digests are chained from
the context through every step, so editing the context or any step is detected on load; the
outcome, seed, status and lineage are outside the chain (``RunStore`` seals them separately).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from car_core.errors import CorruptRun, StepOutOfRange
from car_core.model.json_values import JSON, canonical, check_json, digest, digest_of, dumps, loads
from car_core.model.vocabulary import Origin, RunStatus
from car_core.secrets.redact import holds_secret, scrub

ORIGINS = tuple(Origin)
FAILED_AT = 0.5  # an outcome value at or above it counts as a failure where one is counted


def is_failure(value: float) -> bool:
    """Whether an outcome value counts as a failure: the one threshold every count uses (a
    run's ``failed``, a report's fail / ok counts, an exact test on pass/fail outcomes)."""
    return value >= FAILED_AT


@dataclass(frozen=True)
class Outcome:
    """The outcome score ``y`` in [0, 1]; 1 means the failure happened."""

    value: float
    detail: JSON = None

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        return cls(value=float(data["value"]), detail=data.get("detail"))


@dataclass(frozen=True)
class Lineage:
    """Where a branch came from: its parent run, the interventions applied, the branch step."""

    parent_id: str
    interventions: tuple[dict[str, Any], ...] = ()
    branch_step: int | None = None
    attribution_id: str | None = None
    arm: str | None = None
    rollout: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"parent_id": self.parent_id, "interventions": list(self.interventions),
                "branch_step": self.branch_step, "attribution_id": self.attribution_id,
                "arm": self.arm, "rollout": self.rollout}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lineage:
        return cls(parent_id=data["parent_id"],
                   interventions=tuple(data.get("interventions") or ()),
                   branch_step=data.get("branch_step"), attribution_id=data.get("attribution_id"),
                   arm=data.get("arm"), rollout=data.get("rollout"))


@dataclass(frozen=True)
class Step:
    """One decision: the action drawn at ``index`` and what the environment answered."""

    index: int
    action: JSON
    observation: JSON = None
    observed: bool = False
    state: JSON = None
    meta: dict[str, Any] = field(default_factory=dict)
    digest: str = ""

    def content(self, prev: str) -> dict[str, Any]:
        """What the digest covers: everything stored except the digest itself."""
        return {"prev": prev, "index": self.index, "action": self.action,
                "observation": self.observation, "observed": self.observed,
                "state": self.state, "meta": self.meta}

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "action": self.action, "observation": self.observation,
                "observed": self.observed, "state": self.state, "meta": self.meta,
                "digest": self.digest}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        return cls(index=int(data["index"]), action=data.get("action"),
                   observation=data.get("observation"), observed=bool(data.get("observed")),
                   state=data.get("state"), meta=dict(data.get("meta") or {}),
                   digest=str(data.get("digest", "")))


@dataclass(frozen=True)
class History:
    """What step ``index`` decides from: the run's context and the steps before it."""

    context: JSON
    steps: tuple[Step, ...]
    index: int

    def with_step(self, step: Step) -> History:
        return History(self.context, self.steps + (step,), self.index + 1)


def _context_root(context: JSON) -> str:
    return digest({"context": context})


def _scrub_fields(context: JSON, fields: dict[str, Any]) -> JSON:
    """The run's context, error and meta without any registered secret (a framework's error
    text may quote the request that carried one)."""
    for name in ("error", "meta"):
        if fields.get(name):
            fields[name] = scrub(fields[name])
    return scrub(context)


def content_text(step: Step, prev: str, memo: dict[int, str] | None = None) -> str:
    """``canonical(step.content(prev))``, the text a step's digest is taken over. With ``memo``
    (shared across the steps of one run, while their values are alive and unchanged), each
    element of a list ``state`` is encoded once by identity: a run's states repeat the same
    messages step after step, so sealing costs what the run holds, not its square. The text
    is the same: ``state`` is the last key in sorted order, and a list's canonical encoding is
    its elements' joined by ``,``."""
    state = step.state
    if memo is None or type(state) is not list or not state:
        return canonical(step.content(prev))
    head = canonical({"prev": prev, "index": step.index, "action": step.action,
                      "observation": step.observation, "observed": step.observed,
                      "meta": step.meta})
    parts = []
    for item in state:
        text = memo.get(id(item))
        if text is None:
            text = memo[id(item)] = canonical(item)
        parts.append(text)
    return f'{head[:-1]},"state":[{",".join(parts)}]}}'


def seal_steps(context: JSON, steps: list[Step] | tuple[Step, ...]) -> tuple[Step, ...]:
    """Number-check the steps and fill in their chained digests."""
    prev = _context_root(context)
    sealed = []
    memo: dict[str, str] = {}
    encoded: dict[int, str] = {}
    for i, step in enumerate(steps):
        if step.index != i:
            raise CorruptRun(f"step at position {i} says it is step {step.index}",
                             hint="steps must be numbered 0, 1, 2, … in order")
        text = content_text(step, prev, encoded)
        if holds_secret(text):  # a registered secret never reaches a record, digest or store
            step = Step(step.index, scrub(step.action, memo), scrub(step.observation, memo),
                        step.observed, scrub(step.state, memo), scrub(step.meta, memo))
            text = canonical(step.content(prev))
        d = digest_of(text)
        sealed.append(Step(step.index, step.action, step.observation, step.observed, step.state,
                           step.meta, d))  # dataclasses.replace costs more than the digest
        prev = d
    return tuple(sealed)


# meta key: the step a branch's error belongs to, where the adapter knows it (a safe tool that
# errored at step 1 of a branch that ran on to step 5: ``tasks.errored_branch`` names step 1)
ERROR_STEP = "error_step"
# meta key: for a step decided in one of several tasks its graph ran in parallel (LangGraph's
# ``Send`` workers), that task's 0-based index: such steps are no agent's 1st, 2nd, 3rd
# decision in turn, as ``step_label`` had read them
PARALLEL_TASK = "parallel_task"
# run meta key: what the run began from that no step of it re-decides, in the adapter's words
# with how to attribute the whole (a LangGraph thread resumed after a pause for human input:
# ``attribute_thread``); results that find no cause in the run say it
BEGAN_FROM = "began_from"


@dataclass(frozen=True)
class Trajectory:
    """A recorded run. Build one with ``Trajectory.new``; it validates and seals digests."""

    id: str
    context: JSON
    steps: tuple[Step, ...]
    outcome: Outcome | None = None
    seed: int | None = None
    agent: str = ""
    status: str = RunStatus.COMPLETE
    error: str | None = None
    lineage: Lineage | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    @classmethod
    def new(cls, *, context: JSON, steps: list[Step] | tuple[Step, ...], id: str | None = None,
            **fields: Any) -> Trajectory:
        checked: set[int] = set()  # a value shared by several steps is walked once
        check_json(context, "context", checked=checked)
        for s in steps:
            check_json(s.action, f"action of step {s.index}", checked=checked)
            check_json(s.observation, f"observation of step {s.index}", checked=checked)
            check_json(s.state, f"state of step {s.index}", checked=checked)
            check_json(s.meta, f"meta of step {s.index}", checked=checked)
        fields.setdefault("created_at", time.time())
        context = _scrub_fields(context, fields)
        return cls(id=id or new_run_id(), context=context, steps=seal_steps(context, steps),
                   **fields)

    @classmethod
    def _from_checked(cls, *, context: JSON, steps: list[Step], **fields: Any) -> Trajectory:
        """``new`` for the replay engine, whose step values were checked as they were made
        (policy and tool results on return, forced values when the intervention was built)."""
        fields.setdefault("created_at", time.time())
        context = _scrub_fields(context, fields)
        return cls(id=new_run_id(), context=context, steps=seal_steps(context, steps), **fields)

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def digest(self) -> str:
        """The run's content address: the last step's chained digest (or the context's)."""
        return self.steps[-1].digest if self.steps else _context_root(self.context)

    @property
    def failed(self) -> bool:
        return self.outcome is not None and is_failure(self.outcome.value)

    def step(self, k: int) -> Step:
        if not 0 <= k < len(self.steps):
            raise StepOutOfRange(f"step {k} does not exist; the run has {len(self.steps)} steps",
                                 run_id=self.id,
                                 hint=f"use a step index between 0 and {len(self.steps) - 1}")
        return self.steps[k]

    def held_prefix(self, k: int) -> list[Step]:
        """Steps ``< k`` as a branch serves them: the recorded values, marked origin held."""
        return [Step(s.index, s.action, s.observation, s.observed, s.state,
                     {**s.meta, "origin": Origin.HELD}, s.digest)  # cheaper than replace
                for s in self.steps[:k]]

    def history(self, k: int) -> History:
        """The state ``s_k``: context and steps ``< k``, straight from the record."""
        if not 0 <= k <= len(self.steps):
            raise StepOutOfRange(f"state {k} does not exist; the run has {len(self.steps)} steps",
                                 run_id=self.id,
                                 hint=f"use a step index between 0 and {len(self.steps)}")
        return History(self.context, self.steps[:k], k)

    def verify(self) -> None:
        """Raise CorruptRun when any stored digest disagrees with the content."""
        try:
            prev = _context_root(self.context)
        except (TypeError, ValueError) as exc:
            raise CorruptRun(f"the context is not JSON: {exc}", run_id=self.id,
                             hint="the run was edited; record it again") from exc
        encoded: dict[int, str] = {}
        for i, step in enumerate(self.steps):
            if step.index != i:
                raise CorruptRun(f"step at position {i} says it is step {step.index}",
                                 run_id=self.id, hint="the run was edited; record it again")
            try:
                expected = digest_of(content_text(step, prev, encoded))
            except (TypeError, ValueError) as exc:  # not JSON, NaN, a lone surrogate
                raise CorruptRun(f"step content is not JSON: {exc}", run_id=self.id, step=i,
                                 hint="the run was edited; record it again") from exc
            if step.digest != expected:
                raise CorruptRun("digest mismatch: the stored step was changed after recording",
                                 run_id=self.id, step=i,
                                 hint="the run was edited or corrupted; record it again or "
                                      "restore it from a backup")
            prev = expected

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "context": self.context,
                "steps": [s.to_dict() for s in self.steps],
                "outcome": self.outcome.to_dict() if self.outcome else None,
                "seed": self.seed, "agent": self.agent, "status": self.status,
                "error": self.error,
                "lineage": self.lineage.to_dict() if self.lineage else None,
                "meta": self.meta, "created_at": self.created_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, verify: bool = True) -> Trajectory:
        try:
            run = cls(
                id=str(data["id"]), context=data.get("context"),
                steps=tuple(Step.from_dict(s) for s in data["steps"]),
                outcome=Outcome.from_dict(data["outcome"]) if data.get("outcome") else None,
                seed=data.get("seed"), agent=str(data.get("agent", "")),
                status=str(data.get("status", RunStatus.COMPLETE)), error=data.get("error"),
                lineage=Lineage.from_dict(data["lineage"]) if data.get("lineage") else None,
                meta=dict(data.get("meta") or {}), created_at=float(data.get("created_at", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRun(f"not a CAR trajectory: {exc!r}",
                             run_id=data.get("id") if isinstance(data, dict) else None,
                             hint="load runs saved by CAR (RunStore or Trajectory.to_json)"
                             ) from exc
        if verify:
            run.verify()
        return run

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str, *, verify: bool = True) -> Trajectory:
        try:
            data = loads(text)
        except ValueError as exc:
            raise CorruptRun(f"trajectory JSON does not parse: {exc}",
                             hint="the file is truncated or not JSON") from exc
        if not isinstance(data, dict):
            raise CorruptRun("trajectory JSON is not an object")
        return cls.from_dict(data, verify=verify)


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def step_label(run: Trajectory, k: int) -> str:
    """Who decided step ``k`` and when: ``"account_agent, step 4 (its 2nd decision)"`` for a
    step whose adapter recorded ``meta["agent"]`` (multi-agent apps), ``"worker, step 2
    (parallel task 2)"`` for one decided in a task run beside others (``PARALLEL_TASK``),
    else ``"step 4"``."""
    if not 0 <= k < len(run.steps):
        return f"step {k}"
    meta = run.steps[k].meta
    agent = meta.get("agent")
    if not agent:
        return f"step {k}"
    task = meta.get(PARALLEL_TASK)
    if isinstance(task, int) and not isinstance(task, bool):
        return f"{agent}, step {k} (parallel task {task + 1})"
    nth = sum(1 for s in run.steps[:k + 1] if s.meta.get("agent") == agent)
    return f"{agent}, step {k} (its {_ordinal(nth)} decision)"


def label_parts(label: str, k: int) -> tuple[str, str] | None:
    """``(who, when)`` of a ``step_label`` of step ``k``: ``("account_agent", "its 2nd
    decision")`` or ``("worker", "parallel task 2")``; None for a bare ``"step 4"``."""
    found = re.fullmatch(rf"(.+), step {k} \((its \w+ decision|parallel task \d+)\)", label)
    return (found[1], found[2]) if found else None
