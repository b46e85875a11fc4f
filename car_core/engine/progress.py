"""The progress display an estimate draws: a ``tqdm`` bar on a terminal, the user's own, or none."""

from __future__ import annotations

import sys
from typing import Any, Protocol


class ProgressBar(Protocol):
    """What a progress display offers an estimate (a ``tqdm`` bar does)."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> object: ...


# None: a bar when stderr is a terminal; True: always; False: never; or the user's own bar.
Progress = bool | ProgressBar | None


def progress_bar(progress: Progress, total: int | None, label: str) -> Any:
    """None → a bar only when stderr is a terminal; True → always; False → never; an object
    with ``update(n)`` and ``close()`` is used as is."""
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    if progress is None or progress is True:
        from tqdm import tqdm
        return tqdm(total=total, desc=label, unit="rollout", leave=False, file=sys.stderr)
    return progress
