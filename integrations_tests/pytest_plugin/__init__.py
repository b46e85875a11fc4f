"""Tests of car_adapters.pytest_plugin, run inside pytest with pytester."""
