"""Tests of car_adapters.llamaindex against real LlamaIndex workflows."""
