"""What an adapter author needs from the core, in one place: import from here, ``car_core``,
``car_core.errors`` and ``car_core.testing``, nothing else.

An agent (``Agent``) has a ``name``, says whether its randomness follows the ``Noise`` it is
given (``couples_noise``: then branches share common random numbers) and implements:

- ``start(context, noise) -> Trajectory``: a run from scratch (``car.record``);
- ``branch(run, plan, noise) -> Trajectory``: a counterfactual of ``run`` under ``plan``.
  Steps ``< plan.start`` come from the record with no model or tool call (build them with
  ``run.held_prefix(plan.start)``); at and after it, ``plan.forced_actions`` /
  ``plan.forced_observations`` replace what the agent would decide / observe,
  ``plan.context_edits`` edit the state before deciding, ``plan.policy`` swaps the policy from
  a step on; every new step's ``meta["origin"]`` is ``plan.origin(k)`` (an ``Origin``);
- ``redecide(run, k, noise) -> action``: decide step ``k`` again from the recorded state
  (``car.action_match_rate``).

Optional hooks, each a ``Capability`` that ``capabilities(agent)`` detects (the one place the
core looks; an agent may leave any of them out), each checked by ``run_conformance`` when the
agent offers it:

- ``async abranch(run, plan, noise)`` (``ASYNC_BRANCH``): ``branch`` as a coroutine; the
  asyncio executor awaits it instead of running ``branch`` in a thread (``AsyncAgent``); an
  agent with ``STOP`` whose ``abranch`` takes ``stop`` too is given it there as well.
  Checked: under the same noise it gives the outcomes the sync ``branch`` gives;
- ``couples_noise = True`` (``COUPLES_NOISE``): its randomness follows the ``Noise`` it is
  given. Checked: the same noise gives the same branch, and the coupling measured from paired
  arms (``stats.coupling_of``) shows the sharing the flag claims;
- ``seed_check(run) -> reason | None`` (``SEED_CHECK``): for an agent over a model server,
  whether the backend honours the seed (the reason when it does not);
- ``fingerprint() -> JSON`` (``FINGERPRINT``): what makes this agent this agent (its graph,
  tools, prompts; never its model or tool implementations), stable across processes;
  ``agent_fingerprint`` digests it, a recorder that sees only the app stamps
  ``meta["agent_fingerprint"]`` with ``fingerprint_digest`` of the same value, and estimators
  refuse a run whose stamp differs. Checked: a fresh agent built in another Python process
  gives the same digest;
- ``preflight(run)`` (``PREFLIGHT``): refuse, before an estimate stores anything or runs a
  branch, a run this agent cannot branch (raise a ``car_core.errors`` error naming what to fix);
- ``framework_state(run, k) -> JSON`` (``FRAMEWORK_STATE``): the framework state step ``k`` of
  ``run`` decided from (a workflow store, graph channels, a run context), read off the
  trajectory where the adapter's recorder put it, on a branch as the branch's own recorder saw
  it. Checked (``check_held_state``): a branch starts from the recorded state;
- ``prefers_concurrency = True`` (``CONCURRENCY``): the agent waits on a model server, so
  estimators default to the asyncio executor even without ``abranch``; an agent with
  ``abranch`` that sets it ``False`` (an in-process model) keeps the sequential default;
- ``branch(run, plan, noise, stop=None)`` (``STOP``): the agent is given the outcome's
  ``settled`` hook (``car_core.model.outcome``) when the outcome has one; it calls ``stop(branch so
  far)`` on the held prefix and after each step and, once it is True, returns that partial
  branch with status ``RunStatus.SETTLED`` (never before a pending ``do_context`` edit is
  applied, since an edit may rewrite the steps it saw). Checked: a branch ends settled at the
  first step where ``stop`` holds, and not before;
- ``caveats`` (``CAVEATS``): lines every result of this agent must carry (an adapter whose
  user let unclassified tools run live on branches says so); estimators warn each once per
  estimate (``AgentCaveat``) and keep them in the result's ``caveats``;
- a policy's ``step_meta() -> dict`` (``STEP_META``): what the last decision cost (model,
  ``tokens``, ``cost``, seed, latency); the engine keeps it in the step's meta, where budgets
  count tokens and money (``ModelPolicy``).

Randomness: draw a step's policy randomness from ``noise.rng(k, Stream.POLICY)`` and tool
randomness from ``noise.rng(k, Stream.ENVIRONMENT)``; the outcome is scored by the engine, not
the agent (a recorder that scores the runs it records uses ``scored``, the engine's rule).
Check an adapter with ``car_core.testing.run_conformance(factory, context=..., outcome=...)``:
replay with everything held reproduces the run, a held prefix makes no model or tool call,
lineage and origins are right, forced values are used, noise is honoured.

Actions are compared with ``same_action`` (``canonical_action`` / ``canonical_arguments`` give
the form it compares): tool-call ids and other provider-assigned fields do not count, so use it
wherever an adapter checks a decision against the record.

Recorders: ``in_branch()`` is True while the engine runs a branch; a recorder the user attached
to every run (a callback, an instrumentation handler) leaves those runs out.

Secrets: ``redact`` is the one redaction rule; register API keys with ``redact.register``, chain
``redact.redacted(exc)`` instead of a client's exception, and log through ``redact.logger``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from car_core.engine.agent import Agent, AsyncAgent, agent_fingerprint, fingerprint_digest
from car_core.engine.branching import in_branch
from car_core.model.actions import canonical_action, canonical_arguments, same_action
from car_core.model.capabilities import Capability, capabilities
from car_core.model.interventions import Plan, compile_plan
from car_core.model.json_values import JSON
from car_core.model.outcome import OutcomeFn, OutcomeLike, scored
from car_core.model.seeding import Noise, Stream
from car_core.model.trajectory import History, Outcome, Step, Trajectory
from car_core.model.vocabulary import AttributionStatus, Origin, RunStatus
from car_core.secrets import redact
from car_core.store.run_writer import RunWriter

__all__ = ["JSON", "Agent", "AsyncAgent", "AttributionStatus", "Capability", "History",
           "ModelPolicy", "Noise", "Origin", "Outcome", "OutcomeFn", "OutcomeLike", "Plan",
           "RunStatus", "RunWriter", "Step", "Stream", "Trajectory", "agent_fingerprint",
           "canonical_action", "canonical_arguments", "capabilities", "compile_plan",
           "fingerprint_digest",
           "in_branch", "redact", "same_action", "scored"]


@runtime_checkable
class ModelPolicy(Protocol):
    """A policy that reports what its last decision cost (``step_meta``), as model policies do."""

    def __call__(self, history: History, rng: Any) -> JSON: ...

    def step_meta(self) -> dict[str, Any]: ...
