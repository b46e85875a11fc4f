"""Every error CAR raises, under one root so callers can catch ``CarError``.

The tree::

    CarError
    ├── InvalidInput (ValueError)              bad arguments, caught before anything runs
    │   ├── InvalidIntervention                 a do(·) that is malformed or does not fit the run
    │   ├── StepOutOfRange (IndexError)         a step index past the end of the run
    │   ├── InvalidJSONValue                    an action/observation/context that is not JSON
    │   ├── InvalidBudget                       a budget of zero, negative, or too small
    │   ├── AgentMismatch                       the agent given is not the one the run recorded
    │   │   └── CheckpointsMissing              the run's checkpoints are gone; the record cannot
    │   │                                       rebuild where a branch starts
    │   ├── UnclassifiedTools                   tools no source says are safe or side effects
    │   └── OutcomeError                        an outcome function that raised or left [0, 1]
    │       └── OutcomeMismatch                 it scores the recorded run the other way
    ├── RunError                                a recorded run that cannot be trusted
    │   ├── CorruptRun                          digest mismatch, hand-edited or truncated JSON
    │   └── ReplayMismatch                      replay did not reproduce the record
    ├── StoreError                              the SQLite store
    │   ├── RunNotFound (KeyError)              unknown run id
    │   ├── AttributionNotFound (KeyError)      unknown attribution id
    │   ├── NotACarStore                        a database file that is not ours
    │   ├── StoreTooNew                         written by a newer CAR than this one
    │   ├── StoreReadOnly                       the file or its folder cannot be written
    │   ├── StoreDiskError                      the disk is full or failed a write
    │   ├── CorruptStore                        damaged pages, missing tables, bad values
    │   │   └── CorruptAttribution              an attribution edited after it was stored
    │   └── AttributionBusy                     another process is running that attribution
    ├── AgentError                              the agent under test misbehaved
    │   ├── PolicyError                         the policy raised or returned garbage
    │   ├── EnvironmentError_                   the environment (a tool) raised
    │   ├── SideEffectBlocked                   a side-effect tool asked to run on a branch
    │   ├── ModelUnavailable                    a model server that is down or unreachable
    │   ├── AdapterError                        framework glue: no checkpointer, unknown thread…
    │   ├── BranchesFailed                      too many branches raised or ended in error
    │   └── ConformanceFailure (AssertionError) an agent broke the contract car_core.testing checks
    ├── ExecutorUnavailable                     an execution backend (Ray) that cannot be reached
    ├── BudgetExhausted                         a budget tripped (results keep what was measured)
    └── NothingToAttribute                      the outcome never varies, or the run has no steps

Every error carries context (``run_id``, ``step``) where it has one and its message ends with
what to do next.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Self

from car_core.secrets.redact import redact

_EDITED_BY_HAND = "the database was edited by hand"


def _edited_by_hand(then: str | None) -> str:
    return _EDITED_BY_HAND if then is None else f"{_EDITED_BY_HAND}; {then}"


# How a resumable stop's hint ends where the code raising it cannot know the attribution (a
# model client's outage on a branch); ``CarError.name_attribution`` words it for the one that
# stopped, once the estimator knows it.
RESUME_SAME_ID = ("resume the attribution with the same attribution_id (`car attribute ... "
                  "--resume ID`)")


def resume_words(attribution_id: str) -> str:
    """``RESUME_SAME_ID`` for the attribution ``attribution_id``: the Python call's spelling
    and the command's."""
    return (f'resume the attribution: pass attribution_id="{attribution_id}" to the same call, '
            f"or run `car attribute RUN ... --resume {attribution_id}`")


def resume_population_words(call: str, param: str, ident: str, command: str) -> str:
    """How to resume a population (``car.triage``, ``car.fix_population``) that one run's
    stop ended: the population resumes, not that run's own attribution."""
    return (f'resume the {call.removeprefix("car.").replace("_", " ")}: run {call}(...) again '
            f'with {param}="{ident}" and the same store=, or `{command} ... --resume {ident}`')


class CarError(Exception):
    """Root of every error CAR raises."""

    def __init__(self, message: str, *, run_id: str | None = None, step: int | None = None,
                 hint: str | None = None, **context: Any) -> None:
        self.run_id = run_id
        self.step = step
        self.hint = hint
        self.context = context
        self.message = redact(message)  # what went wrong alone: no run, step or hint
        super().__init__(self._text())

    def _text(self) -> str:
        parts = [self.message]
        if self.run_id is not None:
            parts.append(f"[run {self.run_id}]")
        if self.step is not None:
            parts.append(f"[step {self.step}]")
        text = " ".join(parts)
        if self.hint:  # a message that ends its sentence itself read "error.. start it"
            text = f"{text} {self.hint}" if text.endswith(".") else f"{text}. {self.hint}"
        return redact(text)  # a message built from a caught error may carry a key

    resume_said = RESUME_SAME_ID  # the resume the hint spells out now (``resume_as``)

    def name_attribution(self, attribution_id: str) -> None:
        """Record the attribution this stop left for a resume (``context["attribution_id"]``)
        and name it in a hint that ends ``RESUME_SAME_ID``, where the code that raised could
        not: a Python caller reads the id and the spelling of the resume in the message."""
        named = str(self.context.setdefault("attribution_id", attribution_id))
        self.resume_as(resume_words(named))

    def resume_as(self, words: str) -> None:
        """Spell the resume in the hint as ``words``, in place of the one it says now: a
        triage whose run stopped resumes as a triage, not as that run's attribution (whose
        id the hint named from Python)."""
        if self.hint and self.resume_said in self.hint:
            self.hint = self.hint.replace(self.resume_said, words)
            self.resume_said = words
            self.args = (self._text(),)


