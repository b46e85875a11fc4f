"""Test agent code with fakes, and prove an ``Agent`` implementation keeps the replay contract.

- ``fakes``: ``ScriptedPolicy``, ``DictEnvironment``, ``CallCounter``, ``SideEffectLedger``,
  ``FakeClock`` and friends, plain callables for ``car.FunctionAgent``;
- ``conformance``: ``run_conformance(make_agent, context=..., outcome=...)``, every check an
  adapter runs in its own suite, built from ``contract_checks`` (one per duty of ``Agent``) and
  ``capability_checks`` (one per optional capability);
- ``synthetic`` and ``synthetic_context``: planted causal models with known answers.

Every public name of ``fakes`` and the checks is importable from here, as documented.
"""

from __future__ import annotations

from car_core.testing._conformance import AgentFactory
from car_core.testing.capability_checks import (
    check_async_branch,
    check_coupling_measured,
    check_fingerprint_stable,
    check_stop_honoured,
)
from car_core.testing.conformance import CAPABILITY_CHECKS, CHECKS, run_conformance
from car_core.testing.contract_checks import (
    check_branch_lineage,
    check_forced_values,
    check_held_state,
    check_identity_edit,
    check_no_side_effects,
    check_prefix_makes_no_calls,
    check_replay_reproduces,
    check_same_noise_same_branch,
)
from car_core.testing.fakes import (
    CallCounter,
    Choice,
    CountedAgent,
    Counters,
    DictEnvironment,
    FakeClock,
    ScriptedPolicy,
    SideEffectLedger,
    StepCounter,
    action_key,
    count_calls,
)

__all__ = [
    "CAPABILITY_CHECKS", "CHECKS", "AgentFactory", "CallCounter", "Choice", "CountedAgent",
    "Counters", "DictEnvironment", "FakeClock", "ScriptedPolicy", "SideEffectLedger",
    "StepCounter", "action_key", "check_async_branch", "check_branch_lineage",
    "check_coupling_measured", "check_fingerprint_stable", "check_forced_values",
    "check_held_state", "check_identity_edit", "check_no_side_effects",
    "check_prefix_makes_no_calls", "check_replay_reproduces", "check_same_noise_same_branch",
    "check_stop_honoured", "count_calls", "run_conformance",
]
