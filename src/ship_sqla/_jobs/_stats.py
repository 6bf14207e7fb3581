"""#36's job history on PostgreSQL: the stats table and its store.

:func:`ship_job_stats_table` declares the table (one row per job and UTC minute, primary key
``(job_id, minute)``); :class:`PostgresJobStats` is the kernel's
:class:`~ship_sqla.kernel._stats.JobStatsStore` over it: the workers' flushes (one statement
each), the fleet sampler's backlog gauges and retention, and the chart reads
(:meth:`PostgresJobStats.series`). The design and its reasons: ``kernel/_stats.py`` and
docs/dashboard.md ("History").
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, TIMESTAMP

from ship_sqla._jobs._sql.stats import (
    ADD_STATS,
    PRUNE_STATS,
    READ_STATS,
    READ_STATS_BUCKETS,
    RECORD_BACKLOG,
)
from ship_sqla._naming import derived_names, quoted_table
from ship_sqla._storage_options import HOT_ROW_OPTIONS, declare_storage_options
from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._durations import MAX_SAMPLE_INTERVAL, require_duration
from ship_sqla.kernel._stats import (
    STATS_FLUSH_INTERVAL,
    STATS_RETENTION,
    StatsRow,
    range_buckets,
    series_from_rows,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._stats import Backlog, StatsSeries

__all__ = ["DEFAULT_STATS_TABLE", "PostgresJobStats", "create_job_stats", "ship_job_stats_table"]

DEFAULT_STATS_TABLE: Final = "ship_job_stats"

_TSTZ = TIMESTAMP(timezone=True)
_MINUTE: Final = timedelta(minutes=1)


def ship_job_stats_table(
    metadata: MetaData, name: str = DEFAULT_STATS_TABLE, schema: str | None = None
) -> Table:
    """#36's history: one row per (job, UTC minute), written by the workers' flushes (every
    15 s per process: the minute's completed / retried / dead / cancelled attempt counts and
    the run-time and queue-wait histograms, ``bigint[]`` of fixed log buckets, added to what
    other processes flushed) and by the fleet's sampler (the backlog gauge, F5: ``waiting``,
    due and delayed runs, and ``oldest_due_age``, seconds); the sampler deletes minutes older
    than the retention (7 days by default) through ``<name>_minute_idx``.
    A chart reads a range of the primary key."""
    n = derived_names(name, ("_pkey", "_minute_idx"), "job stats", schema=schema)
    table = Table(
        name,
        metadata,
        Column("job_id", Text, nullable=False),
        Column("minute", _TSTZ, nullable=False),
        Column("completed", BigInteger, nullable=False, server_default=text("0")),
        Column("retried", BigInteger, nullable=False, server_default=text("0")),
        Column("dead", BigInteger, nullable=False, server_default=text("0")),
        Column("cancelled", BigInteger, nullable=False, server_default=text("0")),
        Column("run_hist", ARRAY(BigInteger), nullable=False, server_default=text("'{}'")),
        Column("wait_hist", ARRAY(BigInteger), nullable=False, server_default=text("'{}'")),
        Column("waiting", BigInteger, nullable=True),
        Column("oldest_due_age", Double, nullable=True),
        PrimaryKeyConstraint("job_id", "minute", name=n["_pkey"]),
        Index(n["_minute_idx"], "minute"),
        schema=schema,
        comment="ship_sqla job history per minute (ship_job_stats_table)",
    )
    # A minute's row is updated in place by every flush of it: no indexed column changes (HOT).
    return declare_storage_options(table, HOT_ROW_OPTIONS)


def _array_text(counts: Sequence[int]) -> str:
    return "{" + ",".join(str(c) for c in counts) + "}"


class PostgresJobStats:
    """The stats table's store (:class:`~ship_sqla.kernel._stats.JobStatsStore`) and its reads.

    ``clock`` is only :meth:`series`'s default "now"; ``flush_interval``: the workers' flush
    interval (seconds), the bound a series states for a crashed process's loss;
    ``retention``: how long the fleet's sampler keeps minute rows."""

    def __init__(
        self,
        engine: AsyncEngine,
        table: Table,
        *,
        clock: Clock | None = None,
        flush_interval: float = STATS_FLUSH_INTERVAL,
        retention: timedelta = STATS_RETENTION,
    ) -> None:
        self.engine = engine
        self.table = table
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.flush_interval = require_duration(
            flush_interval, "flush_interval", maximum=MAX_SAMPLE_INTERVAL
        )
        self.retention = retention
        name = quoted_table(table)
        self._add = text(ADD_STATS.replace("{stats}", name))
        self._backlog = text(RECORD_BACKLOG.replace("{stats}", name))
        self._prune = text(PRUNE_STATS.replace("{stats}", name))
        self._read = text(READ_STATS.replace("{stats}", name))
        self._read_buckets = text(READ_STATS_BUCKETS.replace("{stats}", name))

    def __repr__(self) -> str:
        return f"PostgresJobStats({self.table.fullname!r})"

    async def add_stats(self, rows: Sequence[StatsRow]) -> None:
        if not rows:
            return
        params = {
            "job_ids": [r.job_id for r in rows],
            "minutes": [r.minute for r in rows],
            "completed": [r.completed for r in rows],
            "retried": [r.retried for r in rows],
            "dead": [r.dead for r in rows],
            "cancelled": [r.cancelled for r in rows],
            "run_hists": [_array_text(r.run_hist) for r in rows],
            "wait_hists": [_array_text(r.wait_hist) for r in rows],
        }
        async with self.engine.begin() as connection:
            await connection.execute(self._add, params)

    async def record_backlog(self, minute: datetime, backlog: Mapping[str, Backlog]) -> None:
        if not backlog:
            return
        jobs = sorted(backlog)
        params = {
            "minute": minute,
            "job_ids": jobs,
            "waitings": [backlog[j].waiting for j in jobs],
            "ages": [backlog[j].oldest_due_age for j in jobs],
        }
        async with self.engine.begin() as connection:
            await connection.execute(self._backlog, params)

    async def prune_stats(self, before: datetime) -> int:
        async with self.engine.begin() as connection:
            result = await connection.execute(self._prune, {"before": before})
        return int(result.rowcount)

    async def read_stats(self, job_id: str, start: datetime, end: datetime) -> list[StatsRow]:
        async with self.engine.connect() as connection:
            result = await connection.execute(
                self._read, {"job_id": job_id, "start": start, "end": end}
            )
            rows = result.all()
        return [
            StatsRow(
                job_id,
                minute,
                completed,
                retried,
                dead,
                cancelled,
                tuple(run_hist),
                tuple(wait_hist),
                waiting,
                oldest_due_age,
            )
            for (
                minute,
                completed,
                retried,
                dead,
                cancelled,
                run_hist,
                wait_hist,
                waiting,
                oldest_due_age,
            ) in rows
        ]

    async def read_stats_buckets(
        self,
        job_ids: Sequence[str],
        start: datetime,
        end: datetime,
        step: timedelta,
        *,
        job_id: str = "*",
    ) -> list[StatsRow]:
        """The minutes in [start, end) of every job of ``job_ids`` summed per bucket of
        ``step`` from ``start`` (``READ_STATS_BUCKETS``): one row per bucket with a minute in
        it, its ``minute`` the bucket's start, named ``job_id``; its backlog is the bucket's
        last sample (meaningful for one job). :func:`series_from_rows` over these rows gives
        the series of the minute rows (the same sums, so the same counts and percentiles), and
        a chart of 7 days receives 84 rows, not 10,080 (issue 36)."""
        params = {
            "job_ids": list(job_ids),
            "start": start,
            "end": end,
            "step": step.total_seconds(),
        }
        async with self.engine.connect() as connection:
            rows = (await connection.execute(self._read_buckets, params)).all()
        return [
            StatsRow(
                job_id,
                start + b * step,
                completed,
                retried,
                dead,
                cancelled,
                tuple(runs),
                tuple(waits),
                waiting,
                age,
            )
            for (b, completed, retried, dead, cancelled, runs, waits, waiting, age) in rows
        ]

    async def series(
        self, job_id: str, window: str = "1h", *, now: datetime | None = None
    ) -> StatsSeries:
        """The job's chart series over ``window`` (``"1h"``, ``"6h"``, ``"24h"``, ``"7d"``) on
        clock-aligned buckets ending with the one ``now`` (default: the clock's) is in; one
        bounded read of the primary key. An unknown range raises ``UsageError``."""
        now = now if now is not None else self._clock.now()
        start, end, step = range_buckets(window, now)
        if step > _MINUTE:  # sum the bucket's minutes in the statement
            rows = await self.read_stats_buckets([job_id], start, end, step, job_id=job_id)
        else:
            rows = await self.read_stats(job_id, start, end)
        return series_from_rows(job_id, window, now, rows, loss_bound=self.flush_interval)


def create_job_stats(
    engine: AsyncEngine,
    table: Table | None = None,
    *,
    clock: Clock | None = None,
    flush_interval: float = STATS_FLUSH_INTERVAL,
    retention: timedelta = STATS_RETENTION,
) -> PostgresJobStats:
    """The job history store over ``table`` (default: :func:`ship_job_stats_table`'s
    ``ship_job_stats``): give it to ``start_job_runtime(..., stats=)`` to record, and read
    charts with its :meth:`~PostgresJobStats.series`. Workers flush every ``flush_interval``
    seconds (10-15 s suits a chart of minutes; a crashed worker loses at most that much of its
    finishes); the fleet's sampler deletes minutes older than ``retention``."""
    if table is None:
        table = ship_job_stats_table(MetaData())
    return PostgresJobStats(
        engine, table, clock=clock, flush_interval=flush_interval, retention=retention
    )
