"""One autocommitted Core statement run straight on a pooled asyncpg connection of an engine.

Why: a store's one-statement operation outside any unit of work (a plain job enqueue) cost
about 600 µs of CPU through ``AsyncConnection.execute`` on a pooled autocommit connection, and
costs about 210 µs this way (a held asyncpg connection: 150 µs; BENCHMARKS.md, "Issue 13
leftovers"): the difference is SQLAlchemy's ``Connection`` (its setup and return,
characteristics and events) and its execute path, not round trips. The same holds for the
job backend's claim, settle and heartbeat, each one autocommitted statement whose rows the
backend reads by position: SQLAlchemy's ``Row`` per returned row (about 2 µs each) came on top
of the driver's record. :class:`DirectStatements` keeps what matters of that path and skips
the rest:

- the SQL is SQLAlchemy Core's: each statement is compiled ONCE by the engine's own dialect
  (the text SQLAlchemy would send) and its parameters are put in the compiled positional
  order; only statements whose parameters SQLAlchemy sends unprocessed (untyped ``text()``
  binds, as every store statement is) are taken;
- the connection is the engine's pool's (``AsyncEngine.raw_connection``: its size, timeout,
  pre-ping, recycling and pool events), returned to it afterwards; nothing is begun on it, so
  the statement autocommits, as on an ``AUTOCOMMIT`` connection. A connection whose statement
  ended cleanly is kept until the event loop's next turn (:meth:`DirectStatements.keep`): a
  statement that the same code runs right after (back-to-back enqueues) takes it again
  without the pool's checkout and return (about 80 µs of a single enqueue's ~600 µs,
  BENCHMARKS.md "Session 9"), and without a pre-ping (as the pool skips one for a connection
  it has just made); at the next turn it goes back to the pool. Only on a
  ``QueuePool`` (the default) that nobody watches (no ``checkout``, ``checkin`` or ``reset``
  listener: they see every checkout), and only while the pool still holds it as valid (not
  invalidated, hard or soft, since it was checked out; not disposed). Returning a connection
  to its pool does I/O whenever the pool closes it (a ``NullPool`` always; a full
  ``QueuePool`` its overflow connections; a disposed engine's old pool, or a lost socket,
  none may have back): the asyncpg adapter's ``close`` then needs SQLAlchemy's greenlet, so
  such a return runs inside ``greenlet_spawn``, to completion even when its caller is
  cancelled (:meth:`DirectStatements.check_in`); a return the pool only queues stays a
  plain call (no I/O, no greenlet: the hot path);
- the statement runs with asyncpg's ``execute`` (or ``fetch``, for its rows), which honours
  the connection's ``statement_cache_size`` (0 behind PgBouncer: every statement unnamed,
  re-parsed in the round trip that runs it, exactly as SQLAlchemy's adapter does with both
  caches off);
- errors are what ``Connection.execute`` raises: the asyncpg adapter's own translation, then
  ``DBAPIError.instance`` (``sqlalchemy.exc.ProgrammingError``, ``IntegrityError``, ... with
  ``orig``, the SQLSTATE, the statement and its parameters); a disconnect marks the error
  ``connection_invalidated`` and invalidates the connection and the pool's older ones, an
  interrupted statement (cancelled, timed out) invalidates its connection, anything that is
  not the driver's passes unchanged; a refused connect is wrapped as ``Engine.connect`` does.

It is used only while nothing watches the engine's statements: an engine with statement
listeners (``before_cursor_execute``, ``after_cursor_execute``, ``before_execute``,
``after_execute``, ``handle_error``: instrumentation, statement counters) or statement logging
(``echo``, the ``sqlalchemy.engine`` logger at INFO) takes ``AsyncConnection.execute``, so they
see every statement. :meth:`DirectStatements.usable` says which, per call (listeners come and
go). The same path runs a bulk insert's ``COPY ... FROM STDIN`` (:class:`CopyIn`): on a pooled
connection outside any unit of work (:meth:`DirectConnection.copy`), or as one statement of a
transaction SQLAlchemy began (:func:`copy_in_transaction`). The SQLAlchemy internals it mirrors
(the adapter's ``_handle_exception`` and
``_check_type_cache_invalidation``, the dialect's ``_invalidate_schema_cache_asof`` and
``Pool._invalidate``) are checked once, when it is made: a SQLAlchemy without them gets no
direct path, only the usual one; one without those a kept connection is checked against (a
connection record's ``starttime`` and ``_soft_invalidate_time``, the pool's
``_invalidate_time``: ``_KEPT_MIRRORED``) keeps no connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final, NoReturn

import attrs
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import Pool, QueuePool
from sqlalchemy.pool.base import _ConnectionFairy, _ConnectionRecord
from sqlalchemy.sql.sqltypes import NullType
from sqlalchemy.util import greenlet_spawn

from ship_sqla._sql_errors import server_read_only

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping

    import asyncpg
    from sqlalchemy import Dialect, Engine, TextClause
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
    from sqlalchemy.pool import PoolProxiedConnection

__all__ = [
    "OWN_LISTENER",
    "CopyIn",
    "DirectConnection",
    "DirectStatements",
    "copy_in_transaction",
    "copy_text",
]

_WATCHING_EVENTS: Final = (
    "before_cursor_execute",
    "after_cursor_execute",
    "before_execute",
    "after_execute",
)
"""The engine's statement events: with any listener, statements take SQLAlchemy's path."""

_MIRRORED: Final = (
    (AsyncAdapt_asyncpg_connection, "_handle_exception"),
    (AsyncAdapt_asyncpg_connection, "_check_type_cache_invalidation"),
    (Pool, "_invalidate"),
)
"""The SQLAlchemy internals the direct path calls to behave as ``Connection.execute`` does."""

_KEPT_MIRRORED: Final = (
    (_ConnectionFairy, "_connection_record"),
    (_ConnectionRecord, "starttime"),
    (_ConnectionRecord, "_soft_invalidate_time"),
)
"""The SQLAlchemy internals a kept connection is checked against before it is taken again, as
the pool's own checkout checks them (with the pool's ``_invalidate_time``)."""

_POOL_WATCHING_EVENTS: Final = ("checkout", "checkin", "reset")
"""The pool's events a kept connection would skip: with any listener, every statement checks
its connection out of the pool and back."""


def _supported(dialect: Dialect) -> bool:
    dbapi = dialect.loaded_dbapi
    return (
        dialect.driver == "asyncpg"
        and dialect.paramstyle == "numeric_dollar"
        and hasattr(dialect, "_invalidate_schema_cache_asof")
        and hasattr(dbapi, "InvalidCachedStatementError")
        and hasattr(dbapi, "InternalServerError")
        and all(hasattr(owner, name) for owner, name in _MIRRORED)
    )


OWN_LISTENER: Final = "ship_sqla_own_listener"
"""An attribute (true) on a listener of ship_sqla's own that only counts statements (a unit of
work's watch): it does not need to see a COPY, so it does not keep one off."""