class InvalidInput(CarError, ValueError):
    """Arguments that are wrong before anything runs."""


class InvalidIntervention(InvalidInput):
    """A do(·) that is malformed, conflicts with another, or does not fit the run."""


class StepOutOfRange(InvalidInput, IndexError):
    """A step index past the end of the run (or negative)."""


class InvalidJSONValue(InvalidInput):
    """A value that must be JSON (action, observation, context) is not."""


class InvalidBudget(InvalidInput):
    """A budget that cannot buy anything: zero, negative, below one rollout or coalition."""


class AgentMismatch(InvalidInput):
    """The agent given is not the one the run was recorded with (name or fingerprint)."""


class CheckpointsMissing(AgentMismatch):
    """The agent's checkpointer does not hold the run's thread (an in-memory one in another
    process) and the record alone cannot rebuild the state a branch starts from; the message
    names what the record lacks."""


class UnclassifiedTools(InvalidInput):
    """Tools of the agent that no source classifies as safe to run on a branch or as side
    effects (neither named in ``safe_tools`` / ``side_effect_tools`` nor annotated), refused
    before any branch runs: a branch would run them live. ``tools`` lists them all."""

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(self.context.get("tools", ()))


class OutcomeError(InvalidInput):
    """The outcome function raised or returned something outside [0, 1]."""


class OutcomeMismatch(OutcomeError):
    """The outcome function scores the recorded run on the other side of the failure
    threshold from the outcome stored with it (failed vs fine), on every re-score: it cannot
    see what the record saw, so any estimate from it would answer "no cause" with confidence.
    Raised before any branch runs. ``stored`` is the recorded value, ``scores`` the new ones."""

    @property
    def stored(self) -> float:
        return float(self.context.get("stored", float("nan")))

    @property
    def scores(self) -> tuple[float, ...]:
        return tuple(self.context.get("scores", ()))


class RunError(CarError):
    """A recorded run that cannot be trusted."""


class CorruptRun(RunError):
    """A run whose digests do not match its content, or whose JSON is malformed."""

    @classmethod
    def edited_by_hand(cls, message: str, *, run_id: str | None,
                       then: str | None = "record the run again") -> Self:
        """A stored run that changed after it was saved; ``then`` says how to get it back."""
        return cls(message, run_id=run_id, hint=_edited_by_hand(then))

    @classmethod
    def among_intact_rows(cls, message: str) -> Self:
        """A damaged row of a listing whose other rows stay readable."""
        return cls(message, hint=_edited_by_hand(None) + " or damaged; the other runs stay "
                   "readable; record this one again or restore it from a copy")


class ReplayMismatch(RunError):
    """Replaying a run with everything held did not reproduce it."""


class StoreError(CarError):
    """Anything about the SQLite store."""


class RunNotFound(StoreError, KeyError):
    """No run with that id in the store."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class AttributionNotFound(StoreError, KeyError):
    """No attribution with that id in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotACarStore(StoreError):
    """The database file exists but was not written by CAR."""


class StoreTooNew(StoreError):
    """The database was migrated by a newer CAR; this one must not write to it."""

    @classmethod
    def migrated_by_newer(cls, path: str | os.PathLike[str], unknown: Iterable[str]) -> Self:
        """``path`` records migrations (``unknown``) this CAR does not have."""
        return cls(f"{path} was migrated by a newer CAR ({sorted(unknown)})",
                   hint="upgrade causal-agent-replay to open it")


class StoreReadOnly(StoreError):
    """The database (or its folder) cannot be written."""

    @classmethod
    def not_writable(cls, path: str | os.PathLike[str], cause: BaseException) -> Self:
        """SQLite refused a write to ``path`` (``cause``) because the file cannot be written."""
        return cls(f"{path} is read-only: {cause}", hint="point the store at a writable file")


class StoreDiskError(StoreError):
    """The disk refused a write to the store: it is full, the file reached a size limit, or
    the disk failed (an I/O error). Nothing of the failed write was kept, the store is as it
    was, and an attribution it stopped resumes once the disk takes writes again."""

    @classmethod
    def writing(cls, path: str | os.PathLike[str], cause: BaseException, full: bool) -> Self:
        """SQLite could not write ``path`` (``cause``): the disk is ``full``, or failed."""
        what = "the disk is full" if full else "the disk failed a write (an I/O error)"
        return cls(f"cannot write {path}: {what}: {cause}",
                   hint="nothing was written; free space on the disk that holds it (or "
                        "raise the file size limit), or check the disk, and try again")


