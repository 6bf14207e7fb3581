"""Durable workflows against real transactions (SPEC §13, D2, D4): a transactional step's
effect happens exactly once (a stale holder's transaction is rolled back, a failed commit
stores nothing and is re-run, a replay opens no transaction); an event published in a unit of
work that rolls back matches nothing; a publish still in flight when a wait begins is ordered
before it (the wait begins after it); and a workflow run end to end by a runtime on PostgreSQL."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from job_helpers import claim_request, record_of
from sqlalchemy import Column, Integer, MetaData, Table, Text, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from workflow_helpers import execute_once, workflow_backend

from ship_sqla import (
    JobContext,
    create_unit_of_work,
    define_job,
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    start_job_runtime,
)
from ship_sqla.errors import JobLeaseStaleError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.testing import FrozenClock

LEASE = 30.0
metadata = MetaData()
runs = ship_job_runs_table(metadata)
# J16, D5: the default shape; declared before the steps, so they have no cascading key (a run
# that ends moves to history and keeps its steps).
history = ship_job_history_table(metadata)
state = ship_job_state_table(metadata)
steps = ship_job_steps_table(metadata)
events = ship_job_events_table(metadata)
effects = Table(
    "wf_effects", metadata, Column("id", Integer, primary_key=True), Column("what", Text)
)


def scope_only(scope: Any) -> Any:
    return scope


@pytest.fixture
async def backend(ship_engine: AsyncEngine, clock: FrozenClock) -> Any:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return await workflow_backend(ship_engine, clock=clock)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


async def effect_count(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int(
            (await connection.execute(select(func.count()).select_from(effects))).scalar_one()
        )


def workflow(job_id: str, handler: Any) -> Any:
    return define_job(
        job_id,
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=5),
    )


async def test_d2_a_transactional_step_commits_its_effect_exactly_once(
    ship_engine: AsyncEngine, backend: Any, clock: Any
) -> None:
    """D2: the step's row and its stored result commit together: the first attempt writes one
    row; the replay (the attempt failed after the step) writes none; and a holder whose claim
    was retaken has its whole transaction rolled back (JobLeaseStaleError), its row with it."""
    uow = create_unit_of_work(ship_engine, repositories=scope_only)

    async def write(scope: Any) -> str:
        await scope.connection.execute(insert(effects).values(what="charged"))
        return "charged"

    async def handler(ctx: Any, payload: Any) -> None:
        assert await ctx.transaction("charge", uow, write) == "charged"
        if ctx.attempt == 1:
            raise RuntimeError("after the transactional step")

    job = workflow("wf.d2.pg", handler)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "retrying"
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert await effect_count(ship_engine) == 1
    [step] = await backend.workflows.list_steps(result.run_id)
    assert (step.kind, step.result) == ("transaction", "charged")

    # A stale holder: its claim was retaken before its transaction stored the step.
    other = await backend.enqueue(job, {})
    [old] = await backend.claim(claim_request(job, worker="old"))
    clock.advance(LEASE + 1)
    [new] = await backend.claim(claim_request(job, worker="new"))
    assert old.run_id == new.run_id == other.run_id
    stale = JobContext.standalone(old, worker_id="old")
    stale.bind_workflows(backend.workflows, backend, clock)
    with pytest.raises(JobLeaseStaleError):
        await stale.transaction("charge", uow, write)
    assert await effect_count(ship_engine) == 1
    current = JobContext.standalone(new, worker_id="new")
    current.bind_workflows(backend.workflows, backend, clock)
    assert await current.transaction("charge", uow, write) == "charged"
    assert await effect_count(ship_engine) == 2


async def test_d2_a_transactional_step_that_raises_stores_nothing(
    ship_engine: AsyncEngine, backend: Any, clock: Any
) -> None:
    """D2: a step function that raises rolls its unit of work back, its row and its result
    alike; the next attempt runs it again, and only that commit counts."""
    uow = create_unit_of_work(ship_engine, repositories=scope_only)
    calls = {"n": 0}

    async def write(scope: Any) -> int:
        calls["n"] += 1
        await scope.connection.execute(insert(effects).values(what=f"try {calls['n']}"))
        if calls["n"] == 1:
            raise RuntimeError("fails inside the transaction")
        return calls["n"]

    async def handler(ctx: Any, payload: Any) -> None:
        await ctx.transaction("write", uow, write)

    job = workflow("wf.d2.rollback", handler)
    result = await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "retrying"
    assert await effect_count(ship_engine) == 0
    assert await backend.workflows.list_steps(result.run_id) == []
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert await effect_count(ship_engine) == 1


async def test_d4_an_event_published_in_a_rolled_back_unit_of_work_matches_nothing(
    ship_engine: AsyncEngine, backend: Any, clock: Any
) -> None:
    """D4: publish_event joins the caller's unit of work: rolled back, it woke nobody and no
    wait ever sees it; committed, it is the wait's result."""
    uow = create_unit_of_work(ship_engine, repositories=scope_only)
    got: list[Any] = []

    async def handler(ctx: Any, payload: Any) -> None:
        event = await ctx.wait_for_event("paid", "invoice.paid", key="i1", timeout=3600)
        got.append(event.payload if event else None)

    job = workflow("wf.d4.rollback", handler)
    await backend.enqueue(job, {})
    assert (await execute_once(backend, job, clock)).outcome == "suspended"

    class AbortError(Exception):
        pass

    async def publish_then_fail(scope: Any) -> None:
        await backend.publish_event("invoice.paid", {"n": 1}, key="i1")
        raise AbortError

    with pytest.raises(AbortError):
        await uow.run(publish_then_fail)
    assert (await execute_once(backend, job, clock)).run is None

    async def publish(scope: Any) -> None:
        await backend.publish_event("invoice.paid", {"n": 2}, key="i1")

    await uow.run(publish)
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert got == [{"n": 2}]


