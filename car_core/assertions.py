"""Assertions for regression tests of attribution itself, decided by intervals.

A point estimate moves from seed to seed; an interval says what the evidence supports. Each
assertion here fails only when its interval says so, so a test built on it fails at a rate
stated in its docstring, and its message shows the interval that decided:

- ``assert_locus(result, step=k)`` passes when the contrastive locus is step ``k``. The locus
  is the latest step whose rescue interval lies above zero with family-wise error ``<= alpha``
  (Bonferroni), so when step ``k`` has no effect and nothing after it does either, the
  assertion passes wrongly with probability ``<= alpha``. Its message says which answer it got
  instead: another step, no cause, or undecided (the candidate, and how to continue).
- ``assert_no_locus(result)`` fails when any step's rescue interval lies above zero: on a run
  where no step matters it fails with probability ``<= alpha``.
- ``assert_rescues(dist, below=p)`` fails when the whole interval of P(failure | do(·)) lies at
  or above ``p``: when the true rate is below ``p`` it fails with probability about
  ``(1 - level) / 2`` (the one-sided miss of a Wilson interval). ``strict=True`` turns the
  burden around: it passes only when the whole interval lies below ``p``.
"""

from __future__ import annotations

from typing import Any

from car_core import formatting as fmt
from car_core.engine.replay import OutcomeDistribution
from car_core.errors import InvalidInput
from car_core.model.checks import is_real
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import Answer
from car_core.results import ContrastiveResult
from car_core.stats import Interval

__all__ = ["assert_locus", "assert_no_locus", "assert_rescues"]


def _interval(ci: Interval | tuple[float, float] | None) -> str:
    return "untested" if ci is None else fmt.effect_interval(ci)


def _contrastive(result: Any, name: str) -> ContrastiveResult:
    if not isinstance(result, ContrastiveResult):
        raise InvalidInput(f"{name} takes a car.contrastive result, got {type(result).__name__}",
                           hint="pass what car.contrastive(run, agent, ...) returned")
    return result


def _describe(result: ContrastiveResult) -> str:
    rows = [f"step {s.step}: rescue {fmt.effect(s.effect)} {_interval(s.ci)}"
            + (" significant" if s.significant else "")
            for s in result.steps if s.tested and s.effect is not None]
    level = fmt.method(result)
    tail = f"; truncated: {result.budget_note}" if result.truncated else ""
    return "\n  ".join([f"{level}{tail}", *rows])


def agent_of(run: Trajectory, step: int) -> str | None:
    """Who decided ``step`` of ``run``: the agent a multi-agent framework named, else the
    graph node, else the run's agent."""
    meta = run.steps[step].meta if 0 <= step < len(run.steps) else {}
    for key in ("agent", "node"):
        if meta.get(key):
            return str(meta[key])
    return run.agent or None


def assert_locus(result: Any, step: int | None = None, *, agent: str | None = None,
                 run: Trajectory | None = None) -> None:
    """Assert the point of commitment is ``step`` and/or was decided by ``agent`` (which needs
    the attributed ``run``, where steps record who decided them)."""
    res = _contrastive(result, "assert_locus")
    if step is None and agent is None:
        raise InvalidInput("assert_locus needs step= or agent=",
                           hint="say which step (or which agent) should be the locus")
    if agent is not None and (run is None or run.id != res.run_id):
        raise InvalidInput("assert_locus(agent=...) needs run= the attributed run",
                           run_id=res.run_id, hint="pass run=the trajectory you attributed")
    if res.locus is None and res.answer == Answer.UNDECIDED:
        raise AssertionError(f"expected the locus at {_want(step, agent)}, but the attribution "
                             f"is undecided: {res.undecided_why()}; {res.candidate_text()}; "
                             f"{res.continue_hint()}\n  {_describe(res)}")
    if res.locus is None:
        raise AssertionError(f"expected the locus at {_want(step, agent)}, but the answer is no "
                             f"cause: no step's rescue interval lies above zero ({res.reason})"
                             f"\n  {_describe(res)}")
    if step is not None and res.locus != step:
        raise AssertionError(f"expected the locus at step {step}, got step {res.locus}\n  "
                             f"{_describe(res)}")
    if agent is not None and run is not None:
        found = agent_of(run, res.locus)
        if found != agent:
            raise AssertionError(f"expected the locus decided by {agent!r}, but step "
                                 f"{res.locus} was decided by {found!r}\n  {_describe(res)}")


def _want(step: int | None, agent: str | None) -> str:
    parts = ([f"step {step}"] if step is not None else []) + (
        [f"agent {agent!r}"] if agent is not None else [])
    return " / ".join(parts)


def assert_no_locus(result: Any) -> None:
    """Assert no step's rescue interval lies above zero (nothing the run did can be blamed)."""
    res = _contrastive(result, "assert_no_locus")
    if res.locus is not None:
        raise AssertionError(f"expected no locus, but step {res.locus}'s rescue interval lies "
                             f"above zero\n  {_describe(res)}")


def assert_rescues(distribution: Any, below: float, *, strict: bool = False) -> None:
    """Assert the intervention brings P(failure) below ``below``. By default it fails only when
    the whole interval lies at or above ``below`` (the evidence says the rate is not below);
    with ``strict`` it passes only when the whole interval lies below ``below``."""
    if not isinstance(distribution, OutcomeDistribution):
        raise InvalidInput(f"assert_rescues takes a car.intervene result, got "
                           f"{type(distribution).__name__}",
                           hint="pass what car.intervene(run, agent, do(...), ...) returned")
    if not is_real(below) or not 0 < below <= 1:
        raise InvalidInput(f"below={below!r}", hint="pass a failure rate in (0, 1]")
    lo, hi = distribution.ci
    shown = (fmt.failure_rate(distribution.mean, (lo, hi), distribution.level, distribution.n)
             + (f" (truncated: {distribution.budget_note})" if distribution.truncated else ""))
    if strict and hi >= below:
        raise AssertionError(f"expected the intervention to bring P(failure) below {below:g} "
                             f"(the whole interval), got {shown}")
    if not strict and lo >= below:
        raise AssertionError(f"expected the intervention to bring P(failure) below {below:g}, "
                             f"but the whole interval lies at or above it: {shown}")
