"""A run context recorded by a script run as ``__main__`` (``python my_agent.py``, the README's
way) is rebuilt when the app is attributed through its module (``--agent my_agent:make``) and
its agents name the class (``Agent[Ctx]``). A user trial was refused: "the run's context class
__main__:Ctx is not one this process has loaded", with a hint to type the agents, already done."""

from __future__ import annotations

import dataclasses
from typing import Any

from agents import Agent, Runner
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel
from pydantic import BaseModel

import car_core as car


class Ctx(BaseModel):
    customer: str
    verified: bool = False


def app() -> Agent[Ctx]:
    return Agent[Ctx](name="desk", model=ScriptedModel(lambda m, t, rng: "hello"))


def as_if_recorded_by_a_script(run: car.Trajectory) -> car.Trajectory:
    """``run`` with its context class named as a script run as ``__main__`` records it."""
    steps = []
    for s in run.steps:
        meta = dict(s.meta)
        meta["run_context"] = {**meta["run_context"], "type": "__main__:Ctx"}
        steps.append(dataclasses.replace(s, meta=meta, digest=""))
    return car.Trajectory.new(context=run.context, steps=steps, agent=run.agent,
                              meta=dict(run.meta))


def test_a_context_class_recorded_under_main_is_found_in_the_typed_app() -> None:
    rec = CarRecorder()
    Runner.run_sync(app(), "hi", context=Ctx(customer="Ada"), hooks=rec)
    run = as_if_recorded_by_a_script(rec.run)
    agent = OpenAIAgentsAgent(app())
    agent.preflight(run)  # refused before: "__main__:Ctx is not one this process has loaded"
    rebuilt: Any = agent.contexts.at(run, 0)
    assert isinstance(rebuilt, Ctx) and rebuilt == Ctx(customer="Ada")
