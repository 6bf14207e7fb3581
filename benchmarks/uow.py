"""uow: what a unit of work adds around one trivial statement.

ship_sqla: ``uow.run(handler)`` whose handler runs ``SELECT 1`` on ``scope.connection``.
Baseline: ``async with engine.begin() as connection`` running the same statement: the same
pool, the same BEGIN / statement / COMMIT, without the scope, the context variable, the
after-commit list and the retry loop. Both sequential on one engine; the figure is the median
time per transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text

from benchmarks._harness import Bench, Figure, Stopwatch, Target, paired_rounds
from ship_sqla import TransactionScope, UnitOfWork, create_unit_of_work

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["NAME", "run"]

NAME = "uow"
TRIVIAL = text("SELECT 1")


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


async def _trivial(scope: TransactionScope) -> None:
    await scope.connection.execute(TRIVIAL)


async def _ship(bench: Bench, uow: UnitOfWork[TransactionScope], count: int) -> float:
    with Stopwatch() as watch:
        for _ in range(count):
            await uow.run(_trivial)
    per_op = watch.seconds / count * 1e6
    bench.log(f"ship  uow.run        {per_op:7.1f} us/transaction")
    return per_op


async def _raw(bench: Bench, engine: AsyncEngine, count: int) -> float:
    with Stopwatch() as watch:
        for _ in range(count):
            async with engine.begin() as connection:
                await connection.execute(TRIVIAL)
    per_op = watch.seconds / count * 1e6
    bench.log(f"raw   engine.begin() {per_op:7.1f} us/transaction")
    return per_op


async def run(bench: Bench) -> list[Figure]:
    count = 500 if bench.quick else 3_000
    async with bench.database(NAME) as db:
        uow = create_unit_of_work(db.engine, repositories=_scope_itself)
        await _ship(bench, uow, 200)  # warm-up, not measured
        await _raw(bench, db.engine, 200)
        ours, theirs = await paired_rounds(
            bench.rounds, lambda: _ship(bench, uow, count), lambda: _raw(bench, db.engine, count)
        )
    return [
        Figure.from_rounds(
            "uow.overhead",
            "us",
            ours,
            theirs,
            baseline_label="async with engine.begin()",
            targets=(Target("ratio", "<=", 1.3),),
            note=f"{count:,} sequential transactions of SELECT 1 per round; time per transaction",
        )
    ]
