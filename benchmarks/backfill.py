"""backfill: pace accuracy of a paced backfill (SPEC §15, C4, issue 28): achieved vs declared.

ship_sqla (``backfill.pace``): a worker runtime runs ``define_backfill(...).job`` over a table of
``PAGES x PAGE_SIZE`` rows at ``PACE`` pages per second; each page is read by
``selectable_source`` (a keyset page by primary key) and handled in a unit of work (one UPDATE of
the page's rows), its checkpoint in the same transaction. The achieved rate is measured from the
handler's own page starts: ``(pages - 1) / (last start - first start)``, wall clock.

Baseline: a raw asyncpg loop doing the same work at the same declared pace (start to start:
``asyncio.sleep`` until the slot, SELECT the page, UPDATE its rows in a transaction with a
one-row cursor UPDATE), measured the same way. Target: within 10% of the declared rate.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Boolean, Column, MetaData, Table, select, text, update

from benchmarks._harness import Bench, BenchDatabase, BenchmarkError, Figure, Target, paired_rounds
from ship_sqla import create_job_backend, create_unit_of_work, start_job_runtime
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table, ship_job_workers_table
from ship_sqla.backfills import (
    create_backfill_ledger,
    create_backfill_operations,
    define_backfill,
    selectable_source,
    ship_backfills_table,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy import Row

    from ship_sqla._scope import TransactionScope

__all__ = ["NAME", "run"]

NAME = "backfill"
PACE = 20.0
PAGE_SIZE = 100
MISS_AFTER = 30.0


async def _allow(_permission: str, _operation: str) -> bool:
    return True


def _tables() -> tuple[MetaData, Table, Table]:
    metadata = MetaData()
    items = Table(
        "bench_items",
        metadata,
        Column("id", BigInteger, primary_key=True),
        Column("done", Boolean, nullable=False, server_default=text("false")),
    )
    ledger = ship_backfills_table(metadata)
    return metadata, items, ledger


def _rate(starts: list[float]) -> float:
    if len(starts) < 2:
        raise BenchmarkError("backfill: fewer than two pages ran")
    return (len(starts) - 1) / (starts[-1] - starts[0])


async def _ship_round(db: BenchDatabase, items: Table, ledger_table: Table, index: int) -> float:
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    state = ship_job_state_table(metadata)
    workers = ship_job_workers_table(metadata)
    backend = create_job_backend(
        database=db.engine, table=runs, state_table=state, workers_table=workers
    )
    ledger = create_backfill_ledger(database=db.engine, table=ledger_table)
    uow = create_unit_of_work(db.engine, repositories=lambda scope: scope)
    starts: list[float] = []
    done = asyncio.Event()
    last_id = await _count(db, items)

    async def handle(_ctx: object, rows: Sequence[Row[Any]], scope: TransactionScope) -> None:
        starts.append(time.perf_counter())
        ids = [row.id for row in rows]
        await scope.connection.execute(update(items).where(items.c.id.in_(ids)).values(done=True))
        if ids[-1] == last_id:
            done.set()

    backfill = define_backfill(
        f"bench.backfill.{index}",
        source=selectable_source(db.engine, select(items.c.id), key=[items.c.id]),
        handle=handle,
        pace=PACE,
        ledger=ledger,
        transaction=uow,
        page_size=PAGE_SIZE,
    )
    ops = create_backfill_operations(ledger, backend, authorizer=_allow)
    async with await start_job_runtime([backfill.job], backend=backend, poll_interval=0.2):
        await ops.start(backfill)
        try:
            async with asyncio.timeout(MISS_AFTER):
                await done.wait()
        except TimeoutError as exc:
            raise BenchmarkError(f"backfill: the pass did not end within {MISS_AFTER} s") from exc
    return _rate(starts)


async def _count(db: BenchDatabase, items: Table) -> int:
    async with db.engine.connect() as connection:
        return int(await connection.scalar(select(items.c.id).order_by(items.c.id.desc())) or 0)


async def _raw_round(db: BenchDatabase) -> float:
    connection = await db.raw()
    interval = 1.0 / PACE
    starts: list[float] = []
    after = 0
    await connection.execute("CREATE TABLE IF NOT EXISTS raw_cursor (id int PRIMARY KEY, k bigint)")
    await connection.execute("INSERT INTO raw_cursor VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
    while True:
        if starts:
            await asyncio.sleep(max(0.0, starts[-1] + interval - time.perf_counter()))
        starts.append(time.perf_counter())
        async with connection.transaction():
            ids = [
                row["id"]
                for row in await connection.fetch(
                    "SELECT id FROM bench_items WHERE id > $1 ORDER BY id LIMIT $2",
                    after,
                    PAGE_SIZE,
                )
            ]
            if not ids:
                starts.pop()
                break
            await connection.execute(
                "UPDATE bench_items SET done = true WHERE id = ANY($1::bigint[])", ids
            )
            await connection.execute("UPDATE raw_cursor SET k = $1 WHERE id = 1", ids[-1])
        after = ids[-1]
        if len(ids) < PAGE_SIZE:
            break
    return _rate(starts)


async def run(bench: Bench) -> list[Figure]:
    pages = 40 if bench.quick else 200  # 2 s or 10 s at 20 pages/s
    async with bench.database(NAME) as db:
        await db.create_job_tables()
        metadata, items, ledger_table = _tables()
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
            await connection.execute(
                text("INSERT INTO bench_items (id) SELECT generate_series(1, :n)"),
                {"n": pages * PAGE_SIZE},
            )
        counter = iter(range(1_000_000))
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(db, items, ledger_table, next(counter)),
            lambda: _raw_round(db),
        )
    note = (
        f"{pages} pages of {PAGE_SIZE} rows at a declared {PACE:g} pages/s, each page's UPDATE and"
        " checkpoint in one transaction; the rate from the handler's page starts (wall clock)"
    )
    return [
        Figure.from_rounds(
            "backfill.pace",
            "pages/s",
            ours,
            theirs,
            baseline_label=f"raw asyncpg loop paced at {PACE:g} pages/s (same SELECT + UPDATEs)",
            targets=(Target("value", ">=", 0.9 * PACE), Target("value", "<=", 1.1 * PACE)),
            note=note,
        )
    ]
