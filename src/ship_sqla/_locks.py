"""PostgreSQL advisory locks as the kernel ``LockProvider`` (L1, L2).

A lock is ``pg_try_advisory_xact_lock`` taken inside a transaction on a connection dedicated to
that lock: the transaction stays open while the lock is held, and rolling it back (``release``,
or the local lease timer) frees the lock. Transaction-level locks, not session-level ones, so the
provider also works behind PgBouncer in transaction pooling mode.

L1 At most one holder per key across every process on the database. The lock is freed at
   ``release()``, when the lease timer fires, and when the holding process dies (PostgreSQL ends
   the dead session's transaction).
L2 PostgreSQL advisory locks never expire on their own: the lease is enforced by the holder's
   clock. ``lock.lost`` turns true the moment the lease ends, and the timer then rolls the
   transaction back. The pause hazard: a holder that is paused, not killed, past its lease (a
   stop-the-world pause, a suspended container) may still believe it holds a lock that another
   process now has. Check ``lost`` before acting on what the lock protects, and fence writes
   with something the database checks (the job backend's run token does exactly that, J5).

Keys share ONE 64-bit space per database with every other user of advisory locks. A key is
hashed with its namespace: the lock id is the first 8 bytes of
``sha256(namespace + "\\x00" + key)`` read as a big-endian signed int64
(:func:`advisory_lock_key`), so two libraries (or two applications on one database) collide only
by a 2**-64 chance as long as their namespaces differ.

``acquire`` raises :class:`~ship_sqla.errors.DatabaseUnavailableError` when the database cannot
be reached or the connection is lost while taking the lock (the outage rule of
:mod:`ship_sqla._sql_errors`); nothing is held then. A lock whose session dies later is reported
through ``lost`` and ``extend`` (False), never by raising.

F4 Fences: with a fence table (``ship_lock_fences_table``, passed as ``fence_table=``),
   ``with_lock(key, ttl)`` draws the key's next fence in a short transaction of its own (so it
   is durable before the holder writes) and ``check_fence(key, fence)`` runs in the write's own
   transaction: it reads the key's newest fence ``FOR SHARE``, so a newer holder's draw waits
   until this write's transaction ended, and a write checked after the draw sees the newer
   fence and is refused. The pause hazard then costs nothing but the stale holder's writes.

Each held lock keeps one connection of the engine's pool checked out (idle in transaction) until
it ends: size the pool for the locks you hold at once, and keep the server's
``idle_in_transaction_session_timeout`` above the longest lease (a session the server ends loses
its lock; ``extend`` then answers False).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Column, DateTime, MetaData, Table, Text, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._naming import check_identifier, quoted_table
from ship_sqla._scope import TransactionScope, current_scope
from ship_sqla._sql import TABLELESS, Statements
from ship_sqla._sql.locks import CHECK_FENCE, NEXT_FENCE, STILL_HELD, TRY_LOCK
from ship_sqla._sql_errors import database_outage_translated
from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._durations import require_lock_lease
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._fences import FencedLock, hold_fenced, require_current_fence

if TYPE_CHECKING:
    import contextlib as _contextlib

__all__ = [
    "AdvisoryLock",
    "AdvisoryLockProvider",
    "advisory_lock_key",
    "advisory_lock_provider",
    "ship_lock_fences_table",
]

logger = logging.getLogger("ship_sqla.locks")


def ship_lock_fences_table(
    metadata: MetaData, *, name: str = "ship_lock_fences", schema: str | None = None
) -> Table:
    """The fence table of :meth:`AdvisoryLockProvider.with_lock` (F4): one row per (namespace,
    key), its newest fence. Add it to your migrations like the other ship tables.

    An unusable ``name`` or ``schema`` (empty, NUL, not UTF-8, over 63 bytes) is a
    :class:`~ship_sqla.errors.ConfigurationError` here, as for every ship table (T1), not a
    driver error at the first fenced lock."""
    check_identifier(name, "lock fences table name")
    if schema is not None:
        check_identifier(schema, "lock fences table schema")
    return Table(
        name,
        metadata,
        Column("namespace", Text, primary_key=True),
        Column("key", Text, primary_key=True),
        Column("fence", BigInteger, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        schema=schema,
    )


def advisory_lock_key(namespace: str, key: str) -> int:
    """The signed 64-bit advisory-lock id of ``key`` in ``namespace`` (see the module docstring).

    Pure and stable across processes, versions and platforms.
    """
    digest = hashlib.sha256(namespace.encode() + b"\x00" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class AdvisoryLock:
    """One holding of a key: a transaction on a dedicated connection holding the xact lock.

    Not safe to share across event loops; safe for concurrent tasks of one loop (``extend``,
    ``release`` and the lease timer are serialized).
    """

    def __init__(
        self,
        *,
        connection: AsyncConnection,
        key: str,
        lock_id: int,
        lease: float,
        clock: Clock,
    ) -> None:
        self.key = key
        self.lock_id = lock_id
        self._connection: AsyncConnection | None = connection
        self._clock = clock
        self._expires_at = clock.monotonic() + lease
        self._lost = False
        self._released = False
        self._guard = asyncio.Lock()
        self._freed = asyncio.Event()
        self._timer = asyncio.get_running_loop().create_task(
            self._expire_when_due(), name=f"ship_sqla advisory lock lease {key!r}"
        )

    @property
    def expires_at(self) -> float:
        """The clock's ``monotonic()`` reading at which the lease ends."""
        return self._expires_at

    @property
    def lost(self) -> bool:
        """True once the lease ended (or the session died) before ``release`` (L2)."""
        if self._released:
            return self._lost
        return self._lost or self._clock.monotonic() >= self._expires_at

    @property
    def held(self) -> bool:
        return not self._released and not self.lost

    async def wait_freed(self) -> None:
        """Return once the lock's transaction has ended (released, lease timer, lost session):
        from then on another session can take the key."""
        await self._freed.wait()

    async def extend(self, lease: float) -> bool:
        """Restart the lease at ``lease`` seconds from now; False once lost or released.

        Costs one round trip on the holding connection, which proves the session (and so the
        lock) is still alive: a lock whose session the server ended answers False here.
        """
        lease = require_lock_lease(lease)
        async with self._guard:
            if not self.held or self._connection is None:
                return False
            try:
                await _drop_statement_snapshot(self._connection)
            except Exception:  # the driver's own errors too (a raw round trip): the session is gone
                logger.warning(
                    "advisory lock %r: its session is gone; the lock is lost",
                    self.key,
                    exc_info=True,
                )
                self._lost = True
                await self._end()
                return False
            self._expires_at = self._clock.monotonic() + lease
            return True

    async def release(self) -> None:
        """Free the key by rolling the transaction back. Safe to call twice or after a loss:
        rolling back our own transaction can only free our own lock."""
        if self._released:
            return
        if self._clock.monotonic() >= self._expires_at:
            self._lost = True
        self._released = True
        self._timer.cancel()
        async with self._guard:
            await self._end()

    async def _expire_when_due(self) -> None:
        while True:
            remaining = self._expires_at - self._clock.monotonic()
            if remaining > 0:
                await self._clock.sleep(remaining)
                continue
            async with self._guard:
                if self._released or self._connection is None:
                    return
                if self._clock.monotonic() < self._expires_at:  # extended while we waited
                    continue
                self._lost = True
                logger.warning(
                    "advisory lock %r: lease ended before release; the lock is freed", self.key
                )
                await self._end()
                return

    async def _end(self) -> None:
        """Roll back and return the connection (caller holds ``_guard``). Shielded: a cancelled
        caller must not leave a transaction open that would keep the lock held."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        await asyncio.shield(_close(connection, self.key, self._freed))

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self.lost else "held")
        return f"AdvisoryLock({self.key!r}, {state})"


async def _drop_statement_snapshot(connection: AsyncConnection) -> None:
    """STILL_HELD through the driver's simple query protocol: one round trip that proves the
    holding session alive AND leaves its idle transaction holding no snapshot.

    Every SQLAlchemy statement on asyncpg is an extended-protocol one, whose unnamed portal
    stays open in the transaction until the next statement, and the portal keeps its snapshot:
    the lock's idle transaction then pinned the database's xmin horizon (``backend_xmin``) for
    as long as the lock was held, a whole run for a single-runner job (J4), so no dead row
    anywhere could be removed meanwhile (J22's horizon read showed the lock holders). A
    simple-protocol statement drops that portal and keeps none."""
    raw = await connection.get_raw_connection()
    driver: Any = raw.driver_connection  # asyncpg's Connection: execute() without arguments
    await driver.execute(STILL_HELD.sql)


async def _close(connection: AsyncConnection, key: str, freed: asyncio.Event | None = None) -> None:
    try:
        # close() rolls back the open transaction, which frees the xact lock.
        await connection.close()
    except Exception:
        # A broken connection is discarded by the pool; its session's end frees the lock.
        logger.warning("advisory lock %r: closing its connection failed", key, exc_info=True)
        with contextlib.suppress(Exception):
            await connection.invalidate()
    finally:
        if freed is not None:
            freed.set()


class AdvisoryLockProvider:
    """The kernel ``LockProvider`` over PostgreSQL advisory locks (L1, L2).

    ``acquire`` never waits for another holder: it answers None at once when the key is taken.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        namespace: str = "ship_sqla",
        clock: Clock | None = None,
        fence_table: Table | None = None,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise ConfigurationError(
                f"advisory_lock_provider needs an AsyncEngine, got {type(engine).__name__}.",
                fix="pass the application's create_async_engine(...): each held lock needs a"
                " connection (and a transaction) of its own.",
            )
        if not namespace:
            raise ConfigurationError(
                "advisory_lock_provider namespace must not be empty.",
                fix="keep the default 'ship_sqla' or name your application.",
            )
        if fence_table is not None and not isinstance(fence_table, Table):
            raise ConfigurationError(
                f"advisory_lock_provider fence_table must be a Table, got {fence_table!r}.",
                fix="pass ship_lock_fences_table(metadata).",
            )
        self._engine = engine
        self._namespace = namespace
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._fence_sql: tuple[TextClause, TextClause] | None = None
        if fence_table is not None:
            fences = Statements({"{fences}": quoted_table(fence_table)})
            self._fence_sql = (fences[NEXT_FENCE], fences[CHECK_FENCE])

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def clock(self) -> Clock:
        return self._clock

    def lock_id(self, key: str) -> int:
        """The advisory-lock id ``key`` maps to (for ``pg_locks`` inspection)."""
        return advisory_lock_key(self._namespace, key)

    async def acquire(self, key: str, lease: float) -> AdvisoryLock | None:
        """The lock on ``key`` for ``lease`` seconds, or None when another session holds it."""
        lease = require_lock_lease(lease)
        lock_id = self.lock_id(key)
        operation = f"advisory lock acquire {key!r}"
        with database_outage_translated(operation, driver_only=True):
            connection = await self._engine.connect().start()
        lock: AdvisoryLock | None = None
        try:
            with database_outage_translated(operation, driver_only=True):
                await connection.begin()
                got = (
                    await connection.execute(TABLELESS[TRY_LOCK], {"lock_id": lock_id})
                ).scalar_one()
                if got:
                    await _drop_statement_snapshot(connection)
            if got:
                lock = AdvisoryLock(
                    connection=connection,
                    key=key,
                    lock_id=lock_id,
                    lease=lease,
                    clock=self._clock,
                )
        finally:
            if lock is None:
                # Not taken, failed or cancelled: never leave the transaction open behind us.
                await asyncio.shield(_close(connection, key))
        return lock

    def with_lock(
        self, key: str, ttl: float
    ) -> _contextlib.AbstractAsyncContextManager[FencedLock]:
        """F4: hold ``key`` for at most ``ttl`` seconds with a fence greater than every earlier
        one (drawn and committed before the block runs); :class:`~ship_sqla.errors.LockHeldError`
        when another session holds it. Needs ``fence_table``."""
        self._fence_statements("with_lock")
        return hold_fenced(key, ttl, acquire=self.acquire, next_fence=self._next_fence)

    async def check_fence(
        self, key: str, fence: int, *, scope: TransactionScope | None = None
    ) -> None:
        """F4: inside the write's transaction (``scope``, else the ambient unit of work), raise
        :class:`~ship_sqla.errors.StaleFenceError` unless ``fence`` is ``key``'s newest; the key's
        fence row stays share-locked until that transaction ends, so no newer holder's fence is
        drawn before the write commits or rolls back."""
        _, check = self._fence_statements("check_fence")
        if isinstance(fence, bool) or not isinstance(fence, int):
            require_current_fence(key, fence, None)  # raises: names the bad fence
        active = scope if scope is not None else current_scope()
        if active is None:
            raise ConfigurationError(
                f"check_fence of lock {key!r} ran outside any unit of work: a fence protects a"
                " write only when it is checked in that write's own transaction.",
                fix="call it inside uow.run(...) (or pass scope=) before the write it guards.",
            )
        active.check_usable()
        params = {"namespace": self._namespace, "key": key}
        with database_outage_translated(f"check_fence {key!r}", driver_only=True):
            newest = (await active.connection.execute(check, params)).scalar_one_or_none()
        require_current_fence(key, fence, newest)

    def _fence_statements(self, operation: str) -> tuple[TextClause, TextClause]:
        if self._fence_sql is None:
            raise ConfigurationError(
                f"{operation} needs the provider's fence table.",
                fix="pass fence_table=ship_lock_fences_table(metadata) to advisory_lock_provider"
                " and create the table (Alembic sees it on your metadata).",
            )
        return self._fence_sql

    async def _next_fence(self, key: str) -> int:
        draw, _ = self._fence_statements("with_lock")
        params = {"namespace": self._namespace, "key": key}
        with database_outage_translated(f"with_lock {key!r}", driver_only=True):
            async with self._engine.begin() as connection:
                return int((await connection.execute(draw, params)).scalar_one())


def advisory_lock_provider(
    database: AsyncEngine,
    *,
    namespace: str = "ship_sqla",
    clock: Clock | None = None,
    fence_table: Table | None = None,
) -> AdvisoryLockProvider:
    """The advisory-lock ``LockProvider`` for ``database`` (an ``AsyncEngine``).

    Keys are hashed with ``namespace`` into PostgreSQL's one 64-bit advisory-lock space (see
    :func:`advisory_lock_key`). ``clock`` runs the local lease timers (a ``FrozenClock`` in tests).
    ``fence_table`` (``ship_lock_fences_table(metadata)``) enables fenced locks (F4):
    :meth:`AdvisoryLockProvider.with_lock` and :meth:`AdvisoryLockProvider.check_fence`.
    """
    return AdvisoryLockProvider(database, namespace=namespace, clock=clock, fence_table=fence_table)
