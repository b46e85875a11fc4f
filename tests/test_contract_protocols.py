"""The contract is written on the protocols: every method of ``Agent`` and of each optional
capability's protocol says what an adapter must do, and each ``Capability`` has a protocol in
``car_core.contract`` whose members are exactly what ``capabilities()`` detects."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from car_core import contract
from car_core.model.capabilities import Capability, capabilities

PROTOCOL_OF = {
    Capability.ASYNC_BRANCH: contract.AsyncAgent,
    Capability.STOP: contract.StoppableAgent,
    Capability.FINGERPRINT: contract.FingerprintedAgent,
    Capability.PREFLIGHT: contract.PreflightAgent,
    Capability.PLAN_CHECK: contract.PlanCheckedAgent,
    Capability.FRAMEWORK_STATE: contract.FrameworkStateAgent,
    Capability.COUPLES_NOISE: contract.Agent,
    Capability.SEED_CHECK: contract.SeedCheckedAgent,
    Capability.CONCURRENCY: contract.ConcurrentAgent,
    Capability.STEP_META: contract.ModelPolicy,
    Capability.CAVEATS: contract.CaveatedAgent,
}
PROTOCOLS = sorted(set(PROTOCOL_OF.values()), key=lambda p: p.__name__)


def own_methods(protocol: type) -> dict[str, object]:
    return {name: fn for name, fn in vars(protocol).items()
            if inspect.isfunction(fn) and (not name.startswith("_") or name == "__call__")}


def test_every_capability_has_a_protocol() -> None:
    assert set(PROTOCOL_OF) == set(Capability)
    assert all(p.__name__ in contract.__all__ for p in PROTOCOLS)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_every_protocol_method_says_what_to_do(protocol: type) -> None:
    undocumented = [name for name, fn in own_methods(protocol).items()
                    if len(inspect.getdoc(fn) or "") < 40]
    assert undocumented == []
    assert len(inspect.getdoc(protocol) or "") > 20


@pytest.mark.parametrize("capability", sorted(Capability), ids=str)
def test_an_object_with_just_the_protocols_own_members_has_the_capability(
        capability: Capability) -> None:
    protocol = PROTOCOL_OF[capability]
    members: dict[str, object] = dict(own_methods(protocol))
    members.update({name: True for name in vars(protocol).get("__annotations__", {})})
    found = capabilities(SimpleNamespace(**members))
    assert capability in found
    # and nothing that came from another protocol's members
    other = {c for c, p in PROTOCOL_OF.items() if p is not protocol}
    assert found & other == set()
