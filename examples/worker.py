"""A job worker on PostgreSQL, declared as an application declares it: the jobs at module level,
in a registry the ``ship-sqla worker`` command loads.

Extras: none with a PostgreSQL server; the ``embedded`` extra (``pip install
'ship-sqla[embedded]'``) for ``python examples/worker.py`` on a machine without one.

From the shell, in the repository root (the ``examples`` folder is not installed with the
wheel; the worker imports it from the current directory)::

    export SHIP_SQLA_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres
    ship-sqla schema apply                     # the ship tables, once
    ship-sqla enqueue examples.greet --payload '{"name": "Ada"}'
    ship-sqla enqueue examples.greet --payload '{"name": ""}'   # fails: retried, then dead
    ship-sqla worker examples.worker:registry  # Ctrl-C drains and stops (--burst: when done)

The worker logs the failing run's retries and its dead letter (job id, run id, attempt and
error; never the payload), and `ship-sqla jobs dead` then lists it.

Or everything in one process, in a scratch database it drops at the end (the server is
``SHIP_SQLA_DATABASE_URL`` when set, else the embedded one)::

    python examples/worker.py        # or: python -m examples.worker
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import attrs
from sqlalchemy import MetaData

from ship_sqla import (
    JobContext,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
    start_job_runtime,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest, JobRegistry, RetryPolicy

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

RUNS = 20

registry = JobRegistry()
"""What ``ship-sqla worker examples.worker:registry`` executes."""


@attrs.frozen
class Greeting:
    name: str


@registry.job(
    "examples.greet",
    payload=Greeting,
    concurrency=Concurrency(max=5, lease=30),
    retry=RetryPolicy(base_delay=1),  # 5 attempts, the default `ship-sqla enqueue` also uses
)
async def greet(ctx: JobContext, payload: Greeting) -> None:
    # Delivery is at least once: a crash after this line and before the completion lands runs
    # it again. Real handlers make their effects idempotent.
    if not payload.name.strip():
        message = "nobody to greet: the payload's name is empty"
        raise ValueError(message)
    print(f"hello, {payload.name} (run {ctx.run_id}, attempt {ctx.attempt})")


# The tables, as an application's migrations would declare them (`ship-sqla schema apply`
# creates the same ones with these default names).
metadata = MetaData()
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)
job_workers = ship_job_workers_table(metadata)  # the worker registry (F6), optional


async def main() -> None:
    # Imported here: the worker command imports this module and needs none of it.
    from ship_sqla.testing import DatabaseFactory, resolve_server  # noqa: PLC0415

    factory = DatabaseFactory(resolve_server(prefer_embedded=True))
    async with factory.private(name="ship_sqla_worker_example") as (_, engine):
        await run(engine)


async def run(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=engine, table=job_runs, state_table=job_state, workers_table=job_workers
    )
    runtime = await start_job_runtime(registry, backend=backend)
    try:
        # One statement for the whole batch; the local worker wakes as soon as it commits.
        results = await runtime.enqueue_many(
            greet, [EnqueueRequest(Greeting(name=f"friend #{n}")) for n in range(RUNS)]
        )
        run_ids = [r.run_id for r in results if r.run_id is not None]

        async def all_completed() -> bool:
            records = [await backend.admin.get_run(run_id) for run_id in run_ids]
            return all(r is not None and r.state == "completed" for r in records)

        async with asyncio.timeout(60):
            while not await all_completed():  # noqa: ASYNC110 - the runs change in the database
                await asyncio.sleep(0.1)
    finally:
        await runtime.stop()  # lets running handlers finish and flushes their completions
    print(f"done: {len(run_ids)} runs completed")


if __name__ == "__main__":
    asyncio.run(main())
