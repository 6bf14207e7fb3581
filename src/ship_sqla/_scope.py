"""The transaction scope, and how every ship store joins it (U1, U2, U4).

A :class:`TransactionScope` is one ``uow.run``'s transaction: its connection, its tenant, and the
callbacks that run after it commits. Stores (outbox, idempotency, webhook events, job enqueue)
never open a transaction of their own while a scope is active: they call :func:`joined` with the
``scope=`` they were given, or find the ambient scope through a context variable that ``uow.run``
sets. Outside any scope, :func:`joined` opens one short transaction for the store's statements.

A scope is bound to the task that runs its ``uow.run``. A context variable is inherited by child
tasks, and an ``AsyncConnection`` is not safe for concurrent tasks, so a scope used from any other
task is refused with :class:`~ship_sqla.errors.ScopeConcurrencyError` rather than corrupting the
connection's protocol state.

Every database call made through :func:`joined` is judged by the one outage rule
(:mod:`ship_sqla._sql_errors`): a refused or lost connection surfaces as
:class:`~ship_sqla.errors.DatabaseUnavailableError`, the driver's error chained.

A tenant is checked once, by :func:`~ship_sqla.kernel._tenancy.check_tenant` (re-exported
here), for ``uow.run`` and every store: ``""`` and blank tenants are refused, since a store that
keys "no tenant" as ``''`` would otherwise alias the two.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from ship_sqla._direct import DirectStatements, copy_in_transaction
from ship_sqla._failover import Hosts, follow_primary, hosts_of
from ship_sqla._sql_errors import database_outage_translated
from ship_sqla.kernel._errors import (
    ConfigurationError,
    DatabaseTimeoutError,
    ScopeClosedError,
    ScopeConcurrencyError,
    TenantViolationError,
)
from ship_sqla.kernel._tenancy import MAX_TENANT_BYTES, check_tenant

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sqlalchemy import CursorResult, Executable
    from sqlalchemy.engine.interfaces import IsolationLevel

    from ship_sqla._direct import CopyIn, DirectConnection

__all__ = [
    "MAX_TENANT_BYTES",
    "OWN",
    "AfterCommit",
    "Database",
    "StoreConnections",
    "TransactionScope",
    "Within",
    "check_tenant",
    "current_scope",
    "joined",
    "same_database",
    "tenant_within",
]

logger = logging.getLogger("ship_sqla")

Database: TypeAlias = AsyncEngine | AsyncConnection
"""What stores and units of work are given: an engine, or a connection already in a transaction
(then their work runs in a SAVEPOINT of it, which is how tests roll everything back)."""

AfterCommit: TypeAlias = Callable[[], Awaitable[None] | None]

_STORE_CALL = "a ship_sqla store call"

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
        "_savepoint",
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
        savepoint: bool = False,
    ) -> None:
        self._connection = connection
        self._database = database
        self.tenant = tenant
        self._parent = parent
        self._savepoint = savepoint
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
        # A session opened inside a savepoint run is flushed before that savepoint is released,
        # and discarded with it when it rolls back: its pending changes never outlive it.
        self._boundary()._sessions.append(session)  # noqa: SLF001 - same class
        return session

    def after_commit(self, callback: AfterCommit) -> None:
        """Run ``callback`` once this scope's outermost transaction has committed (U4).

        Never runs after a rollback. Registered inside a ``uow.run(..., savepoint=True)`` (or
        a store called there), it belongs to that savepoint: discarded if the savepoint rolls
        back, kept when it is released, and then run after the outermost commit, as Django's
        ``on_commit`` does; savepoints nest. A callback's exception is logged (logger
        ``ship_sqla``) and does not undo or mask the commit.
        """
        self.check_usable()
        self._boundary()._after_commit.append(callback)  # noqa: SLF001 - same class

    # -- lifecycle, driven by the unit of work ---------------------------------------------------

    def _root(self) -> TransactionScope:
        scope = self
        while scope._parent is not None:
            scope = scope._parent
        return scope

    def _boundary(self) -> TransactionScope:
        """The nearest scope, this one or an ancestor, that can roll back on its own: the
        innermost savepoint run, else the root. Joined runs have no boundary of their own."""
        scope = self
        while scope._parent is not None and not scope._savepoint:
            scope = scope._parent
        return scope

    def _child(self, tenant: str | None, *, savepoint: bool = False) -> TransactionScope:
        return TransactionScope(
            self._connection,
            database=self._database,
            tenant=tenant,
            parent=self,
            savepoint=savepoint,
        )

    def _released(self) -> None:
        """This savepoint run's savepoint was released: what it registered now belongs to the
        enclosing boundary, to run (or be discarded) with it."""
        assert self._parent is not None  # noqa: S101 - only savepoint children are released
        boundary = self._parent._boundary()  # noqa: SLF001 - same class
        boundary._after_commit.extend(self._take_after_commit())  # noqa: SLF001
        boundary._sessions.extend(self._sessions)  # noqa: SLF001
        self._sessions = []

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
    read or write another tenant's rows through a scope that was granted only T's. A tenant
    that is no tenant (``""``, blank) is refused (:func:`check_tenant`).
    """
    scope_tenant = None if scope is None else scope.tenant
    if tenant is None:
        return scope_tenant
    check_tenant(tenant, operation=operation)
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

    Raises :class:`~ship_sqla.errors.ScopeConcurrencyError` when called from a child task of a
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
    """What :func:`joined` and :meth:`StoreConnections.transaction` yield: the connection to
    run statements on, and ``after_commit``; given as ``scope=`` to the entry, a statement
    joins this block."""

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
    operation: str = _STORE_CALL,
) -> AsyncIterator[Joined]:
    """The connection a store must use: the given or ambient scope's, else its own transaction.

    With an explicit or ambient scope the statements join that transaction (U1/U2) and
    ``after_commit`` defers to it. Without one, a short transaction is opened on ``database``
    (a SAVEPOINT when ``database`` is a connection already in a transaction) and committed when
    the block exits cleanly; its ``after_commit`` callbacks then run.

    ``alone``: an AUTOCOMMIT engine, for a block that runs ONE statement: without a scope, the
    statement commits by itself (one round trip instead of BEGIN, statement, COMMIT) and the
    callbacks run after it.

    A refused or lost connection in the block raises
    :class:`~ship_sqla.errors.DatabaseUnavailableError` naming ``operation`` (the block holds
    only the store's own code, so a bare ``OSError`` there is the driver's).
    """
    if scope is None:
        scope = current_scope()
    else:
        scope.check_usable()
    if scope is not None:
        with database_outage_translated(operation, driver_only=True):
            yield Joined(scope.connection, scope)
        return
    joined_ = None
    if alone is not None:
        async with connected(alone, operation) as connection:
            # One autocommitted statement cut off mid-flight may have committed or not.
            with database_outage_translated(f"{operation} ({ALONE_CUT_OFF})", driver_only=True):
                joined_ = Joined(connection, None)
                yield joined_
    else:
        async with _own_transaction(
            database, isolation_level=isolation_level, operation=operation
        ) as connection:
            joined_ = Joined(connection, None)
            yield joined_
    await run_after_commit(joined_._callbacks)  # noqa: SLF001 - same module


