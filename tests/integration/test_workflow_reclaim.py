"""A workflow run resumed by the same process that suspended it (SPEC §13, D3; J5): a suspend
commits inside a settle batch, the run is due again at once (a zero sleep, an event published
meanwhile) and this process claims it before the rest of the batch is answered. The earlier
claim's settle landed (its handler is done): the new claim is not a lost lease, so nothing is
reported stale and nothing cancelled."""

from __future__ import annotations

from typing import Any

import anyio
from sqlalchemy import MetaData, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import workflow_backend

from ship_sqla import (
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    start_job_runtime,
)
from ship_sqla.jobs import Concurrency
from ship_sqla.kernel._ports import EnqueueRequest

runs = ship_job_runs_table(MetaData())
history = ship_job_history_table(MetaData())  # J16: completed runs are here

RUNS = 40


async def test_d3_a_run_resumed_by_its_own_process_mid_settle_batch_is_not_stale(
    ship_engine: AsyncEngine,
) -> None:
    """D3, J5: runs suspended by zero-second sleeps, settled in batches, are claimed again by
    the same runtime while their batch's other suspends are still being sent; every run
    completes and no error is reported (no 'claimed it anew' stale report, no cancel)."""
    errors: list[BaseException] = []
    backend = await workflow_backend(ship_engine, on_error=errors.append)
    finished = anyio.Event()
    ended: list[str] = []

    async def handler(ctx: Any, payload: Any) -> None:
        for i in range(3):
            await ctx.sleep(f"nap-{i}", 0)
        ended.append(ctx.run_id)
        if len(ended) == RUNS:
            finished.set()

    job = define_job("wf.reclaim", handler, payload=dict, concurrency=Concurrency(lease=30))
    runtime = await start_job_runtime(job, backend=backend, poll_interval=0.01)
    try:
        await backend.enqueue_many(job, [EnqueueRequest({}) for _ in range(RUNS)])
        with anyio.fail_after(30):
            await finished.wait()
    finally:
        await runtime.stop()
    assert sorted(ended) == sorted(set(ended))
    async with ship_engine.connect() as connection:
        completed = sum(  # J16: the ended runs moved to history (none left in the runs)
            [
                await connection.scalar(
                    select(func.count()).select_from(t).where(t.c.state == "completed")
                )
                or 0
                for t in (runs, history)
            ]
        )
    assert completed == RUNS
    assert [str(e) for e in errors] == []
