"""Agents used as tools (``agent.as_tool``, the SDK's orchestrator pattern): a branch cannot
guard the tools inside an agent tool's nested run, so an agent tool may run live on a branch
only when every tool its agent can call is known safe, and is refused by name before any
branch otherwise. A user trial's orchestrator, its agent tool named safe, sent 26 real e-mails
from one attribution through the nested agent's ``send_email``; with the recorder passed to
``as_tool(hooks=...)`` one run was stored as two and branches wrote runs into the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.errors import AdapterError, UnclassifiedTools


class Desk:
    """An orchestrator that asks a billing agent (an agent tool) to mail the customer; the
    billing agent looks the account up, then sends the mail. ``sent`` is the real mail."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.looked: list[str] = []
        self.billing_calls = 0

    def app(self, hooks: Any = None) -> Agent[Any]:
        @function_tool
        def send_email(to: str) -> str:
            """Send an e-mail (a side effect)."""
            self.sent.append(to)
            return f"sent to {to}"

        @function_tool
        def check_account(customer: str) -> str:
            """Read a customer's account (reads only)."""
            self.looked.append(customer)
            return "in good standing"

        def billing(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            self.billing_calls += 1
            done = [m for m in messages if m["role"] == "tool"]
            if not done:
                return assistant(None, [tool_call("b1", "check_account", {"customer": "c"})])
            if len(done) == 1:
                return assistant(None, [tool_call("b2", "send_email", {"to": "c@x.com"})])
            return "emailed"

        def orchestrator(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            if not any(m["role"] == "tool" for m in messages):
                return assistant(None, [tool_call("o1", "ask_billing", {"input": "refund"})])
            return "done: " + str(messages[-1]["content"])

        sub = Agent(name="billing_agent", model=ScriptedModel(billing),
                    tools=[check_account, send_email])
        kw = {"hooks": hooks} if hooks is not None else {}
        return Agent(name="orchestrator", model=ScriptedModel(orchestrator),
                     tools=[sub.as_tool(tool_name="ask_billing", tool_description="billing",
                                        **kw)])


def failed(run: car.Trajectory) -> bool:
    return True  # every run fails: these tests count what branches do


def _recorded(desk: Desk, tmp_path: Path, nested_hooks: bool = False
              ) -> tuple[CarRecorder, car.Trajectory]:
    rec = CarRecorder(store=tmp_path / "runs.db", outcome=failed)
    Runner.run_sync(desk.app(hooks=rec if nested_hooks else None), "refund me", hooks=rec)
    assert desk.sent == ["c@x.com"]
    return rec, rec.run


def test_an_agent_tool_named_safe_whose_agent_sends_mail_is_refused_before_any_branch(
        tmp_path: Path) -> None:
    desk = Desk()
    _, run = _recorded(desk, tmp_path)
    with pytest.raises(AdapterError, match=r"agent tool 'ask_billing' would run agent\(s\) "
                                           r"\['billing_agent'\] live .*\['send_email'\]"
                       ) as info:
        agent = OpenAIAgentsAgent(desk.app(), safe_tools=["ask_billing", "check_account"],
                                  side_effect_tools=["send_email"])
        car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert desk.sent == ["c@x.com"]  # the recording's only
    # no guardrail is involved: its remedy is not offered (a trial read it here)
    assert "guardrail" not in str(info.value)


def test_the_tools_inside_an_agent_tool_must_be_classified_and_may_be_named(
        tmp_path: Path) -> None:
    desk = Desk()
    _, run = _recorded(desk, tmp_path)
    with pytest.raises(UnclassifiedTools) as got:
        car.contrastive(run, OpenAIAgentsAgent(desk.app(), safe_tools=["ask_billing"]),
                        outcome=failed, rollouts=4, seed=0)
    assert got.value.tools == ("check_account", "send_email")
    assert desk.sent == ["c@x.com"]


def test_an_agent_tool_answered_from_the_record_never_runs_its_agent(tmp_path: Path) -> None:
    desk = Desk()
    _, run = _recorded(desk, tmp_path)
    calls = desk.billing_calls
    agent = OpenAIAgentsAgent(desk.app(), side_effect_tools=["ask_billing"])
    res = car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert res.rollouts_used > 0
    assert desk.sent == ["c@x.com"] and desk.billing_calls == calls  # nothing inside ran
    # and every result says its agents' decisions are no steps: a trial's booker, an agent
    # tool so answered, fixed the outcome, and "undecided, raise the budget" said nothing
    said = [c for c in res.caveats if c.startswith("agent tool 'ask_billing' runs agent(s) ")]
    assert len(said) == 1 and "no decision inside it is re-decided" in said[0]
    live = OpenAIAgentsAgent(desk.app(), safe_tools=["ask_billing", "check_account",
                                                     "send_email"])
    assert not any(c.startswith("agent tool ") for c in live.caveats)  # it runs: no caveat


def test_an_agent_tool_whose_agent_only_reads_runs_live_on_branches(tmp_path: Path) -> None:
    desk = Desk()
    _, run = _recorded(desk, tmp_path)
    looked = len(desk.looked)
    agent = OpenAIAgentsAgent(desk.app(), safe_tools=["ask_billing", "check_account",
                                                      "send_email"])
    res = car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert res.rollouts_used > 0
    assert len(desk.looked) > looked  # the nested agent ran, as the user said it may


def test_the_recorder_given_to_as_tool_records_one_run_and_no_branch(tmp_path: Path) -> None:
    desk = Desk()
    rec, run = _recorded(desk, tmp_path, nested_hooks=True)
    assert len(rec.runs) == 1
    assert [s.meta["agent"] for s in run.steps] == ["orchestrator", "orchestrator"]
    assert run.steps[0].observation[0]["content"] == "emailed"  # the agent tool's answer
    agent = OpenAIAgentsAgent(desk.app(hooks=rec), safe_tools=["ask_billing", "check_account",
                                                               "send_email"])
    car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert len(rec.runs) == 1
    with car.RunStore(tmp_path / "runs.db", readonly=True) as store:
        assert [r["id"] for r in store.runs()] == [run.id]
