"""aging: what priority aging (F10) costs a claim at a large backlog.

One runs table holds the shape aging exists for (the EXPLAIN test's): a steady stream of fresh
priority-5 runs (60% of the backlog, due within the last minute), twenty fresh priority-10
runs, an old priority-0 backlog (30%, due within the last four minutes) with thirty runs due
seven minutes ago, and delayed runs on the highest and lowest levels. A figure is the median
latency of a claim of 50 by a job with ``Aging(step=1, every=60 s)`` (the aged claim: the
priority walk plus the aged seek below where it stopped), beside the same claim by a job with
strict priorities (K6) on the same rows, in the same round. After each timed claim the runs it
took are put back as they were (untimed), so every claim sees the same backlog.

Quick: 100,000 waiting runs; full: 1,000,000. Target: the aged claim within 2x the strict one.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchmarkError,
    Figure,
    Stopwatch,
    Target,
    measure_pair,
    median,
)
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import Aging
from ship_sqla.kernel._ports import ClaimRequest

__all__ = ["NAME", "run"]

NAME = "aging"
JOB_ID = "bench.aging"
BATCH = 50
FULL_BACKLOG = 1_000_000
QUICK_BACKLOG = 100_000
AGING = Aging(step=1, every=60.0)

SHAPE = [
    # tag, share of the backlog in 1/1000 (None: a fixed count), priority, due from (seconds
    # ago; < 0: delayed), spread over (seconds, later)
    ("p10d", 50, 10, -3_600, 100),
    ("p10u", None, 10, 30, 10),
    ("p5u", 600, 5, 60, 50),
    ("p0a", None, 0, 420, 10),
    ("p0u", 300, 0, 230, 200),
    ("pm5d", 50, -5, -3_600, 100),
]
FIXED = {"p10u": 20, "p0a": 30}


def _request(aging: Aging | None) -> ClaimRequest:
    return ClaimRequest(JOB_ID, "bench", BATCH, None, 300.0, aging=aging)


def _load(table: str, backlog: int) -> list[str]:
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at, priority"
    statements = []
    for tag, share, priority, ago, over in SHAPE:
        count = FIXED[tag] if share is None else share * backlog // 1_000
        statements.append(
            f"INSERT INTO {table} ({columns})"
            f" SELECT '{tag}' || lpad(g::text, 9, '0'), '{JOB_ID}', 'waiting', '{{}}'::jsonb, 5,"
            f"  now() - {ago} * interval '1 second' + g * ({over} * interval '1 second' / {count}),"
            f"  now(), now(), {priority}"
            f" FROM generate_series(1, {count}) g"
        )
    return statements


def _put_back(table: str) -> str:
    """The claimed runs waiting again as they were (same run_at, priority, seq)."""
    return (
        f"UPDATE {table} SET state = 'waiting', attempt = 0, lease_expires_at = NULL,"
        " claimed_by = NULL, lease_token = NULL WHERE id = ANY($1::text[])"
    )


async def _claims(backend: Any, conn: Any, table: str, aging: Aging | None, n: int) -> list[float]:  # noqa: ANN401
    latencies = []
    request = _request(aging)
    for _ in range(n):
        with Stopwatch() as watch:
            taken = await backend.claim(request)
        if len(taken) != BATCH:
            raise BenchmarkError(f"aging: a claim returned {len(taken)} runs, expected {BATCH}")
        latencies.append(watch.seconds * 1000.0)
        await conn.execute(_put_back(table), [run.run_id for run in taken])
    return latencies


async def run(bench: Bench) -> list[Figure]:
    size = QUICK_BACKLOG if bench.quick else FULL_BACKLOG
    claims = 30 if bench.quick else 100
    aged: list[float] = []
    strict: list[float] = []
    async with bench.database(NAME) as db:
        metadata = MetaData()
        runs = ship_job_runs_table(metadata, name="aging_runs")
        ship_job_state_table(metadata)
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        conn = await db.raw()
        bench.log(f"loading {size:,} waiting runs")
        for statement in _load(runs.name, size):
            await conn.execute(statement)
        await conn.execute(f"VACUUM (ANALYZE) {runs.name}")
        backend = create_job_backend(database=db.engine, table=runs)
        mine = partial(_claims, backend, conn, runs.name, AGING, claims)
        base = partial(_claims, backend, conn, runs.name, None, claims)
        await mine()  # warm-up: plans, prepared statements, caches
        await base()
        for index in range(bench.rounds):
            ours, theirs = await measure_pair(index, mine, base)
            aged.append(median(ours))
            strict.append(median(theirs))
            bench.log(f"round {index + 1}: aged {aged[-1]:.2f} ms, strict {strict[-1]:.2f} ms")
    label = f"{size // 1_000_000}M" if size >= 1_000_000 else f"{size // 1_000}k"
    return [
        Figure.from_rounds(
            f"aging.claim@{label}",
            "ms",
            aged,
            strict,
            baseline_label=f"the strict-priority claim of {BATCH} (K6), same rows",
            targets=(Target("ratio", "<=", 2.0),),
            note=f"median of {claims} claims of {BATCH} per round, Aging(step=1, every=60 s)",
        )
    ]
