"""Model policies over the official clients and the embedded model.

``openai`` and ``ollama`` talk to model servers through ``server_policy`` (retries, the HTTP 429
limiter in ``ratelimit``); ``local`` runs SmolLM2 in-process through llama.cpp; ``chat_agent`` is
the policy base they share and a framework-free chat agent over any of them. Each module imports
its client lazily, so importing this package costs nothing.
"""
