"""The unit of work: one transaction per ``run``, domain repositories in, commit or rollback out.

U1 Everything the handler writes, and every ship store called inside the run, commits or rolls
   back together: they all share the scope's connection.
U3 Serialization failures and deadlocks (SQLSTATE 40001, 40P01) re-run the handler, up to
   ``max_attempts`` runs in all. Handlers must therefore be re-runnable: no external effects
   before the commit (use the outbox, or ``scope.after_commit``).
U4 ``after_commit`` callbacks run after the outermost commit only, never after a rollback.
   Those registered inside a ``savepoint=True`` run are discarded when its savepoint rolls
   back, and kept (to run after the outermost commit) when it is released.
U5 A ``run`` inside an active run joins the outer transaction (or a SAVEPOINT with
   ``savepoint=True``); it never silently opens a second connection.

J24 Every statement of a run and its COMMIT (or ROLLBACK) is bounded by the unit of work's
   ``operation_timeout``: one that does not finish in time (a server that stopped answering,
   a lock held for long) ends the run with :class:`UnitOfWorkTimeoutError`, its connection
   dropped (never handed back to the pool mid-statement). It is an operation timeout, not a
   deadline for the whole run: the handler's own waits between statements are not counted.

A database outage is :class:`~ship_sqla.errors.DatabaseUnavailableError`. A run whose pooled
connection turns out dead before any of its statements completed (a connection the server
closed while it sat in the pool, e.g. across a restart) is re-run once on a fresh connection:
no statement of it can have committed. Once a statement of the run completed, never.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, ClassVar, Final, Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._engine import create_engine
from ship_sqla._failover import Hosts, Overdue, follow_primary, hosts_of
from ship_sqla._scope import (
    Database,
    TransactionScope,
    _current,
    check_tenant,
    committed,
    connected,
    run_after_commit,
    same_database,
    tenant_within,
)
from ship_sqla._sql_errors import database_outage_translated, sqlstate_of
from ship_sqla.kernel._durations import MAX_OPERATION_TIMEOUT, require_duration
from ship_sqla.kernel._errors import (
    ConfigurationError,
    DatabaseTimeoutError,
    DatabaseUnavailableError,
    RollbackOnlyError,
)
from ship_sqla.kernel._tenancy import ambient_tenant, tenant_ambient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from sqlalchemy.engine import Connection
    from sqlalchemy.engine.interfaces import IsolationLevel

__all__ = [
    "DEFAULT_OPERATION_TIMEOUT",
    "UnitOfWork",
    "UnitOfWorkTimeoutError",
    "create_unit_of_work",
]

R = TypeVar("R")
T = TypeVar("T")

logger = logging.getLogger("ship_sqla")

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
"""serialization_failure and deadlock_detected: the transaction may succeed when re-run."""

_RUN = "uow.run"

DEFAULT_OPERATION_TIMEOUT: Final = 30.0
"""Seconds one statement, COMMIT or ROLLBACK of a ``uow.run`` may take (J24)."""


class UnitOfWorkTimeoutError(DatabaseTimeoutError):
    """A statement, the COMMIT or the ROLLBACK of a ``uow.run`` did not finish within the unit
    of work's ``operation_timeout`` (J24). The run's connection was dropped: the transaction
    was rolled back by the server, except when the COMMIT was cut off (the message says so),
    whose outcome is unknown."""

    code = "SHIP_SQLA_UOW_TIMEOUT"


_ISOLATION_LEVELS = frozenset(
    {"SERIALIZABLE", "REPEATABLE READ", "READ COMMITTED", "READ UNCOMMITTED", "AUTOCOMMIT"}
)


def _check_isolation(level: str | None) -> None:
    if level is not None and level not in _ISOLATION_LEVELS:
        raise ConfigurationError(
            f"isolation_level {level!r} is not one PostgreSQL knows.",
            fix="use one of " + ", ".join(sorted(_ISOLATION_LEVELS - {"AUTOCOMMIT"})) + ".",
        )
    if level == "AUTOCOMMIT":
        raise ConfigurationError(
            "isolation_level 'AUTOCOMMIT' would make a unit of work non-atomic.",
            fix="use 'READ COMMITTED' or stricter; autocommit work needs no unit of work.",
        )


class UnitOfWork(Generic[R]):
    """Runs handlers in one transaction each, handing them the application's repositories."""

    def __init__(
        self,
        bind: Database,
        *,
        repositories: Callable[[TransactionScope], R],
        isolation_level: IsolationLevel | None = None,
        max_attempts: int = 3,
        row_level_security: bool = False,
        operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
    ) -> None:
        if not isinstance(bind, AsyncEngine | AsyncConnection):
            raise ConfigurationError(
                "create_unit_of_work needs an AsyncEngine or AsyncConnection,"
                f" got {type(bind).__name__}.",
                fix="pass ship_sqla.create_engine(os.environ['SHIP_SQLA_DATABASE_URL']) (or the"
                " URL itself), or a connection already in a transaction.",
            )
        _check_isolation(isolation_level)
        if max_attempts < 1:
            raise ConfigurationError(
                f"max_attempts must be at least 1, got {max_attempts}.",
                fix="use 1 to disable re-running on serialization failures.",
            )
        if isinstance(bind, AsyncEngine):
            follow_primary(bind)  # J24
            if operation_timeout is not None:
                _install_clock(bind)
        self._bind = bind
        self._repositories = repositories
        self._isolation_level = isolation_level
        self._max_attempts = max_attempts
        self._row_level_security = row_level_security
        self._operation_timeout = (
            None
            if operation_timeout is None
            else require_duration(
                operation_timeout, "operation_timeout", maximum=MAX_OPERATION_TIMEOUT
            )
        )

    @property
    def bind(self) -> Database:
        return self._bind

    @property
    def connection_capacity(self) -> int | None:
        """How many runs of this unit of work can hold a connection at once: the engine pool's
        size plus its overflow (1 on a connection); None when the pool sets no bound (a
        NullPool, or unlimited overflow). A worker compares it with its transactional jobs'
        concurrency (J13)."""
        if isinstance(self._bind, AsyncConnection):
            return 1
        pool = self._bind.sync_engine.pool
        size = getattr(pool, "size", None)
        overflow = getattr(pool, "_max_overflow", None)
        if not callable(size) or not isinstance(overflow, int) or overflow < 0:
            return None
        capacity = size() + overflow
        return capacity if isinstance(capacity, int) else None

    async def run(
        self,
        handler: Callable[[R], Awaitable[T]],
        *,
        tenant: str | None = None,
        isolation_level: IsolationLevel | None = None,
        savepoint: bool = False,
    ) -> T:
        """Run ``handler(repositories)`` in one transaction and return its result.

        Commits when the handler returns, rolls back and re-raises (unchanged) when it raises.
        Re-runs the whole handler on SQLSTATE 40001/40P01 up to ``max_attempts`` (U3).
        Inside an active run on the same bind, joins it (U5); ``savepoint=True`` makes the
        nested work a SAVEPOINT that rolls back alone when the nested handler raises, taking
        the ``after_commit`` callbacks registered in it along (U4).

        A refused or lost connection raises :class:`~ship_sqla.errors.DatabaseUnavailableError`
        (the driver's error chained). On an engine, a run whose pooled connection was dead
        before any of its statements completed is re-run once on a fresh connection.
        ``tenant`` is None (no tenant) or a real tenant: ``""`` and blank are refused. A run
        opened without one inside a job handler is in the handler's run's tenant (F2); every
        run enqueued inside it records its tenant.
        """
        _check_isolation(isolation_level)
        check_tenant(tenant, operation=_RUN)
        outer = _current.get()
        if outer is not None and outer.active:
            return await self._run_nested(outer, handler, tenant=tenant, savepoint=savepoint)
        if tenant is None:
            # F2: a job handler's units of work default to its run's tenant.
            tenant = ambient_tenant()
        level = isolation_level or self._isolation_level
        attempt = 1
        fresh_connection_tried = False
        while True:
            try:
                return await self._run_once(handler, tenant=tenant, isolation_level=level)
            except _DeadBeforeFirstStatementError as dead:
                failure = dead.error
            except DBAPIError as exc:
                state = sqlstate_of(exc)
                if (
                    state not in RETRYABLE_SQLSTATES
                    or attempt >= self._max_attempts
                    or isinstance(self._bind, AsyncConnection)
                ):
                    raise
                logger.info(
                    "ship_sqla: uow.run re-running after SQLSTATE %s (attempt %d of %d)",
                    state,
                    attempt,
                    self._max_attempts,
                )
                attempt += 1
                continue
            if fresh_connection_tried:
                raise failure
            fresh_connection_tried = True
            logger.warning(
                "ship_sqla: uow.run re-running once on a fresh connection: its pooled"
                " connection was dead before any statement completed (%s)",
                failure.message,
            )

    async def _run_once(
        self,
        handler: Callable[[R], Awaitable[T]],
        *,
        tenant: str | None,
        isolation_level: IsolationLevel | None,
    ) -> T:
        hosts = hosts_of(self._bind) if isinstance(self._bind, AsyncEngine) else None
        watch = _StatementWatch(self._operation_timeout, hosts)
        try:
            async with self._transaction(isolation_level, watch) as connection:
                scope = TransactionScope(connection, database=self._bind, tenant=tenant)
                token = scope._enter()  # noqa: SLF001 - the unit of work owns the scope's lifecycle
                try:
                    if self._row_level_security:
                        await _set_tenant_setting(connection, tenant)
                    with tenant_ambient(tenant):
                        result = await handler(self._repositories(scope))
                    if scope.rollback_only:
                        raise RollbackOnlyError(
                            "a nested uow.run that joined this run raised, and this run's"
                            " handler returned anyway; the nested run's partial writes cannot be"
                            " separated from this run's, so the whole transaction was rolled"
                            " back.",
                            fix="let the nested run's exception propagate, or call it with"
                            " savepoint=True so its failure rolls back alone.",
                        ) from scope._failed_nested  # noqa: SLF001
                    await scope._flush_sessions()  # noqa: SLF001
                finally:
                    TransactionScope._exit(token)  # noqa: SLF001
                    await scope._close()  # noqa: SLF001
        except DatabaseUnavailableError as exc:
            if watch.dead_before_first_statement:
                raise _DeadBeforeFirstStatementError(exc) from exc
            raise
        await run_after_commit(scope._take_after_commit())  # noqa: SLF001
        return result

    async def _run_nested(
        self,
        outer: TransactionScope,
        handler: Callable[[R], Awaitable[T]],
        *,
        tenant: str | None,
        savepoint: bool,
    ) -> T:
        outer.check_usable()
        if not same_database(outer.database, self._bind):
            raise ConfigurationError(
                "uow.run was called inside another unit of work's run on a different database;"
                " joining is impossible and a second connection would break atomicity (U5).",
                fix="build both units of work on the same engine, or finish the outer run first.",
            )
        # A nested run keeps the outer run's tenant and may not name another: it shares the
        # outer transaction (and its row-level-security setting), so joining never widens R2.
        # An untenanted outer run may narrow to a tenant.
        nested_tenant = tenant_within(outer, tenant, operation="a nested uow.run")
        scope = outer._child(nested_tenant, savepoint=savepoint)  # noqa: SLF001
        token = scope._enter()  # noqa: SLF001
        try:
            if savepoint:
                with database_outage_translated(_RUN):
                    async with outer.connection.begin_nested():
                        with tenant_ambient(nested_tenant):
                            result = await handler(self._repositories(scope))
                        await scope._flush_sessions()  # noqa: SLF001
                # Released: its callbacks and sessions now live and die with the enclosing one.
                # Had it rolled back, they would be discarded with the scope below (U4).
                scope._released()  # noqa: SLF001
                return result
            try:
                with tenant_ambient(nested_tenant):
                    return await handler(self._repositories(scope))
            except BaseException as exc:
                # Joined work has no boundary of its own: the outer run must never commit it.
                outer._root()._failed_nested = exc  # noqa: SLF001
                raise
        finally:
            TransactionScope._exit(token)  # noqa: SLF001
            await scope._close()  # noqa: SLF001

    @asynccontextmanager
    async def _transaction(
        self, isolation_level: IsolationLevel | None, watch: _StatementWatch
    ) -> AsyncIterator[AsyncConnection]:
        if isinstance(self._bind, AsyncConnection):
            # The test path: the caller owns the outer transaction; ours is a SAVEPOINT of it.
            with database_outage_translated(_RUN, connection=self._bind):
                async with self._bind.begin_nested():
                    yield self._bind
            return
        async with connected(self._bind, _RUN) as connection:
            with watch.watching(connection):
                if isolation_level is not None:
                    await connection.execution_options(isolation_level=isolation_level)
                # driver_only=False: the block runs the application's handler, whose own
                # OSErrors (its network calls) are not outages and pass unchanged.
                async with watch.bounded(), committed(connection, _RUN, driver_only=False):
                    yield connection