ALONE_CUT_OFF = "its autocommitted statement was cut off and may or may not have taken effect"
COMMIT_CUT_OFF = "its COMMIT was cut off: the work may or may not have committed"


@asynccontextmanager
async def connected(engine: AsyncEngine, operation: str) -> AsyncIterator[AsyncConnection]:
    """A connection of ``engine``'s pool; a refused connect raises DatabaseUnavailableError."""
    with database_outage_translated(operation, driver_only=True):
        connection = await engine.connect().start()
    try:
        yield connection
    finally:
        # Returning a dead connection is the pool's business: it discards it and logs.
        await connection.close()


@asynccontextmanager
async def committed(
    connection: AsyncConnection, operation: str, *, driver_only: bool
) -> AsyncIterator[None]:
    """A transaction on ``connection``: committed when the block exits cleanly, else rolled
    back. Outages in the block are translated (``driver_only``: see
    :func:`~ship_sqla._sql_errors.database_outage_translated`); one at the COMMIT says that
    the outcome is unknown."""
    with database_outage_translated(operation, driver_only=driver_only, connection=connection):
        async with connection.begin() as transaction:
            yield
            with database_outage_translated(f"{operation} ({COMMIT_CUT_OFF})", driver_only=True):
                await transaction.commit()


@asynccontextmanager
async def _own_transaction(
    database: Database, *, isolation_level: IsolationLevel | None, operation: str
) -> AsyncIterator[AsyncConnection]:
    if isinstance(database, AsyncConnection):
        with database_outage_translated(operation, driver_only=True):
            async with database.begin_nested():
                yield database
        return
    async with connected(database, operation) as connection:
        if isolation_level is not None:
            await connection.execution_options(isolation_level=isolation_level)
        async with committed(connection, operation, driver_only=True):
            yield connection


