"""transactional: a transactional handler (J13) beside a plain handler's own uow (issue 37).

Both drain the same backlog of runs, each writing one app row, at ``Concurrency(max=N)`` =
``max_in_flight`` = N for N in 1, 10 and 100, in the same run, one runtime in this process:

- ship_sqla (the figure): ``define_job(..., transaction=uow)``; the handler inserts the row
  through its repositories. One transaction per run: the fence (``SELECT ... FOR UPDATE`` of the
  run row), the INSERT and the completion (the settle statement, joined), one COMMIT.
- baseline: a plain handler running ``uow.run`` of the same INSERT (its own BEGIN / INSERT /
  COMMIT), then the runtime's completer completing it with the others of its batch (one
  autocommitted settle statement for many runs).

Per shape and round (runs pre-enqueued, the clock from the runtime's start until ``stop()``
returned, so the last completion is in):

- ``runs_per_s``: runs / wall seconds.
- ``server_us``: ``pg_stat_database.active_time`` delta / runs: the time the database's backends
  spent executing statements (the claims, inserts, fences, settles, commits), per run.
- ``commits``: ``pg_stat_database.xact_commit`` delta / runs (an autocommitted statement is one
  commit: the claims and the plain shape's batched settles count).
- ``idle_in_tx_us``: ``pg_stat_database.idle_in_transaction_time`` delta / runs: how long
  transactions sat open waiting on the client (Python) per run, which is how long their row locks
  and the MVCC horizon were held beyond the statements themselves.
- ``hold_us``: the unit of work's pooled connection, checkout to checkin (SQLAlchemy pool
  events), per run: what a run costs the pool.

The statistics are read from another database's connection after every pooled connection of
the bench database flushed its pending counters (``pg_stat_force_next_flush()``, then a statement
ending: PostgreSQL flushes a backend's counters when it goes idle, at most once a second
otherwise). The pool's ``checkout`` / ``checkin`` listeners are attached in both shapes; they
turn off the direct path's one-turn connection keep (``ship_sqla._direct``) for both alike. The
engine's pool is N + 10 connections (capped at :data:`POOL_CAP` on the shared server), no
overflow; the log shows the most connections checked out at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import MetaData, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import QueuePool

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Countdown,
    Figure,
    Stopwatch,
    Target,
    asyncpg_dsn,
    paired_rounds,
    rate,
)
from ship_sqla import (
    JobContext,
    TransactionScope,
    create_unit_of_work,
    define_job,
    start_job_runtime,
)
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import Concurrency, EnqueueRequest, JobDefinition

if TYPE_CHECKING:
    from sqlalchemy.pool import Pool

    from ship_sqla._jobs import PostgresJobBackend

__all__ = ["NAME", "run"]

NAME = "transactional"
FUSED_JOB = "bench.tx.fused"
PLAIN_JOB = "bench.tx.plain"
APP_TABLE = "bench_tx_app"
LEVELS = (1, 10, 100)
POOL_CAP = 60
"""The engine's pool at most (max_connections is 100 on a server other work shares)."""
POOL_SPARE = 10
"""Connections beyond N: the runtime's claims, settles and heartbeats."""
DRAIN_TIMEOUT = 120.0
POLL_INTERVAL = 5.0

APP_INSERT = text(f"INSERT INTO {APP_TABLE} (run_id) VALUES (:run_id)")
FORCE_FLUSH = "SELECT pg_stat_force_next_flush()"
DATABASE_STATS = (
    "SELECT xact_commit, active_time, idle_in_transaction_time FROM pg_stat_database"
    " WHERE datname = $1"
)


def _runs(bench: Bench, concurrency: int) -> int:
    """Runs per drain: enough for a second or so at each level, far fewer with ``--quick``."""
    if bench.quick:
        return {1: 40, 10: 150, 100: 300}[concurrency]
    return {1: 300, 10: 1_000, 100: 2_000}[concurrency]


