"""process: how fast one worker drains a backlog of noop runs.

ship_sqla: N runs pre-enqueued with ``enqueue_many``; one runtime (``start_job_runtime`` over
``create_job_backend``) in this process; the time from start until ``stop()`` returned after the
last handler (so the last batched completion is included) gives jobs/s. Every run must end
``completed`` or the round is invalid.

Baseline: the raw ceiling of the same work on an equivalent table (same factory, same indexes):
4 asyncpg connections, each looping claim 50 (``FOR UPDATE SKIP LOCKED``) then complete them.

``process.rate_limit_unbound`` (F3): the same drain with the job rate-limited far above what it
reaches (every claim goes through the job's claim gate and records its starts), beside the same
drain without a rate limit. ``process.fair_lone_tenant`` (F2): the same drain with the job fair
across tenants and every run one tenant's, beside the same drain without fairness.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Countdown,
    Figure,
    Stopwatch,
    Target,
    paired_rounds,
    rate,
)
from benchmarks._raw_sql import job_sql
from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._tables import fair_claims_ddl
from ship_sqla.jobs import Concurrency, EnqueueRequest, Fairness, JobDefinition, RateLimit
from ship_sqla.kernel._tenancy import tenant_ambient

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla._jobs import PostgresJobBackend
    from ship_sqla.jobs import JobRuntime

__all__ = ["MAX_IN_FLIGHT", "NAME", "drain_jobs", "drain_size", "run"]

NAME = "process"
JOB_ID = "bench.noop"
RAW_TABLE = "raw_job_runs"
RAW_CONNECTIONS = 4
RAW_BATCH = 50
ENQUEUE_BATCH = 10_000
MAX_IN_FLIGHT = 1000
"""Runtime tuning for throughput: noop handlers finish at once, so slots only bound batching."""
DRAIN_TIMEOUT = 120.0
RATE_UNBOUND = 1_000_000
"""process.rate_limit_unbound's RateLimit per second: far above any drain here."""


def drain_size(bench: Bench) -> int:
    """Runs per drain: 20,000, or 5,000 with ``--quick``."""
    return 5_000 if bench.quick else 20_000


async def _ship_round(
    bench: Bench,
    db: BenchDatabase,
    runs: int,
    *,
    rate_limit: RateLimit | None = None,
    fairness: Fairness | None = None,
) -> float:
    return await drain_jobs(
        bench,
        db,
        runs,
        max_in_flight=MAX_IN_FLIGHT,
        poll_interval=5.0,
        rate_limit=rate_limit,
        fairness=fairness,
    )


async def drain_jobs(
    bench: Bench,
    db: BenchDatabase,
    runs: int,
    *,
    max_in_flight: int | None,
    poll_interval: float | None,
    rate_limit: RateLimit | None = None,
    fairness: Fairness | None = None,
    ablate_backend: Callable[[PostgresJobBackend], AbstractContextManager[None]] | None = None,
    ablate_runtime: Callable[[JobRuntime], AbstractContextManager[None]] | None = None,
) -> float:
    """``runs`` noop runs pre-enqueued, one runtime; jobs/s from its start until stop() returned.

    ``max_in_flight`` (also the job's ``concurrency.max``) and ``poll_interval``: None leaves
    the library's default (no fleet-wide cap, 100 in flight, poll every second).
    ``rate_limit``: the job's (F3), None for none. ``fairness``: the job's (F2); its runs are
    then one tenant's.

    ``ablate_backend`` / ``ablate_runtime`` (benchmarks/ablations.py) turn one optimisation off
    for the timed part: the backend's before the runtime starts, the runtime's right after."""
    metadata = MetaData()
    table = ship_job_runs_table(metadata)
    state = ship_job_state_table(metadata)
    await db.maintain(f"TRUNCATE {table.name}, {state.name} CASCADE")
    drain = Countdown(runs)
    options: dict[str, Any] = {}
    if max_in_flight is not None:
        options["max_in_flight"] = max_in_flight
    if poll_interval is not None:
        options["poll_interval"] = poll_interval
    job: JobDefinition[dict[str, Any]] = define_job(
        JOB_ID,
        drain.tick,
        payload=dict,
        concurrency=Concurrency() if max_in_flight is None else Concurrency(max=max_in_flight),
        rate_limit=rate_limit,
        fairness=fairness,
    )
    backend = create_job_backend(database=db.engine, table=table, state_table=state)
    # A fair job's runs are one tenant's (F2: the lone-tenant case); others have none.
    with tenant_ambient(None if fairness is None else "bench-tenant"):
        for start in range(0, runs, ENQUEUE_BATCH):
            size = min(ENQUEUE_BATCH, runs - start)
            await backend.enqueue_many(job, [EnqueueRequest(payload={}) for _ in range(size)])
    await db.maintain(f"VACUUM (ANALYZE) {table.name}")
    backend_off = ablate_backend(backend) if ablate_backend is not None else nullcontext()
    with backend_off, Stopwatch() as watch:
        runtime = await start_job_runtime(job, backend=backend, **options)
        try:
            with ablate_runtime(runtime) if ablate_runtime is not None else nullcontext():
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await drain.done.wait()
        finally:
            await runtime.stop()
    async with db.engine.connect() as connection:
        completed = await connection.exec_driver_sql(
            f"SELECT count(*) FROM {table.name} WHERE state = 'completed'"
        )
        finished = completed.scalar_one()
    if finished != runs:
        raise BenchmarkError(f"process: {finished} of {runs} runs completed after the drain")
    jobs_per_s = rate(runs, watch.seconds)
    ablated = ablate_backend is not None or ablate_runtime is not None
    bench.log(
        f"ship{' (ablated)' if ablated else ''}  {runs} runs, in flight"
        f" {max_in_flight or 'default'}, in"
        f" {watch.seconds:.2f} s = {jobs_per_s:,.0f} jobs/s"
    )
    return jobs_per_s


