"""Branches on a Ray cluster, for attributions that outgrow one machine.

Imported only when asked for (``make_executor("ray")``): Ray is an optional extra
(``pip install causal-agent-replay[ray]``). Branches run on a few long-lived actors, each with
a pool of threads, since a branch mostly waits on a model server; at most ``concurrency`` are
in flight and each is submitted only after the budget allowed it. A branch that raises is
retried inside its worker (``execution.Guarded``); a worker that dies is restarted and the
branch retried once, then returned as a ``Failure``. Results stream back as they finish, so
the caller journals them one by one.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from car_core import defaults
from car_core.engine.tasks import Failure, Task, describe_error
from car_core.errors import CarError, ExecutorUnavailable, InvalidInput
from car_core.model.checks import is_whole

LOCAL_ADDRESSES = (None, "", "local", "auto")
PROBE_TIMEOUT_S = 5.0


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ExecutorUnavailable("the Ray executor needs Ray, which is not installed",
                                  hint="pip install 'causal-agent-replay[ray]'") from exc
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """``ray://host:port`` or ``host:port`` → (host, port); None when there is no port."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast, before any rollout, when nothing listens at ``address``: ``ray.init`` on a
    dead address retries for a long time before it gives up."""
    target = _host_port(address)
    if target is None:
        raise ExecutorUnavailable(f"Ray address {address!r} has no port",
                                  hint="pass host:port (6379 by default) or ray://host:10001")
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        raise ExecutorUnavailable(f"no Ray cluster answers at {address}: {exc}",
                                  hint="start one with `ray start --head` there, check the "
                                       "address, or drop --address to use a local cluster"
                                  ) from exc


class _Worker:
    """A Ray actor that runs branches in threads: branches mostly wait on a model server, so
    one long-lived process serves many of them at once (and Ray does not start, and reap, one
    process per branch)."""

    def __init__(self, fn: Callable[[Task], Any]) -> None:
        self.fn = fn

    def call(self, task: Task) -> Any:
        return self.fn(task)


class RayExecutor:
    """Runs branches on Ray actors. ``address=None`` starts (or joins) a local cluster; pass
    ``host:port`` or ``ray://host:port`` for a running one. ``workers`` actors (default: one
    per CPU of the cluster, at most ``concurrency``) each run up to ``concurrency / workers``
    branches in threads. A worker that dies is restarted and its in-flight branches retried
    once (``worker_retries``); a branch that kills it again is returned as a ``Failure``.
    ``local_cpus`` sizes a local cluster that this executor starts."""

    def __init__(self, address: str | None = None, concurrency: int = defaults.CONCURRENCY,
                 workers: int | None = None, local_cpus: int | None = None,
                 worker_retries: int = 1) -> None:
        for name, value in (("concurrency", concurrency), ("workers", workers)):
            if value is not None and (not is_whole(value)
                                      or value < 1):
                raise InvalidInput(f"{name}={value!r}: need at least 1",
                                   hint=f"pass {name}=N with N >= 1")
        self.address = address
        self.concurrency = concurrency
        self.workers = workers
        self.local_cpus = local_cpus
        self.worker_retries = worker_retries

    def connect(self) -> Any:
        """Ray, initialised: the running session, a local cluster, or the given address."""
        ray = _import_ray()
        local = self.address in LOCAL_ADDRESSES
        if not local:
            probe(str(self.address))
        if ray.is_initialized():  # a session this process already opened is used as is
            return ray
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if local:
            kwargs["num_cpus"] = self.local_cpus
        else:
            kwargs["address"] = self.address
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
            raise ExecutorUnavailable(f"cannot start or join a Ray cluster: {exc}",
                                      hint="check the address and that the cluster runs the "
                                           "same Ray and Python versions") from exc
        return ray

    def run(self, fn: Callable[[Task], Any], tasks: Iterable[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, Any]]:
        queue = iter(tasks)
        first = next(queue, None)
        if first is None:
            return
        queue = itertools.chain([first], queue)
        ray = self.connect()
        from ray.exceptions import RayError, RayTaskError

        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        n_workers = self.workers or max(1, min(self.concurrency, int(cpus)))
        threads = -(-self.concurrency // n_workers)
        actor = ray.remote(_Worker).options(
            num_cpus=min(1.0, cpus / n_workers), max_concurrency=threads, max_restarts=-1,
            max_task_retries=self.worker_retries)
        fn_ref = ray.put(fn)  # shipped once, not once per branch
        actors = [actor.remote(fn_ref) for _ in range(n_workers)]
        load = [0] * n_workers
        pending: dict[Any, tuple[Task, int]] = {}
        more = True
        try:
            while True:
                while more and len(pending) < self.concurrency:
                    task = next(queue, None)
                    if task is None or not may_start():
                        more = False
                        break
                    w = min(range(n_workers), key=load.__getitem__)
                    load[w] += 1
                    pending[actors[w].call.remote(task)] = (task, w)
                if not pending:
                    return
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    task, w = pending.pop(ref)
                    load[w] -= 1
                    try:
                        result = ray.get(ref)
                    except RayTaskError as exc:  # a non-retryable error raised by fn itself
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, CarError):
                            raise cause from exc
                        raise
                    except RayError as exc:  # the worker died on every attempt
                        result = Failure(task, describe_error(exc), self.worker_retries + 1, exc)
                    yield task, result
        finally:
            for a in actors:
                ray.kill(a)