class _StatementWatch:
    """Counts the run's statements that completed, via SQLAlchemy's ``after_cursor_execute``
    event on the run's own connection (one listener per run, removed when it ends), and bounds
    each statement, COMMIT and ROLLBACK of the run (J24): the engine's ``before_cursor_execute``,
    ``commit`` and ``rollback`` listeners (:class:`_Arm`) arm the run's ``asyncio.timeout``
    (:meth:`bounded`) for ``timeout`` seconds, ``after_cursor_execute`` disarms it. A
    statement that raises leaves it armed until the next statement (a savepoint's ROLLBACK TO
    included) or the run's end.

    A run that fails with an outage while the count is 0 on a connection it got from the pool
    had a dead connection before its first statement (with asyncpg, the failure is the BEGIN
    sent ahead of that statement): nothing of it can have committed, so it may be re-run.
    """

    __slots__ = (
        "__weakref__",
        "_bound",
        "_hosts",
        "_overdue",
        "_timeout",
        "completed",
        "connected",
        "ending",
    )
    ship_sqla_own_listener: ClassVar[bool] = True
    """:data:`ship_sqla._direct.OWN_LISTENER`: a bulk's COPY (which it does not see) runs only
    after a statement it counted, so its count needs no COPY."""

    def __init__(self, timeout: float | None = None, hosts: Hosts | None = None) -> None:
        self.completed = 0
        self.connected = False
        self.ending: str | None = None
        """"COMMIT" or "ROLLBACK" once the run's transaction is ending."""
        self._timeout = timeout
        self._bound: asyncio.Timeout | None = None
        self._hosts = hosts
        """J24: the engine's hosts, whose hang check an armed statement keeps (:meth:`arm`)."""
        self._overdue: Overdue | None = None

    def __call__(self, *_: object) -> None:
        self.completed += 1
        self._unwatch()
        bound = self._bound
        if bound is not None and not bound.expired():
            bound.reschedule(None)

    def arm(self, ending: str | None = None) -> None:
        """Start the clock of one statement (or of the COMMIT / ROLLBACK: ``ending``)."""
        bound = self._bound
        if bound is None or self._timeout is None or bound.expired():
            return  # no bound, or it already cut the run off (its ROLLBACK is not timed)
        if ending is not None:
            self.ending = ending
        bound.reschedule(asyncio.get_running_loop().time() + self._timeout)
        if self._hosts is not None and self._overdue is None:
            self._overdue = self._hosts.watch()  # J24: a statement that waits checks its host

    def _unwatch(self) -> None:
        overdue, self._overdue = self._overdue, None
        if overdue is not None:
            overdue.cancel()

    @asynccontextmanager
    async def bounded(self) -> AsyncIterator[None]:
        """The run's statement clock (see the class docstring): a statement, COMMIT or
        ROLLBACK cut off by it raises :class:`UnitOfWorkTimeoutError`."""
        if self._timeout is None:
            yield
            return
        bound = asyncio.timeout(None)
        try:
            async with bound:
                self._bound = bound
                try:
                    yield
                finally:
                    self._bound = None
                    self._unwatch()
        except TimeoutError as exc:
            if isinstance(exc, DatabaseTimeoutError) or not bound.expired():
                raise
            raise _timed_out(self.ending, self._timeout) from exc

    @property
    def dead_before_first_statement(self) -> bool:
        return self.connected and self.completed == 0

    @contextmanager
    def watching(self, connection: AsyncConnection) -> Iterator[None]:
        target = connection.sync_connection
        assert target is not None  # noqa: S101 - a started connection
        self.connected = True
        info = target.info if self._timeout is not None else None
        if info is not None:
            info[_WATCH] = self  # what the engine's _Arm listeners arm
        event.listen(target, "after_cursor_execute", self)
        try:
            yield
        finally:
            event.remove(target, "after_cursor_execute", self)
            if info is not None and info.get(_WATCH) is self:
                del info[_WATCH]


