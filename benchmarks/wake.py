"""wake: from a local enqueue's commit to its handler starting.

ship_sqla: a runtime with ``poll_interval`` = 60 s (so only the local wake can explain a fast
start) waits idle; ``uow.run`` enqueues one run. The clock starts in an ``after_commit`` callback
registered before the enqueue (callbacks run in order, after the commit, so it runs before the
backend's wake) and stops when the handler starts. One run at a time; p50 and p99 per round.

Baseline: the floor any queue on this server pays for the same path: a raw INSERT commits, an
in-process event wakes a waiting task, which claims the row on its own connection (one
autocommitted SKIP LOCKED statement); the clock stops when the claim returns it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Target,
    ordered_ids,
    paired_rounds,
    percentile,
)
from benchmarks._raw_sql import job_sql
from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel import JobContext, JobDefinition, define_job, start_job_runtime

__all__ = ["NAME", "run"]

NAME = "wake"
JOB_ID = "bench.wake"
RAW_TABLE = "raw_job_runs"
POLL_INTERVAL = 60.0
MISS_AFTER = 5.0
"""Seconds: a start later than this is a missed wake (the poll is 60 s away), an invalid round."""


class _Samples:
    """Pairs each commit time with the next handler start."""

    def __init__(self) -> None:
        self.committed = 0.0
        self.started = asyncio.Event()
        self.latencies: list[float] = []

    def mark_commit(self) -> None:
        self.committed = time.perf_counter()

    def mark_start(self) -> None:
        self.latencies.append((time.perf_counter() - self.committed) * 1000.0)
        self.started.set()

    async def next_start(self, what: str) -> None:
        try:
            async with asyncio.timeout(MISS_AFTER):
                await self.started.wait()
        except TimeoutError as exc:
            raise BenchmarkError(f"wake: {what} did not start within {MISS_AFTER} s") from exc
        self.started.clear()


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


async def _ship_round(bench: Bench, db: BenchDatabase, count: int) -> tuple[float, float]:
    samples = _Samples()

    async def handler(_ctx: JobContext, _payload: dict[str, Any]) -> None:
        samples.mark_start()

    metadata = MetaData()
    job: JobDefinition[dict[str, Any]] = define_job(JOB_ID, handler, payload=dict)
    backend = create_job_backend(
        database=db.engine,
        table=ship_job_runs_table(metadata),
        state_table=ship_job_state_table(metadata),
        poll_interval=POLL_INTERVAL,
    )
    uow = create_unit_of_work(db.engine, repositories=_scope_itself)

    async def enqueue(scope: TransactionScope) -> None:
        scope.after_commit(samples.mark_commit)
        await backend.enqueue(job, {})

    runtime = await start_job_runtime(job, backend=backend)
    try:
        for _ in range(count):
            await uow.run(enqueue)
            await samples.next_start("a woken run")
    finally:
        await runtime.stop()
    return _summary(bench, "ship", samples.latencies)


async def _raw_round(bench: Bench, db: BenchDatabase, count: int) -> tuple[float, float]:
    sql = job_sql(RAW_TABLE)
    producer = await db.raw()
    consumer = await db.raw()
    samples = _Samples()
    wake = asyncio.Event()
    ids = ordered_ids()

    async def worker() -> None:
        while True:
            await wake.wait()
            wake.clear()
            if await consumer.fetch(sql.claim, JOB_ID, "raw", 10):
                samples.mark_start()

    task = asyncio.get_running_loop().create_task(worker())
    try:
        for _ in range(count):
            async with producer.transaction():
                await producer.execute(sql.insert_one, next(ids), JOB_ID, "{}")
            samples.mark_commit()
            wake.set()
            await samples.next_start("a raw claim")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return _summary(bench, "raw ", samples.latencies)


def _summary(bench: Bench, who: str, latencies: list[float]) -> tuple[float, float]:
    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    bench.log(f"{who} commit -> start: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    return p50, p99


async def run(bench: Bench) -> list[Figure]:
    count = 50 if bench.quick else 300
    async with bench.database(NAME) as db:
        metadata = MetaData()
        ship_job_runs_table(metadata)
        ship_job_state_table(metadata)
        ship_job_runs_table(metadata, name=RAW_TABLE)
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        await _ship_round(bench, db, 20)  # warm-up, not measured
        await _raw_round(bench, db, 20)
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, count),
            lambda: _raw_round(bench, db, count),
        )
    note = f"{count} enqueues per round, one at a time; poll_interval={POLL_INTERVAL:g} s"
    baseline = "raw commit -> event -> SKIP LOCKED claim"
    return [
        Figure.from_rounds(
            "wake.p50",
            "ms",
            [p50 for p50, _ in ours],
            [p50 for p50, _ in theirs],
            baseline_label=baseline,
            targets=(Target("value", "<=", 5.0),),
            note=note,
        ),
        Figure.from_rounds(
            "wake.p99",
            "ms",
            [p99 for _, p99 in ours],
            [p99 for _, p99 in theirs],
            baseline_label=baseline,
        ),
    ]
