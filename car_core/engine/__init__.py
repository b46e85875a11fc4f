"""How a branch runs: the Agent protocol, tasks, executors, replay."""
