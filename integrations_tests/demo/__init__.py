"""Tests of car_adapters.demo, the `car demo` support desk."""
