"""history: removing a day of finished runs by dropping its partition (J17) against today's
batched DELETE (J8's cleanup).

A day of ``N`` completed runs (1,000,000; 20,000 with ``--quick``, the CI smoke size) is loaded
twice per round: into one day partition of the run history (``ship_job_history_table``, slim
rows as J18 keeps them), and as finished rows of the runs table (``ship_job_runs_table``, as
they are kept before J16). The figure is the time of the maintenance's DROP of that partition
(under its 1 s ``lock_timeout``, as a pass runs it); the baseline is the cleanup's statement
(``DELETE_FINISHED_BATCH``'s shape) in batches of 10,000 until the day is gone. A second figure
is the WAL each wrote: the DROP's own records (``pg_walinspect``, by its transaction id; the
cluster's WAL during it without the extension), the DELETE's as ``pg_current_wal_lsn`` before
and after (cluster-wide: on a shared server another session's writes count too, a few MiB
beside hundreds).

Run: ``python -m benchmarks history`` (opt-in; ``--quick`` for the smoke size).
"""

from __future__ import annotations

from datetime import date
from typing import TYPE_CHECKING

from sqlalchemy import MetaData, text
from sqlalchemy.exc import DBAPIError

from benchmarks._harness import Bench, Figure, Stopwatch, Target
from ship_sqla import ship_job_history_table, ship_job_runs_table
from ship_sqla._jobs._history_ddl import create_day_ddl, drop_day_ddl

if TYPE_CHECKING:
    from benchmarks._harness import BenchDatabase

__all__ = ["NAME", "run"]

NAME = "history"
DAY = date(2000, 1, 1)
BATCH = 10_000

metadata = MetaData()
HISTORY = ship_job_history_table(metadata)
RUNS = ship_job_runs_table(metadata)

FILL_HISTORY = """
INSERT INTO ship_job_history (id, seq, job_id, state, attempt, max_attempts, run_at,
                              created_at, started_at, finished_at, claimed_by)
SELECT gen_random_uuid()::text, n, 'bench.history', 'completed', 1, 3, t, t, t, t, 'w1'
  FROM generate_series(1, {n}) AS n,
       LATERAL (SELECT TIMESTAMPTZ '2000-01-01 00:00:00+00' + n * interval '80 ms') AS x(t)
"""
FILL_RUNS = """
INSERT INTO ship_job_runs (id, job_id, state, payload, attempt, max_attempts, run_at,
                           created_at, updated_at, finished_at, claimed_by)
SELECT gen_random_uuid()::text, 'bench.history', 'completed', '{{}}', 1, 3, t, t, t, t, 'w1'
  FROM generate_series(1, {n}) AS n,
       LATERAL (SELECT TIMESTAMPTZ '2000-01-01 00:00:00+00' + n * interval '80 ms') AS x(t)
"""
DELETE_BATCH = text("""
DELETE FROM ship_job_runs d
WHERE d.id = ANY(ARRAY(
    SELECT r.id FROM ship_job_runs r
    WHERE r.job_id = 'bench.history' AND r.state IN ('completed', 'dead', 'discarded', 'cancelled')
      AND r.state = 'completed' AND r.finished_at <= now() - interval '1 day'
    ORDER BY r.finished_at
    LIMIT 10000
))
""")


async def _lsn(db: BenchDatabase) -> int:
    async with db.engine.connect() as connection:
        value = await connection.scalar(
            text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        )
    return int(value)


async def _own_wal(db: BenchDatabase, before: int, xid: str) -> float | None:
    """KiB of the WAL records of transaction ``xid`` written after ``before``
    (pg_walinspect, PostgreSQL 15+; None without it): what the DROP itself wrote, whatever
    other sessions of a shared server wrote meanwhile."""
    async with db.engine.connect() as connection:
        try:
            total = await connection.scalar(
                text(
                    "SELECT coalesce(sum(record_length), 0) FROM pg_get_wal_records_info("
                    " CAST(CAST(:start AS text) AS pg_lsn), pg_current_wal_lsn())"
                    " WHERE xid::text = CAST(:xid AS text)"
                ),
                {"start": f"{before >> 32:X}/{before & 0xFFFFFFFF:X}", "xid": xid},
            )
        except DBAPIError:
            return None
    return float(total) / 1024


