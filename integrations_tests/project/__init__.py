"""Tests across adapters and of the project as a whole: the README, Ray, secrets, context."""