@asynccontextmanager
async def _checked_out(direct: DirectStatements, operation: str) -> AsyncIterator[DirectConnection]:
    """A pooled connection of the direct path, returned to the pool afterwards (after a clean
    end, kept for the next statement of this turn of the event loop:
    :meth:`~ship_sqla._direct.DirectConnection.release`); a refused or lost connection while
    checking out is :class:`~ship_sqla.errors.DatabaseUnavailableError` naming ``operation``."""
    with database_outage_translated(operation, driver_only=True):
        direct_connection = await direct.checkout()
    try:
        yield direct_connection
    except BaseException:
        await direct_connection.close()
        raise
    await direct_connection.release()


class Own(enum.Enum):
    """The type of :data:`OWN`."""

    OWN = "own"


OWN: Final = Own.OWN
"""``scope=OWN``: the store's own statement or transaction, never a unit of work's, even when
one is ambient (a runtime's claim, heartbeat and settle, a worker's registry rows, the
dashboard's samples): these never join the caller's transaction, and never look for one."""

Within: TypeAlias = TransactionScope | Joined | Own | None
"""Where a store call runs (``scope=`` of :class:`StoreConnections`' entry): a unit of work's
scope (its transaction), ``None`` (the ambient unit of work's, if any, else the store's own),
:data:`OWN` (always the store's own), or the :class:`Joined` of a block already open (one
more statement of that block's transaction)."""


class _Answer(enum.Enum):
    """What a statement of :meth:`StoreConnections._one` answers its caller."""

    NOTHING = "nothing"
    ROWS = "rows"
    """Rows read by position (or unpacked): the direct path's asyncpg records serve."""
    NAMED = "named"
    """SQLAlchemy's rows, read by column name: never the direct path."""
    COUNT = "count"
    """The statement's row count: never the direct path."""


def _answered(result: CursorResult[Any], answer: _Answer) -> Any:  # noqa: ANN401 - per answer
    if answer is _Answer.NOTHING:
        return None
    if answer is _Answer.COUNT:
        return int(result.rowcount)
    return result.all()


async def _copy_then(
    connection: AsyncConnection, copy: CopyIn, then: tuple[TextClause, Mapping[str, Any]] | None
) -> bool:
    """``copy`` as one more statement of ``connection``'s transaction, then ``then``; False
    (nothing done) when the connection cannot run a COPY (:func:`copy_in_transaction`)."""
    if not await copy_in_transaction(connection, copy):
        return False
    if then is not None:
        await connection.execute(*then)
    return True


