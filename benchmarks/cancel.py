"""cancel: from an operator's cancel of a RUNNING run to its handler observing the cancellation.

ship_sqla (``cancel.p50``, ``cancel.p99``, K2): a runtime (``listen=True``, ``poll_interval`` 5 s,
lease 60 s, so its heartbeat, the fallback, is 20 s away and only the notification can explain a
fast cancel) holds one running run whose handler waits forever. The operator is a SECOND backend
on its own engine (its request reaches the runtime only through PostgreSQL: the cancel statement's
NOTIFY, delivered at its commit, as from another process) and calls
``JobOperations.cancel(run_id)``. The clock starts before that call and stops when the handler's
``asyncio.CancelledError`` is raised. One run at a time; p50 and p99 per round.

Baseline: the floor of the same path on this server: one raw asyncpg connection commits an
``UPDATE`` of the row and ``pg_notify`` in one transaction; another, LISTENing, gets the
notification (the clock stops in its callback).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Target,
    latency_figures,
    latency_percentiles,
    ordered_ids,
    paired_rounds,
)
from benchmarks._raw_sql import job_sql
from ship_sqla import JobContext, create_job_operations, define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import Concurrency, JobDefinition

__all__ = ["NAME", "run"]

NAME = "cancel"
JOB_ID = "bench.cancel"
RAW_TABLE = "raw_job_runs"
RAW_CHANNEL = "bench_raw_cancel"
POLL_INTERVAL = 5.0
LEASE = 60.0
MISS_AFTER = 5.0
"""Seconds: a cancellation not observed by then was a missed notification (an invalid round)."""


async def _allow(_permission: str, _operation: str) -> bool:
    return True


class _Observed:
    """The handler's side: when it started, and when its cancellation was observed."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.at = 0.0

    async def handler(self, _ctx: JobContext, _payload: dict[str, Any]) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.at = time.perf_counter()
            self.cancelled.set()
            raise

    async def wait(self, event: asyncio.Event, what: str) -> None:
        try:
            async with asyncio.timeout(MISS_AFTER):
                await event.wait()
        except TimeoutError as exc:
            raise BenchmarkError(f"cancel: {what} within {MISS_AFTER} s") from exc
        event.clear()


async def _ship_round(bench: Bench, db: BenchDatabase, count: int) -> tuple[float, float]:
    observed = _Observed()
    metadata = MetaData()
    runs, state = ship_job_runs_table(metadata), ship_job_state_table(metadata)
    job: JobDefinition[dict[str, Any]] = define_job(
        JOB_ID, observed.handler, payload=dict, concurrency=Concurrency(lease=LEASE)
    )
    backend = create_job_backend(database=db.engine, table=runs, state_table=state)
    operator_engine = create_async_engine(db.url, pool_size=2)
    operator = create_job_backend(
        database=operator_engine, table=runs, state_table=state, listen=False
    )
    ops = create_job_operations(operator, authorizer=_allow)
    latencies: list[float] = []
    runtime = await start_job_runtime(job, backend=backend, poll_interval=POLL_INTERVAL)
    try:
        for _ in range(count):
            result = await backend.enqueue(job, {})
            assert result.run_id is not None  # noqa: S101 - a plain enqueue always has one
            await observed.wait(observed.started, "the run did not start")
            begun = time.perf_counter()
            outcome = await ops.cancel(result.run_id)
            if outcome.outcome != "requested":
                raise BenchmarkError(f"cancel: the run was {outcome.outcome}, not running")
            await observed.wait(observed.cancelled, "the handler did not observe its cancel")
            latencies.append((observed.at - begun) * 1000.0)
    finally:
        await runtime.stop()
        await operator_engine.dispose()
    return latency_percentiles(bench, "ship cancel -> handler cancelled", latencies)


async def _raw_round(bench: Bench, db: BenchDatabase, count: int) -> tuple[float, float]:
    sql = job_sql(RAW_TABLE)
    operator = await db.raw()
    listener = await db.raw()
    heard = asyncio.Event()
    at = 0.0

    def on_notify(*_args: object) -> None:
        nonlocal at
        at = time.perf_counter()
        heard.set()

    await listener.add_listener(RAW_CHANNEL, on_notify)
    ids = ordered_ids()
    latencies: list[float] = []
    try:
        for _ in range(count):
            run_id = next(ids)
            await operator.execute(sql.insert_one, run_id, JOB_ID, "{}")
            begun = time.perf_counter()
            async with operator.transaction():
                await operator.execute(
                    f"UPDATE {RAW_TABLE} SET updated_at = now() WHERE id = $1",
                    run_id,
                )
                await operator.execute("SELECT pg_notify($1, $2)", RAW_CHANNEL, run_id)
            try:
                async with asyncio.timeout(MISS_AFTER):
                    await heard.wait()
            except TimeoutError as exc:
                raise BenchmarkError("cancel: a raw notification was not delivered") from exc
            heard.clear()
            latencies.append((at - begun) * 1000.0)
    finally:
        await listener.remove_listener(RAW_CHANNEL, on_notify)
    return latency_percentiles(bench, "raw  cancel -> handler cancelled", latencies)


async def run(bench: Bench) -> list[Figure]:
    count = 30 if bench.quick else 200
    async with bench.database(NAME) as db:
        await db.create_job_tables(raw=RAW_TABLE)
        await _ship_round(bench, db, 5)  # warm-up, not measured
        await _raw_round(bench, db, 5)
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, count),
            lambda: _raw_round(bench, db, count),
        )
    note = (
        f"{count} cancels per round, one running run at a time, from a second backend on its own"
        f" engine; lease {LEASE:g} s (the heartbeat fallback is {LEASE / 3:g} s away)"
    )
    baseline = "raw UPDATE + pg_notify commit -> raw LISTEN callback"
    return latency_figures(
        "cancel",
        ours,
        theirs,
        baseline_label=baseline,
        p99_targets=(Target("value", "<=", 250.0),),
        note=note,
    )
