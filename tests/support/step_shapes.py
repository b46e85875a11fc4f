"""What a recorded step looks like on each adapter, and an outcome that reads it, for the
framework pages' output blocks (``readme_outputs.py`` runs this in a fresh folder).

    python tests/support/step_shapes.py FRAMEWORK OUTCOME_FILE

records, with a planted model (no network, no real model), one failing and one passing run of
a small app per framework into ``runs.db``, prints the deciding step of the failing run as the
store gives it back (``car show RUN --json`` prints the same ``step.to_dict()``), trimmed to
what an outcome reads, then the value of ``outcome`` from OUTCOME_FILE (the page's own code
block) on both stored runs. A change of step shape that breaks the page's outcome fails here.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import car_core as car  # noqa: E402

STORE = "runs.db"


def _until(record: Callable[[int], car.Trajectory], failed: Callable[[car.Trajectory], bool],
           want: bool) -> car.Trajectory:
    """The first run, over seeds 0, 1, ..., whose outcome is ``want``."""
    for seed in range(40):
        run = record(seed)
        if failed(run) == want:
            return run
    raise SystemExit(f"no {'failing' if want else 'passing'} run in 40 seeds")


# -- one small planted app per framework: (failing run, passing run, the step that decides) -------
def langgraph() -> tuple[car.Trajectory, car.Trajectory, int]:
    """The travel desk: books the 900 EUR flight (over its 500 EUR budget) or the 300 EUR one."""
    from car_adapters.langgraph import CarCallback
    from langgraph.checkpoint.memory import InMemorySaver

    from integrations_tests.support import final_state_apps as desk

    def record(p_expensive: float) -> car.Trajectory:
        app = desk.build_app(desk.PlantedDesk(p_expensive=p_expensive), InMemorySaver())
        cb = CarCallback(store=STORE, outcome=desk.outcome, app=app)
        app.invoke(desk.inputs(), {"configurable": {"thread_id": "ticket"}, "callbacks": [cb]})
        assert cb.run is not None
        return cb.run

    return record(1.0), record(0.0), 1


def llamaindex() -> tuple[car.Trajectory, car.Trajectory, int]:
    """The helpdesk of ``examples/llamaindex_ticket_agent.py``: an injected ticket makes it grant
    a role (it looks the attacker up at step 1) or it answers the customer."""
    from car_adapters.llamaindex import CarRecorder, ScriptedLLM

    from examples import llamaindex_ticket_agent as ex

    rec = CarRecorder(store=STORE).attach()

    def record(seed: int) -> car.Trajectory:
        agent = ex.build_agent(ScriptedLLM(ex.fake_model, seed=seed))
        async def go() -> None:
            await agent.run(user_msg="Please handle ticket 4411.")

        asyncio.run(go())
        assert rec.run is not None
        return rec.run

    try:
        return _until(record, ex.outcome, True), _until(record, ex.outcome, False), 1
    finally:
        rec.detach()


def openai_agents() -> tuple[car.Trajectory, car.Trajectory, int]:
    """The triage app of ``examples/openai_agents_triage.py``: its refunds agent refunds the
    injected maximum, 5000 EUR, or the order's price (step 2)."""
    from agents import Runner
    from car_adapters.openai_agents import CarRecorder

    from examples import openai_agents_triage as ex

    rec = CarRecorder(store=STORE)

    def record(seed: int) -> car.Trajectory:
        Runner.run_sync(ex.build_app(seed=seed), ex.REQUEST, hooks=rec)
        assert rec.run is not None
        return rec.run

    return _until(record, ex.outcome, True), _until(record, ex.outcome, False), 2


def chat_agent() -> tuple[car.Trajectory, car.Trajectory, int]:
    """A ``ChatAgent`` (a ``car.FunctionAgent`` over OpenAI-style messages) whose planted policy
    looks order 42 up, then refunds 400 EUR or its price, 40 EUR (step 1)."""
    from car_adapters.common.messages import assistant, tool_call
    from car_adapters.models.chat_agent import ChatAgent

    def policy(history: car.History, rng: Any) -> dict[str, Any]:
        if history.index == 0:
            return assistant(None, [tool_call("call_0_0", "lookup_order", {"order_id": "42"})])
        if history.index == 1:
            amount = 400 if rng.random() < 0.5 else 40
            return assistant(None, [tool_call("call_1_0", "issue_refund",
                                              {"order_id": "42", "amount": amount})])
        return assistant("Refunded.")

    tools = {"lookup_order": lambda order_id: {"order_id": order_id, "price": 40},
             "issue_refund": lambda order_id, amount: {"refunded": amount}}
    agent = ChatAgent(policy, tools, safe_tools=["lookup_order"],
                      side_effect_tools=["issue_refund"])
    store = car.RunStore(STORE)

    def failed(run: car.Trajectory) -> bool:
        return "400" in run.steps[1].action["tool_calls"][0]["function"]["arguments"]

    def record(seed: int) -> car.Trajectory:
        run = car.record(agent, context="Refund my order 42, it arrived broken.",
                         outcome=failed, seed=seed)
        store.save(run)
        return run

    return _until(record, failed, True), _until(record, failed, False), 1


APPS = {"langgraph": langgraph, "llamaindex": llamaindex, "openai-agents": openai_agents,
        "chat-agent": chat_agent}
META = ("agent", "node", "model")  # the meta keys shown with their values; the rest by name


def trimmed(step: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The step without its digest, its state (a list of messages) summarised by their roles,
    and meta reduced to the keys users read (the others are returned by name)."""
    state = step["state"]
    if isinstance(state, list):
        state = f"<{len(state)} messages: {', '.join(m.get('role', '?') for m in state)}>"
    shown = {"index": step["index"], "action": step["action"],
             "observation": step["observation"], "state": state,
             "meta": {k: step["meta"][k] for k in META if k in step["meta"]}}
    return shown, sorted(k for k in step["meta"] if k not in META)


def main(argv: list[str]) -> int:
    framework, code = argv
    failing, passing, k = APPS[framework]()
    db = car.RunStore(STORE)
    failing, passing = db.load(failing.id), db.load(passing.id)  # as another process reads them
    step, others = trimmed(failing.to_dict()["steps"][k])
    print(f"$ car show RUN --json   # step {k} of a failing run; state and meta trimmed")
    print(json.dumps(step, indent=2, ensure_ascii=False))
    if others:
        print(f"(meta also holds: {', '.join(others)})")
    outcome = runpy.run_path(code)["outcome"]
    print(f"\noutcome(failing run) = {outcome(failing)!r}")
    print(f"outcome(passing run) = {outcome(passing)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
