"""A job worker on PostgreSQL: define a job, enqueue runs, run them, stop.

    python -m examples.worker

It uses the server ``SHIP_SQLA_DATABASE_URL`` names, else the embedded one (the ``embedded``
extra), creates a scratch database with the job tables (an application would let Alembic
create them: they come from ``ship_job_runs_table`` / ``ship_job_state_table`` /
``ship_job_workers_table`` on its metadata), and drops it at the end.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import attrs
from sqlalchemy import MetaData

from ship_sqla import (
    Concurrency,
    EnqueueRequest,
    JobContext,
    RetryPolicy,
    create_job_backend,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
    start_job_runtime,
)
from ship_sqla.testing import DatabaseFactory, resolve_server

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

RUNS = 20

metadata = MetaData()
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)
job_workers = ship_job_workers_table(metadata)  # the worker registry (F6), optional


@attrs.frozen
class Greeting:
    name: str


async def main() -> None:
    factory = DatabaseFactory(resolve_server(prefer_embedded=True))
    async with factory.private(name="ship_sqla_worker_example") as (_, engine):
        await run(engine)


async def run(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)

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

    backend = create_job_backend(
        database=engine, table=job_runs, state_table=job_state, workers_table=job_workers
    )
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
    print(f"done: {len(greeted)} runs completed")


if __name__ == "__main__":
    asyncio.run(main())
