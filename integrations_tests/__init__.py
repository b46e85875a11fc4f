"""Tests of CAR against the real frameworks, model servers and Ray: one folder per adapter."""
