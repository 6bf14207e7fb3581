"""backfill: pace accuracy of a paced backfill (SPEC §15, C4, issue 28): achieved vs declared.

ship_sqla (``backfill.pace``): a worker runtime runs ``define_backfill(...).job`` over a table of
``PAGES x PAGE_SIZE`` rows at ``PACE`` pages per second; each page is read by
``selectable_source`` (a keyset page by primary key) and handled in a unit of work (one UPDATE of
the page's rows), its checkpoint in the same transaction. The achieved rate is measured from the
handler's own page starts: ``(pages - 1) / (last start - first start)``, wall clock.

Baseline: a raw asyncpg loop doing the same work at the same declared pace (start to start:
``asyncio.sleep`` until the slot, SELECT the page, UPDATE its rows in a transaction with a
one-row cursor UPDATE), measured the same way. Target: within 10% of the declared rate.

The backfill's cost to a concurrent OLTP load (``backfill.oltp.p50`` / ``.p99``) and the pace
over a longer window (``backfill.pace_window``), one sitting each (not rounds: the window is the
measurement). An OLTP probe (``benchmarks/_oltp_probe.py``, its own process and asyncpg
connection) runs PROBE_RATE transactions a second, each a primary-key SELECT and a one-row
UPDATE of ``bench_accounts``: for half of QUIET seconds alone, then for WINDOW seconds while a
backfill fills a new column of ``bench_big`` (``define_backfill`` with ``transaction=``, OLTP_PAGE
rows a page, each page one UPDATE of its rows by primary key and its checkpoint, declared
OLTP_PACE pages/s, served by a worker runtime in this process), then for the other half of QUIET
alone again. The figures: the probe's p50 and p99 with the backfill beside those without it (the
two quiet halves together); the pace achieved by the pages that started inside the window beside
the declared one (target within 10%).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Boolean, Column, MetaData, Table, select, text, update

from benchmarks._harness import (
    Bench,
    BenchDatabase,
    BenchmarkError,
    Figure,
    Target,
    asyncpg_dsn,
    paired_rounds,
    percentile,
)
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
OLTP_PACE = 10.0
OLTP_PAGE = 500
PROBE_RATE = 200.0
ACCOUNTS = 10_000


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


async def _probe(db: BenchDatabase, seconds: float) -> list[float]:
    """The OLTP probe's latencies (ms) over ``seconds``, from its own process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks._oltp_probe",
        asyncpg_dsn(db.url),
        str(seconds),
        str(ACCOUNTS),
        str(PROBE_RATE),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise BenchmarkError(f"backfill: the OLTP probe exited {process.returncode}")
    latencies: list[float] = json.loads(out)
    return latencies


