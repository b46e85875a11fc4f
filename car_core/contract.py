"""What an adapter author needs from the core, in one place: import from here, ``car_core``,
``car_core.errors`` and ``car_core.testing``, nothing else.

The contract is written on the protocols, one docstring per method (``car_core.engine.protocols``):

- ``Agent``: ``name``, ``couples_noise``, ``start`` (a run from scratch), ``branch`` (a
  counterfactual of a run under a ``Plan``, its held prefix served from the record) and
  ``redecide`` (decide a recorded step again). Every agent implements these.
- One protocol per optional ``Capability``, which ``capabilities(agent)`` detects (the one
  place the core looks; an agent may leave any of them out): ``AsyncAgent`` (``abranch``),
  ``StoppableAgent`` (``branch(..., stop=)``), ``FingerprintedAgent`` (``fingerprint``),
  ``PreflightAgent`` (``preflight``), ``PlanCheckedAgent`` (``check_plan``),
  ``FrameworkStateAgent`` (``framework_state``),
  ``SeedCheckedAgent`` (``seed_check``), ``ConcurrentAgent`` (``prefers_concurrency``),
  ``CaveatedAgent`` (``caveats``) and, for a policy, ``ModelPolicy`` (``step_meta``).

Check an adapter with ``car_core.testing.run_conformance(factory, context=..., outcome=...)``:
one check per duty of ``Agent`` and one per capability the agent offers.

Actions are compared with ``same_action`` (``canonical_action`` / ``canonical_arguments`` give
the form it compares): tool-call ids and other provider-assigned fields do not count, so use it
wherever an adapter checks a decision against the record. The outcome is scored by the engine,
not the agent (a recorder that scores the runs it records uses ``scored``, the engine's rule).

What a step decided from is ``state_of(run, k)``, what ``do_context`` hands an edit: a step
whose ``meta["input"] == PROMPT_INPUT`` decided from ``meta["prompt"]`` (what the framework
added at the model call) followed by its ``state``, and its edit must reach both; a step whose
``meta["tools"]`` lists the tools its call was offered decided from a ``ChatInput`` (the
messages, with ``tools``), and an edited description must reach that call
(``offered_tools(edited)``).

Recorders: ``in_branch()`` is True while the engine runs a branch; a recorder the user attached
to every run (a callback, an instrumentation handler) leaves those runs out.

Outages: ``is_outage(exc)`` says whether a client's error means its server is down (a refused
connection, a timeout, 429 or 5xx): raise ``car_core.errors.ModelUnavailable`` then, so the
attribution stops, resumable, instead of failing every later branch; ``says_service_down(text)``
is the same rule for an error's text (a tool's error message), which a branch is not scored on;
``outage_hint(exc, down)`` is what the stop's hint says to do (wait or slow down for a 429:
``is_rate_limit(exc)``, the rule a client's backoff uses too); ``server_address(exc)`` is the
address the failed request went to, for the message.

Executors: ``ExecutorName`` names the branch backends an estimator takes by name
(``"sequential"``, ``"async"``, ``"ray"``), for an adapter that passes a user's choice on.

Secrets: ``redact`` is the one redaction rule; register API keys with ``redact.register``, chain
``redact.redacted(exc)`` instead of a client's exception, and log through ``redact.logger``.
"""

from __future__ import annotations

from car_core.engine.agent import agent_fingerprint, fingerprint_digest
from car_core.engine.branching import in_branch
from car_core.engine.execution import ExecutorName
from car_core.engine.protocols import (
    Agent,
    AsyncAgent,
    CaveatedAgent,
    ConcurrentAgent,
    FingerprintedAgent,
    FrameworkStateAgent,
    ModelPolicy,
    PlanCheckedAgent,
    PreflightAgent,
    SeedCheckedAgent,
    StoppableAgent,
    StopRule,
)
from car_core.model.actions import canonical_action, canonical_arguments, same_action
from car_core.model.capabilities import Capability, capabilities
from car_core.model.context_sources import PROMPT_INPUT, ChatInput, offered_tools, state_of
from car_core.model.interventions import Plan, compile_plan
from car_core.model.json_values import JSON
from car_core.model.outages import (
    is_outage,
    is_rate_limit,
    outage_hint,
    says_service_down,
    server_address,
)
from car_core.model.outcome import OutcomeFn, OutcomeLike, scored
from car_core.model.seeding import Noise, Stream
from car_core.model.trajectory import (
    BEGAN_FROM,
    ERROR_STEP,
    PARALLEL_TASK,
    History,
    Outcome,
    Step,
    Trajectory,
)
from car_core.model.vocabulary import AttributionStatus, Origin, RunStatus, ToolSource
from car_core.secrets import redact
from car_core.store.run_writer import RunWriter

__all__ = ["BEGAN_FROM", "ERROR_STEP", "JSON", "PARALLEL_TASK", "PROMPT_INPUT", "Agent",
           "AsyncAgent", "AttributionStatus",
           "Capability", "CaveatedAgent", "ChatInput", "ConcurrentAgent", "ExecutorName",
           "FingerprintedAgent", "FrameworkStateAgent", "History",
           "ModelPolicy", "Noise", "Origin", "Outcome", "OutcomeFn", "OutcomeLike", "Plan",
           "PlanCheckedAgent", "PreflightAgent", "RunStatus", "RunWriter", "SeedCheckedAgent",
           "Step",
           "StopRule", "StoppableAgent", "Stream", "ToolSource", "Trajectory",
           "agent_fingerprint", "canonical_action", "canonical_arguments", "capabilities",
           "compile_plan", "fingerprint_digest",
           "in_branch", "is_outage", "is_rate_limit", "offered_tools", "outage_hint", "redact",
           "same_action", "says_service_down", "scored", "server_address", "state_of"]

