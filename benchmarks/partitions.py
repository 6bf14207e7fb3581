"""partitions: what partitioned limits (F8, F9) cost a drain and a claim at 10,000 partitions.

Drains: N noop runs spread over P tenants (round-robin, bulk-loaded), one runtime
(``max_in_flight`` 1,000) draining them; jobs/s from its start until ``stop()`` returned. Each
limit switched on, set far above what the drain reaches so it never binds (what is measured is
its cost: the partition walk, one gate row per partition, the per-partition counts), beside the
same drain of the same rows with no limit (the plain priority walk):

- ``partitions.drain.rate``: ``RateLimit(1,000,000, 1 s, partition="tenant")``;
- ``partitions.drain.cap``: ``Concurrency(max=1,000, partition="tenant")``;
- ``partitions.drain.both``: both;
- ``partitions.drain.rate_by_key``: ``RateLimit(1,000,000, 1 s, partition="key")``, the runs'
  partition keys stored as the tenants are (one key per tenant).

Target: each >= 0.8x the drain with none. Full: 10,000 tenants, 50,000 runs; quick (the CI
smoke): 1,000 tenants, 5,000 runs.

Claim latency: a claim of 50 at a backlog of W waiting runs over the same P tenants, of a job
with a per-tenant rate limit (the partitioned claim), beside the plain claim of the same rows;
the claimed runs are put back (untimed) so every claim sees the same backlog. Full: 1,000,000
runs over 10,000 tenants; quick: 100,000 over 1,000.
"""

from __future__ import annotations

import asyncio
from functools import partial
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
    measure_pair,
    median,
    paired_rounds,
    rate,
)
from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla.jobs import Concurrency, RateLimit
from ship_sqla.kernel._ports import ClaimRequest

if TYPE_CHECKING:
    import asyncpg

__all__ = ["NAME", "run"]

NAME = "partitions"
JOB_ID = "bench.partitions"
MAX_IN_FLIGHT = 1_000
DRAIN_TIMEOUT = 300.0
BATCH = 50
RATE = RateLimit(1_000_000, 1.0, partition="tenant")
CAP = Concurrency(max=1_000, partition="tenant")
LIMITS: dict[str, dict[str, Any]] = {
    "rate": {"rate_limit": RATE},
    "cap": {"concurrency": CAP},
    "both": {"rate_limit": RATE, "concurrency": CAP},
    "rate_by_key": {"rate_limit": RateLimit(1_000_000, 1.0, partition="key")},
}


def _sizes(bench: Bench) -> tuple[int, int, int]:
    """(tenants, runs per drain, waiting runs for the claim latency)."""
    return (1_000, 5_000, 100_000) if bench.quick else (10_000, 50_000, 1_000_000)


def _load(table: str, runs: int, tenants: int, *, spread_s: float) -> str:
    """``runs`` waiting runs of JOB_ID over ``tenants`` tenants (round-robin), due over the last
    ``spread_s`` seconds in creation order."""
    return (
        f"INSERT INTO {table} (id, job_id, state, payload, max_attempts, run_at, created_at,"
        " updated_at, tenant_id, partition_key)"
        f" SELECT 'r' || lpad(g::text, 9, '0'), '{JOB_ID}', 'waiting', '{{}}'::jsonb, 5,"
        f" now() - {spread_s} * interval '1 second' + g * ({spread_s} * interval '1 second'"
        f" / {runs}), now(), now(), 't' || lpad((g % {tenants})::text, 5, '0'),"
        f" 'k' || lpad((g % {tenants})::text, 5, '0')"
        f" FROM generate_series(1, {runs}) g"
    )


async def _drain(
    bench: Bench, db: BenchDatabase, runs: int, tenants: int, limit: str | None
) -> float:
    """One drain (see the module): jobs/s."""
    metadata = MetaData()
    table = ship_job_runs_table(metadata, partitioned_claims=True, partition_keys=True)
    state = ship_job_state_table(metadata)
    await db.maintain(f"TRUNCATE {table.name}, {state.name} CASCADE")
    async with db.engine.begin() as connection:
        await connection.exec_driver_sql(_load(table.name, runs, tenants, spread_s=60.0))
    await db.maintain(f"VACUUM (ANALYZE) {table.name}")
    drain = Countdown(runs)
    options = LIMITS[limit] if limit is not None else {}
    job = define_job(JOB_ID, drain.tick, payload=dict, **options)
    backend = create_job_backend(database=db.engine, table=table, state_table=state)
    with Stopwatch() as watch:
        runtime = await start_job_runtime(
            job, backend=backend, max_in_flight=MAX_IN_FLIGHT, poll_interval=5.0
        )
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                await drain.done.wait()
        finally:
            await runtime.stop()
    async with db.engine.connect() as connection:
        finished = (
            await connection.exec_driver_sql(
                f"SELECT count(*) FROM {table.name} WHERE state = 'completed'"
            )
        ).scalar_one()
    if finished != runs:
        raise BenchmarkError(f"partitions: {finished} of {runs} runs completed after the drain")
    jobs_per_s = rate(runs, watch.seconds)
    bench.log(
        f"drain {limit or 'none':5} {runs:,} runs / {tenants:,} tenants:"
        f" {watch.seconds:.2f} s = {jobs_per_s:,.0f} jobs/s"
    )
    return jobs_per_s