class StoreConnections:
    """How a store reaches the database: ONE execution entry, and the decision of how each
    call runs made here, once. Every ship store (jobs, outbox, idempotency, webhooks, audit)
    holds one. A store says what it runs and where (``scope=``, :data:`Within`); this class
    decides how:

    - joined: with a unit of work given or ambient (``scope=`` a scope, or ``None`` while one
      is ambient), or the :class:`Joined` of an open block, the statements run on that
      transaction's connection (U1/U2), not bounded by ``operation_timeout`` (the unit of work
      owns its time), and ``after_commit`` waits for its commit;
    - else, ONE statement (:meth:`execute`, :meth:`rows`, :meth:`count`) is its own
      transaction, autocommitted: straight on a pooled asyncpg connection of the engine
      whenever :class:`~ship_sqla._direct.DirectStatements` may run it (a ``text()``
      statement, nothing watching the engine's statements, rows read by position), else on a
      pooled AUTOCOMMIT ``AsyncConnection`` (one round trip instead of BEGIN, statement,
      COMMIT);
    - else, SEVERAL statements (:meth:`transaction`, a block) run in a short READ COMMITTED
      transaction of the store's own, whatever the engine's default isolation (a statement's
      snapshot is then taken when it starts, after any lock an earlier statement of the block
      waited for);
    - a bulk insert's COPY (:meth:`copy`) runs as a statement would: joined, as one more
      statement of the transaction; on its own, straight on a pooled asyncpg connection (with
      its announcement in one transaction); False when the path cannot run it, and the caller
      inserts another way (:meth:`~ship_sqla._jobs._insert.RunInserter.store_plain` decides
      the insert path once);
    - on a connection already in a transaction (the test path), the store's own statements and
      blocks each run in a SAVEPOINT of it, taking turns (one ``AsyncConnection`` serves one
      statement at a time; a unit of work's joined calls run in its own task, which the scope
      already guards).

    Every call of the store's own is bounded by ``operation_timeout``
    (:class:`DatabaseTimeoutError`, or the store's subclass of it) when one is set, and every
    call is judged by the one outage rule (:class:`~ship_sqla.errors.DatabaseUnavailableError`
    naming the store and ``what``).
    An autocommitted statement of a call that could have joined a unit of work (``scope=`` not
    :data:`OWN`) cut off mid-flight says that it may or may not have taken effect
    (:data:`ALONE_CUT_OFF`), and so does a COMMIT of such a call's own transaction
    (:data:`COMMIT_CUT_OFF`); :data:`OWN` calls keep the plain operation name, as before.
    """

    __slots__ = (
        "_autocommit",
        "_direct",
        "_hosts",
        "_read_committed",
        "_timeout",
        "_timeout_error",
        "_turn",
        "database",
        "name",
    )

    def __init__(
        self,
        database: Database,
        *,
        name: str,
        operation_timeout: float | None = None,
        timeout_error: type[DatabaseTimeoutError] = DatabaseTimeoutError,
    ) -> None:
        self.database = database
        self.name = name
        self._timeout = operation_timeout
        self._timeout_error = timeout_error
        self._autocommit: AsyncEngine | None = None
        self._read_committed: AsyncEngine | None = None
        self._direct: DirectStatements | None = None
        self._hosts: Hosts | None = None
        if isinstance(database, AsyncEngine):
            follow_primary(database)  # J24
            self._hosts = hosts_of(database)
            self._autocommit = database.execution_options(isolation_level="AUTOCOMMIT")
            self._read_committed = database.execution_options(isolation_level="READ COMMITTED")
            self._direct = DirectStatements(self._autocommit)
        self._turn = asyncio.Lock()

    @property
    def concurrent(self) -> bool:
        """Whether two calls may run at once: on an engine each takes its own pooled
        connection; one ``AsyncConnection`` serves a single statement at a time."""
        return self._autocommit is not None

    def pool_in_use(self) -> object:
        """What changes when the engine is disposed (its pool: ``dispose()`` replaces it); the
        connection itself on the test path. Work a store does on its own after a caller's
        statements (an announcement, K8) is dropped when this changed since: it would make the
        disposed engine a new pool nobody disposes."""
        engine = self.database
        return engine.sync_engine.pool if isinstance(engine, AsyncEngine) else engine

    # -- the entry ------------------------------------------------------------------------------

    async def execute(
        self,
        what: str,
        statement: Executable,
        params: Mapping[str, Any] | None = None,
        *,
        scope: Within,
    ) -> None:
        """Run ONE statement whose rows nobody reads (see the class docstring)."""
        await self._one(what, statement, params, scope, _Answer.NOTHING)

    async def rows(
        self,
        what: str,
        statement: Executable,
        params: Mapping[str, Any] | None = None,
        *,
        scope: Within,
        by_name: bool = False,
    ) -> Sequence[Any]:
        """The rows of ONE statement (see the class docstring), read by position or unpacked
        (asyncpg records on the direct path, else SQLAlchemy's rows); ``by_name``: the caller
        reads columns by name, so always SQLAlchemy's rows."""
        answer = _Answer.NAMED if by_name else _Answer.ROWS
        rows: Sequence[Any] = await self._one(what, statement, params, scope, answer)
        return rows

    async def count(
        self,
        what: str,
        statement: Executable,
        params: Mapping[str, Any] | None = None,
        *,
        scope: Within,
    ) -> int:
        """The row count of ONE statement (see the class docstring)."""
        counted: int = await self._one(what, statement, params, scope, _Answer.COUNT)
        return counted

    def joins(self, scope: Within) -> bool:
        """Whether a call given ``scope`` runs in a transaction not its own (a unit of work's,
        or an open block's): what it does is undone with that transaction."""
        return self._joined(scope) is not None

    def require_joined(self, what: str, *, fix: str) -> None:
        """Refuse ``what`` outside the ambient unit of work (a fence, a joined settle, an inbox
        mark: J13), which must commit with the caller's transaction; ``fix`` says how."""
        if not self.joins(None):
            raise ConfigurationError(
                f"{what} was asked for outside a unit of work on the {self.name} store's"
                " database; it must join the handler's transaction.",
                fix=fix,
            )

    def scope_of(self, scope: Within) -> TransactionScope | None:
        """The unit of work a call given ``scope`` joins (its tenant rules the call's), or None:
        the store's own transaction (or a block of it)."""
        tx = self._joined(scope)
        return None if tx is None else tx.scope

    async def after_commit(self, scope: Within, *callbacks: AfterCommit) -> None:
        """After a call given ``scope``: run ``callbacks`` once the transaction it joined
        commits (U4), else now (its statement committed on its own). A failing callback is
        logged and stops none of the others."""
        tx = self._joined(scope)
        if tx is None:
            await run_after_commit(list(callbacks))
            return
        for callback in callbacks:
            tx.after_commit(callback)

    @asynccontextmanager
    async def transaction(self, what: str, *, scope: Within) -> AsyncIterator[Joined]:
        """A block of SEVERAL statements (see the class docstring): the transaction joined,
        else a short READ COMMITTED one of the store's own, committed when the block exits
        cleanly; its ``after_commit`` callbacks run after that commit (or the joined one's)."""
        operation = f"{self.name} {what}"
        tx = self._joined(scope)
        if tx is not None:
            with database_outage_translated(operation, driver_only=True):
                yield tx
            return
        async with self._bounded(what):
            if self._read_committed is None:
                connection = self._test_connection()
                async with self._turn, connection.begin_nested():
                    own = Joined(connection, None)
                    yield own
            elif scope is OWN:
                async with self._read_committed.begin() as connection:
                    own = Joined(connection, None)
                    yield own
            else:
                async with _own_transaction(
                    self.database, isolation_level="READ COMMITTED", operation=operation
                ) as connection:
                    own = Joined(connection, None)
                    yield own
            await run_after_commit(own._callbacks)  # noqa: SLF001 - same module

    @asynccontextmanager
    async def outside_transaction(self, what: str) -> AsyncIterator[AsyncConnection | None]:
        """An AUTOCOMMIT connection of the engine's pool, each statement its own transaction,
        for what cannot run in a transaction block (``REINDEX CONCURRENTLY``); None on the test
        path (a connection already in a transaction can run none of it). Judged by the outage
        rule but not bounded by ``operation_timeout``: an index rebuild takes as long as the
        table's scan. Session settings made on it must be reset before the block ends."""
        operation = f"{self.name} {what}"
        if self._autocommit is None:
            yield None
            return
        async with connected(self._autocommit, operation) as connection:
            with database_outage_translated(operation, driver_only=True):
                yield connection

    async def copy(
        self,
        what: str,
        copy: CopyIn,
        then: tuple[TextClause, Mapping[str, Any]] | None = None,
        *,
        scope: Within,
    ) -> bool:
        """``copy`` (a bulk insert's COPY), then ``then`` (a statement and its parameters) in
        its transaction, as the class docstring says; False (nothing done) when the path taken
        cannot run a COPY now (:attr:`~ship_sqla._direct.DirectStatements.copies`,
        :func:`~ship_sqla._direct.copy_in_transaction`): the caller inserts another way."""
        operation = f"{self.name} {what}"
        tx = self._joined(scope)
        if tx is not None:
            with database_outage_translated(operation, driver_only=True):
                return await _copy_then(tx.connection, copy, then)
        direct = self._direct
        if direct is None:
            connection = self._test_connection()
            async with self._bounded(what), self._turn, connection.begin_nested():
                return await _copy_then(connection, copy, then)
        if not direct.copies or (then is not None and not direct.usable(then[0])):
            return False
        async with self._bounded(what), _checked_out(direct, operation) as direct_connection:
            with database_outage_translated(self._cut_off(operation, scope), driver_only=True):
                await direct_connection.copy(copy, then)
        return True

    # -- the decision ---------------------------------------------------------------------------

    def _joined(self, scope: Within) -> Joined | None:
        """The transaction a call given ``scope`` joins, or None: the store's own."""
        if scope is OWN:
            return None
        if isinstance(scope, Joined):
            return scope
        if scope is None:
            scope = current_scope()
            if scope is None:
                return None
        return Joined(scope.connection, scope)  # .connection refuses a closed or foreign scope

    def _cut_off(self, operation: str, scope: Within) -> str:
        """How an autocommitted statement of the store's own cut off mid-flight is named (see
        the class docstring)."""
        if scope is OWN or self._autocommit is None:
            return operation
        return f"{operation} ({ALONE_CUT_OFF})"

    async def _one(
        self,
        what: str,
        statement: Executable,
        params: Mapping[str, Any] | None,
        scope: Within,
        answer: _Answer,
    ) -> Any:  # noqa: ANN401 - per answer
        """ONE statement, run where the class docstring says: THE decision of every store's
        one-statement calls."""
        operation = f"{self.name} {what}"
        tx = self._joined(scope)
        if tx is not None:
            with database_outage_translated(operation, driver_only=True):
                return _answered(await tx.connection.execute(statement, params), answer)
        cut_off = self._cut_off(operation, scope)
        async with self._bounded(what):
            direct = self._direct
            if (
                direct is not None
                and answer in (_Answer.NOTHING, _Answer.ROWS)
                and isinstance(statement, TextClause)
                and direct.usable(statement)
            ):
                async with _checked_out(direct, operation) as direct_connection:
                    with database_outage_translated(cut_off, driver_only=True):
                        if answer is _Answer.ROWS:
                            return await direct_connection.fetch(statement, params or {})
                        await direct_connection.execute(statement, params or {})
                        return None
            if self._autocommit is None:
                connection = self._test_connection()
                async with self._turn, connection.begin_nested():
                    return _answered(await connection.execute(statement, params), answer)
            async with connected(self._autocommit, operation) as connection:
                with database_outage_translated(cut_off, driver_only=True):
                    return _answered(await connection.execute(statement, params), answer)

    @asynccontextmanager
    async def _bounded(self, what: str) -> AsyncIterator[None]:
        """The store's own call ``what``: bounded by ``operation_timeout``, judged by the outage
        rule, and watched for a hung host (J24, :meth:`~ship_sqla._failover.Hosts.watch`)."""
        overdue = None if self._hosts is None else self._hosts.watch()
        try:
            async with self._timed(what):
                yield
        finally:
            if overdue is not None:
                overdue.cancel()

    @asynccontextmanager
    async def _timed(self, what: str) -> AsyncIterator[None]:
        operation = f"{self.name} {what}"
        if self._timeout is None:
            with database_outage_translated(operation, driver_only=True):
                yield
            return
        try:
            async with asyncio.timeout(self._timeout):
                # Inside the timeout: its own TimeoutError must stay the store's timeout error.
                with database_outage_translated(operation, driver_only=True):
                    yield
        except TimeoutError as exc:
            if isinstance(exc, DatabaseTimeoutError):
                raise
            raise self._timeout_error(
                f"{operation} did not finish within {self._timeout} s (database unreachable,"
                " overloaded, or a lock held for long).",
                fix="check the database; the work is retried on its next pass. Raise"
                " operation_timeout if such waits are expected.",
            ) from exc

    def _test_connection(self) -> AsyncConnection:
        database = self.database
        if not isinstance(database, AsyncConnection):  # pragma: no cover - by construction
            raise TypeError("a StoreConnections without an engine holds a connection")
        return database


def same_database(a: Database, b: Database) -> bool:
    """Whether ``a`` and ``b`` reach one database through one engine (a connection counts as
    its engine): what a unit of work joining another, or a store joining a unit of work,
    requires (U5, J13)."""

    def engine_of(d: Database) -> AsyncEngine:
        return d if isinstance(d, AsyncEngine) else d.engine

    return a is b or engine_of(a).sync_engine is engine_of(b).sync_engine
