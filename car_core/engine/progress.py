"""The progress display an estimate draws: a ``tqdm`` bar on a terminal, the user's own, or none."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any, Protocol

LINE_EVERY = 10.0  # seconds between two lines of a progress written to a pipe or a log


class ProgressBar(Protocol):
    """What a progress display offers an estimate (a ``tqdm`` bar does)."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> object: ...


# None: a bar when stderr is a terminal; True: always; False: never; or the user's own bar.
Progress = bool | ProgressBar | None


def ended_short(truncated: bool, count: int | float, allowed: int | float) -> str:
    """How a bar that ended before its total says so: the budget ran out (``truncated``: a
    rollout or two may be left that no pair could use), or the estimate stopped early; and
    how much was allowed, so the total never silently shrinks."""
    how = "the budget ran out" if truncated else "stopped early"
    return f"{how}, {int(count)} of {int(allowed)} allowed"


def duration(seconds: float) -> str:
    """A span for people: ``42 s``, ``3 min 39 s``, ``1 h 05 min``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Paced:
    """A population's per-run line with the time since it began and, once a run has finished,
    about how long the rest will take at the pace so far: a trial's triage of 28 runs printed
    one bare line per run for four minutes, with no way to tell whether to wait or stop.

    ``at_once`` runs go at a time, so the rest is timed as lanes (``_left``): timed from the
    first run to end alone, four at once read "about 7 min left" of a triage that ended within
    one. A run ``untimed(*rest)`` says took no time (read back from the store, refused) counts
    as done but not towards the pace: read back first, they read "about 0 s left".

    A population whose runs also wait for budget (a total that the runs in flight hold) says
    when each began (``started``); the runs are then timed from those starts, not from the
    lanes (a trial's triage of three runs read "about 0 s left" beside a third run that had
    waited for the first two and had 20 s to go)."""

    def __init__(self, line: Any, clock: Any = time.monotonic, at_once: int = 1,
                 untimed: Any = None) -> None:
        self.line, self.clock, self.untimed = line, clock, untimed
        self.at_once = max(1, at_once)
        self.start = clock()
        self.ends: list[float] = []  # when each timed run ended, from the start
        self.began: list[float] = []  # when each run began, where the caller says so
        self.seen = 0

    def started(self) -> None:
        """A run began now."""
        self.began.append(self.clock() - self.start)

    def __call__(self, done: int, total: int, *rest: Any, **kw: Any) -> str:
        now = self.clock() - self.start
        said = f"{self.line(done, total, *rest, **kw)} · {duration(now)} so far"
        ended, self.seen = max(done - self.seen, 0), max(self.seen, done)
        if self.untimed is None or not self.untimed(*rest, **kw):
            self.ends.extend([now] * ended)
        if self.ends and 0 < done < total:
            said += f", about {duration(self._left(total - done, now))} left"
        return said

    def _left(self, waiting: int, now: float) -> float:
        """The time the ``waiting`` runs still take: the ``i``-th timed run began when a lane
        freed (the first ``at_once`` at the start, each later one as a run ended), so the
        mean run takes the ends less those starts; the runs in flight take what is left of
        it, and the queued ones the whole of it, ``at_once`` at a time, none sooner than a
        whole run from now. One at a time this is the time so far per run, times the runs
        left. Runs said to have begun (``started``) are taken to end in the order they
        began, as lanes are."""
        k, m = self.at_once, len(self.ends)
        starts = self.began if len(self.began) >= m else [0.0] * k + self.ends
        mean = (sum(self.ends) - sum(starts[:m])) / m
        flying = [max(mean - (now - s), 0.0) for s in starts[m:m + min(k, waiting)]]
        queued = waiting - len(flying)
        return max(max(flying, default=0.0), mean if queued else 0.0,
                   (sum(flying) + queued * mean) / k)


class PacedPrinter:
    """A population's progress that prints each ``Paced`` line with ``write``; the estimate
    tells it when a run begins (``started``), which a callback of the user's is never
    asked."""

    def __init__(self, paced: Paced, write: Any) -> None:
        self.paced, self.write = paced, write

    def __call__(self, *args: Any, **kw: Any) -> None:
        self.write(self.paced(*args, **kw))

    def started(self) -> None:
        self.paced.started()


def run_started(progress: Any) -> None:
    """Tell ``progress`` a run began, when it is one that times runs (``PacedPrinter``)."""
    if isinstance(progress, PacedPrinter):
        progress.started()


class LineProgress:
    """Progress for a stderr that is no terminal (a pipe, a CI log): a bar redrawn with
    carriage returns reads as one garbled line there, so this writes a plain line at most every
    ``every`` seconds and one when it closes. While no rollout finishes (a model server that
    stalls, a rate limit backing off) a line still comes every ``every`` seconds saying how
    long it has waited: a log that stops reads as a hang."""

    def __init__(self, label: str, total: int | None, budget: int | None = None,
                 every: float = LINE_EVERY, stream: IO[str] | None = None) -> None:
        self.label, self.total, self.budget, self.every = label, total, budget, every
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.began = self.last = self.moved = time.monotonic()
        self.closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if every > 0:
            threading.Thread(target=self._heartbeat, name="car-progress", daemon=True).start()

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.count += n
            now = self.moved = time.monotonic()
            if now - self.last >= self.every:
                self._line(now)

    def done(self, truncated: bool = False) -> None:
        """The estimate finished: the closing line says so, and how much was allowed when it
        stopped early (``truncated``: the budget ended it, with a rollout or two left that no
        pair could use, which the line says as the result does)."""
        if self.total is not None and self.count < self.total:
            self._close(ended_short(truncated, self.count, self.total))
        else:
            self._close("done")

    def close(self) -> None:
        self._close(None)

    def _close(self, how: str | None) -> None:
        self._stop.set()
        with self._lock:
            if not self.closed:
                self.closed = True
                self._line(time.monotonic(), how)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                now = time.monotonic()
                if not self.closed and min(now - self.last, now - self.moved) >= self.every:
                    self._line(now, f"waiting: no rollout finished for {now - self.moved:.0f} s")

    def _line(self, now: float, how: str | None = None) -> None:
        self.last = now
        of = f" of {self.total}" if self.total is not None else ""
        left = (f", budget left {max(0, self.budget - self.count)}"
                if self.budget is not None else "")
        took = now - self.began
        rate = f", {self.count / took:.1f}/s" if took > 0 and self.count else ""
        end = f" ({how})" if how else ""
        try:
            print(f"{self.label}: {self.count}{of} rollouts{rate}{left}, {took:.0f} s{end}",
                  file=self.stream, flush=True)
        except (ValueError, OSError):  # the stream was closed under a bar never closed:
            self._stop.set()            # its heartbeat stops rather than raise in its thread


class TqdmBar:
    """A ``tqdm`` bar on a terminal, with the ``done()`` every bar the estimates draw offers:
    an estimate that stopped before its budget was spent ends the bar at what was run, its
    label saying how much was allowed, so the total never silently shrinks; and whether it
    stopped early or the budget ran out (``truncated``), as the result says."""

    def __init__(self, label: str, total: int | None) -> None:
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=label, unit="rollout", leave=False, file=sys.stderr)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def done(self, truncated: bool = False) -> None:
        bar = self.bar
        if bar.total is not None and bar.n < bar.total:
            bar.set_description(f"{bar.desc.rstrip(': ')}: "
                                f"{ended_short(truncated, bar.n, bar.total)}")
            bar.total = bar.n
            bar.refresh()
        self.close()

    def close(self) -> None:
        self.bar.close()


def progress_bar(progress: Progress, total: int | None, label: str) -> Any:
    """None → a bar only when stderr is a terminal; True → always (a line every
    ``LINE_EVERY`` seconds where stderr is no terminal); False → never; an object with
    ``update(n)`` and ``close()`` is used as is."""
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    if progress is True and not sys.stderr.isatty():
        return LineProgress(label, total)
    if progress is None or progress is True:
        return TqdmBar(label, total)
    return progress