async def test_d4_a_wait_meeting_a_publish_in_flight_begins_after_it(
    ship_engine: AsyncEngine, backend: Any, clock: Any
) -> None:
    """D4: a wait that would begin while a publish of its event is uncommitted does not queue
    behind the publisher's transaction (its settle would block every other settle of its
    worker): the run is handed back for a moment, nothing stored, its attempt unspent; replayed
    after the publish committed, the wait begins after it, so that event is not its result;
    the next publish is."""
    uow = create_unit_of_work(ship_engine, repositories=scope_only)
    published = anyio.Event()
    release = anyio.Event()
    got: list[Any] = []

    async def handler(ctx: Any, payload: Any) -> None:
        event = await ctx.wait_for_event("w", "box.packed", key="b1", timeout=3600)
        got.append(event.payload if event else None)

    job = workflow("wf.d4.inflight", handler)
    result = await backend.enqueue(job, {})

    async def slow_publish(scope: Any) -> None:
        await backend.publish_event("box.packed", "early", key="b1")
        published.set()
        await release.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(uow.run, slow_publish)
        await published.wait()
        deferred = await execute_once(backend, job, clock)
        release.set()
    assert deferred.outcome == "suspended"
    assert await backend.workflows.list_steps(result.run_id) == []
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("waiting", 0)
    assert (await execute_once(backend, job, clock)).run is None
    clock.advance(1)
    assert (await execute_once(backend, job, clock)).outcome == "suspended"
    [step] = await backend.workflows.list_steps(result.run_id)
    assert step.state == "waiting"
    assert (await execute_once(backend, job, clock)).run is None  # "early" is not its event
    await backend.publish_event("box.packed", "late", key="b1")
    assert (await execute_once(backend, job, clock)).ended == "completed"
    assert got == ["late"]


async def test_a_workflow_runs_end_to_end_in_a_runtime(ship_engine: AsyncEngine) -> None:
    """D1-D5 in a worker runtime on PostgreSQL (the system clock): a step, a sleep, an event
    wait woken by a publish from outside, a fan-out of children and the fan-in; the
    continuation runs once."""
    backend = await workflow_backend(ship_engine)
    continued: list[list[str]] = []
    waiting = anyio.Event()
    finished = anyio.Event()

    async def child(ctx: Any, payload: Any) -> None:
        return None

    child_job = define_job("wf.e2e.child", child, payload=dict)

    async def parent(ctx: Any, payload: Any) -> None:
        async def one() -> int:
            return 1

        await ctx.step("one", one)
        await ctx.sleep("nap", 0.05)
        waiting.set()
        await ctx.wait_for_event("go", "e2e.go", key=ctx.run_id, timeout=60)
        await ctx.spawn("kids", child_job, [{"i": i} for i in range(20)])
        outcomes = await ctx.wait_for_children("join")
        continued.append([o.state for o in outcomes])
        finished.set()

    parent_job = define_job("wf.e2e", parent, payload=dict)
    runtime = await start_job_runtime([parent_job, child_job], backend=backend, poll_interval=0.05)
    try:
        result = await backend.enqueue(parent_job, {})
        with anyio.fail_after(20):
            await waiting.wait()
            # The run suspends once it reached the wait; publish until it has received it.
            while not finished.is_set():
                await backend.publish_event("e2e.go", None, key=result.run_id)
                with anyio.move_on_after(0.5):
                    await finished.wait()
    finally:
        await runtime.stop()
    assert continued == [["completed"] * 20]
    record = await record_of(backend, result.run_id)
    assert record.state == "completed"
