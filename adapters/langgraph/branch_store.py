"""The LangGraph store on a branch: read from a store the user names, written to a copy of the
branch's own.

An app compiled with a store (``compile(store=...)``, ``create_agent(..., store=...)``) keeps
long-term memory there: tools and nodes read it (``runtime.store.search``) and write it
(``put``). A branch that ran on the app's store read it as it is now, holding what was written
after the run, the run's own later writes included: a user trial wrote "no longer vegetarian"
after a run and CAR said no step caused the run's failure, when one step did. And a tool named
safe that writes memories wrote 58 of them into the user's store from one attribution. CAR does
not record the store, so where branches read is the user's to say (``LangGraphAgent(
branch_store=...)``): ``"live"``, the app's store as it is now (when what the run read has not
changed since), or a store holding what the run saw (a copy the user kept). Either way a branch
writes to a ``BranchStore`` of its own over that store, which it reads back; the store it
reads is never written, and its items' time to live is not refreshed by a branch's reads."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from car_core.errors import AdapterError, InvalidInput

LIVE = "live"


class BranchStore(BaseStore):
    """``base`` as a branch sees it: its own writes (``PutOp``; a ``None`` value deletes) kept
    here and read back over ``base``'s items, which are only read."""

    def __init__(self, base: BaseStore) -> None:
        self.base = base
        self.written: dict[tuple[tuple[str, ...], str], Item | None] = {}

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        out: list[Result] = []
        for op in ops:  # one at a time: a read after a write in one batch sees the write
            if isinstance(op, PutOp):
                self._put(op)
                out.append(None)
            else:
                read = _unrefreshed(op)
                out.append(self._over(read, self.base.batch([read])[0]))
        return out

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        out: list[Result] = []
        for op in ops:
            if isinstance(op, PutOp):
                self._put(op)
                out.append(None)
            else:
                read = _unrefreshed(op)
                out.append(self._over(read, (await self.base.abatch([read]))[0]))
        return out

    def _put(self, op: PutOp) -> None:
        key = (tuple(op.namespace), op.key)
        if op.value is None:
            self.written[key] = None
            return
        now = datetime.now(UTC)
        before = self.written.get(key)
        self.written[key] = Item(value=dict(op.value), key=op.key, namespace=tuple(op.namespace),
                                 created_at=before.created_at if before else now,
                                 updated_at=now)

    def _over(self, op: Op, result: Any) -> Any:
        """``base``'s answer to a read, with this branch's writes over it."""
        if isinstance(op, GetOp):
            key = (tuple(op.namespace), op.key)
            return self.written[key] if key in self.written else result
        if isinstance(op, SearchOp):
            prefix = tuple(op.namespace_prefix)
            mine = [SearchItem(ns, key, item.value, item.created_at, item.updated_at)
                    for (ns, key), item in self.written.items()
                    if item is not None and ns[:len(prefix)] == prefix
                    and _matches(item.value, op.filter)]
            theirs = [i for i in result or () if (tuple(i.namespace), i.key) not in self.written]
            return [*mine, *theirs][:op.limit]
        if isinstance(op, ListNamespacesOp):
            own = {ns for (ns, _), item in self.written.items()
                   if item is not None and _listed(ns, op)}
            spaces = sorted(set(result or ()) | {n[:op.max_depth] if op.max_depth else n
                                                 for n in own})
            return spaces[:op.limit]
        return result


def _unrefreshed(op: Op) -> Op:
    """A read that leaves the items' time to live alone (a refresh is a write)."""
    if isinstance(op, (GetOp, SearchOp)) and op.refresh_ttl:
        return op._replace(refresh_ttl=False)
    return op


def _listed(ns: tuple[str, ...], op: ListNamespacesOp) -> bool:
    """Whether a namespace meets a listing's prefix and suffix conditions (``*``: any)."""
    for cond in op.match_conditions or ():
        path = tuple(cond.path)
        part = ns[:len(path)] if cond.match_type == "prefix" else ns[-len(path):] if path else ()
        if len(part) != len(path) or any(p not in ("*", n) for p, n in zip(path, part,
                                                                             strict=True)):
            return False
    return True


def _matches(value: dict[str, Any], where: dict[str, Any] | None) -> bool:
    """A search filter's plain equality conditions, on one of this branch's own items."""
    return all(value.get(k) == v for k, v in (where or {}).items() if not isinstance(v, dict))


def read_store(app: Any, branch_store: Any) -> BaseStore | None:
    """The store a branch of ``app`` reads (None: the app has none), refused before any
    branch where the app has one and ``branch_store`` does not say which."""
    own = getattr(app, "store", None)
    if own is None:
        if branch_store is not None:
            raise InvalidInput("branch_store= was given, but the app is compiled without a "
                               "store", hint="leave branch_store out")
        return None
    if branch_store is None:
        raise AdapterError(
            f"the app is compiled with a store ({type(own).__name__}) that branches would read "
            "as it is now, holding what was written after the run (its own later steps' "
            "writes among them), not what its steps read; CAR does not record the store",
            hint='pass LangGraphAgent(app, ..., branch_store="live") to read it as it is now, '
                 "where what the run read has not changed since, or branch_store=<a store "
                 "holding what the run saw>; either way branches write to a copy of their own, "
                 "never to your store")
    if branch_store == LIVE:
        return own  # type: ignore[no-any-return]
    if not isinstance(branch_store, BaseStore):
        raise InvalidInput(f"branch_store={branch_store!r} is neither 'live' nor a LangGraph "
                           "store", hint='pass "live" or a BaseStore (InMemoryStore, ...)')
    return branch_store


def on_branch(app: Any, store: BaseStore | None) -> Any:
    """``app`` as one branch runs it: over a ``BranchStore`` of its own (``app`` itself when it
    has no store)."""
    return app if store is None else app.copy(update={"store": BranchStore(store)})
