"""Random streams keyed by position, so results never depend on scheduling.

Every random draw in a rollout comes from a stream named by ``(root seed, key…, step,
stream)``, the stream a ``Stream`` member. A recorded run uses key ``(0,)``; rollout ``r`` of an
estimator uses ``(1, r)`` when branches are coupled, so arms that share a rollout index share
the noise of every step they do not intervene on (common random numbers); uncoupled branches
add the arm's own number, ``(2, arm, r)``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from car_core.errors import InvalidInput
from car_core.model.capabilities import Capability, capabilities
from car_core.model.json_values import digest


class Stream(StrEnum):
    """Which draw of a step a random stream feeds; each has its own stream, so drawing more of
    one (a longer tool result) never shifts another (the next decision)."""

    POLICY = "policy"  # the agent's decision at the step
    ENVIRONMENT = "environment"  # the tool / environment's answer to it
    OUTCOME = "outcome"  # a noisy judge scoring the run (drawn at step 0)
    MODEL = "model"  # the integer seed handed to a model server


# The number each stream contributes to the spawn key: fixed forever, since every recorded
# seed and stored run was drawn with it.
_STREAM_NUMBER = {Stream.POLICY: 0, Stream.ENVIRONMENT: 1, Stream.OUTCOME: 2, Stream.MODEL: 3}
RECORD_KEY = (0,)


@dataclass(frozen=True)
class Noise:
    """A family of independent random streams for one run or branch."""

    seed: int
    key: tuple[int, ...] = RECORD_KEY

    def __post_init__(self) -> None:
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise InvalidInput(f"seed={seed!r}: a seed must be a non-negative integer",
                               hint="pass seed=0, 1, 2, …")
        object.__setattr__(self, "seed", int(seed))

    def rng(self, step: int, stream: Stream) -> np.random.Generator:
        number = _STREAM_NUMBER.get(stream)  # a member or its string (they hash alike)
        if number is None:
            raise InvalidInput(f"unknown noise stream {stream!r}",
                               hint=f"use a car_core.contract.Stream: {', '.join(Stream)}")
        seq = np.random.SeedSequence(entropy=self.seed, spawn_key=(*self.key, step, number))
        return np.random.Generator(np.random.PCG64(seq))

    def int_seed(self, step: int, stream: Stream = Stream.MODEL) -> int:
        """A 31-bit integer seed for a model server that takes one (llama.cpp, OpenAI, Ollama)."""
        return int(self.rng(step, stream).integers(0, 2**31 - 1))

    def to_dict(self) -> dict[str, object]:
        return {"seed": self.seed, "key": list(self.key)}


def arm_number(description: object) -> int:
    """A stable number for an arm, from its description (used only for uncoupled branches)."""
    return int(digest(description)[:8], 16)


def branch_noise(seed: int, rollout: int, arm: object, coupled: bool) -> Noise:
    if coupled:
        return Noise(seed, (1, rollout))
    return Noise(seed, (2, arm_number(arm), rollout))


def replays_alike(agent: Any, requested: bool, coupled: bool) -> bool:
    """Whether a branch run again on its task's noise draws what it drew the first time: the
    agent draws its randomness from CAR's noise and, over a model server, the seed was measured
    honoured (``coupling``'s check, made only where coupling was ``requested``; ``coupled`` is
    its answer). Only then is retrying a branch that raised a re-run of the same path; a
    fresh draw instead favours the paths that do not raise (a model server that fails more
    often after a refund made the refund look rarer: a rescue of 0.5 read 0.72). An agent
    that waits on a model server (``prefers_concurrency``) and has no seed check is not taken
    at its word: handed CAR's noise, a model that ignores its seed still draws afresh (a user
    trial's OpenAI Agents branches that raised were retried into the paths that do not, and a
    rescue of 0.6 read 1.0)."""
    caps = capabilities(agent)
    if Capability.COUPLES_NOISE not in caps:
        return False
    if Capability.SEED_CHECK in caps:
        return requested and coupled
    return Capability.CONCURRENCY not in caps


def coupling(agent: Any, run: Any, requested: bool) -> tuple[bool, str]:
    """Whether branches of ``run`` can share common random numbers, and why (said in results).

    They can only when coupling was asked for, the agent draws its randomness from CAR's noise
    (``couples_noise``) and, for an agent over a model server (``seed_check(run)``, which
    re-decides recorded states with one seed and another and returns the reason when the
    replies do not follow the seed), the backend was measured to honour the seed."""
    if not requested:
        return False, ("not requested (coupled=False, or Shapley's exact mode): every branch "
                       "draws its own noise")
    caps = capabilities(agent)
    if Capability.COUPLES_NOISE not in caps:
        return False, "the agent's randomness does not come from CAR's noise streams"
    if Capability.SEED_CHECK in caps:
        reason = agent.seed_check(run)
        if reason:
            return False, str(reason)
        return True, ("measured: the model repeated its reply for one seed (six times "
                      "where another seed changed it), and another seed changed it")
    return True, "the agent was handed CAR's noise streams (not a claim that it drew from them)"
