"""``ChatAgent`` branches say where each tool result came from (``meta["tool_sources"]``): the
record, the user's simulator, a forced result, or the tool itself, run live; held steps carry
none, and the marks survive the store.

The planted agent looks order 42 up (step 0, a safe tool), then refunds an order (step 1, a
side-effect tool); a ledger counts the real calls, so "live" and "did not run" are checked
against what happened, not only against what the step says.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from car_adapters.common.messages import assistant, tool_call
from car_adapters.models.chat_agent import ChatAgent

import car_core as car
from car_core.contract import Origin, ToolSource
from car_core.store import RunStore


class Ledger:
    """Counts every real call of each tool."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def tools(self) -> dict[str, Any]:
        def lookup_order(order_id: str) -> dict[str, Any]:
            self.calls["lookup_order"] = self.calls.get("lookup_order", 0) + 1
            return {"order_id": order_id, "status": "shipped"}

        def issue_refund(order_id: str) -> dict[str, Any]:
            self.calls["issue_refund"] = self.calls.get("issue_refund", 0) + 1
            return {"order_id": order_id, "refunded": True}
        return {"lookup_order": lookup_order, "issue_refund": issue_refund}


def planted(history: car.History, rng: np.random.Generator) -> dict[str, Any]:
    k = history.index
    if k == 0:
        return assistant(None, [tool_call("call_0_0", "lookup_order", {"order_id": "42"})])
    if k == 1:
        return assistant(None, [tool_call("call_1_0", "issue_refund", {"order_id": "42"})])
    return assistant("Refunded.")


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def stored(store: RunStore, branch: car.Trajectory) -> car.Trajectory:
    store.save(branch)
    return store.load(branch.id)


def refund(order_id: str) -> dict[str, Any]:
    return assistant(None, [tool_call("call_1_0", "issue_refund", {"order_id": order_id})])


def test_each_branch_tool_result_says_where_it_came_from(store: RunStore) -> None:
    ledger = Ledger()
    sims = {"issue_refund": lambda a: {"simulated": a["order_id"]}}
    agent = ChatAgent(planted, ledger.tools(), safe_tools=["lookup_order"], simulators=sims)
    run = car.record(agent, context="Refund order 42", outcome=refunded, seed=0, store=store)
    assert all("tool_sources" not in s.meta for s in run.steps)  # the record ran its tools
    ledger.calls.clear()

    # (a) the identical recorded call is served from the record; (c) the safe lookup ran live
    same = car.intervene(run, agent, car.do_resample(0), outcome=refunded, rollouts=1)
    branch = stored(store, same.trajectories[0])
    assert branch.steps[0].meta["tool_sources"] == {"call_0_0": ToolSource.LIVE}
    assert branch.steps[1].meta["tool_sources"] == {"call_1_0": ToolSource.RECORD}
    assert "tool_sources" not in branch.steps[2].meta  # a reply: no tool result
    assert ledger.calls == {"lookup_order": 1}

    # (b) a call the record cannot answer goes to the simulator; step 0 is held: no mark
    other = car.intervene(run, agent, car.do_action(1, refund("7")), outcome=refunded,
                          rollouts=1)
    branch = stored(store, other.trajectories[0])
    assert branch.steps[0].meta["origin"] == Origin.HELD
    assert "tool_sources" not in branch.steps[0].meta
    assert branch.steps[1].meta["tool_sources"] == {"call_1_0": ToolSource.SIMULATOR}
    assert branch.steps[1].observation[0]["content"] == '{"simulated": "7"}'

    # a result do_observation gave is marked forced
    forced = car.intervene(run, agent, car.do_observation(1, ["refund failed"]),
                           outcome=refunded, rollouts=1)
    branch = stored(store, forced.trajectories[0])
    assert branch.steps[1].meta["tool_sources"] == {"call_1_0": ToolSource.FORCED}
    assert ledger.calls == {"lookup_order": 1}  # the side-effect tool never ran on a branch
