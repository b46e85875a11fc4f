"""A safe tool's error on a ``ChatAgent`` branch is scored only when it is the call's own.

A tool that raises answers the model ``error: ...``, which the model reads like any result.
The planted agent looks order 42 up (step 0), wording a note into the call that changes from
draw to draw, then refunds the full amount unless the lookup answered with an error (step 1),
and replies. The refund over the cap is the failure, and every draw refunds: no step causes
it. A lookup that fails every other call, or that fails on every call where the estimate
runs, made the branches whose lookup failed look rescued; now they are not scored and the
estimate stops. An agent that looks up an order that does not exist gets the same error on
every call while the recorded lookup still answers: that error is its own, and is scored.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.models.chat_agent import ChatAgent

import car_core as car
from car_core.errors import BranchesFailed

NOTES = ("late", "damaged", "wrong size", "gift", "duplicate", "never arrived")


class Desk:
    """The tools: ``lookup_order`` (safe) fails as ``mode`` says once ``down`` is set;
    ``issue_refund`` (a side effect, answered from the record on branches) counts real calls."""

    def __init__(self, mode: str, ask_unknown: float = 0.0, returns: bool = False) -> None:
        self.mode, self.ask_unknown, self.down = mode, ask_unknown, False
        self.returns = returns  # an unknown order answered "error: ..." rather than raised
        self.tick = itertools.count()
        self.refunds = 0

    def lookup_order(self, order_id: str, note: str = "") -> dict[str, Any]:
        if order_id != "42":
            if self.returns:
                return f"error: no order {order_id}"  # type: ignore[return-value]
            raise LookupError(f"no order {order_id}")
        if self.down and (self.mode == "gone" or next(self.tick) % 2 == 0):
            raise RuntimeError("orders backend failed")  # no outage words: only a re-run tells
        return {"order_id": order_id, "amount": 120}

    def issue_refund(self, order_id: str, amount: int) -> str:
        self.refunds += 1
        return f"refunded {amount}"

    def policy(self, history: car.History, rng: np.random.Generator) -> dict[str, Any]:
        k = history.index
        if k == 0:
            order = "99" if rng.random() < self.ask_unknown else "42"
            note = NOTES[int(rng.integers(len(NOTES)))]
            return assistant(None, [tool_call("c0", "lookup_order",
                                              {"order_id": order, "note": note})])
        if k == 1:
            looked = history.steps[0].observation[0]["content"]
            if str(looked).startswith("error: "):
                return assistant("Sorry, I could not find that order.")
            return assistant(None, [tool_call("c1", "issue_refund",
                                              {"order_id": "42", "amount": 120})])
        return assistant("Done.")

    def agent(self) -> car.FunctionAgent:
        return ChatAgent(self.policy, {"lookup_order": self.lookup_order,
                                       "issue_refund": self.issue_refund},
                         safe_tools=["lookup_order"], side_effect_tools=["issue_refund"],
                         simulators={"issue_refund": lambda a: f"refunded {a['amount']}"},
                         max_steps=3)


def refunded_over_cap(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def recorded(desk: Desk) -> car.Trajectory:
    run = next(r for r in (car.record(desk.agent(), context="Refund order 42", seed=s,
                                      outcome=refunded_over_cap) for s in range(50))
               if r.failed and r.steps[0].action["tool_calls"][0]["function"]["arguments"]
               .find('"42"') > 0)
    desk.refunds = 0
    return run


@pytest.mark.parametrize("mode", ["flaky", "gone"])
def test_a_lookup_that_fails_where_the_estimate_runs_is_not_read_as_a_rescue(mode: str) -> None:
    desk = Desk(mode)
    run = recorded(desk)
    desk.down = True
    with pytest.raises(BranchesFailed) as err:
        car.contrastive(run, desk.agent(), outcome=refunded_over_cap, rollouts=16, seed=0)
    said = str(err.value)
    assert "safe tool 'lookup_order' ran live at step 0" in said
    assert ("answered the same call when CAR ran it again" in said if mode == "flaky"
            else "errors too when CAR runs it again" in said)
    assert "bring that service up" in (err.value.hint or "")
    # tagged with the step the tool ran at, not the one the branch ended at (a trial read
    # "ran live at step 1 ... [step 5]")
    assert err.value.step == 0 and err.value.first.where == 0
    assert desk.refunds == 0  # no real refund on any branch


@pytest.mark.parametrize("returns", [False, True])
def test_an_unknown_order_the_agent_asked_for_is_its_own_doing_and_scored(returns: bool) -> None:
    # step 0 asks for order 99 w.p. 0.5, which never exists: re-deciding it rescues half. A
    # tool that returns "error: ..." for it, not raising, read as answering when run again,
    # and every such branch was left out as a transient failure
    desk = Desk("flaky", ask_unknown=0.5, returns=returns)
    run = recorded(desk)
    res = car.contrastive(run, desk.agent(), outcome=refunded_over_cap, rollouts=32, seed=0)
    assert res.failures == ()
    assert res.locus == 0
    s = res.steps[0]
    assert s.ci.low <= 0.5 <= s.ci.high
    assert desk.refunds == 0
