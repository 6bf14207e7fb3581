"""A job worker on PostgreSQL: define a job, enqueue runs, run them, stop.

    SHIP_SQLA_DATABASE_URL=postgresql+asyncpg://user@host/db python examples/worker.py

Without SHIP_SQLA_DATABASE_URL it uses postgresql+asyncpg://postgres@127.0.0.1:5432/postgres.
It creates the two job tables if they are missing (an application would let Alembic do that:
the tables come from ``ship_job_runs_table`` / ``ship_job_state_table`` on its metadata).
"""

from __future__ import annotations

import asyncio
import os

import attrs
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel import (
    Concurrency,
    EnqueueRequest,
    JobContext,
    RetryPolicy,
    define_job,
    start_job_runtime,
)

DATABASE_URL = os.environ.get(
    "SHIP_SQLA_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
RUNS = 20

metadata = MetaData()
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)


@attrs.frozen
class Greeting:
    name: str


async def main() -> None:
    engine = create_async_engine(DATABASE_URL)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)  # checkfirst: existing tables are kept

    greeted: list[str] = []
    all_done = asyncio.Event()

    async def greet(ctx: JobContext, payload: Greeting) -> None:
        # Delivery is at least once: a crash after this line and before the completion lands
        # runs it again. Real handlers make their effects idempotent.
        greeted.append(payload.name)
        print(f"hello, {payload.name} (run {ctx.run_id}, attempt {ctx.attempt})")
        if len(greeted) == RUNS:
            all_done.set()

    greet_job = define_job(
        "examples.greet",
        greet,
        payload=Greeting,
        concurrency=Concurrency(max=5, lease=30),
        retry=RetryPolicy(attempts=3),
    )

    backend = create_job_backend(database=engine, table=job_runs, state_table=job_state)
    runtime = await start_job_runtime([greet_job], backend=backend)
    try:
        # One statement for the whole batch; the local worker wakes as soon as it commits.
        results = await runtime.enqueue_many(
            greet_job, [EnqueueRequest(Greeting(name=f"friend #{n}")) for n in range(RUNS)]
        )
        assert all(result.accepted for result in results)
        await asyncio.wait_for(all_done.wait(), timeout=60)
    finally:
        await runtime.stop()  # lets running handlers finish and flushes their completions
        await engine.dispose()
    print(f"done: {len(greeted)} runs completed")


if __name__ == "__main__":
    asyncio.run(main())
