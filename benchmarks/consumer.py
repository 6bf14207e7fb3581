"""consumer: items per second through a consumer over a table stream (SPEC §15, C1, issue 28).

ship_sqla (``consumer.batch_N``): a worker runtime runs ``define_consumer(...)`` (batch N) over
``bench_stream`` (ITEMS rows, one key); ``open`` reads the stream a page of N rows at a time
(keyset by id, each page its own short read), ``handle`` inserts one ``bench_effects`` row per
item (one INSERT ... SELECT unnest), and the cursor (``bench_cursors``, one row per key) is
upserted by the cursor seam in the batch's transaction, which begins with the run's J13 fence.
Timed from the stream's ``open`` (the run claimed, its cursor loaded) to the commit of the
batch holding the last item (the consumer's ``lag`` is called after each commit); the
supervisor's arming and the claim are outside the window.

Baseline: one raw asyncpg connection looping, per batch, in one transaction: SELECT the next N
ids after the cursor, the same INSERT ... SELECT unnest, and the cursor UPDATE. Same tables
(its own effects and cursor rows), same run, rounds alternating which goes first.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, text

from benchmarks._harness import Bench, BenchDatabase, BenchmarkError, Figure, paired_rounds
from ship_sqla import create_job_backend, create_unit_of_work, start_job_runtime
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table, ship_job_workers_table
from ship_sqla.consumers import define_consumer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ship_sqla import TransactionScope

__all__ = ["NAME", "run"]

NAME = "consumer"
BATCHES = (1, 100, 1000)
MISS_AFTER = 120.0

SCHEMA = (
    "CREATE TABLE bench_stream (id bigint PRIMARY KEY, amount bigint NOT NULL)",
    "CREATE TABLE bench_effects (item_id bigint NOT NULL, amount bigint NOT NULL)",
    "CREATE TABLE bench_cursors (key text PRIMARY KEY, position bigint NOT NULL)",
)
PAGE = text(
    "SELECT id, amount FROM bench_stream WHERE id > :after AND id <= :last ORDER BY id LIMIT :n"
)  # bench_stream_pkey
EFFECTS = text(
    "INSERT INTO bench_effects (item_id, amount)"
    " SELECT unnest(CAST(:ids AS bigint[])), unnest(CAST(:amounts AS bigint[]))"
)
LOAD = text("SELECT position FROM bench_cursors WHERE key = :key")
SAVE = text(
    "INSERT INTO bench_cursors (key, position) VALUES (:key, :position)"
    " ON CONFLICT (key) DO UPDATE SET position = excluded.position"
)
RAW_PAGE = "SELECT id, amount FROM bench_stream WHERE id > $1 AND id <= $3 ORDER BY id LIMIT $2"
RAW_EFFECTS = (
    "INSERT INTO bench_effects (item_id, amount) SELECT unnest($1::bigint[]), unnest($2::bigint[])"
)
RAW_CURSOR = "UPDATE bench_cursors SET position = $2 WHERE key = $1"


def _items(bench: Bench, batch: int) -> int:
    if bench.quick:
        return {1: 200, 100: 5_000, 1000: 20_000}[batch]
    return {1: 1_000, 100: 30_000, 1000: 100_000}[batch]


class _Cursors:
    async def load(self, key: str, scope: TransactionScope) -> int | None:
        row = (await scope.connection.execute(LOAD, {"key": key})).first()
        return None if row is None else int(row.position)

    async def save(self, key: str, cursor: int, scope: TransactionScope) -> None:
        await scope.connection.execute(SAVE, {"key": key, "position": cursor})


def _scope(scope: TransactionScope) -> TransactionScope:
    return scope


async def _ship_round(db: BenchDatabase, batch: int, items: int, index: int) -> float:
    metadata = MetaData()
    backend = create_job_backend(
        database=db.engine,
        table=ship_job_runs_table(metadata),
        state_table=ship_job_state_table(metadata),
        workers_table=ship_job_workers_table(metadata),
    )
    uow = create_unit_of_work(db.engine, repositories=_scope)
    key = f"ship-{batch}-{index}"
    began: list[float] = []
    ended = asyncio.Event()
    finished_at: list[float] = []

    async def keys(_ctx: object) -> list[str]:
        return [key]

    async def read(_ctx: object, _key: str, cursor: int | None) -> AsyncIterator[Any]:
        began.append(time.perf_counter())
        after = cursor or 0
        while True:
            async with db.engine.connect() as connection:
                rows = (
                    await connection.execute(PAGE, {"after": after, "last": items, "n": batch})
                ).all()
            if not rows:
                return
            for row in rows:
                yield row
            after = rows[-1].id

    async def handle(_ctx: object, _key: str, rows: list[Any], scope: TransactionScope) -> int:
        ids = [row.id for row in rows]
        amounts = [row.amount for row in rows]
        await scope.connection.execute(EFFECTS, {"ids": ids, "amounts": amounts})
        return ids[-1]

    async def lag(_ctx: object, _key: str, cursor: int) -> int:
        if cursor >= items:
            finished_at.append(time.perf_counter())
            ended.set()
        return items - cursor

    consumer = define_consumer(
        f"bench.consumer.{batch}.{index}",
        keys=keys,
        open=read,
        handle=handle,
        cursor=_Cursors(),
        transaction=uow,
        batch=batch,
        lag=lag,
    )
    async with await start_job_runtime(list(consumer.jobs), backend=backend, poll_interval=0.05):
        await backend.enqueue(consumer.supervisor, {})
        try:
            async with asyncio.timeout(MISS_AFTER):
                await ended.wait()
        except TimeoutError as exc:
            raise BenchmarkError(
                f"consumer: batch {batch} did not finish in {MISS_AFTER} s"
            ) from exc
    return items / (finished_at[0] - began[0])


async def _raw_round(db: BenchDatabase, batch: int, items: int, index: int) -> float:
    connection = await db.raw()
    key = f"raw-{batch}-{index}"
    await connection.execute("INSERT INTO bench_cursors (key, position) VALUES ($1, 0)", key)
    began = time.perf_counter()
    after = 0
    while True:
        async with connection.transaction():
            rows = await connection.fetch(RAW_PAGE, after, batch, items)
            if not rows:
                break
            ids = [row["id"] for row in rows]
            await connection.execute(RAW_EFFECTS, ids, [row["amount"] for row in rows])
            await connection.execute(RAW_CURSOR, key, ids[-1])
        after = ids[-1]
    seconds = time.perf_counter() - began
    await connection.close()
    return items / seconds


async def run(bench: Bench) -> list[Figure]:
    figures: list[Figure] = []
    async with bench.database(NAME) as db:
        await db.create_job_tables()
        async with db.engine.begin() as connection:
            for statement in SCHEMA:
                await connection.execute(text(statement))
            await connection.execute(
                text(
                    "INSERT INTO bench_stream (id, amount) SELECT n, n % 1000"
                    " FROM generate_series(1, :n) AS n"
                ),
                {"n": max(_items(bench, batch) for batch in BATCHES)},
            )
        await db.maintain("VACUUM (ANALYZE) bench_stream")
        counter = iter(range(1_000_000))  # a fresh consumer id and cursor key per round
        for batch in BATCHES:
            items = _items(bench, batch)
            ours, theirs = await paired_rounds(
                bench.rounds,
                lambda batch=batch, items=items: _ship_round(db, batch, items, next(counter)),
                lambda batch=batch, items=items: _raw_round(db, batch, items, next(counter)),
            )
            bench.log(
                f"batch {batch}: ship {sorted(round(v) for v in ours)} items/s,"
                f" raw {sorted(round(v) for v in theirs)}"
            )
            await db.maintain("TRUNCATE bench_effects", "VACUUM bench_effects")
            figures.append(
                Figure.from_rounds(
                    f"consumer.batch_{batch}",
                    "items/s",
                    ours,
                    theirs,
                    baseline_label=(
                        "raw asyncpg loop: SELECT the batch + INSERT its effects + UPDATE the"
                        " cursor, one transaction per batch"
                    ),
                    note=(
                        f"{items:,} items of one key, batch {batch}; each batch's effects and"
                        " cursor in one transaction (the consumer's begins with the J13 fence);"
                        " from the stream's open to the last batch's commit"
                    ),
                )
            )
    return figures