class _Arm:
    """An engine listener (installed once per engine, :func:`_install_clock`) that arms the
    statement clock of the run whose connection it fires on (its :class:`_StatementWatch` in the
    connection's ``info`` while the run watches): before each statement (``ending`` None), or
    before the COMMIT or ROLLBACK (the ``commit`` / ``rollback`` events)."""

    __slots__ = ("__weakref__", "_ending")
    ship_sqla_own_listener: ClassVar[bool] = True
    """:data:`ship_sqla._direct.OWN_LISTENER`: it keeps no statement off the direct path."""

    def __init__(self, ending: str | None) -> None:
        self._ending = ending

    def __call__(self, conn: Connection, *args: object) -> object:
        if not conn.invalidated:
            watch = conn.info.get(_WATCH)
            if watch is not None:
                watch.arm(self._ending)
        # before_cursor_execute is listened with retval=True (unwrapped, so the OWN_LISTENER
        # mark stays visible): it hands back the statement and parameters unchanged.
        return args[1:3] if self._ending is None else None


_WATCH: Final = "ship_sqla_statement_watch"
"""The connection ``info`` key of the run's :class:`_StatementWatch` while it watches."""

_ARMS: Final = {
    "before_cursor_execute": _Arm(None),
    "commit": _Arm("COMMIT"),
    "rollback": _Arm("ROLLBACK"),
}


