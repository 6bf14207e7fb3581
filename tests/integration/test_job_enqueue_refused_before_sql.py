"""Bad enqueue input is refused before any SQL runs, on PostgreSQL (the typed errors themselves
are tested on both backends in tests/conformance/test_job_enqueue_inputs.py)."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from sqlalchemy import MetaData, event
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import TransactionScope, create_unit_of_work, define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.errors import ShipError
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.testing import FrozenClock

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


async def noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("inputs.job", noop, payload=dict, max_payload_bytes=100)

BAD = [
    EnqueueRequest({"t": "\x00"}),
    EnqueueRequest({"t": "x" * 100}),
    EnqueueRequest({}, run_at="2030-01-01T00:00:00Z"),  # type: ignore[arg-type]
    EnqueueRequest({}, run_at=date(2030, 1, 1)),  # type: ignore[arg-type]
    EnqueueRequest({}, run_id="r" * 1000),
    EnqueueRequest({}, dedupe_key="d" * 10_000),
    EnqueueRequest({}, dedupe_key=""),
]


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.mark.parametrize("limit", [None, 10])
async def test_bad_input_runs_no_sql(
    engine: AsyncEngine, ship_clock: FrozenClock, limit: int | None
) -> None:
    """Each bad request raises its typed error (a ShipError with a code) before the backend
    sends a statement: not PostgreSQL's "index row requires N bytes" or "invalid byte
    sequence", and no gate taken (J2), inside a unit of work or not."""
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, clock=ship_clock, queue_depth_limit=limit
    )
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        for request in BAD:
            with pytest.raises(ShipError) as caught:
                await backend.enqueue_many(JOB, [EnqueueRequest({"ok": 1}), request])
            assert caught.value.code.startswith("SHIP_SQLA_")

            async def in_unit(scope: TransactionScope, request: EnqueueRequest = request) -> None:
                await backend.enqueue_many(JOB, [request], scope=scope)

            with pytest.raises(ShipError):
                await uow.run(in_unit)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert statements == []
