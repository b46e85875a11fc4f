"""``FunctionAgent``, the reference agent, and what the engine does with any agent.

The contract itself (``Agent``, and one protocol per optional capability) lives in
``car_core.engine.protocols``, documented per method; ``Agent`` and ``AsyncAgent`` are
re-exported here. ``FunctionAgent`` implements ``start``, ``branch`` and ``redecide`` from
three plain callables with ``drive`` (below); framework adapters implement them with their own
machinery. ``agent_fingerprint``, ``check_agent`` and ``caveats_of`` read an agent's optional
hooks for the estimators.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from car_core.engine.protocols import (
    Agent,
    AsyncAgent,
    CaveatedAgent,
    FingerprintedAgent,
    ModelPolicy,
    PlanCheckedAgent,
    PreflightAgent,
    StopRule,
)
from car_core.errors import (
    AgentMismatch,
    CarError,
    EnvironmentError_,
    InvalidInput,
    InvalidIntervention,
    PolicyError,
)
from car_core.model.capabilities import Capability, capabilities
from car_core.model.checks import is_whole
from car_core.model.interventions import Plan
from car_core.model.json_values import JSON, check_json, digest
from car_core.model.outcome import OutcomeFn
from car_core.model.seeding import Noise, Stream
from car_core.model.trajectory import History, Step, Trajectory
from car_core.model.vocabulary import Origin, RunStatus
from car_core.secrets.redact import redacted

__all__ = ["Agent", "AgentCaveat", "AsyncAgent", "Environment", "FunctionAgent", "OutcomeFn",
           "Policy", "agent_fingerprint", "call_environment", "call_policy", "caveats_of",
           "check_agent", "drive", "fingerprint_digest", "policy_meta"]

Policy = Callable[[History, np.random.Generator], JSON]
Environment = Callable[[History, JSON, np.random.Generator], JSON]


def agent_fingerprint(agent: Agent) -> str:
    """A short digest naming the agent: its optional ``fingerprint()`` hook (an adapter
    returns its tools or graph), else its ``name`` (a ``FunctionAgent`` is known by its name:
    wrapping its callables, to count or rate-limit them, keeps it the same agent). Recorded
    with a run and compared with the agent an estimate is given, so a run is never attributed
    with another agent by mistake."""
    if Capability.FINGERPRINT in capabilities(agent):
        value = cast(FingerprintedAgent, agent).fingerprint()
    else:
        value = {"name": agent.name}
    return fingerprint_digest(value)


def fingerprint_digest(value: JSON) -> str:
    """The digest ``agent_fingerprint`` gives an agent whose ``fingerprint()`` returns
    ``value``: a recorder that sees the app, not the agent, stamps its runs with it."""
    return digest({"agent": value})[:16]


class AgentCaveat(UserWarning):
    """A line the agent says every result of it must carry (``caveats``), warned once per
    estimate before its first branch: unclassified tools a sandboxed agent runs live."""


def caveats_of(agent: object) -> tuple[str, ...]:
    """The agent's ``caveats`` (``Capability.CAVEATS``), as a tuple of strings."""
    if Capability.CAVEATS not in capabilities(agent):
        return ()
    return tuple(str(c) for c in cast(CaveatedAgent, agent).caveats)


# A framework's own agent object, by the package its class comes from, and the CAR wrapper it
# needs (car_core names them without importing any framework).
_GRAPH = ("from car_adapters.langgraph import LangGraphAgent; "
          "LangGraphAgent(app, safe_tools=[...], side_effect_tools=[...])")
WRAPPERS = {
    "agents": "from car_adapters.openai_agents import OpenAIAgentsAgent; "
              "OpenAIAgentsAgent(agent, safe_tools=[...], side_effect_tools=[...])",
    "langgraph": _GRAPH,
    "langchain": _GRAPH,  # create_agent's compiled graph
    "llama_index": "from car_adapters.llamaindex import LlamaIndexAgent; "
                   "LlamaIndexAgent(workflow, safe_tools=[...], side_effect_tools=[...])",
}


def require_agent(agent: object, given: str = "the agent",
                  needs: tuple[str, ...] = ("branch",)) -> None:
    """Refuse, by name, an object that is not a CAR agent (no callable ``needs``: an
    estimate needs ``branch`` only, the CLI's ``--agent`` also ``start``), saying which
    wrapper a framework's own agent needs. An OpenAI Agents SDK ``Agent`` passed as it is was
    refused as "recorded with another agent" (and, with ``force_agent=True``, every branch
    failed on a missing ``branch``)."""
    missing = [m for m in needs if not callable(getattr(agent, m, None))]
    if not missing:
        return
    package = (type(agent).__module__ or "").split(".")[0]
    wrap = WRAPPERS.get(package)
    raise InvalidInput(
        f"{given} is a {type(agent).__module__}.{type(agent).__name__}, not a CAR agent "
        f"(it has no {' and no '.join(missing)})",
        hint=(f"wrap it: {wrap}" if wrap else
              "pass a car.FunctionAgent, a car_adapters.models.ChatAgent or a framework "
              "adapter's agent (LangGraphAgent, LlamaIndexAgent, OpenAIAgentsAgent)"))


