"""Tests of car_adapters.langgraph against real LangGraph apps."""
