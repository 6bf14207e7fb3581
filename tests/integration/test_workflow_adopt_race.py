"""D5, J16 on PostgreSQL: a spawned child whose settle moves it to history WHILE its parent's
adoption runs is still adopted (the adoption's history half is a statement of its own,
ADOPT_ENDED_CHILDREN, run after the runs table's). Before, the adoption's runs-table UPDATE
waited on the child's row lock, found the row gone once the settle committed, and its history
UPDATE could not see the new row: the child kept no parent, and ``wait_for_children`` saw none
of a fan-out's 20 children (a CI failure of test_workflows' end-to-end test under load)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from job_helpers import claim_request
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import workflow_backend

from ship_sqla import define_job
from ship_sqla._jobs._sql._moves import insert_ended
from ship_sqla.jobs import RetryPolicy


async def _noop(ctx: Any, payload: Any) -> None:
    return None


async def _waiting_on_lock(engine: AsyncEngine, marker: str) -> bool:
    """Whether a statement naming ``marker`` waits on a row lock (pg_stat_activity)."""
    async with engine.connect() as connection:
        row = await connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE :marker AND pid <> pg_backend_pid()"
            ),
            {"marker": f"%{marker}%"},
        )
        return bool(row.scalar_one())


async def test_d5_j16_a_child_moved_while_its_adoption_runs_is_adopted(
    ship_engine: AsyncEngine,
) -> None:
    """D5, J16: the child's row is locked by a settle in flight when the parent's adoption
    reaches it; the settle then moves it to history and commits; the adoption, once done, has
    made it the parent's child all the same, so ``children`` lists it with its outcome."""
    backend = await workflow_backend(ship_engine)
    parent_job = define_job("adopt.race.parent", _noop, payload=dict)
    child_job = define_job("adopt.race.child", _noop, payload=dict, retry=RetryPolicy(attempts=1))
    await backend.enqueue(parent_job, {})
    [held] = await backend.claim(claim_request(parent_job, worker="w1"))
    child = (await backend.enqueue(child_job, {})).run_id
    runs, history = backend.table.name, backend.history_table.name
    move = (
        "WITH gone AS (DELETE FROM {runs} r WHERE r.id = :id RETURNING r.*) "
        + insert_ended("gone", "'completed'", "false", "{now}")
    ).format(runs=runs, history=history, now="now()")
    async with ship_engine.connect() as settle, settle.begin():
        # The settle in flight: it holds the child's row, then moves it, then commits.
        await settle.execute(text(f"SELECT 1 FROM {runs} WHERE id = :id FOR UPDATE"), {"id": child})
        adoption = asyncio.ensure_future(backend.workflows.adopt_children(held, [child]))
        with anyio.fail_after(10):
            while not await _waiting_on_lock(ship_engine, "parent_id = "):
                await anyio.lowlevel.checkpoint()
        await settle.execute(text(move), {"id": child})
    with anyio.fail_after(10):
        await adoption
    outcomes = await backend.workflows.children(held.run_id)
    assert [(c.run_id, c.state) for c in outcomes] == [(child, "completed")]
