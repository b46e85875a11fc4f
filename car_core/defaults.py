"""Default settings, in one place: the Python API and the ``car`` command both read them, so a
default changed here changes everywhere it is shown and used."""

from __future__ import annotations

ROLLOUTS = 32  # contrastive: rollouts per arm
INTERVENE_ROLLOUTS = 64  # car.intervene: branches per call
CLI_INTERVENE_ROLLOUTS = 32  # `car intervene`: fewer than the API's, for a quick look at a run
ALPHA = 0.05  # contrastive: family-wise error rate over the steps tested
LEVEL = 0.95  # confidence level of intervals (shapley, intervene); 1 - ALPHA
SHAPLEY_BUDGET = 2000  # shapley: total rollouts
CONCURRENCY = 16  # branches in flight for the asyncio and Ray executors
CONTEXT_ROLLOUTS = 64  # context_attribution: all its rollouts (¼–½ screen, the rest confirm)
REPAIR_ROLLOUTS = 64  # repairs: rollouts per candidate at most (the baseline arm included)
