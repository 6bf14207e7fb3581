"""pools: plain enqueues outside a unit of work on each pool shape (issue 33, part 1).

A plain ``backend.enqueue`` outside any unit of work runs on a pooled asyncpg connection of its
own (``ship_sqla._direct``), and hands it back to the pool afterwards. Whether the pool keeps it
(the default ``QueuePool`` with room) or closes it (``NullPool``; a full ``QueuePool``'s
overflow) decides what that costs: ``pools.plain.<shape>`` is runs/s of ``COUNT`` sequential
enqueues, ``pools.gather8.<shape>`` of the same number sent eight at a time (more than the
overflow shape's pool holds). Baseline: raw asyncpg, one INSERT per enqueue on one held
connection (sequential) or on an asyncpg pool of eight (gather8).

Opt-in (``python -m benchmarks pools``): it measures connection handling, not the engine's
steady state; ``synchronous_commit = off`` for the database, so commits do not wait on the disk.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from benchmarks._harness import Bench, BenchDatabase, Figure, paired_rounds
from benchmarks._raw_sql import job_sql
from ship_sqla import create_job_backend, define_job
from ship_sqla._server import asyncpg_dsn

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["NAME", "run"]

NAME = "pools"
AT_ONCE = 8
RAW_TABLE = "raw_job_runs"
SHAPES: dict[str, dict[str, Any]] = {
    "queuepool": {},
    "nullpool": {"poolclass": NullPool},
    "overflow": {"pool_size": 1, "max_overflow": AT_ONCE},
}


async def _noop(_ctx: object, _payload: dict[str, int]) -> None:
    return None


JOB = define_job("bench.pools", _noop, payload=dict)
RAW_INSERT = job_sql(RAW_TABLE).insert_one
"""$1 id, $2 job_id, $3 payload: the raw baseline's one enqueue."""


async def _rate(count: int, enqueue: Callable[[int], Awaitable[object]], *, at_once: int) -> float:
    started = time.perf_counter()
    for first in range(0, count, at_once):
        await asyncio.gather(*(enqueue(n) for n in range(first, min(first + at_once, count))))
    return count / (time.perf_counter() - started)


async def _ship_rate(db: BenchDatabase, shape: str, count: int, *, at_once: int) -> float:
    engine = create_async_engine(db.url, **SHAPES[shape])
    try:
        backend = create_job_backend(database=engine)
        return await _rate(count, lambda n: backend.enqueue(JOB, {"n": n}), at_once=at_once)
    finally:
        await engine.dispose()


async def _raw_rate(db: BenchDatabase, count: int, *, at_once: int) -> float:
    pool = await asyncpg.create_pool(**asyncpg_dsn(db.url), min_size=at_once, max_size=at_once)
    try:
        return await _rate(
            count,
            lambda n: pool.execute(RAW_INSERT, uuid.uuid4().hex, JOB.id, f'{{"n": {n}}}'),
            at_once=at_once,
        )
    finally:
        await pool.close()


async def run(bench: Bench) -> list[Figure]:
    figures: list[Figure] = []
    async with bench.database(NAME) as db:
        await db.create_job_tables(raw=RAW_TABLE)
        await db.maintain(f"ALTER DATABASE {db.url.database} SET synchronous_commit = off")
        for shape in SHAPES:
            count = 30 if shape == "nullpool" else 300
            if bench.quick:
                count //= 3
            for label, at_once in (("plain", 1), ("gather8", AT_ONCE)):
                ours, theirs = await paired_rounds(
                    bench.rounds,
                    partial(_ship_rate, db, shape, count, at_once=at_once),
                    partial(_raw_rate, db, count, at_once=at_once),
                )
                bench.log(f"pools.{label}.{shape}: {ours} vs raw {theirs}")
                figures.append(
                    Figure.from_rounds(
                        f"pools.{label}.{shape}",
                        "runs/s",
                        ours,
                        theirs,
                        baseline_label=f"raw asyncpg INSERT, {at_once} at a time",
                        note=f"{count} plain enqueues per round outside a unit of work,"
                        f" {at_once} at a time, engine pool: {shape}",
                    )
                )
    return figures
