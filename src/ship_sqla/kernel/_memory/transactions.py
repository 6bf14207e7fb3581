"""An in-memory unit of work (U1, U4, J13): the transactions the in-memory reference stores
join, so that the conformance suite can hold them to the same all-or-nothing rule as
PostgreSQL.

A store called inside :meth:`InMemoryUnitOfWork.run` applies its write at once and registers
how to undo it (:meth:`InMemoryTransaction.on_rollback`), or defers it to the commit
(:meth:`InMemoryTransaction.on_commit`); a raising handler undoes every write, newest first, and
runs no after-commit callback. A run row the transaction fenced (J13) stays held until the
transaction ends: the in-memory claim skips it, as ``FOR UPDATE SKIP LOCKED`` does.

It models one thing PostgreSQL does not let a test choose: how a COMMIT ends. ``commit_fault``
makes the next commit fail ``"before"`` it applies (nothing committed) or ``"after"`` (all of it
committed, and the caller told it failed: a connection lost during COMMIT).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._tenancy import ambient_tenant, tenant_ambient

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "CommitFault",
    "InMemoryCommitError",
    "InMemoryTransaction",
    "InMemoryUnitOfWork",
    "active_transaction",
    "required_transaction",
]

R = TypeVar("R")
T = TypeVar("T")

CommitFault = Literal["before", "after"]

_active: ContextVar[InMemoryTransaction | None] = ContextVar(
    "ship_sqla_memory_transaction", default=None
)


def active_transaction() -> InMemoryTransaction | None:
    """The in-memory transaction the current task runs in, or None."""
    tx = _active.get()
    return tx if tx is not None and tx.open else None


def required_transaction(what: str) -> InMemoryTransaction:
    """The in-memory transaction ``what`` must join (a fence, a joined settle, an inbox mark:
    J13), or ConfigurationError naming it."""
    tx = active_transaction()
    if tx is None:
        raise ConfigurationError(
            f"{what} was asked for outside a unit of work; it must join the handler's transaction.",
            fix="call it inside InMemoryUnitOfWork.run (a transactional job does).",
        )
    return tx


class InMemoryCommitError(ConnectionError):
    """The in-memory commit failed as :attr:`InMemoryUnitOfWork.commit_fault` asked (a test's
    stand-in for a connection lost before or during COMMIT)."""


class InMemoryTransaction:
    """One in-memory transaction: the undo log of the writes made in it, what runs at its commit
    and after it, and what it holds until it ends."""

    __slots__ = ("_after_commit", "_on_commit", "_on_end", "_undo", "open", "tenant")

    def __init__(self, tenant: str | None) -> None:
        self.tenant = tenant
        self.open = True
        self._undo: list[Callable[[], None]] = []
        self._on_commit: list[Callable[[], None]] = []
        self._on_end: list[Callable[[], None]] = []
        self._after_commit: list[Callable[[], Awaitable[None]]] = []

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """``undo`` a write made in this transaction if it rolls back (newest first)."""
        self._undo.append(undo)

    def on_commit(self, apply: Callable[[], None]) -> None:
        """``apply`` a write as this transaction commits (in order)."""
        self._on_commit.append(apply)

    def on_end(self, release: Callable[[], None]) -> None:
        """``release`` what this transaction holds (a fenced run) once it ends, either way."""
        self._on_end.append(release)

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """U4: ``callback`` after the commit only."""
        self._after_commit.append(callback)

    def _commit(self) -> list[Callable[[], Awaitable[None]]]:
        for apply in self._on_commit:
            apply()
        self._end()
        return self._after_commit

    def _rollback(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._end()

    def _end(self) -> None:
        self.open = False
        releases, self._on_end = self._on_end, []
        for release in releases:
            release()


class InMemoryUnitOfWork(Generic[R]):
    """A unit of work over the in-memory stores: ``run(handler)`` calls
    ``handler(repositories(tx))`` in one :class:`InMemoryTransaction` (a run inside a run joins
    it, U5), commits when it returns, undoes everything when it raises (U1), and runs its
    after-commit callbacks after the commit only (U4). ``runs``, ``commits`` and ``rollbacks``
    count what happened; ``commit_fault`` injects a failed COMMIT (see the module docstring)."""

    def __init__(self, repositories: Callable[[InMemoryTransaction], R] | None = None) -> None:
        self._repositories: Callable[[InMemoryTransaction], Any] = (
            repositories if repositories is not None else _itself
        )
        self.runs = 0
        self.commits = 0
        self.rollbacks = 0
        self.commit_fault: CommitFault | None = None

    async def run(
        self,
        handler: Callable[[R], Awaitable[T]],
        *,
        tenant: str | None = None,
    ) -> T:
        outer = active_transaction()
        if outer is not None:
            return await handler(self._repositories(outer))
        tenant = tenant if tenant is not None else ambient_tenant()
        tx = InMemoryTransaction(tenant)
        self.runs += 1
        token = _active.set(tx)
        try:
            try:
                with tenant_ambient(tenant):
                    result = await handler(self._repositories(tx))
                fault, self.commit_fault = self.commit_fault, None
                _fail_before_commit(fault)
            except BaseException:
                tx._rollback()  # noqa: SLF001 - the unit of work owns its transaction
                self.rollbacks += 1
                raise
            callbacks = tx._commit()  # noqa: SLF001
            self.commits += 1
            if fault == "after":
                raise InMemoryCommitError("the in-memory COMMIT applied, then its answer was lost")
        finally:
            _active.reset(token)
        for callback in callbacks:
            await callback()
        return result


def _fail_before_commit(fault: CommitFault | None) -> None:
    if fault == "before":
        raise InMemoryCommitError("the in-memory COMMIT failed before it applied")


def _itself(tx: InMemoryTransaction) -> InMemoryTransaction:
    return tx
