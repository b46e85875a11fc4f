"""Whether the code running now is one of CAR's counterfactual branches.

The engine enters ``branch_scope`` around every ``agent.branch`` / ``abranch`` call; the scope
is a ``ContextVar``, so it follows the branch into the threads and tasks a framework starts
with a copied context. Recorders a user attached (a LangChain callback on every run of a
test, an instrumentation handler on a root dispatcher) ask ``in_branch()`` so that a branch is
never recorded as one of the user's runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_BRANCH: ContextVar[bool] = ContextVar("car_branch", default=False)


def in_branch() -> bool:
    """True inside a counterfactual branch the engine is running."""
    return _BRANCH.get()


@contextmanager
def branch_scope() -> Iterator[None]:
    token = _BRANCH.set(True)
    try:
        yield
    finally:
        _BRANCH.reset(token)