def _watched(dispatch: Any, sync_engine: Engine) -> bool:  # noqa: ANN401 - an event dispatcher
    """Whether anyone watches the statements run through ``dispatch`` (an engine's or a
    connection's, which joins its engine's): statement listeners, an error hook, or statement
    logging. Then every statement takes SQLAlchemy's path, so they all see it. A listener
    marked :data:`OWN_LISTENER` does not count."""
    for name in _WATCHING_EVENTS:
        listeners = getattr(dispatch, name)
        # Most engines have none: the empty collection's truth test skips the iteration.
        if listeners and any(not getattr(listener, OWN_LISTENER, False) for listener in listeners):
            return True
    errors = sync_engine.dialect.dispatch.handle_error
    if errors and any(not getattr(listener, OWN_LISTENER, False) for listener in errors):
        return True
    return bool(sync_engine.echo or sync_engine.logger.isEnabledFor(logging.INFO))


@attrs.frozen
class CopyIn:
    """Rows for ``COPY <table> (<columns>) FROM STDIN (FORMAT text)``: ``chunks()`` yields the
    COPY text (tab-separated fields, ``\\N`` for NULL, backslash escapes; :func:`copy_text`),
    whole lines per chunk, afresh at each call. Each chunk is on the wire before the next is
    made, so the server stores the first rows while the client formats the rest. Making a
    chunk must not fail (its rows were checked before): an error mid-COPY aborts it, and
    asyncpg then sends a cancel request. ``schema`` None: the connection's search path."""

    table: str
    schema: str | None
    columns: tuple[str, ...]
    chunks: Callable[[], Iterable[bytes]]

    @property
    def sql(self) -> str:
        """The statement, as errors and logs name it."""
        name = f"{self.schema}.{self.table}" if self.schema else self.table
        return f"COPY {name} ({', '.join(self.columns)}) FROM STDIN (FORMAT text)"


