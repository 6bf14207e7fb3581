"""F8, F9 on PostgreSQL: partitioned claims read ``<runs>_tenant_idx`` and
``<runs>_running_idx``, which a runs table has only when declared with
``ship_job_runs_table(..., partitioned_claims=True)`` (``ship-sqla schema apply
--partitioned-claims``); on a table without them a worker with a per-tenant limit is refused at
start with an error naming the indexes and the DDL that adds them, before any claim."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._backend import PostgresJobBackend
from ship_sqla._schema_apply import ship_tables_metadata
from ship_sqla.errors import MissingTablesError
from ship_sqla.jobs import Concurrency, RateLimit

metadata = MetaData()
runs = ship_job_runs_table(metadata, fair_claims=True)  # the tenant index, not the running one
state = ship_job_state_table(metadata)


async def noop(ctx: Any, payload: Any) -> None:
    return None


RATED = define_job(
    "part_index.rated", noop, payload=dict, rate_limit=RateLimit(5, 1.0, partition="tenant")
)
CAPPED = define_job(
    "part_index.capped", noop, payload=dict, concurrency=Concurrency(max=2, partition="tenant")
)
PLAIN = define_job("part_index.plain", noop, payload=dict)


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)


def test_the_runs_table_declares_the_partition_indexes_only_with_partitioned_claims() -> None:
    """F8, F9: ``partitioned_claims=True`` adds ``<runs>_tenant_idx`` and
    ``<runs>_running_idx``, ``partition_keys=True`` ``<runs>_part_idx`` and
    ``<runs>_part_run_idx``; the other indexes are the same; ``ship-sqla schema apply
    --partitioned-claims`` / ``--partition-keys`` build the same tables."""
    plain = {index.name for index in ship_job_runs_table(MetaData()).indexes}
    parted = {
        index.name for index in ship_job_runs_table(MetaData(), partitioned_claims=True).indexes
    }
    assert parted - plain == {"ship_job_runs_tenant_idx", "ship_job_runs_running_idx"}
    applied = ship_tables_metadata(components=("jobs",), partitioned_claims=True)
    assert {index.name for index in applied.tables["ship_job_runs"].indexes} == parted
    keyed = ship_tables_metadata(components=("jobs",), partition_keys=True)
    assert {index.name for index in keyed.tables["ship_job_runs"].indexes} - plain == {
        "ship_job_runs_part_idx",
        "ship_job_runs_part_run_idx",
    }


async def test_a_worker_with_a_per_tenant_limit_on_a_table_without_the_indexes_fails_at_start(
    backend: PostgresJobBackend, ship_engine: AsyncEngine
) -> None:
    """F8, F9: start_job_runtime of a worker with per-tenant limits, on a runs table without
    <runs>_running_idx, raises MissingTablesError naming the jobs, the missing index,
    ``partitioned_claims=True`` and the exact DDL (its Fix: line); nothing was claimed. Once
    the index is made (that DDL), the same worker starts."""
    result = await backend.enqueue(RATED, {"n": 1})
    with pytest.raises(MissingTablesError) as caught:
        await start_job_runtime([PLAIN, RATED, CAPPED], backend=backend)
    message = str(caught.value)
    assert "'part_index.rated', 'part_index.capped'" in message
    assert "'part_index.plain'" not in message
    assert "ship_job_runs_running_idx" in message
    assert "ship_job_runs_tenant_idx" not in message  # it exists
    fix = caught.value.fix
    assert fix is not None
    assert "partitioned_claims=True" in fix
    ddl = (
        "CREATE INDEX CONCURRENTLY ship_job_runs_running_idx ON ship_job_runs"
        " (job_id, tenant_id) WHERE state = 'running'"
    )
    assert ddl in fix
    assert f"Fix: {fix}" in message
    async with ship_engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        found = await connection.scalar(
            text("SELECT state FROM ship_job_runs WHERE id = :id"), {"id": result.run_id}
        )
        assert found == "waiting"
        await connection.execute(text(ddl))
    runtime = await start_job_runtime([PLAIN, RATED, CAPPED], backend=backend)
    await runtime.stop()


async def test_limits_per_key_on_a_table_without_their_indexes_are_refused(
    backend: PostgresJobBackend,
) -> None:
    """F8, F9 per key: a worker with a limit per partition key, and an enqueue that gives a
    partition key, on a runs table without <runs>_part_idx and <runs>_part_run_idx, are
    refused with MissingTablesError whose Fix: line names partition_keys=True, the column and
    the indexes' DDL; nothing was written."""
    by_key = define_job(
        "part_index.by_key", noop, payload=dict, rate_limit=RateLimit(5, 1.0, partition="key")
    )
    with pytest.raises(MissingTablesError) as caught:
        await start_job_runtime([by_key], backend=backend)
    fix = caught.value.fix or ""
    assert "partition_keys=True" in fix
    assert "ADD COLUMN IF NOT EXISTS partition_key text" in fix
    assert "ship_job_runs_part_idx" in fix
    assert "ship_job_runs_part_run_idx" in fix
    with pytest.raises(MissingTablesError):
        await backend.enqueue(by_key, {"n": 1}, partition_key="acme")
    assert await backend.admin.job_known(by_key.id) is False
