"""Tests of car_adapters.models: the embedded llama.cpp model and HTTP model servers."""
