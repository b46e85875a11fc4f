"""How rollouts run. The engine hands a list of independent ``Task``s to an executor; every
task carries its own noise, so results never depend on the order or place they ran in.

The budget is checked before each task is handed out; a task that was not started is simply
not in the results, and the caller reports the estimate as truncated.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .budget import BudgetMeter
from .interventions import Plan
from .seeding import Noise

R = TypeVar("R")


@dataclass(frozen=True)
class Task:
    """One rollout to run: which arm it belongs to, its index, its plan and its noise."""

    arm: str
    rollout: int
    plan: Plan
    noise: Noise


class Journal(Protocol):
    """Where finished branches are kept so an interrupted estimate can resume: ``lookup``
    returns the stored result of a task that already ran (or None), ``write`` stores one."""

    def lookup(self, task: Task) -> Any: ...

    def write(self, task: Task, result: Any) -> None: ...


class Executor(Protocol):
    """Runs tasks; yields ``(task, result)`` as they finish. ``may_start`` is asked before each
    task is started and stops the run when it returns False."""

    def run(self, fn: Callable[[Task], R], tasks: Sequence[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, R]]: ...


class Sequential:
    """In-process, one task at a time: reproducible and the default for synthetic agents."""

    def run(self, fn: Callable[[Task], R], tasks: Sequence[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, R]]:
        for task in tasks:
            if not may_start():
                return
            yield task, fn(task)


def _progress_bar(progress: Any, total: int, label: str) -> Any:
    """None → a bar only when stderr is a terminal; True → always; False → never; an object
    with ``update(n)`` and ``close()`` is used as is."""
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    if progress is None or progress is True:
        from tqdm import tqdm
        return tqdm(total=total, desc=label, unit="rollout", leave=False, file=sys.stderr)
    return progress


def execute(tasks: Sequence[Task], fn: Callable[[Task], R], meter: BudgetMeter, *,
            executor: Executor | None = None, progress: Any = None, label: str = "rollouts",
            on_result: Callable[[Task, R], None] | None = None,
            journal: Journal | None = None) -> list[tuple[Task, R]]:
    """Run ``tasks`` under the budget; return the finished ``(task, result)`` pairs.

    With a ``journal``, tasks that already finished in an earlier, interrupted call are taken
    from it (and still counted against the budget, so a resumed estimate spends and reports
    exactly what an uninterrupted one would); new results are written to it as they finish.
    """
    bar = _progress_bar(progress, len(tasks), label)
    done: list[tuple[Task, R]] = []
    if journal is not None:
        pending = []
        for task in tasks:
            cached = journal.lookup(task)
            if cached is None:
                pending.append(task)
            elif meter.reserve():
                meter.charge(cached)
                done.append((task, cached))
                if on_result is not None:
                    on_result(task, cached)
                if bar is not None:
                    bar.update(1)
        tasks = pending

    def may_start() -> bool:
        return meter.reserve()

    try:
        for task, result in (executor or Sequential()).run(fn, tasks, may_start):
            meter.charge(result)  # type: ignore[arg-type]
            if journal is not None:
                journal.write(task, result)
            done.append((task, result))
            if on_result is not None:
                on_result(task, result)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None and progress is not bar:
            bar.close()
    return done
