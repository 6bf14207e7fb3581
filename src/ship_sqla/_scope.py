"""The transaction scope, and how every ship store joins it (U1, U2, U4).

A :class:`TransactionScope` is one ``uow.run``'s transaction: its connection, its tenant, and the
callbacks that run after it commits. Stores (outbox, idempotency, webhook events, job enqueue)
never open a transaction of their own while a scope is active: they call :func:`joined` with the
``scope=`` they were given, or find the ambient scope through a context variable that ``uow.run``
sets. Outside any scope, :func:`joined` opens one short transaction for the store's statements.

A scope is bound to the task that runs its ``uow.run``. A context variable is inherited by child
tasks, and an ``AsyncConnection`` is not safe for concurrent tasks, so a scope used from any other
task is refused with :class:`~ship_sqla.kernel.ScopeConcurrencyError` rather than corrupting the
connection's protocol state.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from ship_sqla.kernel import ScopeClosedError, ScopeConcurrencyError, TenantViolationError

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import IsolationLevel

__all__ = [
    "AfterCommit",
    "Database",
    "TransactionScope",
    "current_scope",
    "joined",
    "tenant_within",
]

logger = logging.getLogger("ship_sqla")

Database: TypeAlias = AsyncEngine | AsyncConnection
"""What stores and units of work are given: an engine, or a connection already in a transaction
(then their work runs in a SAVEPOINT of it, which is how tests roll everything back)."""

AfterCommit: TypeAlias = Callable[[], Awaitable[None] | None]

_current: contextvars.ContextVar[TransactionScope | None] = contextvars.ContextVar(
    "ship_sqla_scope", default=None
)


class TransactionScope:
    """One unit of work's transaction. Handed to ``repositories(scope)`` and to stores.

    Not safe for concurrent tasks: only the task running the ``uow.run`` that opened it may use
    it, and never after that run has ended.
    """

    __slots__ = (
        "_active",
        "_after_commit",
        "_connection",
        "_database",
        "_failed_nested",
        "_owner",
        "_parent",
        "_sessions",
        "tenant",
    )

    def __init__(
        self,
        connection: AsyncConnection,
        *,
        database: Database,
        tenant: str | None,
        parent: TransactionScope | None = None,
    ) -> None:
        self._connection = connection
        self._database = database
        self.tenant = tenant
        self._parent = parent
        self._owner = asyncio.current_task()
        self._active = True
        self._failed_nested: BaseException | None = None
        self._after_commit: list[AfterCommit] = []
        self._sessions: list[AsyncSession] = []

    # -- guards ---------------------------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise unless this scope may be used here and now (open, and on its owner task)."""
        if not self._active:
            raise ScopeClosedError(
                "this transaction scope belongs to a uow.run that has already ended;"
                " its transaction is committed or rolled back and can take no more statements.",
                fix="do the work inside the handler passed to uow.run, or start a new uow.run.",
            )
        if asyncio.current_task() is not self._owner:
            raise ScopeConcurrencyError(
                "this transaction scope was used from a task other than the one running its"
                " uow.run; one connection cannot serve concurrent tasks.",
                fix="await the work in the handler's own task, or give each concurrent task its"
                " own uow.run.",
            )

    @property
    def active(self) -> bool:
        return self._active

    @property
    def rollback_only(self) -> bool:
        """True once a nested ``uow.run`` that joined this transaction raised: the run that owns
        the transaction will roll back, whatever its handler returns (U5)."""
        return self._root()._failed_nested is not None  # noqa: SLF001 - same class

    @property
    def database(self) -> Database:
        """The engine or connection the unit of work that opened this scope was built on."""
        return self._database

    @property
    def connection(self) -> AsyncConnection:
        """The run's connection, for SQLAlchemy Core statements in the same transaction."""
        self.check_usable()
        return self._connection

    def session(self, **kwargs: Any) -> AsyncSession:  # noqa: ANN401 - forwarded to AsyncSession
        """An ORM ``AsyncSession`` bound to the run's connection: its flushes join this transaction.

        The unit of work owns the transaction: the session's ``commit()`` only flushes, pending
        changes are flushed when the handler returns, and the session is closed when the run ends,
        so ORM and Core writes commit or roll back together (U1). A ``rollback()`` on the session
        rolls back the whole run's transaction.
        """
        self.check_usable()
        kwargs.setdefault("expire_on_commit", False)
        session = AsyncSession(
            bind=self._connection, join_transaction_mode="rollback_only", **kwargs
        )
        self._root()._sessions.append(session)  # noqa: SLF001 - same class
        return session

    def after_commit(self, callback: AfterCommit) -> None:
        """Run ``callback`` once this scope's outermost transaction has committed (U4).

        Never runs after a rollback. A callback's exception is logged (logger ``ship_sqla``) and
        does not undo or mask the commit.
        """
        self.check_usable()
        self._root()._after_commit.append(callback)  # noqa: SLF001 - same class

    # -- lifecycle, driven by the unit of work ---------------------------------------------------

    def _root(self) -> TransactionScope:
        scope = self
        while scope._parent is not None:
            scope = scope._parent
        return scope

    def _child(self, tenant: str | None) -> TransactionScope:
        return TransactionScope(
            self._connection, database=self._database, tenant=tenant, parent=self
        )

    async def _flush_sessions(self) -> None:
        for session in self._sessions:
            await session.flush()

    async def _close(self) -> None:
        self._active = False
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.close()

    def _take_after_commit(self) -> list[AfterCommit]:
        callbacks, self._after_commit = self._after_commit, []
        return callbacks

    def _enter(self) -> contextvars.Token[TransactionScope | None]:
        return _current.set(self)

    @staticmethod
    def _exit(token: contextvars.Token[TransactionScope | None]) -> None:
        _current.reset(token)


