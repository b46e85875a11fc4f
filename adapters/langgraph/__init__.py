"""LangGraph adapter: record with a callback, fork checkpoints under interventions, attribute.

``agent`` holds ``LangGraphAgent`` (the car_core agent protocol over checkpoints), ``callback``
the recorder, ``guard`` the side-effect guard, ``middleware`` the ``create_agent``
middleware, ``model`` the model proxy for forced and resampled steps, ``messages`` the
conversion between LangChain messages and the OpenAI-style dicts CAR stores, ``reach`` what a
node's code can call (tools, models), ``undecided`` the refusal of model calls CAR does not
decide. Beside ``agent``: ``shape`` (the app read once), ``refusals`` (every run, step or plan
a branch cannot reproduce), ``plan`` (a plan read per step), ``branch_state`` (one branch in
flight), ``checkpoints`` (the fork) and ``importer`` (a thread as a trajectory). ``final``
gives a run's final graph state back as the app saw it (``final_state(run)``), for outcomes.
"""

from __future__ import annotations

from ..common.background import open_in_background
from .agent import LangGraphAgent, attribute_thread
from .callback import CarCallback
from .final import final_state
from .middleware import CarMiddleware
from .model import CarChatModel

__all__ = ["CarCallback", "CarChatModel", "CarMiddleware", "LangGraphAgent", "attribute_thread",
           "final_state", "open_in_background"]