async def _raw_round(bench: Bench, db: BenchDatabase, runs: int) -> float:
    sql = job_sql(RAW_TABLE)
    loader = await db.raw()
    await loader.execute(f"TRUNCATE {RAW_TABLE}")
    await loader.execute(sql.load_waiting, JOB_ID, runs)
    await loader.execute(f"VACUUM (ANALYZE) {RAW_TABLE}")
    connections = [await db.raw() for _ in range(RAW_CONNECTIONS)]
    done = 0

    async def worker(connection: Any) -> None:  # noqa: ANN401 - asyncpg is untyped
        nonlocal done
        while True:
            claimed = await connection.fetch(sql.claim, JOB_ID, "raw", RAW_BATCH)
            if not claimed:
                return
            await connection.execute(
                sql.complete, [row[0] for row in claimed], [row[1] for row in claimed]
            )
            done += len(claimed)

    with Stopwatch() as watch:
        await asyncio.gather(*(worker(connection) for connection in connections))
    for connection in connections:
        await connection.close()
    if done != runs:
        raise BenchmarkError(f"process baseline: {done} of {runs} runs completed")
    jobs_per_s = rate(runs, watch.seconds)
    bench.log(f"raw   {runs} runs in {watch.seconds:.2f} s = {jobs_per_s:,.0f} jobs/s")
    return jobs_per_s


async def run(bench: Bench) -> list[Figure]:
    runs = drain_size(bench)
    async with bench.database(NAME) as db:
        await db.create_job_tables(raw=RAW_TABLE)
        # Warm-up (not measured): connections, prepared statements, the runtime's code paths.
        await _ship_round(bench, db, 1_000)
        await _raw_round(bench, db, 1_000)
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, runs),
            lambda: _raw_round(bench, db, runs),
        )
        # F3: a rate limit that never binds, beside the same drain without one.
        rated = RateLimit(RATE_UNBOUND, 1.0)
        await _ship_round(bench, db, 1_000, rate_limit=rated)
        rated_ours, rated_theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, runs, rate_limit=rated),
            lambda: _ship_round(bench, db, runs),
        )
        # F2: a fair job whose runs are all one tenant's, beside the same drain without fairness,
        # both on a runs table with the fair claims' index (ship_job_runs_table(...,
        # fair_claims=True)), added here so the drains above ran on the default table.
        await db.maintain(fair_claims_ddl(ship_job_runs_table(MetaData())))
        fair = Fairness()
        await _ship_round(bench, db, 1_000, fairness=fair)
        fair_ours, fair_theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, runs, fairness=fair),
            lambda: _ship_round(bench, db, runs),
        )
    return [
        Figure.from_rounds(
            "process.fair_lone_tenant",
            "jobs/s",
            fair_ours,
            fair_theirs,
            baseline_label="the same drain without fairness (FIFO)",
            targets=(Target("ratio", ">=", 0.9),),
            note=f"N={runs:,} noop runs as process.noop, all of one tenant, the job with"
            " Fairness() (F2: every claim walks the tenants and shares the room)",
        ),
        Figure.from_rounds(
            "process.rate_limit_unbound",
            "jobs/s",
            rated_ours,
            rated_theirs,
            baseline_label="the same drain without a rate limit",
            targets=(Target("ratio", ">=", 0.85),),
            note=f"N={runs:,} noop runs as process.noop, the job with"
            f" RateLimit({RATE_UNBOUND:,}, 1.0), which never binds (F3: every claim goes"
            " through the claim gate and records its starts)",
        ),
        Figure.from_rounds(
            "process.noop",
            "jobs/s",
            ours,
            theirs,
            baseline_label=f"raw asyncpg claim {RAW_BATCH} + complete, {RAW_CONNECTIONS} conns",
            targets=(Target("value", ">=", 15_000), Target("ratio", ">=", 0.6)),
            note=f"N={runs:,} noop runs, one runtime, max_in_flight={MAX_IN_FLIGHT},"
            f" concurrency.max={MAX_IN_FLIGHT}",
        ),
    ]
