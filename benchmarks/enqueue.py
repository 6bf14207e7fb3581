"""enqueue: runs written per second, one at a time and in bulk.

single: each ``backend.enqueue`` in its own ``uow.run`` (BEGIN, the enqueue statement, COMMIT)
        vs. a raw asyncpg INSERT each in its own transaction; sequential, one connection each.
bulk:   ``enqueue_many`` in calls of BULK_BATCH requests (each call its own transaction)
        vs. raw asyncpg COPY of the same number of rows per call.
single.capped / bulk.capped: the same calls on a backend with a ``queue_depth_limit`` (J2, a
        hard cap), beside the uncapped calls of the same run: what the cap costs per enqueue.
single.announced / single.notify / bulk.notify (K1, K8): what announcing costs a committing
        enqueue, beside the same calls on a backend that announces nothing
        (``announce=False``), same run: as shipped (``announced``: every enqueue is announced,
        in its transaction when the sender's gap allows, else after its commit in a
        notify-only transaction carrying every enqueue committed meanwhile), and every one in
        its own transaction (``notify``: every enqueue, or every ``enqueue_many`` call, folds
        its NOTIFY into its INSERT; the cost of one NOTIFY plus the notifying commit's
        database-wide lock).
        The limit (CAP_LIMIT) is never reached, so every run is accepted; each call takes the
        job's gate row, then counts the job's waiting runs (up to the depth at that moment,
        the backlog of the round so far) in the checked statement.

Both write tables built by ``ship_job_runs_table`` (same indexes), truncated before each round.
The library's timed path includes what it does for the caller (payload validation and JSON
encoding, ids, dedupe and depth checks); the baselines' timed path builds their rows (ids and
JSON text) too. The requests themselves are the caller's data, built before timing.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import MetaData

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    Figure,
    Stopwatch,
    Target,
    ordered_ids,
    paired_rounds,
    rate,
)
from benchmarks._raw_sql import JOB_COPY_COLUMNS, job_sql
from ship_sqla import JobContext, TransactionScope, create_unit_of_work, define_job
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.jobs import EnqueueRequest, JobDefinition
from ship_sqla.kernel._plans.announce import AnnouncePlan

__all__ = ["NAME", "run"]

NAME = "enqueue"
JOB_ID = "bench.enqueue"
RAW_TABLE = "raw_job_runs"
BULK_BATCH = 10_000
CAP_LIMIT = 1_000_000
PAYLOAD: dict[str, Any] = {"order_id": 12345, "kind": "bench"}


async def _noop(_ctx: JobContext, _payload: dict[str, Any]) -> None:
    return None


def _sizes(bench: Bench) -> tuple[int, int]:
    """(single enqueues per round, bulk runs per round)."""
    return (300, 20_000) if bench.quick else (2_000, 100_000)


class _FoldEvery(AnnouncePlan):
    """Every enqueue announces in its own transaction (the unthrottled baseline of K1)."""

    def fold(self, now: float) -> bool:  # noqa: ARG002 - always
        return True


class _Enqueue:
    def __init__(self, bench: Bench, db: BenchDatabase) -> None:
        self.bench = bench
        self.db = db
        metadata = MetaData()
        self.table = ship_job_runs_table(metadata)
        state = ship_job_state_table(metadata)
        ship_job_runs_table(metadata, name=RAW_TABLE)
        self.metadata = metadata
        self.job: JobDefinition[dict[str, Any]] = define_job(JOB_ID, _noop, payload=dict)
        self.backend: PostgresJobBackend = create_job_backend(database=db.engine, table=self.table)
        self.capped: PostgresJobBackend = create_job_backend(
            database=db.engine,
            table=self.table,
            state_table=state,
            queue_depth_limit=CAP_LIMIT,
        )
        # K1's A/B: the same backend announcing nothing, and announcing every enqueue in its
        # own transaction.
        self.silent: PostgresJobBackend = create_job_backend(
            database=db.engine, table=self.table, announce=False
        )
        self.every: PostgresJobBackend = create_job_backend(database=db.engine, table=self.table)
        assert self.every._announcer is not None  # noqa: S101, SLF001 - announce=True
        self.every._announcer.plan = _FoldEvery()  # noqa: SLF001 - the unthrottled "worst"
        self.uow = create_unit_of_work(db.engine, repositories=_scope_itself)
        self.sql = job_sql(RAW_TABLE)

    async def setup(self) -> None:
        async with self.db.engine.begin() as connection:
            await connection.run_sync(self.metadata.create_all)

    async def _truncate(self) -> None:
        await self.db.maintain(f"TRUNCATE {self.table.name}, {RAW_TABLE} CASCADE")

    async def ship_single(
        self, count: int, *, capped: bool = False, announcing: str | None = None
    ) -> float:
        await self._truncate()
        backend, job = (self.capped if capped else self.backend), self.job
        if announcing is not None:
            backend = self.silent if announcing == "none" else self.every

        async def enqueue_one(_scope: TransactionScope) -> None:
            await backend.enqueue(job, PAYLOAD)

        with Stopwatch() as watch:
            for _ in range(count):
                await self.uow.run(enqueue_one)
        per_s = rate(count, watch.seconds)
        label = "ship single capped" if capped else "ship single "
        if announcing is not None:
            label = f"ship single announcing {announcing}"
        self.bench.log(f"{label} {count} in {watch.seconds:.2f} s = {per_s:,.0f}/s")
        return per_s

    async def raw_single(self, count: int) -> float:
        await self._truncate()
        connection = await self.db.raw()
        ids = ordered_ids()
        with Stopwatch() as watch:
            for _ in range(count):
                async with connection.transaction():
                    await connection.execute(
                        self.sql.insert_one, next(ids), JOB_ID, json.dumps(PAYLOAD)
                    )
        await connection.close()
        per_s = rate(count, watch.seconds)
        self.bench.log(f"raw  single  {count} in {watch.seconds:.2f} s = {per_s:,.0f}/s")
        return per_s

    async def ship_bulk(
        self, count: int, *, capped: bool = False, announcing: str | None = None
    ) -> float:
        await self._truncate()
        backend = self.capped if capped else self.backend
        if announcing is not None:
            backend = self.silent if announcing == "none" else self.every
        calls = [
            [EnqueueRequest(payload=PAYLOAD) for _ in range(min(BULK_BATCH, count - start))]
            for start in range(0, count, BULK_BATCH)
        ]
        with Stopwatch() as watch:
            for requests in calls:
                await backend.enqueue_many(self.job, requests)
        per_s = rate(count, watch.seconds)
        label = "ship bulk capped" if capped else "ship bulk   "
        if announcing is not None:
            label = f"ship bulk announcing {announcing}"
        self.bench.log(f"{label} {count} in {watch.seconds:.2f} s = {per_s:,.0f}/s")
        return per_s

    async def raw_bulk(self, count: int) -> float:
        await self._truncate()
        connection = await self.db.raw()
        now = await connection.fetchval("SELECT now()")
        ids = ordered_ids()
        with Stopwatch() as watch:
            for start in range(0, count, BULK_BATCH):
                payload = json.dumps(PAYLOAD)
                records = [
                    (next(ids), JOB_ID, "waiting", payload, 5, now, now, now)
                    for _ in range(min(BULK_BATCH, count - start))
                ]
                await connection.copy_records_to_table(
                    RAW_TABLE, records=records, columns=JOB_COPY_COLUMNS
                )
        await connection.close()
        per_s = rate(count, watch.seconds)
        self.bench.log(f"raw  COPY    {count} in {watch.seconds:.2f} s = {per_s:,.0f}/s")
        return per_s


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


async def run(bench: Bench) -> list[Figure]:
    single, bulk = _sizes(bench)
    async with bench.database(NAME) as db:
        work = _Enqueue(bench, db)
        await work.setup()
        # Warm-up (not measured): pool, prepared statements, SQLAlchemy's compiled cache.
        await work.ship_single(50)
        await work.raw_single(50)
        await work.ship_bulk(BULK_BATCH)
        await work.raw_bulk(BULK_BATCH)
        await work.ship_single(50, capped=True)
        await work.ship_bulk(BULK_BATCH, capped=True)
        for announcing in ("none", "every"):
            await work.ship_single(50, announcing=announcing)
            await work.ship_bulk(BULK_BATCH, announcing=announcing)
        single_ours, single_raw = await paired_rounds(
            bench.rounds, lambda: work.ship_single(single), lambda: work.raw_single(single)
        )
        bulk_ours, bulk_raw = await paired_rounds(
            bench.rounds, lambda: work.ship_bulk(bulk), lambda: work.raw_bulk(bulk)
        )
        single_capped, single_uncapped = await paired_rounds(
            bench.rounds,
            lambda: work.ship_single(single, capped=True),
            lambda: work.ship_single(single),
        )
        bulk_capped, bulk_uncapped = await paired_rounds(
            bench.rounds,
            lambda: work.ship_bulk(bulk, capped=True),
            lambda: work.ship_bulk(bulk),
        )
        single_announced, single_silent = await paired_rounds(
            bench.rounds,
            lambda: work.ship_single(single),
            lambda: work.ship_single(single, announcing="none"),
        )
        single_every, single_silent_too = await paired_rounds(
            bench.rounds,
            lambda: work.ship_single(single, announcing="every"),
            lambda: work.ship_single(single, announcing="none"),
        )
        bulk_every, bulk_silent = await paired_rounds(
            bench.rounds,
            lambda: work.ship_bulk(bulk, announcing="every"),
            lambda: work.ship_bulk(bulk, announcing="none"),
        )
    return [
        Figure.from_rounds(
            "enqueue.single",
            "runs/s",
            single_ours,
            single_raw,
            baseline_label="raw INSERT, own transaction each",
            targets=(Target("ratio", ">=", 0.60),),
            note=f"{single:,} sequential enqueues per round, each its own uow.run",
        ),
        Figure.from_rounds(
            "enqueue.bulk",
            "runs/s",
            bulk_ours,
            bulk_raw,
            baseline_label=f"raw COPY, {BULK_BATCH:,} rows per call",
            targets=(Target("value", ">=", 80_000),),
            note=f"{bulk:,} runs per round in enqueue_many calls of {BULK_BATCH:,}",
        ),
        Figure.from_rounds(
            "enqueue.single.capped",
            "runs/s",
            single_capped,
            single_uncapped,
            baseline_label="the same enqueues without queue_depth_limit",
            note=f"{single:,} sequential enqueues per round, each its own uow.run, on a backend"
            f" with queue_depth_limit={CAP_LIMIT:,} (gate row + counted insert)",
        ),
        Figure.from_rounds(
            "enqueue.bulk.capped",
            "runs/s",
            bulk_capped,
            bulk_uncapped,
            baseline_label="the same enqueue_many calls without queue_depth_limit",
            note=f"{bulk:,} runs per round in enqueue_many calls of {BULK_BATCH:,}, with"
            f" queue_depth_limit={CAP_LIMIT:,}: each call counts the round's backlog so far",
        ),
        Figure.from_rounds(
            "enqueue.single.announced",
            "runs/s",
            single_announced,
            single_silent,
            baseline_label="the same enqueues announcing nothing",
            targets=(Target("ratio", ">=", 0.90),),
            note=f"{single:,} sequential enqueues per round, each its own uow.run, as shipped"
            " (K8: every one announced, in its transaction or right after its commit)",
        ),
        Figure.from_rounds(
            "enqueue.single.notify",
            "runs/s",
            single_every,
            single_silent_too,
            baseline_label="the same enqueues announcing nothing",
            note=f"{single:,} sequential enqueues per round, EVERY one announced in its own"
            " transaction: one NOTIFY's cost per committing enqueue",
        ),
        Figure.from_rounds(
            "enqueue.bulk.notify",
            "runs/s",
            bulk_every,
            bulk_silent,
            baseline_label="the same enqueue_many calls announcing nothing",
            note=f"{bulk:,} runs per round in enqueue_many calls of {BULK_BATCH:,}, every call"
            " announced (one NOTIFY per call)",
        ),
    ]