class CorruptStore(StoreError):
    """A CAR store that cannot be read as one: damaged pages, a missing table, a value of the
    wrong type or text that is not UTF-8."""

    @classmethod
    def edited_by_hand(cls, message: str, *, then: str | None = "restore it from a copy"
                       ) -> Self:
        """The file was changed outside CAR; ``then`` says how to get its data back."""
        return cls(message, hint=_edited_by_hand(then))


class CorruptAttribution(CorruptStore):
    """A stored attribution whose seal does not match its content (edited by hand)."""

    @classmethod
    def edited_by_hand(cls, message: str, *,
                       then: str | None = "run the attribution again (a new id)") -> Self:
        """The attribution's row changed after it was stored; running it again (a new id)
        stores a fresh one."""
        return cls(message, hint=_edited_by_hand(then))


class AttributionBusy(StoreError):
    """Another live process holds the attribution's lease (it is running or resuming it)."""


class AgentError(CarError):
    """The agent under test misbehaved."""


class PolicyError(AgentError):
    """The policy raised or returned a value that is not JSON."""


class EnvironmentError_(AgentError):
    """The environment (a tool) raised. Named with a trailing underscore to avoid the builtin."""


class SideEffectBlocked(AgentError):
    """A tool marked as having side effects was asked to run on a counterfactual branch."""


class ModelUnavailable(AgentError):
    """A model server that is down, unreachable, or does not have the model."""


class AdapterError(AgentError):
    """Framework glue failed: no checkpointer, unknown thread, a run from another graph."""


class BranchesFailed(AgentError):
    """Branches that raised (or came back with status ``error``) stopped the estimate: any at
    the arm that holds every recorded step, or more than the share an estimate may leave out.
    ``failures`` lists them, ``first`` names the first, ``ran`` counts every branch run; the
    branches that finished stay in the store, so the attribution resumes once the agent is
    fixed."""

    @property
    def ran(self) -> int:
        return int(self.context.get("ran", 0))

    @property
    def failures(self) -> tuple[Any, ...]:
        return tuple(self.context.get("failures", ()))

    @property
    def first(self) -> Any:
        return self.context.get("first")


class ConformanceFailure(AgentError, AssertionError):
    """An agent implementation broke the replay contract (``car_core.testing`` checks)."""


class ExecutorUnavailable(CarError):
    """An execution backend that is not installed or does not answer (a Ray address)."""


class BudgetExhausted(CarError):
    """A budget tripped before work could start."""


class NothingToAttribute(CarError):
    """The run has no steps, or the outcome does not vary whatever we do."""


class RunNotFailed(NothingToAttribute):
    """The run did not fail: it is stored as fine and the outcome scores it fine. A population
    (``car.triage``) leaves such a run out of its counts and lists it apart."""


# The stops a resume can change: an interruption, memory or a budget that ran out (resume with
# fewer in flight or a larger budget), a model server or execution backend that was down,
# branches that failed (fix the agent, then resume: the stored branches are kept) and a disk
# that refused a write (free space, then resume). Everything
# else comes out the same again on a resume: an error in the user's outcome function, a
# sys.exit in user code, bad input, a damaged or hand-edited store, an attribution another
# process is running. Only these offer "Resume with", and only they keep an attribution row
# that holds no branch yet (the resume it offers needs the row).
RESUMABLE: tuple[type[BaseException], ...] = (
    KeyboardInterrupt, MemoryError, BudgetExhausted, ModelUnavailable, ExecutorUnavailable,
    BranchesFailed, StoreDiskError)


def resumable(exc: BaseException) -> bool:
    """Whether resuming the attribution ``exc`` stopped can end otherwise (``RESUMABLE``)."""
    return isinstance(exc, RESUMABLE)


__all__ = [  # the error tree; RESUMABLE and resumable are its rule, not errors
    "AdapterError", "AgentError", "AgentMismatch", "AttributionBusy", "AttributionNotFound",
    "BranchesFailed", "BudgetExhausted", "CarError", "CheckpointsMissing", "ConformanceFailure",
    "CorruptAttribution", "CorruptRun", "CorruptStore", "EnvironmentError_", "ExecutorUnavailable",
    "InvalidBudget", "InvalidIntervention", "InvalidInput", "InvalidJSONValue", "ModelUnavailable",
    "NotACarStore", "NothingToAttribute", "OutcomeError", "OutcomeMismatch", "PolicyError",
    "ReplayMismatch", "RunError", "RunNotFailed", "RunNotFound", "SideEffectBlocked",
    "StepOutOfRange", "StoreDiskError", "StoreError", "StoreReadOnly", "StoreTooNew",
    "UnclassifiedTools",
]