async def _oltp_sitting(bench: Bench, db: BenchDatabase) -> list[Figure]:
    window, quiet = (5.0, 4.0) if bench.quick else (60.0, 20.0)
    rows = int(OLTP_PACE * (window + 10) * OLTP_PAGE * 1.2)
    metadata = MetaData()
    big = Table(
        "bench_big",
        metadata,
        Column("id", BigInteger, primary_key=True),
        Column("score", BigInteger, nullable=True),
    )
    ledger_table = ship_backfills_table(metadata, name="bench_big_backfills")
    async with db.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text("CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        )
        await connection.execute(
            text("INSERT INTO bench_accounts SELECT n, 0 FROM generate_series(1, :n) AS n"),
            {"n": ACCOUNTS},
        )
        await connection.execute(
            text("INSERT INTO bench_big (id) SELECT generate_series(1, :n)"), {"n": rows}
        )
    await db.maintain("VACUUM (ANALYZE) bench_big", "VACUUM (ANALYZE) bench_accounts")
    bench.log(f"oltp: {rows:,} rows to fill; probe alone {quiet / 2:g} s")
    alone = await _probe(db, quiet / 2)

    runtime_metadata = MetaData()
    backend = create_job_backend(
        database=db.engine,
        table=ship_job_runs_table(runtime_metadata),
        state_table=ship_job_state_table(runtime_metadata),
        workers_table=ship_job_workers_table(runtime_metadata),
    )
    ledger = create_backfill_ledger(database=db.engine, table=ledger_table)
    uow = create_unit_of_work(db.engine, repositories=lambda scope: scope)
    starts: list[float] = []
    first_page = asyncio.Event()

    async def fill(_ctx: object, page: Sequence[Row[Any]], scope: TransactionScope) -> None:
        starts.append(time.perf_counter())
        first_page.set()
        ids = [row.id for row in page]
        await scope.connection.execute(
            update(big).where(big.c.id.in_(ids)).values(score=big.c.id % 97)
        )

    backfill = define_backfill(
        "bench.backfill.oltp",
        source=selectable_source(
            db.engine, select(big.c.id).where(big.c.score.is_(None)), key=[big.c.id]
        ),
        handle=fill,
        pace=OLTP_PACE,
        ledger=ledger,
        transaction=uow,
        page_size=OLTP_PAGE,
    )
    ops = create_backfill_operations(ledger, backend, authorizer=_allow)
    async with await start_job_runtime([backfill.job], backend=backend, poll_interval=0.2):
        await ops.start(backfill)
        async with asyncio.timeout(MISS_AFTER):
            await first_page.wait()
        bench.log(f"oltp: probe beside the backfill {window:g} s")
        opened = time.perf_counter()
        beside = await _probe(db, window)
        closed = time.perf_counter()
        await ops.cancel(backfill.id)
    record = await ledger.get(backfill.id)
    if record is None or record.state != "cancelled":
        raise BenchmarkError(f"backfill: the pass ended before the window did: {record}")
    bench.log(f"oltp: probe alone {quiet / 2:g} s")
    alone += await _probe(db, quiet / 2)

    inside = [start for start in starts if opened <= start <= closed]
    achieved = _rate(inside)
    note = (
        f"probe: {PROBE_RATE:g} transactions/s (pkey SELECT + one-row UPDATE), {len(beside):,}"
        f" beside the backfill over {window:g} s, {len(alone):,} without it over {quiet:g} s;"
        f" backfill: {OLTP_PAGE} rows a page (one UPDATE by pkey + its checkpoint a"
        f" transaction), declared {OLTP_PACE:g} pages/s"
    )
    bench.log(
        f"oltp: p50 {percentile(beside, 0.5):.2f} vs {percentile(alone, 0.5):.2f} ms, p99"
        f" {percentile(beside, 0.99):.2f} vs {percentile(alone, 0.99):.2f} ms; pace"
        f" {achieved:.2f} pages/s over {len(inside)} pages"
    )
    label = "the same probe without the backfill (same run, before and after)"
    return [
        *(
            Figure.from_rounds(
                f"backfill.oltp.p{int(fraction * 100)}",
                "ms",
                [percentile(beside, fraction)],
                [percentile(alone, fraction)],
                baseline_label=label,
                note=note if fraction == 0.5 else "",
            )
            for fraction in (0.5, 0.99)
        ),
        Figure.from_rounds(
            "backfill.pace_window",
            "pages/s",
            [achieved],
            [OLTP_PACE],
            baseline_label=f"the declared pace, {OLTP_PACE:g} pages/s",
            targets=(Target("ratio", ">=", 0.9), Target("ratio", "<=", 1.1)),
            note=(
                f"{len(inside)} pages of {OLTP_PAGE} rows started inside the {window:g} s window,"
                " from the handler's page starts (wall clock), beside a live OLTP probe"
            ),
        ),
    ]


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
        oltp = await _oltp_sitting(bench, db)
    note = (
        f"{pages} pages of {PAGE_SIZE} rows at a declared {PACE:g} pages/s, each page's UPDATE and"
        " checkpoint in one transaction; the rate from the handler's page starts (wall clock)"
    )
    return [
        *oltp,
        Figure.from_rounds(
            "backfill.pace",
            "pages/s",
            ours,
            theirs,
            baseline_label=f"raw asyncpg loop paced at {PACE:g} pages/s (same SELECT + UPDATEs)",
            targets=(Target("value", ">=", 0.9 * PACE), Target("value", "<=", 1.1 * PACE)),
            note=note,
        ),
    ]