def check_agent(run: Trajectory, agent: Agent, *, force: bool = False) -> None:
    """Refuse, before any branch runs, an object that is not a CAR agent (``require_agent``)
    and an agent other than the one ``run`` was recorded with (runs recorded without a
    fingerprint are not checked; ``force`` skips that check), then let the agent's optional
    ``preflight(run)`` hook refuse a run it cannot branch (a thread its checkpointer does not
    have, a graph shape it cannot fork). Each of the agent's ``caveats`` is warned
    (``AgentCaveat``) once the run is accepted."""
    require_agent(agent)
    recorded = run.meta.get("agent_fingerprint")
    if not force and isinstance(recorded, str):
        given = agent_fingerprint(agent)
        if given != recorded:
            raise AgentMismatch(
                f"run {run.id} was recorded with agent {run.agent or '?'!r} (fingerprint "
                f"{recorded}), not with the agent given, {agent.name!r} "
                f"(fingerprint {given})", run_id=run.id,
                hint="pass the agent the run was recorded with, or force_agent=True "
                     "(--force-agent) if it is the same agent under a new name or tools")
    if Capability.PREFLIGHT in capabilities(agent):
        cast(PreflightAgent, agent).preflight(run)
    for caveat in caveats_of(agent):
        warnings.warn(f"{agent.name}: {caveat}", AgentCaveat, stacklevel=3)


def check_plans(run: Trajectory, agent: Agent, plans: Iterable[Plan]) -> None:
    """Let the agent's optional ``check_plan(run, plan)`` hook refuse any of ``plans`` before
    the first of them runs: a plan refused at its own first branch costs every branch of the
    other plans run before it (Shapley's resample-only coalitions ran, calling the model,
    before the first coalition that holds a later step was refused)."""
    if Capability.PLAN_CHECK not in capabilities(agent):
        return
    for plan in plans:
        cast(PlanCheckedAgent, agent).check_plan(run, plan)


@dataclass
class FunctionAgent:
    """An agent from plain callables: ``policy(history, rng) -> action``,
    ``environment(history, action, rng) -> observation`` (optional), ``is_final(action)``."""

    policy: Policy
    environment: Environment | None = None
    is_final: Callable[[JSON], bool] | None = None
    max_steps: int = 20
    name: str = "function-agent"
    couples_noise: bool = True

    def __post_init__(self) -> None:
        if not callable(self.policy):
            raise InvalidInput("FunctionAgent: policy must be callable",
                               hint="pass policy=lambda history, rng: ...")
        if self.environment is not None and not callable(self.environment):
            raise InvalidInput("FunctionAgent: environment must be callable or None")
        if self.is_final is not None and not callable(self.is_final):
            raise InvalidInput("FunctionAgent: is_final must be callable or None",
                               hint="pass is_final=lambda action: ... (True ends the run)")
        steps = self.max_steps
        if not is_whole(steps, 1):
            raise InvalidInput(f"FunctionAgent: max_steps={steps!r} must be an int of at least 1",
                               hint="pass max_steps=20, say")

    def finished(self, action: JSON) -> bool:
        return bool(self.is_final(action)) if self.is_final is not None else False

    def start(self, context: JSON, noise: Noise) -> Trajectory:
        return drive(self, Trajectory.new(context=context, steps=[]), Plan(start=0), noise)

    def branch(self, run: Trajectory, plan: Plan, noise: Noise,
               stop: StopRule | None = None) -> Trajectory:
        return drive(self, run, plan, noise, stop=stop)

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> JSON:
        return call_policy(self.policy, run.history(k), noise.rng(k, Stream.POLICY), k, run.id)


def call_policy(policy: Callable[..., JSON], history: History, rng: np.random.Generator,
                k: int, run_id: str | None) -> JSON:
    try:
        action = policy(history, rng)
    except CarError:
        raise
    except Exception as exc:  # the user's policy: report which step broke
        raise PolicyError(f"the policy raised {exc!r}", run_id=run_id, step=k,
                          hint="fix the policy; CAR calls it as policy(history, rng)"
                          ) from redacted(exc)
    try:
        check_json(action, f"the action returned at step {k}")
    except InvalidInput as exc:
        raise PolicyError(str(exc), run_id=run_id, step=k) from exc
    return action


