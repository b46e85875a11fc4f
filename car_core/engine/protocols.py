"""The contract an agent keeps, one method at a time: ``Agent`` (what every agent implements)
and one small protocol per optional capability (``car_core.model.capabilities``).

The core detects an optional hook with ``capabilities(agent)``, never with ``isinstance``; the
protocols here say what a hook's signature and duty are, so an adapter can declare them and
the core can type the agent it holds once a capability is found. ``car_core.testing`` checks
each duty (``run_conformance``); ``FunctionAgent`` (``car_core.engine.agent``) is the reference
implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from car_core.model.interventions import Plan
from car_core.model.json_values import JSON
from car_core.model.seeding import Noise
from car_core.model.trajectory import History, Trajectory

__all__ = ["Agent", "AsyncAgent", "CaveatedAgent", "ConcurrentAgent", "FingerprintedAgent",
           "FrameworkStateAgent", "ModelPolicy", "PreflightAgent", "SeedCheckedAgent",
           "StoppableAgent", "StopRule"]

StopRule = Callable[[Trajectory], bool]
"""``stop(branch so far) -> bool``: True once the branch's outcome can no longer change."""


@runtime_checkable
class Agent(Protocol):
    """What ``car.record``, ``car.intervene`` and every estimator need of an agent.

    Randomness: draw step ``k``'s policy randomness from ``noise.rng(k, Stream.POLICY)`` and its
    tools' from ``noise.rng(k, Stream.ENVIRONMENT)`` (or a seed from ``noise.int_seed(k)``).
    The engine scores the outcome and writes the lineage; the agent leaves both out.
    """

    name: str
    """A short name, shown in results and stored with every run the agent records."""

    couples_noise: bool
    """Whether the agent's randomness follows the ``Noise`` it is given
    (``Capability.COUPLES_NOISE``): then branches of two arms share common random numbers and
    estimators pair them. Say False for an agent whose model draws its own randomness. Checked:
    the same noise gives the same branch, and the coupling measured from paired arms
    (``stats.coupling_of``) shows the sharing the flag claims."""

    def start(self, context: JSON, noise: Noise) -> Trajectory:
        """Run from scratch on ``context`` and return the run as recorded (``car.record``).

        Every step is decided and observed for real, its randomness drawn from ``noise``; the
        run carries the agent's ``name`` and ``noise.seed``.
        """
        ...

    def branch(self, run: Trajectory, plan: Plan, noise: Noise) -> Trajectory:
        """A counterfactual of ``run`` under ``plan``, run forward under ``noise``.

        - Steps before ``plan.start`` come from the record with no model or tool call: build
          them with ``run.held_prefix(plan.start)``.
        - At and after ``plan.start``: ``plan.forced_actions`` / ``plan.forced_observations``
          replace what the agent would decide / observe, ``plan.context_edits`` edit the state
          before the step decides (once each), ``plan.policy`` swaps the policy from its step on.
        - Every new step's ``meta["origin"]`` is ``plan.origin(k)`` (an ``Origin``), and its
          ``state`` the messages it decided from, where the agent records them.
        - No side-effect tool runs for real: answer its call from the record or a simulator, or
          raise ``SideEffectBlocked``. An observation that cannot be forced without losing what
          the tool wrote to the app's state is refused with ``InvalidIntervention``.
        - Say where each tool result of a new step came from: ``meta["tool_sources"]`` maps
          each tool call id to a ``ToolSource`` (ran live, served from the record, simulated,
          forced), so no view shows a simulated result as a call that happened.
        """
        ...

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> JSON:
        """Decide step ``k`` of ``run`` again from the state the record decided it from, and
        return the action (``car.action_match_rate``); no tool runs. Under the record's noise
        an agent that couples its noise returns the recorded action."""
        ...


@runtime_checkable
class AsyncAgent(Agent, Protocol):
    """An agent that can branch as a coroutine (``Capability.ASYNC_BRANCH``)."""

    async def abranch(self, run: Trajectory, plan: Plan, noise: Noise) -> Trajectory:
        """``branch`` as a coroutine, with the same duties: the asyncio executor awaits it
        instead of running ``branch`` in a thread. An agent with ``STOP`` whose ``abranch``
        takes ``stop`` too is given it there as well. Checked: under the same noise it gives
        the outcomes ``branch`` gives."""
        ...


