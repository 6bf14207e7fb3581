"""relay: how fast one outbox relay moves a backlog of messages to a sink that does nothing.

ship_sqla: M pending messages (INSERT ... SELECT generate_series), one ``start_outbox_relay``
with a noop sink and a long poll interval, timed from its start until ``stop()`` returned
after the sink saw the M-th message (so the last completion is included). Every message
must end ``delivered``.

Baseline: one asyncpg connection looping claim a batch of the same size (SKIP LOCKED) then
complete it (UPDATE ... delivered) on an equivalent table, loaded the same way: the relay's
work without the library.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

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
from benchmarks._raw_sql import outbox_sql
from ship_sqla import create_outbox, ship_outbox_table, start_outbox_relay

if TYPE_CHECKING:
    from collections.abc import Callable

    from ship_sqla.outbox import Outbox

__all__ = ["NAME", "relay_messages", "run"]

NAME = "relay"
OUTBOX_ID = "bench"
SHIP_TABLE = "ship_outbox"
RAW_TABLE = "raw_outbox"
BATCH = 100
"""The relay's default batch_size: what an application gets without tuning."""
TIMEOUT = 120.0


def _messages(bench: Bench) -> int:
    return 5_000 if bench.quick else 20_000


async def _reload(db: BenchDatabase, table: str, count: int) -> None:
    conn = await db.raw()
    await conn.execute(f"TRUNCATE {table}")
    await conn.execute(outbox_sql(table).load_pending, OUTBOX_ID, count)
    await conn.execute(f"VACUUM (ANALYZE) {table}")
    await conn.close()


async def _delivered(db: BenchDatabase, table: str) -> int:
    conn = await db.raw()
    count: int = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE state = 'delivered'")
    await conn.close()
    return count


async def _ship_round(bench: Bench, db: BenchDatabase, count: int) -> float:
    return await relay_messages(bench, db, count)


async def relay_messages(
    bench: Bench,
    db: BenchDatabase,
    count: int,
    *,
    ablate: Callable[[Outbox], AbstractContextManager[None]] | None = None,
) -> float:
    """``count`` pending messages through one relay (batch BATCH) to a noop sink; msg/s.

    ``ablate`` (benchmarks/ablations.py) turns one of the outbox's optimisations off while the
    relay runs."""
    table = ship_outbox_table(MetaData(), name=SHIP_TABLE)
    await _reload(db, SHIP_TABLE, count)
    outbox = create_outbox(database=db.engine, table=table)
    sink = Countdown(count)
    with ablate(outbox) if ablate is not None else nullcontext(), Stopwatch() as watch:
        relay = await start_outbox_relay(
            outbox, OUTBOX_ID, sink.tick, batch_size=BATCH, poll_interval=60.0
        )
        try:
            async with asyncio.timeout(TIMEOUT):
                await sink.done.wait()
        finally:
            await relay.stop()
    delivered = await _delivered(db, SHIP_TABLE)
    if delivered != count or relay.delivered != count:
        raise BenchmarkError(f"relay: {delivered} of {count} messages delivered")
    per_s = rate(count, watch.seconds)
    state = "ablated" if ablate is not None else "shipped"
    bench.log(f"ship ({state}) {count} messages in {watch.seconds:.2f} s = {per_s:,.0f} msg/s")
    return per_s


async def _raw_round(bench: Bench, db: BenchDatabase, count: int) -> float:
    await _reload(db, RAW_TABLE, count)
    sql = outbox_sql(RAW_TABLE)
    conn = await db.raw()
    moved = 0
    with Stopwatch() as watch:
        while True:
            rows = await conn.fetch(sql.claim, OUTBOX_ID, "raw", BATCH)
            if not rows:
                break
            await conn.execute(sql.complete, [r[0] for r in rows], [r[1] for r in rows])
            moved += len(rows)
    await conn.close()
    if moved != count:
        raise BenchmarkError(f"relay baseline: {moved} of {count} messages delivered")
    per_s = rate(count, watch.seconds)
    bench.log(f"raw   {count} messages in {watch.seconds:.2f} s = {per_s:,.0f} msg/s")
    return per_s


async def run(bench: Bench) -> list[Figure]:
    count = _messages(bench)
    async with bench.database(NAME) as db:
        metadata = MetaData()
        ship_outbox_table(metadata, name=SHIP_TABLE)
        ship_outbox_table(metadata, name=RAW_TABLE)
        async with db.engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        await _ship_round(bench, db, 1_000)  # warm-up, not measured
        await _raw_round(bench, db, 1_000)
        ours, theirs = await paired_rounds(
            bench.rounds,
            lambda: _ship_round(bench, db, count),
            lambda: _raw_round(bench, db, count),
        )
    return [
        Figure.from_rounds(
            "relay.noop_sink",
            "msg/s",
            ours,
            theirs,
            baseline_label=f"raw claim {BATCH} + complete loop, 1 conn",
            targets=(Target("value", ">=", 20_000),),
            note=f"{count:,} messages, one relay, batch_size={BATCH} (the default)",
        )
    ]
