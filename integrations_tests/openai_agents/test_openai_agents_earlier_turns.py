"""A second turn that began from the conversation (an SDK ``session=``, or the first turn's
items given as input) where the first turn's note already made most of the failure: a trial's
transfer went to the wrong account w.p. 0.8 once turn 1 had noted it, so re-deciding turn 2's
first step rescued 0.2 and CAR named it, "caused the failure", with no word that 80% of the
failure was committed before the run began. The result now says how often the run still
failed with every step re-decided, with the arm's interval, and that this share lies in what
it began from or in the agent's own odds from there (here at 0.6, so that 64 rollouts a step
decide the locus).

Planted: the history holds a note of payee ACC-290 (the wrong one); at step 0 the model
transfers to the noted account w.p. ``P_NOTED`` (else ACC-200), then replies. Failure = a
transfer to any account but ACC-200. P(fail | step 0 re-decided) = 0.6, P(fail | held) = 1:
step 0 rescues 0.4 and is the locus; the rest, 0.6, is the note's."""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.model.vocabulary import Answer

set_tracing_disabled(True)
P_NOTED = 0.6
HISTORY: list[Any] = [
    {"role": "user", "content": "Please pay my landlord, account ACC-200, next week."},
    {"role": "assistant", "content": "Noted: payee ACC-290."},
    {"role": "user", "content": "Send it now, please."}]


@function_tool
def transfer_funds(account: str) -> str:
    """Transfer the rent to an account (a side effect)."""
    return f"sent to {account}"


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    if any(m.get("role") == "tool" for m in messages[3:]):
        return assistant("Done.")
    noted = "ACC-290" if rng.random() < P_NOTED else "ACC-200"
    return assistant(None, [tool_call("call_1", "transfer_funds", {"account": noted})])


def wrong_payee(run: car.Trajectory) -> bool:
    return any(json.loads(c["function"]["arguments"]).get("account") != "ACC-200"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def test_a_locus_named_after_an_earlier_turn_says_what_was_committed_before() -> None:
    for seed in range(40):
        app = Agent(name="bank", model=ScriptedModel(decide, seed=seed), tools=[transfer_funds])
        rec = CarRecorder()
        Runner.run_sync(app, HISTORY, hooks=rec)
        if wrong_payee(rec.run):
            break
    run = rec.run
    assert wrong_payee(run) and len(run.steps) == 2
    agent = OpenAIAgentsAgent(app, side_effect_tools=["transfer_funds"],
                              simulators={"transfer_funds": lambda a: f"sent to {a['account']}"})
    res = car.contrastive(run, agent, outcome=wrong_payee, rollouts=64, seed=0)
    assert res.answer == Answer.LOCUS and res.locus == 0
    said = [c for c in res.caveats if "that much lies in what it began from" in c]
    assert len(said) == 1, res.caveats
    assert "1 decision(s) of the agent" in said[0] and "car what" in said[0]
    first = next(a for a in res.arms if a.hold_before == 0)
    assert first.ci.low > 0.3 and first.ci.low <= P_NOTED <= first.ci.high
    assert "caveat: re-deciding every step of this run, it still failed in" in str(res)
