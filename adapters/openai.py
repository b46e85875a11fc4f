"""The stable import name ``car_adapters.openai``; the policy is in ``models.openai``."""

from .models.openai import OpenAIPolicy, wire_messages

__all__ = ["OpenAIPolicy", "wire_messages"]
