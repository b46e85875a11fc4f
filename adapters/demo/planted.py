"""The randomness every planted chat model of the demos and tests shares.

With ``seed`` set, each call draws from it (``CarChatModel`` sets a per-step seed on a copy, so
a step re-drawn on a branch is reproducible); without it, from one generator seeded by
``rng_seed``, so a recorded run follows its own stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from langchain_core.language_models.chat_models import BaseChatModel
from pydantic import PrivateAttr


class SeededChatModel(BaseChatModel):
    """A LangChain chat model whose draws follow ``seed`` or else ``rng_seed``."""

    seed: int | None = None
    rng_seed: int = 0
    # seeded from ``rng_seed`` once the fields are set (``model_post_init``)
    _rng: np.random.Generator = PrivateAttr(default_factory=lambda: np.random.default_rng(0))

    def model_post_init(self, context: Any) -> None:
        self._rng = np.random.default_rng(self.rng_seed)

    def generator(self) -> np.random.Generator:
        """What this call draws from: a fresh generator of ``seed``, or the running one."""
        return np.random.default_rng(self.seed) if self.seed is not None else self._rng

    def _draw(self) -> float:
        return float(self.generator().random())