def tenant_within(
    scope: TransactionScope | None, tenant: str | None, *, operation: str
) -> str | None:
    """The tenant a store call acts for: ``tenant=`` or the scope's own (R2 for stores).

    Inside a unit of work for tenant T a store may only act for T: naming another tenant would
    read or write another tenant's rows through a scope that was granted only T's.
    """
    scope_tenant = None if scope is None else scope.tenant
    if tenant is None:
        return scope_tenant
    if scope_tenant is not None and tenant != scope_tenant:
        raise TenantViolationError(
            f"{operation} named tenant {tenant!r} inside a unit of work for tenant"
            f" {scope_tenant!r}.",
            fix=f"{operation} for the scope's own tenant (omit tenant=),"
            " or run it in that tenant's unit of work.",
        )
    return tenant


def current_scope() -> TransactionScope | None:
    """The scope of the ``uow.run`` this code is running inside, if any (U2).

    Raises :class:`~ship_sqla.kernel.ScopeConcurrencyError` when called from a child task of a
    run: the ambient scope is visible there but may not be used.
    """
    scope = _current.get()
    if scope is None or not scope.active:
        return None
    scope.check_usable()
    return scope


async def run_after_commit(callbacks: list[AfterCommit]) -> None:
    """Run committed callbacks in order; one failing never stops the rest (each is logged)."""
    for callback in callbacks:
        try:
            result = callback()
            if result is not None:
                await result
        except Exception:
            logger.exception("ship_sqla: an after_commit callback failed; the commit stands")


class Joined:
    """What :func:`joined` yields: the connection to run statements on, and ``after_commit``."""

    __slots__ = ("_callbacks", "_scope", "connection")

    def __init__(self, connection: AsyncConnection, scope: TransactionScope | None) -> None:
        self.connection = connection
        self._scope = scope
        self._callbacks: list[AfterCommit] = []

    @property
    def scope(self) -> TransactionScope | None:
        """The unit of work's scope joined, or None when this is a store's own transaction."""
        return self._scope

    def after_commit(self, callback: AfterCommit) -> None:
        if self._scope is not None:
            self._scope.after_commit(callback)
        else:
            self._callbacks.append(callback)


@asynccontextmanager
async def joined(
    database: Database,
    scope: TransactionScope | None = None,
    *,
    isolation_level: IsolationLevel | None = None,
    alone: AsyncEngine | None = None,
) -> AsyncIterator[Joined]:
    """The connection a store must use: the given or ambient scope's, else its own transaction.

    With an explicit or ambient scope the statements join that transaction (U1/U2) and
    ``after_commit`` defers to it. Without one, a short transaction is opened on ``database``
    (a SAVEPOINT when ``database`` is a connection already in a transaction) and committed when
    the block exits cleanly; its ``after_commit`` callbacks then run.

    ``alone``: an AUTOCOMMIT engine, for a block that runs ONE statement: without a scope, the
    statement commits by itself (one round trip instead of BEGIN, statement, COMMIT) and the
    callbacks run after it.
    """
    if scope is None:
        scope = current_scope()
    else:
        scope.check_usable()
    if scope is not None:
        yield Joined(scope.connection, scope)
        return
    joined_ = None
    if alone is not None:
        async with alone.connect() as connection:
            joined_ = Joined(connection, None)
            yield joined_
    else:
        async with _own_transaction(database, isolation_level=isolation_level) as connection:
            joined_ = Joined(connection, None)
            yield joined_
    await run_after_commit(joined_._callbacks)  # noqa: SLF001 - same module


@asynccontextmanager
async def _own_transaction(
    database: Database, *, isolation_level: IsolationLevel | None
) -> AsyncIterator[AsyncConnection]:
    if isinstance(database, AsyncConnection):
        async with database.begin_nested():
            yield database
        return
    async with database.connect() as connection:
        if isolation_level is not None:
            await connection.execution_options(isolation_level=isolation_level)
        async with connection.begin():
            yield connection
