"""synchronous_claims: what ``create_job_backend(synchronous_claims=True)`` costs a claim (J24).

By default a claim commits with ``synchronous_commit = off``: its COMMIT does not wait for the
WAL flush (nor, under synchronous replication, for the standby). ``synchronous_claims=True``
keeps the server's own setting (here ``on``, set on the benchmark's database), so each claim
waits for its WAL flush, as enqueues and settles always do. Both backends claim the same
backlog shape, sequentially, in batches of :data:`BATCH` (one statement, one round trip each);
the figure is the median claim latency with ``synchronous_claims=True``, beside the default's;
a second figure is the claim throughput of :data:`CONCURRENT` concurrent claimers (where the
server's group commit shares one WAL flush among commits that wait together).
On a single server this is the local flush (fdatasync); under synchronous replication the
claim also waits for the standby's answer, which this benchmark does not model.

Run: ``python -m benchmarks synchronous_claims`` (opt-in).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from benchmarks._harness import Bench, Figure, Stopwatch, median, paired_rounds
from ship_sqla import define_job
from ship_sqla._jobs import create_job_backend
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.kernel._ports import ClaimRequest

if TYPE_CHECKING:
    from benchmarks._harness import BenchDatabase
    from ship_sqla._jobs import PostgresJobBackend

__all__ = ["NAME", "run"]

NAME = "synchronous_claims"
BATCH = 10
CONCURRENT = 8
LEASE = 30.0


async def _noop(_ctx: object, _payload: dict[str, int]) -> None:
    return None


JOB = define_job("bench.synchronous_claims", _noop, payload=dict)


async def _claims(
    bench: Bench, db: BenchDatabase, backend: PostgresJobBackend, claims: int, label: str
) -> float:
    """Median ms of ``claims`` claims of BATCH, on a freshly loaded backlog."""
    await db.maintain("TRUNCATE ship_job_runs, ship_job_state CASCADE")
    await backend.enqueue_many(JOB, [EnqueueRequest({"n": n}) for n in range(claims * BATCH)])
    await db.maintain("VACUUM (ANALYZE) ship_job_runs")
    latencies: list[float] = []
    for _ in range(claims):
        with Stopwatch() as watch:
            batch = await backend.claim(ClaimRequest(JOB.id, "bench", BATCH, None, LEASE))
        if len(batch) != BATCH:
            msg = f"synchronous_claims: claimed {len(batch)} of {BATCH}"
            raise RuntimeError(msg)
        latencies.append(watch.seconds * 1e3)
    figure = median(latencies)
    bench.log(f"{label:<22} {figure:7.3f} ms/claim of {BATCH}")
    return figure


async def _concurrent(
    bench: Bench, db: BenchDatabase, backend: PostgresJobBackend, claims: int, label: str
) -> float:
    """Claims per second of CONCURRENT claimers sharing ``claims`` claims of BATCH (the
    server's group commit shares a WAL flush among concurrent commits)."""
    await db.maintain("TRUNCATE ship_job_runs, ship_job_state CASCADE")
    await backend.enqueue_many(JOB, [EnqueueRequest({"n": n}) for n in range(claims * BATCH)])
    await db.maintain("VACUUM (ANALYZE) ship_job_runs")

    async def claimer() -> None:
        for _ in range(claims // CONCURRENT):
            await backend.claim(ClaimRequest(JOB.id, "bench", BATCH, None, LEASE))

    with Stopwatch() as watch:
        await asyncio.gather(*(claimer() for _ in range(CONCURRENT)))
    figure = claims // CONCURRENT * CONCURRENT / watch.seconds
    bench.log(f"{label:<22} {figure:9.0f} claims/s ({CONCURRENT} concurrent)")
    return figure


async def run(bench: Bench) -> list[Figure]:
    claims = 100 if bench.quick else 400
    async with bench.database(NAME) as db:
        await db.create_job_tables()
        await db.maintain(f"ALTER DATABASE {db.name} SET synchronous_commit = on")
        await db.engine.dispose()  # new sessions take the database's setting
        synchronous = create_job_backend(database=db.engine, synchronous_claims=True)
        default = create_job_backend(database=db.engine)
        await _claims(bench, db, default, 20, "warm-up")
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _claims(bench, db, synchronous, claims, "synchronous_claims=True"),
            lambda: _claims(bench, db, default, claims, "default (off)"),
        )
        ours_c, theirs_c = await paired_rounds(
            bench.rounds,
            lambda: _concurrent(bench, db, synchronous, claims, "synchronous_claims=True"),
            lambda: _concurrent(bench, db, default, claims, "default (off)"),
        )
    return [
        Figure.from_rounds(
            "claim.synchronous.concurrent",
            "claims/s",
            ours_c,
            theirs_c,
            baseline_label="default claim (synchronous_commit=off)",
            note=f"{claims} claims of {BATCH} per round by {CONCURRENT} concurrent claimers,"
            " synchronous_commit=on, one server; throughput (higher is better)",
        ),
        Figure.from_rounds(
            "claim.synchronous",
            "ms",
            ours,
            theirs,
            baseline_label="default claim (synchronous_commit=off)",
            note=f"{claims} sequential claims of {BATCH} per round, synchronous_commit=on,"
            " one server (no standby); median claim latency",
        ),
    ]
