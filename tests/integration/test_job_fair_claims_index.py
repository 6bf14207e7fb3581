"""F2 on PostgreSQL: fair claims read ``<runs>_tenant_idx``, which a runs table has only when
declared with ``ship_job_runs_table(..., fair_claims=True)``; on a table without it a backend
refuses fair jobs with a ConfigurationError that names the index and its DDL, before any claim.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from job_helpers import claim_request
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._backend import PostgresJobBackend
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Fairness

metadata = MetaData()
runs = ship_job_runs_table(metadata)  # the default: no fair claims, no tenant index
state = ship_job_state_table(metadata)

DDL = (
    "CREATE INDEX CONCURRENTLY ship_job_runs_tenant_idx ON ship_job_runs"
    " (job_id, tenant_id, run_at, seq) WHERE state = 'waiting'"
)


async def noop(ctx: Any, payload: Any) -> None:
    return None


FAIR = define_job("fair_index.fair", noop, payload=dict, fairness=Fairness())
PLAIN = define_job("fair_index.plain", noop, payload=dict)


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)


async def _state_of(engine: AsyncEngine, run_id: str) -> str:
    async with engine.connect() as connection:
        found = await connection.scalar(
            text("SELECT state FROM ship_job_runs WHERE id = :id"), {"id": run_id}
        )
    return str(found)


def test_the_runs_table_declares_the_tenant_index_only_with_fair_claims() -> None:
    """F2: ``<runs>_tenant_idx`` (which every waiting run enters) is declared only by
    ``fair_claims=True``; the other indexes are the same either way."""
    plain = {index.name for index in ship_job_runs_table(MetaData()).indexes}
    fair = {index.name for index in ship_job_runs_table(MetaData(), fair_claims=True).indexes}
    assert fair - plain == {"ship_job_runs_tenant_idx"}
    assert plain < fair


async def test_a_worker_with_a_fair_job_on_a_table_without_the_index_fails_at_start(
    backend: PostgresJobBackend, ship_engine: AsyncEngine
) -> None:
    """F2: start_job_runtime of a worker with a fair job, on a runs table without the tenant
    index, raises ConfigurationError naming the job, the index, ``fair_claims=True`` and the
    exact DDL; the fair job's waiting run was not claimed."""
    result = await backend.enqueue(FAIR, {"n": 1})
    assert result.run_id is not None
    with pytest.raises(ConfigurationError) as caught:
        await start_job_runtime([PLAIN, FAIR], backend=backend)
    message = str(caught.value)
    assert "'fair_index.fair'" in message
    assert "'fair_index.plain'" not in message
    assert "has no index ship_job_runs_tenant_idx" in message
    assert caught.value.fix is not None
    assert "ship_job_runs_table(metadata, ..., fair_claims=True)" in caught.value.fix
    assert DDL in caught.value.fix
    assert await _state_of(ship_engine, result.run_id) == "waiting"


async def test_a_fair_claim_without_the_index_is_refused_and_a_plain_claim_is_not(
    backend: PostgresJobBackend,
) -> None:
    """F2: ``backend.claim`` of a fair job on a runs table without the tenant index raises
    ConfigurationError before any claim statement (asked again at the next fair claim, so an
    index created meanwhile is found); a job without fairness claims as usual."""
    await backend.enqueue(FAIR, {"n": 1})
    await backend.enqueue(PLAIN, {"n": 2})
    for _ in range(2):
        with pytest.raises(ConfigurationError, match="ship_job_runs_tenant_idx"):
            await backend.claim(claim_request(FAIR, worker="w", limit=5))
    [claimed] = await backend.claim(claim_request(PLAIN, worker="w", limit=5))
    assert claimed.job_id == PLAIN.id


async def test_the_ddl_the_refusal_names_lets_the_fair_job_run(
    backend: PostgresJobBackend, ship_engine: AsyncEngine
) -> None:
    """F2: after the DDL the refusal names (run as given, CONCURRENTLY, outside a
    transaction), the same backend starts a worker with the fair job and runs its waiting run."""
    result = await backend.enqueue(FAIR, {"n": 1})
    assert result.run_id is not None
    with pytest.raises(ConfigurationError) as caught:
        await start_job_runtime(FAIR, backend=backend)
    assert caught.value.fix is not None
    found = re.search(r"CREATE INDEX CONCURRENTLY [^)]*\)[^)]*'waiting'", caught.value.fix)
    assert found is not None
    async with ship_engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.execute(text(found.group(0)))
    started: list[str] = []
    ran = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        started.append(ctx.run.run_id)
        ran.set()

    job = define_job(FAIR.id, handler, payload=dict, fairness=Fairness())
    async with await start_job_runtime(job, backend=backend):
        with anyio.fail_after(10):
            await ran.wait()
    assert started == [result.run_id]
    assert await _state_of(ship_engine, result.run_id) == "completed"