class _Holds:
    """Pool checkout -> checkin times (SQLAlchemy pool events): all of them, and those of the
    connections a unit of work ran on (marked by the repositories factory)."""

    def __init__(self, pool: Pool) -> None:
        self._out: dict[int, float] = {}
        self._uow: set[int] = set()
        self.uow_seconds = 0.0
        self.uow_checkouts = 0
        self.current = 0
        self.peak = 0
        event.listen(pool, "checkout", self._checkout)
        event.listen(pool, "checkin", self._checkin)

    def reset(self) -> None:
        self._uow.clear()
        self.uow_seconds = 0.0
        self.uow_checkouts = 0
        self.peak = self.current

    def mark_uow(self, scope: TransactionScope) -> None:
        connection = scope.connection.sync_connection
        assert connection is not None  # noqa: S101 - a started connection
        self._uow.add(id(connection.connection.dbapi_connection))

    def _checkout(self, _dbapi: object, record: object, _proxy: object) -> None:
        self._out[id(record)] = time.perf_counter()
        self.current += 1
        self.peak = max(self.peak, self.current)

    def _checkin(self, dbapi: object, record: object) -> None:
        started = self._out.pop(id(record), None)
        if started is None:
            return
        self.current -= 1
        if id(dbapi) in self._uow:
            self._uow.discard(id(dbapi))
            self.uow_seconds += time.perf_counter() - started
            self.uow_checkouts += 1


class _AppRows:
    """The application's repositories: one INSERT of an app row."""

    def __init__(self, scope: TransactionScope, holds: _Holds) -> None:
        self._scope = scope
        holds.mark_uow(scope)

    async def insert(self, run_id: str) -> None:
        await self._scope.connection.execute(APP_INSERT, {"run_id": run_id})


async def _insert(run_id: str, rows: _AppRows) -> None:
    await rows.insert(run_id)


@dataclass(frozen=True, slots=True)
class _Stats:
    commits: int
    active_ms: float
    idle_in_tx_ms: float


@dataclass(frozen=True, slots=True)
class _Sample:
    runs_per_s: float
    server_us: float
    commits: float
    idle_in_tx_us: float
    hold_us: float


class _Level:
    """One concurrency level: its own engine (pool N + spare), backend, unit of work and jobs."""

    def __init__(self, bench: Bench, db: BenchDatabase, reader: Any, concurrency: int) -> None:  # noqa: ANN401 - asyncpg is untyped
        self.bench = bench
        self.db = db
        self.reader = reader
        self.concurrency = concurrency
        self.runs = _runs(bench, concurrency)
        self.pool_size = min(concurrency + POOL_SPARE, POOL_CAP)
        self.engine: AsyncEngine = create_async_engine(
            db.url, pool_size=self.pool_size, max_overflow=0
        )
        self.holds = _Holds(self.engine.sync_engine.pool)
        metadata = MetaData()
        self.table = ship_job_runs_table(metadata)
        self.state = ship_job_state_table(metadata)
        # No LISTEN connection: it would hold a pooled connection for the runtime's life.
        self.backend: PostgresJobBackend = create_job_backend(
            database=self.engine, table=self.table, state_table=self.state, listen=False
        )
        holds = self.holds
        uow = create_unit_of_work(self.engine, repositories=lambda scope: _AppRows(scope, holds))
        self.drain = Countdown()
        concurrency_of = Concurrency(max=concurrency)

        async def fused(ctx: JobContext, _payload: dict[str, Any], rows: _AppRows) -> None:
            await rows.insert(ctx.run_id)
            self.drain.hit()

        async def plain(ctx: JobContext, _payload: dict[str, Any]) -> None:
            await uow.run(partial(_insert, ctx.run_id))
            self.drain.hit()

        self.jobs: dict[str, JobDefinition[dict[str, Any]]] = {
            "transactional": define_job(
                FUSED_JOB, fused, payload=dict, concurrency=concurrency_of, transaction=uow
            ),
            "plain": define_job(PLAIN_JOB, plain, payload=dict, concurrency=concurrency_of),
        }

    async def close(self) -> None:
        await self._flush()  # nothing left pending for the next level's window
        await self.engine.dispose()

    async def _flush(self) -> None:
        """Every idle pooled connection flushes its pending statistics (held all at once, so
        each is a different connection)."""
        pool = self.engine.sync_engine.pool
        assert isinstance(pool, QueuePool)  # noqa: S101 - create_async_engine's default
        count = pool.checkedin()
        if count == 0:
            return
        barrier = asyncio.Barrier(count)

        async def flush() -> None:
            async with self.engine.connect() as connection:
                await barrier.wait()
                await connection.exec_driver_sql(FORCE_FLUSH)
            # The ROLLBACK that closed the block answered once the backend, idle, had flushed.

        await asyncio.gather(*(flush() for _ in range(count)))

    async def _stats(self) -> _Stats:
        await self._flush()
        row = await self.reader.fetchrow(DATABASE_STATS, self.db.name)
        return _Stats(int(row[0]), float(row[1]), float(row[2]))

    async def _reset(self, job: JobDefinition[dict[str, Any]]) -> None:
        async with self.engine.begin() as connection:
            await connection.exec_driver_sql(
                f"TRUNCATE {self.table.name}, {self.state.name}, {APP_TABLE} CASCADE"
            )
        await self.backend.enqueue_many(job, [EnqueueRequest(payload={}) for _ in range(self.runs)])

    async def round(self, shape: str) -> _Sample:
        job = self.jobs[shape]
        runs = self.runs
        await self._reset(job)
        self.drain.reset(runs)
        before = await self._stats()
        self.holds.reset()
        with Stopwatch() as watch:
            runtime = await start_job_runtime(
                job,
                backend=self.backend,
                max_in_flight=self.concurrency,
                poll_interval=POLL_INTERVAL,
            )
            try:
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await self.drain.done.wait()
            finally:
                await runtime.stop()
        uow_seconds, uow_checkouts, peak = (
            self.holds.uow_seconds,
            self.holds.uow_checkouts,
            self.holds.peak,
        )
        after = await self._stats()
        await self._check(shape)
        sample = _Sample(
            runs_per_s=rate(runs, watch.seconds),
            server_us=(after.active_ms - before.active_ms) * 1000 / runs,
            commits=(after.commits - before.commits) / runs,
            idle_in_tx_us=(after.idle_in_tx_ms - before.idle_in_tx_ms) * 1000 / runs,
            hold_us=uow_seconds * 1e6 / runs,
        )
        self.bench.log(
            f"c{self.concurrency:<3} {shape:13} {runs} runs in {watch.seconds:.2f} s ="
            f" {sample.runs_per_s:,.0f} runs/s; server {sample.server_us:.0f} us/run;"
            f" {sample.commits:.2f} commits/run; idle in tx {sample.idle_in_tx_us:.0f} us/run;"
            f" uow hold {sample.hold_us:.0f} us/run ({uow_checkouts} checkouts);"
            f" peak {peak}/{self.pool_size} connections"
        )
        return sample

    async def _check(self, shape: str) -> None:
        async with self.engine.connect() as connection:
            completed = await connection.scalar(
                text(f"SELECT count(*) FROM {self.table.name} WHERE state = 'completed'")
            )
            written = await connection.scalar(text(f"SELECT count(*) FROM {APP_TABLE}"))
        if completed != self.runs or written != self.runs:
            raise BenchmarkError(
                f"transactional: {shape} at c{self.concurrency}: {completed} runs completed and"
                f" {written} app rows of {self.runs}"
            )