def _install_clock(engine: AsyncEngine) -> None:
    """The statement clock's listeners on ``engine``, once (J24)."""
    target = engine.sync_engine
    for name, arm in _ARMS.items():
        if not event.contains(target, name, arm):
            event.listen(target, name, arm, retval=name == "before_cursor_execute")


def _timed_out(ending: str | None, timeout: float) -> UnitOfWorkTimeoutError:
    if ending == "COMMIT":
        what = "its COMMIT was cut off: the work may or may not have committed"
    else:
        what = f"a {'ROLLBACK' if ending else 'statement'} was cut off: nothing of it committed"
    return UnitOfWorkTimeoutError(
        f"uow.run did not finish an operation within its operation_timeout of {timeout:g} s"
        f" (the database stopped answering, is overloaded, or a lock is held for long); {what}."
        " Its connection was dropped.",
        fix="check the database, then retry the work (handlers are re-runnable, U3). Raise"
        " create_unit_of_work(operation_timeout=...) if statements this long are expected.",
    )


class _DeadBeforeFirstStatementError(Exception):
    """Internal: ``error`` ended a run whose connection died before any statement completed."""

    def __init__(self, error: DatabaseUnavailableError) -> None:
        super().__init__(error.message)
        self.error = error


async def _set_tenant_setting(connection: AsyncConnection, tenant: str | None) -> None:
    from ship_sqla._sql import TABLELESS  # noqa: PLC0415 - keeps RLS optional
    from ship_sqla._sql.rls import SET_TENANT_SETTING  # noqa: PLC0415 - keeps RLS optional

    await connection.execute(TABLELESS[SET_TENANT_SETTING], {"tenant": tenant or ""})


