"""What an agent offers beyond the three required methods, detected in one place.

An ``Agent`` must have ``start``, ``branch`` and ``redecide``; everything else is optional and
named by a ``Capability``. ``capabilities(agent)`` looks once and returns the set, so callers ask
``Capability.ASYNC_BRANCH in caps`` instead of probing attributes or signatures themselves (as
LangGraph's checkpoint conformance suite asks a saver what it implements before testing it).
Each hook is documented on its protocol (``car_core.engine.protocols``, exported from
``car_core.contract``); ``car_core.testing`` has one conformance check per capability.

This module imports nothing from the rest of the core, so the lowest layers (tasks, seeding,
agent) can use it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import StrEnum

__all__ = ["Capability", "capabilities", "positional_arity", "takes_param"]


class Capability(StrEnum):
    """An optional hook of an agent (or, for ``STEP_META``, of a policy)."""

    ASYNC_BRANCH = "async-branch"  # ``async abranch(run, plan, noise)``
    STOP = "stop"  # ``branch(run, plan, noise, stop=...)`` ends a settled branch early
    FINGERPRINT = "fingerprint"  # ``fingerprint() -> JSON``, stable across processes
    PREFLIGHT = "preflight"  # ``preflight(run)`` refuses a run before any branch
    PLAN_CHECK = "plan-check"  # ``check_plan(run, plan)`` refuses a plan before any branch
    FRAMEWORK_STATE = "framework-state"  # ``framework_state(run, k) -> JSON``
    COUPLES_NOISE = "couples-noise"  # ``couples_noise = True``: draws from CAR's noise
    SEED_CHECK = "seed-check"  # ``seed_check(run) -> reason | None``: measures the seed
    CONCURRENCY = "concurrency"  # ``prefers_concurrency = True``: waits on a model server
    STEP_META = "step-meta"  # a policy's ``step_meta() -> dict``: what a decision cost
    CAVEATS = "caveats"  # ``caveats``: lines every result of this agent must show


# The callable hooks, by the attribute that offers each.
_METHODS = {
    Capability.ASYNC_BRANCH: "abranch",
    Capability.FINGERPRINT: "fingerprint",
    Capability.PREFLIGHT: "preflight",
    Capability.PLAN_CHECK: "check_plan",
    Capability.FRAMEWORK_STATE: "framework_state",
    Capability.SEED_CHECK: "seed_check",
    Capability.STEP_META: "step_meta",
}
# The flags, by the attribute that sets each.
_FLAGS = {
    Capability.COUPLES_NOISE: "couples_noise",
    Capability.CONCURRENCY: "prefers_concurrency",
    Capability.CAVEATS: "caveats",
}


def capabilities(agent: object) -> frozenset[Capability]:
    """The optional hooks ``agent`` offers: a method counts when the attribute is callable, a
    flag when it is truthy, ``STOP`` when ``agent.branch`` takes a ``stop`` parameter."""
    found = {cap for cap, name in _METHODS.items() if callable(getattr(agent, name, None))}
    found |= {cap for cap, name in _FLAGS.items() if getattr(agent, name, False)}
    branch = getattr(agent, "branch", None)
    if callable(branch) and takes_param(branch, "stop"):
        found.add(Capability.STOP)
    return frozenset(found)


def takes_param(fn: Callable[..., object], name: str) -> bool:
    """Whether ``fn`` takes a parameter called ``name`` (False when it cannot be read)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable with no signature to read
        return False


def positional_arity(fn: Callable[..., object]) -> int:
    """How many positional arguments ``fn`` takes (2 for ``*args``; 1 when it cannot be read):
    how ``OutcomeFn`` tells ``outcome(run)`` from ``outcome(run, rng)``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return 2
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
    return count
