"""J5 on PostgreSQL: a row a heartbeat updated while the settle waited on its lock is rechecked
on its new version (id, token, state: no ``ctid``), so the run settles once the heartbeat
commits and a stale token still changes nothing, whatever plan the settle has (custom or
generic). The settle's one-path ``<runs>_pkey`` probe (J20, settle.py's docstring) must keep
this; so did the plan it replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import MetaData, TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._backend import _SETTLE_FIELDS_NONE
from ship_sqla._jobs._sql import JobStatements, live, settle
from ship_sqla._jobs._tables import ship_job_history_table

metadata = MetaData()
runs = ship_job_runs_table(metadata, name="recheck_job_runs")
ship_job_state_table(metadata, name="recheck_job_state")
history = ship_job_history_table(metadata, name="recheck_job_history")

RUNNING = (
    "INSERT INTO recheck_job_runs (id, job_id, state, payload, max_attempts, run_at, created_at,"
    " updated_at, lease_expires_at, lease_token, attempt) VALUES"
    " ('a', 'j', 'running', '{}', 5, now(), now(), now(), now() + interval '1 hour', 7, 1),"
    " ('b', 'j', 'running', '{}', 5, now(), now(), now(), now() + interval '1 hour', 8, 1)"
)
"""Two running runs, tokens 7 and 8."""


def _completes(**extra: Any) -> dict[str, Any]:
    """Complete 'a' with its token and 'b' with a stale one (the completer's batch: ids and
    tokens only)."""
    return {
        "ids": ["a", "b"],
        "tokens": [7, 999],
        **_SETTLE_FIELDS_NONE,  # a batch of completions: no other field
        "now": None,
        **extra,
    }


async def _settle_behind_a_heartbeat(
    engine: AsyncEngine, statement: TextClause, params: dict[str, Any], mode: str
) -> list[Any]:
    """Hold both rows under an uncommitted lease extension, start the settle (``mode``: its
    plan), check it waits, commit the extension; the settle's rows."""
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM recheck_job_runs"))
        await connection.execute(text(RUNNING))

    async def settle_now() -> list[Any]:
        async with engine.begin() as connection:
            await connection.execute(text(f"SET LOCAL plan_cache_mode = {mode}"))
            return list((await connection.execute(statement, params)).all())

    async with engine.connect() as beat:
        transaction = await beat.begin()
        await beat.execute(
            text(
                "UPDATE recheck_job_runs SET lease_expires_at = now() + interval '2 hours',"
                " updated_at = now() WHERE id IN ('a', 'b')"
            )
        )
        settling = asyncio.create_task(settle_now())
        await asyncio.sleep(0.5)
        assert not settling.done(), "the settle did not wait for the heartbeat's row lock"
        await transaction.commit()
    return await asyncio.wait_for(settling, 30)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_j5_a_settle_behind_a_heartbeat_settles_its_run_on_the_new_version(
    ship_engine: AsyncEngine, mode: str
) -> None:
    """J5: the in-place settle and J16's moving settle, custom and generic plans, each
    blocked by a heartbeat's uncommitted lease extension of both runs: once it commits, the
    current token's run is completed (the new row version passes the recheck: id, token,
    state) and the stale token's stays running, answered by no row."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    statements = JobStatements(runs=runs.name, state="recheck_job_state", history=history.name)
    in_place = await _settle_behind_a_heartbeat(
        ship_engine, statements[settle.SETTLE_IF_TOKEN_CURRENT], _completes(), mode
    )
    assert [(row[0], row[1]) for row in in_place] == [(1, "completed")]
    async with ship_engine.connect() as connection:
        left = (await connection.execute(text("SELECT id, state FROM recheck_job_runs"))).all()
    assert sorted((row[0], row[1]) for row in left) == [("a", "completed"), ("b", "running")]

    moving = await _settle_behind_a_heartbeat(
        ship_engine, statements[live.SETTLE_MOVING], _completes(starts=[], keeps=[]), mode
    )
    assert [(row[0], row[1]) for row in moving] == [(1, "completed")]
    async with ship_engine.connect() as connection:
        left = (await connection.execute(text("SELECT id, state FROM recheck_job_runs"))).all()
    assert [(row[0], row[1]) for row in left] == [("b", "running")]