def create_unit_of_work(
    bind: Database | str | URL,
    *,
    repositories: Callable[[TransactionScope], R],
    isolation_level: IsolationLevel | None = None,
    max_attempts: int = 3,
    row_level_security: bool = False,
    operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
) -> UnitOfWork[R]:
    """Build a unit of work over ``bind``: an ``AsyncEngine``, a connection in a transaction, or
    a database URL (``postgresql://`` or ``postgresql+asyncpg://`` alike, as ``ship-sqla``
    reads it), for which :func:`ship_sqla.create_engine` builds the engine (``uow.bind``;
    dispose it at shutdown).

    ``repositories(scope)`` builds the application's domain repositories for one scope; handlers
    see only what it returns. ``isolation_level`` applies to every run unless a run overrides it;
    ``max_attempts`` bounds re-runs on serialization failures and deadlocks (U3).
    ``row_level_security=True`` sets ``ship.tenant_id`` at the start of each run (see
    :func:`ship_sqla.schema.tenant_policy_ddl`).
    ``operation_timeout`` (J24; seconds, default 30; None: no bound): how long any one
    statement, COMMIT or ROLLBACK of a run may take before :class:`UnitOfWorkTimeoutError` (its
    connection dropped); the handler's own time between statements is not counted (a job's
    handler is bounded by its job's ``timeout``). Not applied on a connection (the test path).
    """
    if isinstance(bind, str | URL):
        bind = create_engine(bind)
    return UnitOfWork(
        bind,
        repositories=repositories,
        isolation_level=isolation_level,
        max_attempts=max_attempts,
        row_level_security=row_level_security,
        operation_timeout=operation_timeout,
    )
