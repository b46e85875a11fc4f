"""Branches on a Ray cluster, for attributions that outgrow one machine.

Imported only when asked for (``make_executor("ray")``): Ray is an optional extra
(``pip install causal-agent-replay[ray]``). Each branch is one Ray task; at most
``concurrency`` are in flight and each is submitted only after the budget allowed it. A branch
that raises is retried inside its worker (``execution.Guarded``); a worker that dies is
retried once by Ray, then the branch is returned as a ``Failure``. Results stream back as they
finish, so the caller journals them one by one.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import CarError, ExecutorUnavailable, InvalidInput
from .execution import Failure, Task, describe_error

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


def _call(fn: Callable[[Task], Any], task: Task) -> Any:
    return fn(task)


class RayExecutor:
    """Runs branches as Ray tasks. ``address=None`` starts (or joins) a local cluster; pass
    ``host:port`` or ``ray://host:port`` for a running one. ``num_cpus`` is what one branch
    reserves: branches mostly wait on a model server, so a fraction lets more run per core;
    ``local_cpus`` sizes a local cluster that this executor starts."""

    def __init__(self, address: str | None = None, concurrency: int = 16,
                 num_cpus: float = 1.0, local_cpus: int | None = None,
                 worker_retries: int = 1) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput(f"concurrency={concurrency!r}: need at least 1",
                               hint="pass concurrency=N with N >= 1")
        if num_cpus <= 0:
            raise InvalidInput(f"num_cpus={num_cpus}: a branch must reserve some CPU",
                               hint="pass a positive fraction such as 0.25")
        self.address = address
        self.concurrency = concurrency
        self.num_cpus = num_cpus
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

    def run(self, fn: Callable[[Task], Any], tasks: Sequence[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, Any]]:
        ray = self.connect()
        from ray.exceptions import RayError, RayTaskError

        remote = ray.remote(_call).options(num_cpus=self.num_cpus,
                                           max_retries=self.worker_retries,
                                           retry_exceptions=False)
        fn_ref = ray.put(fn)  # shipped once, not once per branch
        pending: dict[Any, Task] = {}
        queue = iter(tasks)
        more = True
        try:
            while True:
                while more and len(pending) < self.concurrency:
                    task = next(queue, None)
                    if task is None or not may_start():
                        more = False
                        break
                    pending[remote.remote(fn_ref, task)] = task
                if not pending:
                    return
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    task = pending.pop(ref)
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
            for ref in pending:
                ray.cancel(ref, force=True)
