"""J16: a worker's start check of the database's shape (``require_support``).

In the legacy in-place shape (no history declared) a worker says once that its runs table
keeps finished runs and names the migration. With a history table (J16, the default shape):
a missing history is refused (MissingTablesError); a foreign key referencing the runs table
(an old steps table's ON DELETE CASCADE: a move would delete a finished workflow's steps) is
refused naming the constraint to drop; finished runs still in the runs table (not migrated
yet) are warned about with ``ship-sqla jobs maintain --migrate``, and stay readable; a database
with no steps table (an application without workflows) still settles (J18's "is it a workflow
run" probe is left out).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from job_helpers import claim_request
from sqlalchemy import MetaData, text

from ship_sqla import (
    create_job_backend,
    create_job_operations,
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla.errors import ConfigurationError, MissingTablesError
from ship_sqla.kernel import completed
from ship_sqla.testing import FrozenClock


async def _noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("start.job", _noop, payload=dict)


def _tables(*, history: bool, steps: bool = True) -> MetaData:
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    if history:
        ship_job_history_table(metadata)
    if steps:
        ship_job_steps_table(metadata)
    return metadata


async def _create(engine: Any, metadata: MetaData) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)


def _backend(engine: Any, metadata: MetaData) -> Any:
    tables = metadata.tables
    return create_job_backend(
        database=engine,
        table=tables["ship_job_runs"],
        state_table=tables["ship_job_state"],
        steps_table=tables.get("ship_job_steps"),
        clock=FrozenClock(),
    )


async def test_j16_an_in_place_worker_warns_naming_the_migration(
    ship_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """J16: without a history declared, the worker starts and warns (once) that its runs table
    keeps finished runs, naming ship_job_history_table and the migration verb."""
    metadata = _tables(history=False)
    await _create(ship_engine, metadata)
    backend = _backend(ship_engine, metadata)
    assert not backend.history
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        await backend.require_support([JOB])
        await backend.require_support([JOB])
    warned = [r.getMessage() for r in caplog.records if "J16" in r.getMessage()]
    assert len(warned) == 1
    assert "ship_job_history_table" in warned[0]
    assert "ship-sqla jobs maintain --migrate" in warned[0]


async def test_j16_a_missing_history_is_refused_at_the_start(ship_engine: Any) -> None:
    """J16: a backend declared with a history the database lacks refuses to start a worker."""
    await _create(ship_engine, _tables(history=False))
    backend = _backend(ship_engine, _tables(history=True))
    with pytest.raises(MissingTablesError, match="ship_job_history"):
        await backend.require_support([JOB])


async def test_j16_a_foreign_key_on_the_runs_table_is_refused_at_the_start(
    ship_engine: Any,
) -> None:
    """J16: an old steps table still referencing the runs table (ON DELETE CASCADE) would lose
    a finished workflow's steps at its move: the worker refuses to start, naming it."""
    old = MetaData()
    ship_job_runs_table(old)
    ship_job_state_table(old)
    ship_job_steps_table(old, runs_fkey=True)
    ship_job_history_table(old)
    await _create(ship_engine, old)
    backend = _backend(ship_engine, _tables(history=True))
    with pytest.raises(ConfigurationError, match="ship_job_steps_run_fkey"):
        await backend.require_support([JOB])


async def test_j16_finished_runs_left_in_the_runs_table_are_warned_and_readable(
    ship_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """J16: a database upgraded to the history with its finished runs not migrated yet: the
    worker starts, warns naming the migration, and the old finished run still reads."""
    legacy_metadata = _tables(history=False)
    await _create(ship_engine, legacy_metadata)
    legacy = _backend(ship_engine, legacy_metadata)
    run_id = (await legacy.enqueue(JOB, {})).run_id
    [claimed] = await legacy.claim(claim_request(JOB, worker="w"))
    assert await legacy.settle([completed(claimed)]) == ["completed"]

    async with ship_engine.begin() as connection:
        await connection.execute(
            text("ALTER TABLE ship_job_steps DROP CONSTRAINT ship_job_steps_run_fkey")
        )
    metadata = _tables(history=True)
    await _create(ship_engine, metadata)
    backend = _backend(ship_engine, metadata)
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        await backend.require_support([JOB])
    warned = [r.getMessage() for r in caplog.records if "still in the runs table" in r.getMessage()]
    assert warned
    assert "ship-sqla jobs maintain --migrate" in warned[0]
    record = await create_job_operations(backend, authorizer=lambda *_: True).get_run(run_id or "")
    assert record is not None
    assert record.state == "completed"


async def test_j16_j18_a_database_without_a_steps_table_still_settles(ship_engine: Any) -> None:
    """J16, J18: an application with no workflows has no steps table: after the start check,
    the moving settle does not read one, and the run lands in history."""
    metadata = _tables(history=True, steps=False)
    await _create(ship_engine, metadata)
    backend = create_job_backend(
        database=ship_engine,
        table=metadata.tables["ship_job_runs"],
        state_table=metadata.tables["ship_job_state"],
        clock=FrozenClock(),
    )
    await backend.require_support([JOB])
    run_id = (await backend.enqueue(JOB, {})).run_id
    [claimed] = await backend.claim(claim_request(JOB, worker="w"))
    assert await backend.settle([completed(claimed)]) == ["completed"]
    async with ship_engine.connect() as connection:
        moved = await connection.execute(
            text("SELECT state FROM ship_job_history WHERE id = :id"), {"id": run_id}
        )
        assert moved.scalar_one() == "completed"
        left = await connection.execute(text("SELECT count(*) FROM ship_job_runs"))
        assert left.scalar_one() == 0
