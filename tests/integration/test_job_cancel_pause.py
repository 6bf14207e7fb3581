"""Cancel (K2) and pause / resume (K3) on PostgreSQL across engines: what only a real database
shows (notifications between backends, the pause read in another engine's claim, a unit of
work that rolls back, the schema check). The conformance suite covers both backends' rules;
tests/integration/test_job_control_processes.py does the same across OS processes."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from job_helpers import claim_request, record_of, settle_loop
from spy_backend import SpyBackend
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import (
    TransactionScope,
    create_job_operations,
    create_unit_of_work,
    define_job,
    start_job_runtime,
)
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._schema_check import check_schema
from ship_sqla.jobs import Concurrency
from ship_sqla.testing import FrozenClock

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


def allow(permission: str, operation: str) -> bool:
    return True


async def noop(ctx: Any, payload: Any) -> None:
    return None


@pytest.fixture
async def engines(ship_engine: AsyncEngine, ship_engine_url: str) -> Any:
    """The test database's engine, and a second engine on it (another process's pool)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    other = create_async_engine(ship_engine_url, pool_size=2)
    try:
        yield ship_engine, other
    finally:
        await other.dispose()


def backend_on(engine: AsyncEngine, clock: FrozenClock, **options: Any) -> Any:
    return create_job_backend(
        database=engine, table=runs, state_table=state, clock=clock, **options
    )


async def test_k2_a_cancel_through_another_backend_reaches_the_handler_by_notification(
    engines: Any,
) -> None:
    """K2: a cancel made through another engine's backend (no shared process state) reaches
    the running handler through the worker's listener at once: time never moves here, so no
    heartbeat can have carried it; the run ends cancelled."""
    worker_engine, operator_engine = engines
    clock = FrozenClock()
    worker = SpyBackend(backend_on(worker_engine, clock))
    operator = backend_on(operator_engine, clock, listen=False)
    ops = create_job_operations(operator, authorizer=allow)
    started, cancelled = anyio.Event(), anyio.Event()
    reasons: list[str | None] = []

    async def handler(ctx: Any, payload: Any) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            reasons.append(ctx.cancel_reason)
            cancelled.set()

    job = define_job("k2.notified", handler, payload=dict, concurrency=Concurrency(lease=30))
    result = await operator.enqueue(job, {})
    assert result.run_id is not None
    async with await start_job_runtime([job], backend=worker, poll_interval=3600.0):
        with anyio.fail_after(10):
            await worker.inner.listener.wait_live()
            await started.wait()
        assert (await ops.cancel(result.run_id)).outcome == "requested"
        with anyio.fail_after(10):
            await cancelled.wait()
        await worker.wait_settled("cancel", 1)
        assert worker.calls.get("heartbeat", []) == []
    assert reasons == ["cancelled"]
    assert (await record_of(operator, result.run_id)).state == "cancelled"


async def test_k3_a_pause_through_one_engine_stops_another_engines_claims_and_resume_wakes_it(
    engines: Any,
) -> None:
    """K3: a pause committed through one engine stops every later claim through another (its
    runtime claims and gets nothing, although enqueues still land and announce); the resume's
    notification wakes that runtime at once: time never moves, and the poll is an hour away."""
    worker_engine, operator_engine = engines
    clock = FrozenClock()
    worker = SpyBackend(backend_on(worker_engine, clock))
    operator = backend_on(operator_engine, clock, listen=False)
    ops = create_job_operations(operator, authorizer=allow)
    ran = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        ran.set()

    job = define_job("k3.engines", handler, payload=dict)
    assert await ops.pause(job.id)
    assert await worker.inner.claim(claim_request(job, worker="direct")) == []
    async with await start_job_runtime([job], backend=worker, poll_interval=3600.0):
        with anyio.fail_after(10):
            await worker.inner.listener.wait_live()
        claims = len(worker.answered("claim"))
        result = await operator.enqueue(job, {})  # announced: the worker claims, gets nothing
        await worker.wait_calls("claim", claims + 1)
        await settle_loop()
        assert not ran.is_set()
        assert (await record_of(operator, result.run_id)).state == "waiting"
        assert await ops.resume(job.id)
        with anyio.fail_after(10):
            await ran.wait()