async def _claims(
    backend: PostgresJobBackend, conn: asyncpg.Connection, table: str, request: ClaimRequest, n: int
) -> list[float]:
    """``n`` timed claims of BATCH, each's runs put back waiting as they were (untimed)."""
    latencies = []
    put_back = (
        f"UPDATE {table} SET state = 'waiting', attempt = 0, lease_expires_at = NULL,"
        " claimed_by = NULL, lease_token = NULL WHERE id = ANY($1::text[])"
    )
    for _ in range(n):
        with Stopwatch() as watch:
            taken = await backend.claim(request)
        if len(taken) != BATCH:
            raise BenchmarkError(f"partitions: a claim returned {len(taken)} runs, not {BATCH}")
        latencies.append(watch.seconds * 1000.0)
        await conn.execute(put_back, [run.run_id for run in taken])
    return latencies


async def _claim_latency(
    bench: Bench, db: BenchDatabase, waiting: int, tenants: int
) -> tuple[list[float], list[float]]:
    """Per round: the median partitioned claim (a per-tenant rate limit that never binds) and
    the median plain claim, on the same rows."""
    metadata = MetaData()
    table = ship_job_runs_table(metadata, partitioned_claims=True, partition_keys=True)
    state = ship_job_state_table(metadata)
    await db.maintain(f"TRUNCATE {table.name}, {state.name} CASCADE")
    bench.log(f"loading {waiting:,} waiting runs over {tenants:,} tenants")
    async with db.engine.begin() as connection:
        await connection.exec_driver_sql(_load(table.name, waiting, tenants, spread_s=3_600.0))
    await db.maintain(f"VACUUM (ANALYZE) {table.name}")
    backend = create_job_backend(database=db.engine, table=table, state_table=state)
    conn = await db.raw()
    claims = 30 if bench.quick else 100
    partitioned = ClaimRequest(
        JOB_ID, "bench", BATCH, None, 300.0, rate_limit=RATE, partition="tenant"
    )
    plain = ClaimRequest(JOB_ID, "bench", BATCH, None, 300.0)
    mine = partial(_claims, backend, conn, table.name, partitioned, claims)
    base = partial(_claims, backend, conn, table.name, plain, claims)
    await mine()  # warm-up: the gate rows, plans, caches
    await base()
    ours: list[float] = []
    theirs: list[float] = []
    for index in range(bench.rounds):
        got, baseline = await measure_pair(index, mine, base)
        ours.append(median(got))
        theirs.append(median(baseline))
        bench.log(
            f"claim round {index + 1}: partitioned {ours[-1]:.2f} ms, plain {theirs[-1]:.2f} ms"
        )
    return ours, theirs


async def run(bench: Bench) -> list[Figure]:
    tenants, runs, waiting = _sizes(bench)
    figures = []
    async with bench.database(NAME) as db:
        metadata = MetaData()
        ship_job_runs_table(metadata, partitioned_claims=True, partition_keys=True)
        ship_job_state_table(metadata)
        ship_job_workers_table(metadata)  # the runtime registers itself (F6), as deployed
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        await _drain(bench, db, 1_000, 100, None)  # warm-up (not measured)
        for limit in LIMITS:
            await _drain(bench, db, 1_000, 100, limit)
            ours, theirs = await paired_rounds(
                bench.rounds,
                lambda limit=limit: _drain(bench, db, runs, tenants, limit),
                lambda: _drain(bench, db, runs, tenants, None),
            )
            figures.append(
                Figure.from_rounds(
                    f"partitions.drain.{limit}",
                    "jobs/s",
                    ours,
                    theirs,
                    baseline_label="the same drain with no limit",
                    targets=(Target("ratio", ">=", 0.8),),
                    note=f"N={runs:,} noop runs over {tenants:,} tenants, max_in_flight"
                    f" {MAX_IN_FLIGHT:,}; the per-tenant {limit} limit never binds",
                )
            )
        ours, theirs = await _claim_latency(bench, db, waiting, tenants)
    label = f"{waiting // 1_000_000}M" if waiting >= 1_000_000 else f"{waiting // 1_000}k"
    figures.append(
        Figure.from_rounds(
            f"partitions.claim@{label}",
            "ms",
            ours,
            theirs,
            baseline_label=f"the plain claim of {BATCH}, same rows",
            note=f"median claim of {BATCH} of a job with a per-tenant rate limit, {waiting:,}"
            f" waiting runs over {tenants:,} tenants",
        )
    )
    return figures