class StoppableAgent(Agent, Protocol):
    """An agent that ends a branch once its outcome is settled (``Capability.STOP``)."""

    def branch(self, run: Trajectory, plan: Plan, noise: Noise,
               stop: StopRule | None = None) -> Trajectory:
        """``Agent.branch``, given the outcome's ``settled`` hook as ``stop`` when the outcome
        has one (``car_core.model.outcome``). Call ``stop(branch so far)`` on the held prefix
        and after each step; once it is True, return that partial branch with status
        ``RunStatus.SETTLED``, but never before a pending ``do_context`` edit is applied (an
        edit may rewrite the steps it saw). Checked: a branch ends settled at the first step
        where ``stop`` holds, and not before."""
        ...


class FingerprintedAgent(Agent, Protocol):
    """An agent that names what makes it itself (``Capability.FINGERPRINT``)."""

    def fingerprint(self) -> JSON:
        """What makes this agent this agent (its graph, tools, prompts; never its model or tool
        implementations, never a memory address), the same in every process.
        ``agent_fingerprint`` digests it, a recorder that sees only the app stamps
        ``meta["agent_fingerprint"]`` with ``fingerprint_digest`` of the same value, and
        estimators refuse a run whose stamp differs. Checked: a fresh agent built in another
        Python process gives the same digest."""
        ...


class PreflightAgent(Agent, Protocol):
    """An agent that refuses, up front, a run it cannot branch (``Capability.PREFLIGHT``)."""

    def preflight(self, run: Trajectory) -> None:
        """Raise a ``car_core.errors`` error naming what to fix when ``run`` cannot be branched
        (a thread its checkpointer does not have, a graph shape it cannot fork); return None
        otherwise. Called before an estimate stores anything or runs a branch."""
        ...


class PlanCheckedAgent(Agent, Protocol):
    """An agent that refuses, up front, a plan it cannot branch (``Capability.PLAN_CHECK``)."""

    def check_plan(self, run: Trajectory, plan: Plan) -> None:
        """Raise the ``car_core.errors`` error ``branch(run, plan, ...)`` would raise before
        it runs anything (a plan that holds later steps of an app whose model calls CAR does
        not decide); return None otherwise. Writes nothing and calls no model: estimators
        that know their plans ahead (Shapley's coalitions) call it on every plan before the
        first branch, so a plan refused late does not cost the branches run before it."""
        ...


class FrameworkStateAgent(Agent, Protocol):
    """An agent whose framework keeps state of its own (``Capability.FRAMEWORK_STATE``)."""

    def framework_state(self, run: Trajectory, k: int) -> JSON:
        """The framework state step ``k`` of ``run`` decided from (a workflow store, graph
        channels, a run context), read off the trajectory where the adapter's recorder put it;
        on a branch, as the branch's own recorder saw it. Checked (``check_held_state``): a
        branch from step ``k`` starts from the recorded state."""
        ...


class SeedCheckedAgent(Agent, Protocol):
    """An agent over a model server that can tell whether the seed is honoured
    (``Capability.SEED_CHECK``)."""

    def seed_check(self, run: Trajectory) -> str | None:
        """None when the backend honours the seed (the same seed gives the same decision),
        else the reason it does not."""
        ...


class ConcurrentAgent(Agent, Protocol):
    """An agent that says how its branches are best run (``Capability.CONCURRENCY``)."""

    prefers_concurrency: bool
    """True when the agent waits on a model server: estimators default to the asyncio
    executor even without ``abranch``. An agent with ``abranch`` that sets it False (an
    in-process model) keeps the sequential default."""


class CaveatedAgent(Agent, Protocol):
    """An agent whose results need a caveat (``Capability.CAVEATS``)."""

    caveats: Sequence[str]
    """Lines every result of this agent must carry (an adapter whose user let unclassified
    tools run live on branches says so): estimators warn each once per estimate
    (``AgentCaveat``) and keep them in the result's ``caveats``."""


@runtime_checkable
class ModelPolicy(Protocol):
    """A policy that reports what its last decision cost (``Capability.STEP_META``)."""

    def __call__(self, history: History, rng: Any) -> JSON:
        """Decide the step ``history`` leads up to, drawing randomness from ``rng``."""
        ...

    def step_meta(self) -> dict[str, Any]:
        """What the last decision in this thread cost (model, ``tokens``, ``cost``, seed,
        latency): the engine keeps it in the step's meta, where budgets count tokens and
        money."""
        ...