def copy_text(value: str) -> str:
    """``value`` as one field of COPY's text format: backslash, tab, newline and carriage return
    escaped (every other character stands for itself)."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


async def _streamed(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _copy_on(driver: asyncpg.Connection[Any], copy: CopyIn) -> None:
    await driver.copy_to_table(
        copy.table,
        # An async iterable: asyncpg sends each chunk as it comes (a bytes source would be read
        # as a path, a file-like one in the executor).
        source=_streamed(copy.chunks()),
        columns=list(copy.columns),
        schema_name=copy.schema,
        format="text",
    )


async def copy_in_transaction(connection: AsyncConnection, copy: CopyIn) -> bool:
    """Run ``copy`` on the asyncpg connection under ``connection`` (a unit of work's, or a
    store's own transaction), as one more statement of its transaction; False (nothing done)
    when it cannot: another driver or SQLAlchemy, someone watching the statements (see
    :func:`_watched`), or no transaction begun on the driver yet (SQLAlchemy begins lazily,
    and a COPY outside it would commit on its own). Errors are what ``Connection.execute``
    raises for the same failure, without invalidating the connection (its owner's rollback or
    next statement does that, as for any statement of the transaction)."""
    sync_connection = connection.sync_connection
    sync_engine = connection.sync_engine
    if sync_connection is None or not _supported(sync_engine.dialect):
        return False
    if _watched(sync_connection.dispatch, sync_engine):
        return False
    raw = await connection.get_raw_connection()
    driver: asyncpg.Connection[Any] | None = raw.driver_connection
    if driver is None or not driver.is_in_transaction():
        return False
    adapted: Any = raw.dbapi_connection
    try:
        await adapted._check_type_cache_invalidation(  # noqa: SLF001 - see the module doc
            sync_engine.dialect._invalidate_schema_cache_asof  # type: ignore[attr-defined]  # noqa: SLF001
        )
        await _copy_on(driver, copy)
    except Exception as error:  # noqa: BLE001 - translated or re-raised, never dropped
        _raise_translated(sync_engine, raw, copy.sql, (), error, invalidate=False)
    except BaseException as error:
        # Interrupted mid-COPY: the connection's protocol state is unknown; it is discarded
        # (its owner's rollback then finds it invalidated, as after a lost connection).
        raw.invalidate(error)
        raise
    return True


class _Compiled:
    """One statement as the engine's dialect renders it, and its parameters' order."""

    __slots__ = ("names", "sql")

    def __init__(self, sql: str, names: tuple[str, ...]) -> None:
        self.sql = sql
        self.names = names


class DirectStatements:
    """Statements of one engine run on its pooled asyncpg connections (see the module
    docstring). Compiled statements are cached per statement object: give it the stable
    statements of a store (rendered once), never one built per call."""

    __slots__ = (
        "_compiled",
        "_engine",
        "_keeping",
        "_kept",
        "_kept_pool",
        "_kept_turn",
        "_queue_visible",
        "_returning",
        "_supported",
    )

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._supported = _supported(engine.dialect)
        self._keeping = (
            self._supported
            and all(hasattr(owner, name) for owner, name in _KEPT_MIRRORED)
            and hasattr(engine.sync_engine.pool, "_invalidate_time")
        )
        """Whether :meth:`keep` may keep a connection at all (the internals it checks exist)."""
        self._compiled: dict[TextClause, _Compiled | None] = {}
        self._kept: PoolProxiedConnection | None = None
        """The connection :meth:`keep` holds until the loop's next turn, else None."""
        self._kept_pool: Pool | None = None
        """The pool ``_kept`` came from (an engine's dispose replaces its pool)."""
        self._kept_turn = 0
        """Counts :meth:`keep`: a give-back scheduled by an earlier keep does nothing."""
        self._queue_visible = hasattr(engine.sync_engine.pool, "_pool")
        """Whether a ``QueuePool``'s queue can be read (:func:`_queues`); else every return
        takes the greenlet."""
        self._returning: set[asyncio.Task[None]] = set()
        """Returns to the pool under way in tasks of their own (see :meth:`check_in`)."""

    def usable(self, statement: TextClause) -> bool:
        """Whether a checked-out connection may run ``statement`` now: a supported SQLAlchemy
        and driver, parameters SQLAlchemy would send unprocessed, and nobody watching the
        engine's statements (listeners or statement logging)."""
        if not self._supported or self.compiled(statement) is None:
            return False
        sync_engine = self._engine.sync_engine
        return not _watched(sync_engine.dispatch, sync_engine)

    @property
    def copies(self) -> bool:
        """Whether :meth:`DirectConnection.copy` may run now: a supported SQLAlchemy and driver,
        and nobody watching the engine's statements (as :meth:`usable`)."""
        sync_engine = self._engine.sync_engine
        return self._supported and not _watched(sync_engine.dispatch, sync_engine)

    def compiled(self, statement: TextClause) -> _Compiled | None:
        """``statement`` compiled by the engine's dialect (once), or None when SQLAlchemy would
        process one of its parameters (a typed bind) and so the direct path cannot run it."""
        try:
            return self._compiled[statement]
        except KeyError:
            pass
        compiled = statement.compile(dialect=self._engine.dialect)
        names = tuple(compiled.positiontup or ())
        plain = all(isinstance(compiled.binds[name].type, NullType) for name in names)
        entry = _Compiled(str(compiled), names) if plain else None
        self._compiled[statement] = entry
        return entry

    async def checkout(self) -> DirectConnection:
        """A connection of the engine's pool (the one :meth:`keep` holds, while the pool still
        holds it as valid); the caller must :meth:`DirectConnection.close` it, or
        :meth:`DirectConnection.release` it after a clean end. A driver error opening it is
        wrapped as ``Engine.connect`` wraps it (a refused socket is an ``OSError``, which
        passes unchanged, as it does there)."""
        kept = self._kept
        if kept is not None:
            self._kept = None
            pool = self._kept_pool
            if pool is not None and await self._reusable(kept, pool):
                return DirectConnection(self, kept, pool)
        engine = self._engine.sync_engine
        dialect = engine.dialect
        # Read before the checkout: a dispose() meanwhile makes this connection's pool an old
        # one, which check_in then closes it for.
        pool = engine.pool
        try:
            connection = await self._engine.raw_connection()
        except dialect.loaded_dbapi.Error as error:
            raise DBAPIError.instance(
                None,
                None,
                error,
                dialect.loaded_dbapi.Error,
                hide_parameters=engine.hide_parameters,
                connection_invalidated=dialect.is_disconnect(error, None, None),
                dialect=dialect,
            ) from error
        return DirectConnection(self, connection, pool)

    async def keep(self, connection: PoolProxiedConnection, pool: Pool) -> None:
        """Hold ``connection`` (of ``pool``), whose statement ended cleanly, until the event
        loop's next turn, for :meth:`checkout` to take again; then return it to the pool.
        Returned at once (:meth:`check_in`) when the pool is not a ``QueuePool``, when a pool
        listener watches checkouts (see the module docstring), or when another connection is
        already kept."""
        if self._kept is not None or not self._keeping or not _keeps(pool):
            await self.check_in(connection, pool)
            return
        self._kept, self._kept_pool = connection, pool
        self._kept_turn += 1
        asyncio.get_running_loop().call_soon(self._give_back, self._kept_turn)

    def _give_back(self, turn: int) -> None:
        """The loop's next turn after :meth:`keep`: the kept connection goes back to its pool
        (:meth:`_return`; in a task of its own when that is I/O)."""
        kept, pool = self._kept, self._kept_pool
        if kept is None or pool is None or turn != self._kept_turn:
            return
        self._kept = None
        self._return(kept, pool)

    async def check_in(self, connection: PoolProxiedConnection, pool: Pool) -> None:
        """Return ``connection``, checked out of ``pool``, for good (:meth:`_return`), to
        completion even when the caller is cancelled."""
        returning = self._return(connection, pool)
        if returning is not None:
            await asyncio.shield(returning)

    def _return(self, connection: PoolProxiedConnection, pool: Pool) -> asyncio.Task[None] | None:
        """Start returning ``connection``, checked out of ``pool``: queued in the pool when the
        pool keeps it (a plain call, no I/O: None); else a task of its own (held until done)
        closing it inside SQLAlchemy's greenlet (a ``NullPool``, a full ``QueuePool``'s
        overflow connection, a pool listener that may do I/O), or invalidating it when no pool
        may have it back (:meth:`_lost`: the engine was disposed since, or its socket closed;
        the old pool would hold it open)."""
        if connection.dbapi_connection is None:
            # Invalidated: its driver connection is already terminated, nothing to close.
            connection.close()
            return None
        lost = self._lost(connection, pool)
        if not lost and self._queues(pool):
            connection.close()  # no I/O: the pool queues it
            return None
        way = connection.invalidate if lost else connection.close
        task = asyncio.get_running_loop().create_task(greenlet_spawn(way))
        self._returning.add(task)
        task.add_done_callback(self._returning.discard)
        return task

    async def returned(self) -> None:
        """Wait until every return to the pool under way in a task of its own is done (a kept
        connection's give-back that needed I/O, or one whose caller was cancelled)."""
        while self._returning:
            await asyncio.gather(*self._returning, return_exceptions=True)

    def _lost(self, connection: PoolProxiedConnection, pool: Pool) -> bool:
        """Whether no pool may have ``connection`` back: its engine was disposed since it was
        checked out (its old pool would hold it open), or its socket closed."""
        driver: asyncpg.Connection[Any] | None = connection.driver_connection
        return pool is not self._engine.sync_engine.pool or driver is None or driver.is_closed()

    def _queues(self, pool: Pool) -> bool:
        """Whether ``pool`` takes a connection back without I/O now: a ``QueuePool`` that no
        listener watches (:func:`_keeps`) with room in its queue (a full one closes the
        connection: an overflow one)."""
        return self._queue_visible and _keeps(pool) and not pool._pool.full()  # type: ignore[attr-defined]  # noqa: SLF001 - checked in __init__

    async def _reusable(self, kept: PoolProxiedConnection, pool: Pool) -> bool:
        """Whether the pool would hand ``kept`` out as it is (True), else ``kept`` is returned
        (:meth:`check_in`): a lost one closed, one the pool has invalidated (hard or soft)
        since it was checked out given back, for the pool to replace at a checkout, as its
        own checkout does (``_ConnectionRecord.get_connection``). (It is valid: only a clean
        end keeps a connection, and nothing else holds it meanwhile.)"""
        if not self._lost(kept, pool):
            record: Any = kept._connection_record  # noqa: SLF001 - _KEPT_MIRRORED
            started = record.starttime
            invalidated: Any = pool
            if invalidated._invalidate_time <= started and record._soft_invalidate_time <= started:  # noqa: SLF001 - _KEPT_MIRRORED
                return True
        await self.check_in(kept, pool)
        return False

    def dialect_schema_time(self) -> float:
        """When the dialect last saw DDL that may outdate asyncpg's type caches."""
        return float(self._engine.dialect._invalidate_schema_cache_asof)  # type: ignore[attr-defined]  # noqa: SLF001

    def raise_translated(
        self, connection: PoolProxiedConnection, sql: str, args: tuple[Any, ...], error: Exception
    ) -> NoReturn:
        """Raise what ``Connection.execute`` raises for ``error``, raised by the driver running
        ``sql`` on ``connection`` (see the module docstring): an error that is not the driver's
        comes out of the adapter's translation unchanged."""
        _raise_translated(self._engine.sync_engine, connection, sql, args, error, invalidate=True)


def _raise_translated(
    engine: Engine,
    connection: PoolProxiedConnection,
    sql: str,
    args: tuple[Any, ...],
    error: Exception,
    *,
    invalidate: bool,
) -> NoReturn:
    """See :meth:`DirectStatements.raise_translated`; ``invalidate``: on a disconnect, replace
    ``connection`` and the pool's older ones here (a connection nobody else holds), else leave
    that to the connection's owner."""
    dialect = engine.dialect
    dbapi = dialect.loaded_dbapi
    adapted: Any = connection.dbapi_connection
    try:
        adapted._handle_exception(error)  # noqa: SLF001 - the adapter's own translation
    except dbapi.Error as translated:
        # J24: a write refused by a read-only server is a disconnect, as ship_sqla's
        # handle_error listener (ship_sqla._failover) makes it on SQLAlchemy's path.
        disconnect = dialect.is_disconnect(translated, adapted, None) or server_read_only(
            translated, connection.driver_connection
        )
        wrapped = DBAPIError.instance(
            sql,
            args,
            translated,
            dbapi.Error,
            hide_parameters=engine.hide_parameters,
            connection_invalidated=disconnect,
            dialect=dialect,
            ismulti=False,
        )
        stale = (dbapi.InvalidCachedStatementError, dbapi.InternalServerError)
        if isinstance(translated, stale):
            dialect._invalidate_schema_cache()  # type: ignore[attr-defined]  # noqa: SLF001
        if disconnect and invalidate:
            # As Connection.execute on a disconnect: this connection, and the pool's
            # connections older than now, are replaced.
            engine.pool._invalidate(connection, translated)  # noqa: SLF001
        raise wrapped from translated
    raise error  # pragma: no cover - the adapter's translation always raises


def _keeps(pool: Pool) -> bool:
    """Whether a connection of ``pool`` may be kept between statements (see
    :meth:`DirectStatements.keep`): a ``QueuePool`` no listener watches checkouts of."""
    if not isinstance(pool, QueuePool):
        return False
    dispatch = pool.dispatch
    return not any(getattr(dispatch, name) for name in _POOL_WATCHING_EVENTS)


def _cannot_run() -> NoReturn:
    raise TypeError("DirectConnection.copy then a statement it cannot run")


class DirectConnection:
    """One checked-out pooled connection of :class:`DirectStatements`; not safe for concurrent
    tasks (one statement at a time, as any connection)."""

    __slots__ = ("_connection", "_pool", "_statements")

    def __init__(
        self, statements: DirectStatements, connection: PoolProxiedConnection, pool: Pool
    ) -> None:
        self._statements = statements
        self._connection = connection
        self._pool = pool

    async def close(self) -> None:
        """Return the connection to the pool (an invalidated one is replaced there), as
        :meth:`DirectStatements.check_in` does. Nothing was begun on it: the pool's reset has
        nothing to roll back."""
        await self._statements.check_in(self._connection, self._pool)

    async def release(self) -> None:
        """After a statement that ended cleanly: keep the connection for the next statement of
        this turn of the event loop, else return it to the pool
        (:meth:`DirectStatements.keep`). After an error, :meth:`close` it instead."""
        await self._statements.keep(self._connection, self._pool)

    async def execute(self, statement: TextClause, params: Mapping[str, Any]) -> None:
        """Run ``statement`` (one whose rows nobody needs) with ``params``, autocommitted. Only
        for a statement :meth:`DirectStatements.usable` accepted."""
        await self._run(statement, params, rows=False)

    async def fetch(self, statement: TextClause, params: Mapping[str, Any]) -> list[asyncpg.Record]:
        """Run ``statement`` with ``params``, autocommitted, and return its rows: asyncpg
        records, read by position or column name (values as SQLAlchemy's untyped ``text()``
        columns give them: the driver's, JSON decoded by the dialect's codecs on the
        connection). Only for a statement :meth:`DirectStatements.usable` accepted."""
        return await self._run(statement, params, rows=True)

    async def _run(
        self, statement: TextClause, params: Mapping[str, Any], *, rows: bool
    ) -> list[asyncpg.Record]:
        statements = self._statements
        compiled = statements.compiled(statement)
        if compiled is None:  # pragma: no cover - usable() said no: a caller's mistake
            raise TypeError("DirectConnection.execute of a statement it cannot run")
        args = tuple([params[name] for name in compiled.names])
        connection = self._connection
        adapted: Any = connection.dbapi_connection
        driver: asyncpg.Connection[Any] = connection.driver_connection
        try:
            # As the adapter before each statement: asyncpg's type cache is reloaded after DDL
            # the dialect saw (``_invalidate_schema_cache``).
            await adapted._check_type_cache_invalidation(  # noqa: SLF001 - see the module doc
                statements.dialect_schema_time()
            )
            if rows:
                records: list[asyncpg.Record] = await driver.fetch(compiled.sql, *args)
                return records
            await driver.execute(compiled.sql, *args)
        except Exception as error:  # noqa: BLE001 - translated or re-raised, never dropped
            statements.raise_translated(connection, compiled.sql, args, error)
        except BaseException as error:
            # As Connection.execute: a statement interrupted mid-flight (cancelled, timed out)
            # leaves the connection in an unknown protocol state: it is discarded.
            connection.invalidate(error)
            raise
        return []

    async def copy(
        self, copy: CopyIn, then: tuple[TextClause, Mapping[str, Any]] | None = None
    ) -> None:
        """Run ``copy`` autocommitted (it commits when the data is in); with ``then`` (a
        statement :meth:`DirectStatements.usable` accepted, and its parameters), both in one
        transaction. Only while :attr:`DirectStatements.copies` says so. Errors and
        interruptions as :meth:`execute`."""
        statements = self._statements
        connection = self._connection
        adapted: Any = connection.dbapi_connection
        driver: asyncpg.Connection[Any] = connection.driver_connection
        sql = copy.sql
        try:
            await adapted._check_type_cache_invalidation(  # noqa: SLF001 - see the module doc
                statements.dialect_schema_time()
            )
            if then is None:
                await _copy_on(driver, copy)
                return
            statement, params = then
            compiled = statements.compiled(statement)
            if compiled is None:  # pragma: no cover - usable() said no: a caller's mistake
                _cannot_run()
            async with driver.transaction():
                await _copy_on(driver, copy)
                sql = compiled.sql
                await driver.execute(sql, *[params[name] for name in compiled.names])
        except Exception as error:  # noqa: BLE001 - translated or re-raised, never dropped
            statements.raise_translated(connection, sql, (), error)
        except BaseException as error:
            connection.invalidate(error)
            raise