async def test_k2_a_cancel_in_a_unit_of_work_that_rolls_back_changes_and_tells_nothing(
    engines: Any,
) -> None:
    """K2 (U1, U4): a cancel joins the running unit of work: rolled back, the run is untouched
    and no holder is told; committed, the holder is told after the commit."""
    engine, _ = engines
    clock = FrozenClock()
    backend = backend_on(engine, clock, listen=False)
    ops = create_job_operations(backend, authorizer=allow)
    told: list[str] = []
    backend.watch_cancel_requests(told.append)
    job = define_job("k2.uow", noop, payload=dict)
    await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="w"))
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    class RollbackError(Exception):
        pass

    async def cancel_then_fail(scope: TransactionScope) -> None:
        assert (await ops.cancel(run.run_id)).outcome == "requested"
        assert told == []  # not before the commit
        raise RollbackError

    with pytest.raises(RollbackError):
        await uow.run(cancel_then_fail)
    record = await record_of(backend, run.run_id)
    assert (record.state, record.cancel_requested_at) == ("running", None)
    assert told == []

    async def cancel(scope: TransactionScope) -> None:
        await ops.cancel(run.run_id)
        assert told == []

    await uow.run(cancel)
    assert told == [run.run_id]
    assert (await record_of(backend, run.run_id)).cancel_requested_at == clock.now()


async def test_k2_the_schema_check_reports_a_runs_table_from_before_cancel(
    ship_engine: AsyncEngine,
) -> None:
    """K2, T3: a runs table created before cancel existed (its state check without
    ``cancelled``, no ``cancel_requested_at``, the finished-runs index on three states) is
    reported by the schema check: each of the three differences, exactly."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for statement in (
            "ALTER TABLE ship_job_runs DROP COLUMN cancel_requested_at",
            "ALTER TABLE ship_job_runs DROP CONSTRAINT ship_job_runs_state_check",
            (
                "ALTER TABLE ship_job_runs ADD CONSTRAINT ship_job_runs_state_check CHECK"
                " (state IN ('waiting', 'running', 'completed', 'dead', 'discarded'))"
            ),
            "DROP INDEX ship_job_runs_finished_idx",
            (
                "CREATE INDEX ship_job_runs_finished_idx ON ship_job_runs (job_id, finished_at)"
                " WHERE state IN ('completed', 'dead', 'discarded')"
            ),
        ):
            await connection.exec_driver_sql(statement)
    report = await check_schema(ship_engine, metadata)
    found = {(d.kind, d.name) for d in report.differences if d.table == "ship_job_runs"}
    assert found == {
        ("column_missing", "cancel_requested_at"),
        ("constraint_definition", "ship_job_runs_state_check"),
        ("index_predicate", "ship_job_runs_finished_idx"),
    }
    [check] = [d for d in report.differences if d.kind == "constraint_definition"]
    assert "cancelled" in (check.metadata or "")
    assert "cancelled" not in (check.database or "")


async def test_k2_j13_a_cancel_through_another_backend_stops_a_transactional_handler(
    engines: Any,
) -> None:
    """K2, J13, J14: a run whose transactional handler is inside its transaction (its fence
    locks the row until that transaction ends) is cancelled through another engine's backend:
    the cancel does not wait for the handler; the worker's listener is told at once, the
    handler is cancelled, its writes roll back, and the run ends cancelled."""
    worker_engine, operator_engine = engines
    async with worker_engine.begin() as connection:
        await connection.exec_driver_sql("CREATE TABLE k2_effects (note text NOT NULL)")
    clock = FrozenClock()
    worker = SpyBackend(backend_on(worker_engine, clock))
    operator = backend_on(operator_engine, clock, listen=False)
    ops = create_job_operations(operator, authorizer=allow)
    uow = create_unit_of_work(worker_engine, repositories=lambda scope: scope)
    started = anyio.Event()

    async def handler(ctx: Any, payload: Any, scope: TransactionScope) -> None:
        await scope.connection.exec_driver_sql("INSERT INTO k2_effects VALUES ('never')")
        started.set()
        await anyio.sleep_forever()

    job = define_job(
        "k2.transactional",
        handler,
        payload=dict,
        transaction=uow,
        concurrency=Concurrency(lease=30),
    )
    result = await operator.enqueue(job, {})
    assert result.run_id is not None
    async with await start_job_runtime([job], backend=worker, poll_interval=3600.0):
        with anyio.fail_after(10):
            await worker.inner.listener.wait_live()
            await started.wait()
            # The request lands after the handler's rollback: before the holder's cancelled
            # settle ("requested") or after it ("cancelled"), as the two race.
            assert (await ops.cancel(result.run_id)).outcome in ("requested", "cancelled")
        await worker.wait_settled("cancel", 1)
    assert (await record_of(operator, result.run_id)).state == "cancelled"
    async with operator_engine.connect() as connection:
        assert (await connection.exec_driver_sql("SELECT count(*) FROM k2_effects")).scalar() == 0
