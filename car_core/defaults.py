"""Default settings, in one place: the Python API and the ``car`` command both read them, so a
default changed here changes everywhere it is shown and used."""

from __future__ import annotations

ROLLOUTS = 32  # contrastive: rollouts per arm
INTERVENE_ROLLOUTS = 64  # car.intervene: branches per call
CLI_INTERVENE_ROLLOUTS = 32  # `car intervene`: fewer than the API's, for a quick look at a run
ALPHA = 0.05  # contrastive: family-wise error rate over the steps tested
INDIFFERENCE = 0.1  # a later step's rescue below this does not move the point of commitment
LEVEL = 0.95  # confidence level of intervals (shapley, intervene); 1 - ALPHA
SHAPLEY_BUDGET = 2000  # shapley: total rollouts
CONCURRENCY = 16  # branches in flight for the asyncio and Ray executors
RUNS_AT_ONCE = 4  # triage, fix_population: runs at once for an agent that waits on a server
CONTEXT_ROLLOUTS = 64  # context_attribution: all its rollouts (¼–½ screen, the rest confirm)
REPAIR_ROLLOUTS = 64  # repairs: rollouts per candidate at most (the baseline arm included)
POPULATION_FIX_ROLLOUTS = 64  # fix_population: pairs per run and fix
# Upper bounds on what one command is asked to run, so a slip (``--rollouts 2**63``) is refused
# before anything runs instead of running until it is killed. Generous on purpose: 100,000
# rollouts in one arm already pin its failure rate to ±0.003 at 95% (1.96 · 0.5 / √100,000),
# past any difference an agent's fix makes; 10,000,000 rollouts in all is about 12 days of a
# model-backed agent at 10 rollouts/s, or 17 minutes of a synthetic one at 10,000/s. A user
# who means more raises them knowingly (``--max-rollouts``, ``--max-budget``).
MAX_ROLLOUTS = 100_000  # rollouts per arm (car intervene: its one arm; contrastive: K)
MAX_BUDGET = 10_000_000  # rollouts in all of one attribution
