"""Tests of car_adapters.common: what every adapter shares (sync, fingerprints, tool safety)."""
