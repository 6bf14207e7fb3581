"""A fan-in of 10,000 children on PostgreSQL (SPEC §13, D5): one spawn enqueues them once, a
worker runtime runs them, and the parent's continuation after ``wait_for_children`` runs
exactly once, seeing every child's outcome."""

from __future__ import annotations

import os
from typing import Any

import anyio
from job_helpers import record_of
from sqlalchemy import MetaData, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import workflow_backend

from ship_sqla import define_job, ship_job_history_table, ship_job_runs_table, start_job_runtime
from ship_sqla.jobs import Concurrency

CHILDREN = int(os.environ.get("SHIP_SQLA_FANIN_CHILDREN", "10000"))
runs = ship_job_runs_table(MetaData())
history = ship_job_history_table(MetaData())  # J16: ended children are here


async def test_d5_a_fan_in_of_ten_thousand_children_continues_exactly_once(
    ship_engine: AsyncEngine,
) -> None:
    """D5: 10,000 children spawned by one step are enqueued once (their ids are durable, the
    parent replays the spawn on every wake); the parent suspends until the last one ends and
    its continuation runs once, with 10,000 completed outcomes."""
    backend = await workflow_backend(ship_engine)
    continued: list[int] = []
    done = anyio.Event()

    async def child(ctx: Any, payload: Any) -> None:
        return None

    child_job = define_job("fanin.child", child, payload=dict)

    async def parent(ctx: Any, payload: Any) -> None:
        await ctx.spawn("children", child_job, [{"i": i} for i in range(CHILDREN)])
        outcomes = await ctx.wait_for_children("all-done")
        continued.append(sum(o.state == "completed" for o in outcomes))
        done.set()

    parent_job = define_job("fanin.parent", parent, payload=dict, concurrency=Concurrency(lease=60))
    runtime = await start_job_runtime(
        [parent_job, child_job], backend=backend, poll_interval=0.05, max_in_flight=500
    )
    try:
        result = await backend.enqueue(parent_job, {})
        with anyio.fail_after(240):
            await done.wait()
    finally:
        await runtime.stop()
    assert continued == [CHILDREN]
    assert (await record_of(backend, result.run_id)).state == "completed"
    async with ship_engine.connect() as connection:
        # D5, J16: the children span both tables (the ended ones moved to history).
        children = sum(
            [
                (
                    await connection.execute(
                        select(func.count()).select_from(t).where(t.c.parent_id == result.run_id)
                    )
                ).scalar_one()
                for t in (runs, history)
            ]
        )
    assert children == CHILDREN