def policy_meta(policy: Callable[..., JSON]) -> dict[str, Any]:
    """What a policy reports about its last decision in this thread (model, token usage,
    seed, latency) through an optional ``step_meta()`` method; kept in the step's meta so
    budgets can count tokens and money without the action carrying them."""
    if Capability.STEP_META not in capabilities(policy):
        return {}
    meta = cast(ModelPolicy, policy).step_meta()
    return dict(meta) if isinstance(meta, dict) else {}


def call_environment(env: Callable[..., JSON], history: History, action: JSON,
                     rng: np.random.Generator, k: int, run_id: str | None) -> JSON:
    try:
        obs = env(history, action, rng)
    except CarError:
        raise
    except Exception as exc:
        raise EnvironmentError_(f"the environment raised {exc!r}", run_id=run_id, step=k,
                                hint="fix the environment; CAR calls it as "
                                     "environment(history, action, rng)") from redacted(exc)
    try:
        check_json(obs, f"the observation returned at step {k}")
    except InvalidInput as exc:
        raise EnvironmentError_(str(exc), run_id=run_id, step=k) from exc
    return obs


def _apply_edit(edit: Callable[[Any], Any], history: History, run_id: str, k: int) -> History:
    try:
        edited = edit(history)
    except CarError:
        raise
    except Exception as exc:  # the user's edit: say which intervention broke
        raise InvalidIntervention(f"the do_context edit raised {exc!r}", run_id=run_id, step=k,
                                  hint="fix the edit; it receives the car.History step "
                                       f"{k} decides from and returns it edited") from exc
    if not isinstance(edited, History):
        raise InvalidIntervention(
            f"do_context edit returned {type(edited).__name__}, not a car.History",
            run_id=run_id, step=k,
            hint="for FunctionAgent the edit takes and returns a car.History "
                 "(e.g. dataclasses.replace(h, context=...))")
    if edited.index != len(edited.steps):
        edited = History(edited.context, tuple(edited.steps), len(edited.steps))
    return edited


def drive(agent: FunctionAgent, run: Trajectory, plan: Plan, noise: Noise,
          stop: Callable[[Trajectory], bool] | None = None) -> Trajectory:
    """Run ``agent`` (a FunctionAgent) forward from ``run`` under ``plan``. With ``stop``, the
    run ends (status settled) at the first point, the held prefix included, where
    ``stop(run so far)`` is True: its outcome can no longer change. It is asked only once every
    ``do_context`` edit has been applied, since an edit may rewrite the steps it saw."""
    prefix = run.held_prefix(plan.start)
    history = History(run.context, tuple(prefix), plan.start)
    status = RunStatus.COMPLETE
    fields: dict[str, Any] = {"seed": noise.seed, "agent": agent.name}

    def settled() -> bool:
        return stop is not None and not edits and stop(Trajectory._from_checked(
            context=history.context, steps=list(history.steps), status=RunStatus.SETTLED,
            **fields))

    done = bool(prefix) and agent.finished(prefix[-1].action)
    k = plan.start
    edits = dict(plan.context_edits)  # each edit applies once, even if it shortens the history
    if not done and settled():
        done, status = True, RunStatus.SETTLED
    while not done:
        if k >= agent.max_steps:
            status = RunStatus.MAX_STEPS
            break
        edited = k in edits
        if edited:
            history = _apply_edit(edits.pop(k), history, run.id, k)
            k = history.index
        policy = agent.policy
        swapped = plan.policy is not None and k >= plan.policy[0]
        if swapped:
            policy = plan.policy[1]  # type: ignore[index]
        meta: dict[str, Any] = {}
        if k in plan.forced_actions and not edited:
            action = plan.forced_actions[k]
        else:
            action = call_policy(policy, history, noise.rng(k, Stream.POLICY), k, run.id)
            meta = policy_meta(policy)
            if meta:
                check_json(meta, f"the step_meta() of the policy at step {k}")
        final = agent.finished(action)
        observed, obs = False, None
        if k in plan.forced_observations:
            observed, obs = True, plan.forced_observations[k]
        elif agent.environment is not None and not final:
            observed = True
            obs = call_environment(agent.environment, history, action,
                                   noise.rng(k, Stream.ENVIRONMENT), k, run.id)
        origin: Origin
        if edited:
            origin = Origin.EDITED
        elif k in plan.context_edits:  # reached again after an edit that dropped steps
            origin = Origin.POLICY_SWAPPED if swapped else Origin.LIVE
        else:
            origin = plan.origin(k)
        step = Step(index=k, action=action, observation=obs, observed=observed,
                    meta={**meta, "origin": origin})
        history = history.with_step(step)
        done = final
        k += 1
        if not done and settled():
            done, status = True, RunStatus.SETTLED
    fields["status"] = status
    if plan.context_edits:  # an edit may have put anything in the history: check it all
        return Trajectory.new(context=history.context, steps=list(history.steps), **fields)
    return Trajectory._from_checked(context=history.context, steps=list(history.steps), **fields)
