"""A lock holder process for tests/integration/test_fenced_locks.py (F4):
``python fenced_holder.py URL KEY WRITES``.

It takes ``with_lock(KEY, 60)`` on an advisory-lock provider with the fence table, makes one
fenced write (a row in ``fenced_writes``), prints ``{"event": "held", "fence": N}`` and waits
for a line on stdin. Then, whatever happened meanwhile (the test SIGSTOPs it, ends its lock's
session and hands the lock to another holder), it believes it still holds the lock and makes
WRITES more fenced writes, each its own unit of work, ignoring ``lost``; it prints
``{"event": "wrote", "landed": L, "refused": R}`` and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Table, Text, insert
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import (
    TransactionScope,
    advisory_lock_provider,
    create_unit_of_work,
    ship_lock_fences_table,
)
from ship_sqla.errors import StaleFenceError

metadata = MetaData()
fences = ship_lock_fences_table(metadata)
writes = Table(
    "fenced_writes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", Text, nullable=False),
    Column("fence", Integer, nullable=False),
)


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main(url: str, key: str, count: int) -> None:
    engine = create_async_engine(url)
    provider = advisory_lock_provider(engine, fence_table=fences)
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)
    try:
        async with provider.with_lock(key, 60.0) as held:

            async def fenced_write(scope: TransactionScope) -> None:
                await provider.check_fence(key, held.fence)
                await scope.connection.execute(insert(writes).values(key=key, fence=held.fence))

            await uow.run(fenced_write)
            emit(event="held", fence=held.fence)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            landed = refused = 0
            for _ in range(count):
                try:
                    await uow.run(fenced_write)
                except StaleFenceError:
                    refused += 1
                else:
                    landed += 1
            emit(event="wrote", landed=landed, refused=refused)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
