"""The public API is exactly ``car_core.__all__``: a name that disappears or appears undocumented
fails here, so a change to it is always deliberate."""

from __future__ import annotations

import car_core

PUBLIC = [
    "Action", "Agent", "Budget", "FunctionAgent", "History", "Intervention", "Lineage",
    "Observation", "Outcome", "RunStore", "Step", "Trajectory", "action_match_rate",
    "contrastive", "do_action", "do_context", "do_observation", "do_policy", "do_resample",
    "intervene", "record", "shapley",
]


def test_all_is_pinned() -> None:
    assert sorted(car_core.__all__) == sorted(PUBLIC)
    assert len(car_core.__all__) == len(set(car_core.__all__))


def test_every_public_name_resolves() -> None:
    for name in PUBLIC:
        assert getattr(car_core, name) is not None, name


def test_callables_and_types_are_what_design_md_says() -> None:
    for name in ("action_match_rate", "contrastive", "do_action", "do_context",
                 "do_observation", "do_policy", "do_resample", "intervene", "record", "shapley"):
        assert callable(getattr(car_core, name)), name
    for name in ("Budget", "FunctionAgent", "History", "Lineage", "Outcome", "RunStore", "Step",
                 "Trajectory"):
        assert isinstance(getattr(car_core, name), type), name


def test_function_agent_satisfies_the_agent_protocol() -> None:
    agent = car_core.FunctionAgent(policy=lambda h, rng: None)
    assert isinstance(agent, car_core.Agent)


def test_version_is_set() -> None:
    assert car_core.__version__.count(".") == 2
