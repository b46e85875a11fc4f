"""LangGraph adapter: record with a callback, fork checkpoints under interventions, attribute.

``agent`` holds ``LangGraphAgent`` (the car_core agent protocol over checkpoints), ``callback``
the recorder, ``model`` the model proxy for forced and resampled steps, ``messages`` the
conversion between LangChain messages and the OpenAI-style dicts CAR stores.
"""

from __future__ import annotations

from .agent import LangGraphAgent, attribute_thread
from .callback import CarCallback
from .model import CarChatModel

__all__ = ["CarCallback", "CarChatModel", "LangGraphAgent", "attribute_thread"]