async def _drop_round(bench: Bench, db: BenchDatabase, n: int) -> tuple[float, float]:
    """ms and KiB of WAL of dropping a day partition of ``n`` runs."""
    async with db.engine.begin() as connection:
        await connection.execute(create_day_ddl(HISTORY, "completed", DAY))
        await connection.execute(text(FILL_HISTORY.format(n=n)))
    # No CHECKPOINT here: right after one, every catalog page the DROP touches is written
    # whole (a full-page image), which a pass in steady state rarely meets.
    await db.maintain("VACUUM (ANALYZE) ship_job_history")
    before = await _lsn(db)
    with Stopwatch() as watch:
        async with db.engine.begin() as connection:
            await connection.execute(text("SET LOCAL lock_timeout = '1s'"))
            await connection.execute(drop_day_ddl(HISTORY, "completed", DAY))
            xid = str(await connection.scalar(text("SELECT pg_current_xact_id()::text")))
    own = await _own_wal(db, before, xid)
    if own is None:
        bench.log("pg_walinspect unreadable: the DROP's WAL is the cluster's during it")
    wal = (await _lsn(db) - before) / 1024 if own is None else own
    bench.log(f"drop partition  {watch.seconds * 1e3:9.1f} ms {wal:10.0f} KiB WAL ({n} runs)")
    return watch.seconds * 1e3, wal


async def _delete_round(bench: Bench, db: BenchDatabase, n: int) -> tuple[float, float]:
    """ms and KiB of WAL of the batched cleanup DELETE of ``n`` finished runs."""
    await db.maintain("TRUNCATE ship_job_runs CASCADE")
    async with db.engine.begin() as connection:
        await connection.execute(text(FILL_RUNS.format(n=n)))
    await db.maintain("CHECKPOINT", "VACUUM (ANALYZE) ship_job_runs")
    before = await _lsn(db)
    with Stopwatch() as watch:
        while True:
            async with db.engine.begin() as connection:
                deleted = (await connection.execute(DELETE_BATCH)).rowcount
            if deleted < BATCH:
                break
    wal = (await _lsn(db) - before) / 1024
    bench.log(f"batched DELETE  {watch.seconds * 1e3:9.1f} ms {wal:10.0f} KiB WAL ({n} runs)")
    return watch.seconds * 1e3, wal


async def run(bench: Bench) -> list[Figure]:
    n = 20_000 if bench.quick else 1_000_000
    rounds = bench.rounds if bench.quick else min(bench.rounds, 3)
    drops: list[tuple[float, float]] = []
    deletes: list[tuple[float, float]] = []
    async with bench.database(NAME) as db:
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        try:
            await db.maintain("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except DBAPIError:
            bench.log("no pg_walinspect: the DROP's WAL is the cluster's during it")
        for _ in range(rounds):
            drops.append(await _drop_round(bench, db, n))
            deletes.append(await _delete_round(bench, db, n))
    note = f"{n} completed runs of one day, {rounds} rounds; DELETE in batches of {BATCH}"
    return [
        Figure.from_rounds(
            "history.remove_day",
            "ms",
            [d[0] for d in drops],
            [d[0] for d in deletes],
            baseline_label="batched DELETE (J8 cleanup)",
            targets=(Target("value", "<=", 1000.0),),
            note=note,
        ),
        Figure.from_rounds(
            "history.remove_day.wal",
            "KiB",
            [d[1] for d in drops],
            [d[1] for d in deletes],
            baseline_label="batched DELETE (J8 cleanup)",
            targets=(Target("value", "<=", 1024.0),),
            note=note + "; the DROP's own WAL records (pg_walinspect), the DELETE's cluster-wide",
        ),
    ]
