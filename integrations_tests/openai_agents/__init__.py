"""Tests of car_adapters.openai_agents against the real OpenAI Agents SDK."""
