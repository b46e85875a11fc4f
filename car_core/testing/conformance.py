"""``run_conformance``: the replay contract as executable tests, so an adapter proves it in its
own test suite with ``run_conformance(make_agent, context=..., outcome=...)``. It checks that:

- replay with every step held gives back the recorded actions and observations;
- a held prefix is served from the record: no model call, no tool call before the branch step;
- a branch from step ``k`` starts from the state step ``k`` was recorded deciding from: the
  held tool results, the messages, and, for an agent with the optional
  ``framework_state(run, k)`` hook, the framework's own state (a workflow store, graph
  channels, a run context) as the branch itself recorded it;
- branches carry their lineage, keep the record before the branch step, and are sealed;
- forced actions and observations are used as given;
- with the same noise an agent that couples its noise gives the same branch twice;
- a ``do_context`` whose edit changes nothing is ``do_resample`` at that step: the branch decides
  the step again from the recorded state, with the same action under the same noise when the
  agent couples its noise, and the same outcome distribution (a paired sign-flip test whose false
  alarm rate is ``alpha``, 1e-3 per step tested by default: at most 2e-3 for the two steps
  ``run_conformance`` tests);
- no side-effect tool runs on any branch, counted by a ``SideEffectLedger`` the test wires into
  its real tools;
- one check per optional capability the agent offers (``car_core.model.capabilities``, the
  checks in ``car_core.testing.capability_checks``): ``abranch`` gives ``branch``'s outcomes
  under the same noise (``async``), ``stop`` is honoured (``stop``), ``couples_noise`` is what
  the branches show (``coupling``) and the fingerprint is the same in a fresh interpreter
  (``fingerprint``, or ``fingerprint-in-process`` when the factory cannot be sent to one).

The checks of the required duties are in ``car_core.testing.contract_checks``. Each check
raises ``ConformanceFailure`` (an ``AssertionError``) saying what broke.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from car_core.engine.agent import Agent
from car_core.engine.replay import record
from car_core.errors import InvalidInput
from car_core.model.capabilities import Capability, capabilities
from car_core.model.json_values import JSON
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import Trajectory
from car_core.testing._conformance import AgentFactory
from car_core.testing.capability_checks import (
    check_async_branch,
    check_coupling_measured,
    check_fingerprint_stable,
    check_stop_honoured,
)
from car_core.testing.contract_checks import (
    check_branch_lineage,
    check_forced_values,
    check_held_state,
    check_identity_edit,
    check_no_side_effects,
    check_prefix_makes_no_calls,
    check_replay_reproduces,
    check_same_noise_same_branch,
    ledger_stays_empty,
)
from car_core.testing.fakes import SideEffectLedger, StepCounter

__all__ = ["CAPABILITY_CHECKS", "CHECKS", "run_conformance"]

_MISSING: Any = object()


# The check of each optional capability, by the name run_conformance lists it under.
_CHECK_OF = {Capability.ASYNC_BRANCH: "async", Capability.STOP: "stop",
             Capability.COUPLES_NOISE: "coupling", Capability.FINGERPRINT: "fingerprint"}
CAPABILITY_CHECKS = tuple(_CHECK_OF.values())
CHECKS = ("replay", "prefix", "state", "lineage", "forced", "noise", "identity", "async",
          "stop", "coupling", "fingerprint", "fingerprint-in-process", "side-effects")


def run_conformance(agent_factory: AgentFactory, *, context: JSON = _MISSING,
                    outcome: OutcomeLike, seed: int = 0, run: Trajectory | None = None,
                    side_effects: SideEffectLedger | None = None,
                    identity_rollouts: int = 32, alpha: float = 1e-3,
                    skip: Collection[str] = ()) -> list[str]:
    """Record a run with a fresh agent and put it through every check, each with a fresh agent.

    ``agent_factory()`` returns an agent, or ``(agent, counter)`` where the counter wraps the
    agent's model and tool calls (then the prefix rule is checked too). ``run``: a run recorded
    beforehand (with the framework's recorder, as users record) instead of one recorded from
    ``context``. ``side_effects``: a ``SideEffectLedger`` wired into the real side-effect tools
    of the agents the factory builds; the recorded run must have called one for real (else the
    check would prove nothing), and no branch of any check may (give the agent simulators for
    calls the record cannot answer).
    ``identity_rollouts`` and ``alpha`` size the identity check (see ``check_identity_edit``).
    ``skip``: capability checks not to run (of ``CAPABILITY_CHECKS``), for an agent whose
    documented limit makes one fail; say why where you pass it.
    The ``state`` check (``check_held_state``) runs for agents with a ``framework_state`` hook,
    the capability checks for agents that offer each (``stop`` needs a run of two steps).
    Returns the names of the checks that ran; the first failure raises ``ConformanceFailure``.
    """
    unknown = set(skip) - set(CAPABILITY_CHECKS)
    if unknown:
        raise InvalidInput(f"skip={sorted(unknown)}: only capability checks may be skipped",
                           hint=f"skip some of {list(CAPABILITY_CHECKS)}")

    def make() -> tuple[Agent, StepCounter | None]:
        made = agent_factory()
        return made if isinstance(made, tuple) else (made, None)

    if run is None:
        if context is _MISSING:
            raise InvalidInput("run_conformance needs context= (to record a run) or run=",
                               hint="pass the context the agent starts from")
        if side_effects is not None:
            side_effects.reset()
        run = record(make()[0], context=context, outcome=outcome, seed=seed)
    if not run.steps:
        raise InvalidInput("the recorded run has no steps, so there is nothing to check",
                           hint="give the agent a context it acts on")
    if side_effects is not None and not side_effects.calls:
        raise InvalidInput(f"the ledger saw no call of {sorted(side_effects.names)} while the "
                           "run was recorded, so counting them on branches would prove nothing",
                           hint="wrap the real tools with ledger.wrap(name, fn) and record a "
                                "run that calls one")
    ran: list[str] = []

    def checked(name: str, fn: Callable[[], object]) -> None:
        assert run is not None
        with ledger_stays_empty(side_effects, name, run):
            fn()
        ran.append(name)

    checked("replay", lambda: check_replay_reproduces(make()[0], run, seed=seed))
    agent, counter = make()
    if counter is not None:
        checked("prefix", lambda: check_prefix_makes_no_calls(agent, run, counter, seed=seed))
    if Capability.FRAMEWORK_STATE in capabilities(agent):
        checked("state", lambda: check_held_state(make()[0], run, seed=seed))
    checked("lineage", lambda: check_branch_lineage(make()[0], run, outcome, seed=seed))
    checked("forced", lambda: check_forced_values(make()[0], run, seed=seed))
    checked("noise", lambda: check_same_noise_same_branch(make()[0], run, seed=seed))
    checked("identity", lambda: check_identity_edit(make()[0], run, outcome, seed=seed,
                                                    rollouts=identity_rollouts, alpha=alpha))
    caps = {c for c in capabilities(agent) if _CHECK_OF.get(c) not in skip}
    if Capability.ASYNC_BRANCH in caps:
        checked("async", lambda: check_async_branch(make()[0], run, outcome, seed=seed,
                                                    alpha=alpha))
    if Capability.STOP in caps and len(run.steps) >= 2:
        checked("stop", lambda: check_stop_honoured(make()[0], run, seed=seed))
    if Capability.COUPLES_NOISE in caps:
        checked("coupling", lambda: check_coupling_measured(make()[0], run, outcome, seed=seed))
    if Capability.FINGERPRINT in caps:
        crossed: list[bool] = []
        checked("fingerprint", lambda: crossed.append(check_fingerprint_stable(agent_factory,
                                                                               run)))
        if not crossed[0]:  # said as it is: the other interpreter could not be used
            ran[-1] = "fingerprint-in-process"
    if side_effects is not None:
        check_no_side_effects(make()[0], run, side_effects, seed=seed)
        ran.append("side-effects")
    return ran