def _figures(
    concurrency: int, runs: int, ours: list[_Sample], theirs: list[_Sample]
) -> list[Figure]:
    prefix = f"transactional.c{concurrency}"
    label = "plain handler: own uow.run + batched completion"

    def figure(field: str, unit: str, targets: tuple[Target, ...] = (), note: str = "") -> Figure:
        return Figure.from_rounds(
            f"{prefix}.{field}",
            unit,
            [getattr(sample, field) for sample in ours],
            [getattr(sample, field) for sample in theirs],
            baseline_label=label,
            targets=targets,
            note=note,
        )

    return [
        figure(
            "runs_per_s",
            "runs/s",
            note=f"{runs:,} runs per drain, Concurrency(max={concurrency}),"
            f" max_in_flight={concurrency}; each run inserts one app row",
        ),
        figure("server_us", "us"),
        figure("commits", "/run", targets=(Target("ratio", "<=", 1.0),)),
        figure("idle_in_tx_us", "us"),
        figure("hold_us", "us"),
    ]


async def _level(bench: Bench, db: BenchDatabase, reader: Any, concurrency: int) -> list[Figure]:  # noqa: ANN401 - asyncpg is untyped
    level = _Level(bench, db, reader, concurrency)
    try:
        # Warm-up (not measured): connections, prepared statements, both code paths.
        await level.round("transactional")
        await level.round("plain")
        ours, theirs = await paired_rounds(
            bench.rounds, lambda: level.round("transactional"), lambda: level.round("plain")
        )
    finally:
        await level.close()
    return _figures(concurrency, level.runs, ours, theirs)


async def run(bench: Bench) -> list[Figure]:
    figures: list[Figure] = []
    async with bench.database(NAME) as db:
        await db.create_job_tables()
        async with db.engine.begin() as connection:
            await connection.execute(
                text(f"CREATE TABLE {APP_TABLE} (id bigserial PRIMARY KEY, run_id text NOT NULL)")
            )
        await db.engine.dispose()
        # Read from another database: the reader's own statements are not the bench's.
        reader = await asyncpg.connect(asyncpg_dsn(db.url.set(database="postgres")))
        try:
            for concurrency in LEVELS:
                figures.extend(await _level(bench, db, reader, concurrency))
        finally:
            await reader.close()
    return figures
