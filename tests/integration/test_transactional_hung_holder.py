"""A hung transactional holder on PostgreSQL (SPEC §8 J14): its fence's row lock is ended by a
server-side bound (``idle_in_transaction_session_timeout`` set to the lease by the fence), the
run is retaken, and the hung transaction's writes are gone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import claim_request, record_of
from sqlalchemy import MetaData, text
from transactional_kit import kit_for

from ship_sqla import JobContext, create_job_backend, define_job
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla.errors import DatabaseUnavailableError
from ship_sqla.jobs import Concurrency
from ship_sqla.kernel._plans.claim_floor import DEFAULT_FLOOR_SWEEP
from ship_sqla.kernel._runtime.fused import FusedAttempt
from ship_sqla.kernel._runtime.state import InFlight
from ship_sqla.testing import FrozenClock

LEASE = 1.0


async def _attempt(backend: Any, job: Any, run: Any) -> FusedAttempt:
    """One transactional attempt of ``run`` outside a runtime (what the executor does)."""
    entry = InFlight(job, run, backend.clock.monotonic())
    ctx = JobContext(run, entry, worker_id="w")
    attempt = FusedAttempt(entry, ctx, job.decode(run.payload), backend, backend.clock)
    await attempt.run()
    return attempt


@pytest.mark.timeout(60)
async def test_j14_a_hung_holders_lock_is_ended_by_the_server_and_the_run_retaken(
    ship_engine: Any,
) -> None:
    """J14, J6, J13: a holder hangs inside its transaction after writing (idle, its fence
    holding the row); while it holds the lock no claim retakes the run, lease lapsed or not.
    The server ends the idle transaction after the lease (the fence's bound), which releases
    the lock: a claim then retakes the run, whose new holder commits it once; the hung holder's
    write was rolled back with its session, and its late end changes nothing (J19: the run is
    below the claimer's lapsed floor once freed, so it is retaken within ``sweep`` seconds)."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    state = ship_job_state_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    clock = FrozenClock()
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, clock=clock, listen=False
    )
    kit = await kit_for(backend, clock)
    entered, release = anyio.Event(), anyio.Event()

    async def handler(ctx: Any, payload: Any, repositories: Any) -> None:
        await repositories.add_effect(f"attempt-{ctx.attempt}")
        if ctx.attempt == 1:
            entered.set()
            await release.wait()  # hung: idle in its transaction

    job = define_job(
        "j14.hung", handler, payload=dict, transaction=kit.uow, concurrency=Concurrency(lease=LEASE)
    )
    result = await backend.enqueue(job, {})
    [hung] = await backend.claim(claim_request(job, worker="A"))
    ended: list[BaseException | None] = []

    async def hung_holder() -> None:
        try:
            await _attempt(backend, job, hung)
        except Exception as exc:
            ended.append(exc)
        else:
            ended.append(None)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(hung_holder)
        with anyio.fail_after(10):
            await entered.wait()
        clock.advance(LEASE + 1)  # the lease lapsed: only the fence's lock keeps the run
        assert await backend.claim(claim_request(job, worker="B")) == []
        # Waits on the row lock itself: it is granted when the server ends the hung session.
        with anyio.fail_after(20):
            async with ship_engine.connect() as connection:
                await connection.execute(
                    text("SELECT 1 FROM ship_job_runs WHERE id = :id FOR UPDATE"),
                    {"id": result.run_id},
                )
                await connection.rollback()
        # J19's lapsed floor: the claim above passed the locked run by in a complete probe, so
        # it is retaken by the next probe from the start, within the sweep.
        freed_at = clock.now()
        batch = await backend.claim(claim_request(job, worker="B"))
        while not batch:
            clock.advance(1.0)
            assert clock.now() - freed_at <= timedelta(seconds=DEFAULT_FLOOR_SWEEP + 1.0)
            batch = await backend.claim(claim_request(job, worker="B"))
        [retaken] = batch
        assert (retaken.run_id, retaken.attempt) == (result.run_id, 2)
        done = await _attempt(backend, job, retaken)
        assert done.landed is not None
        release.set()
    assert len(ended) == 1
    # Its session is gone: its completion could not even be sent.
    assert isinstance(ended[0], DatabaseUnavailableError), ended
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert await kit.effects() == ["attempt-2"]
