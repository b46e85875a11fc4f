"""The stable import name ``car_adapters.ollama``; the policy is in ``models.ollama``."""

from .models.ollama import OllamaPolicy, ollama_messages

__all__ = ["OllamaPolicy", "ollama_messages"]
