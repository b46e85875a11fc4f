"""The progress display an estimate draws: a ``tqdm`` bar on a terminal, the user's own, or none."""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Protocol

LINE_EVERY = 10.0  # seconds between two lines of a progress written to a pipe or a log


class ProgressBar(Protocol):
    """What a progress display offers an estimate (a ``tqdm`` bar does)."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> object: ...


# None: a bar when stderr is a terminal; True: always; False: never; or the user's own bar.
Progress = bool | ProgressBar | None


class LineProgress:
    """Progress for a stderr that is no terminal (a pipe, a CI log): a bar redrawn with
    carriage returns reads as one garbled line there, so this writes a plain line at most every
    ``every`` seconds and one when it closes."""

    def __init__(self, label: str, total: int | None, budget: int | None = None,
                 every: float = LINE_EVERY, stream: IO[str] | None = None) -> None:
        self.label, self.total, self.budget, self.every = label, total, budget, every
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.began = self.last = time.monotonic()
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._line(now)

    def done(self) -> None:
        """The estimate finished: the closing line says so, and how much was allowed when it
        stopped early."""
        if self.total is not None and self.count < self.total:
            self._close(f"stopped early, {self.count} of {self.total} allowed")
        else:
            self._close("done")

    def close(self) -> None:
        self._close(None)

    def _close(self, how: str | None) -> None:
        if not self.closed:
            self.closed = True
            self._line(time.monotonic(), how)

    def _line(self, now: float, how: str | None = None) -> None:
        of = f" of {self.total}" if self.total is not None else ""
        left = (f", budget left {max(0, self.budget - self.count)}"
                if self.budget is not None else "")
        took = now - self.began
        rate = f", {self.count / took:.1f}/s" if took > 0 and self.count else ""
        end = f" ({how})" if how else ""
        print(f"{self.label}: {self.count}{of} rollouts{rate}{left}, {took:.0f} s{end}",
              file=self.stream, flush=True)


def progress_bar(progress: Progress, total: int | None, label: str) -> Any:
    """None → a bar only when stderr is a terminal; True → always (a line every
    ``LINE_EVERY`` seconds where stderr is no terminal); False → never; an object with
    ``update(n)`` and ``close()`` is used as is."""
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    if progress is True and not sys.stderr.isatty():
        return LineProgress(label, total)
    if progress is None or progress is True:
        from tqdm import tqdm
        return tqdm(total=total, desc=label, unit="rollout", leave=False, file=sys.stderr)
    return progress
