"""Durable workflows through a real PgBouncer in transaction pooling mode (SPEC F7, §13): steps,
a transactional step, a sleep, an event wait woken by a publish from another engine, and a
fan-in, every statement through the bouncer (the wait lock is transaction-level, so it holds
there; see tests/integration/test_pgbouncer.py for the fixture and what does not work)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select, text
from workflow_helpers import execute_once, workflow_backend

from ship_sqla import create_unit_of_work, define_job
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from pgbouncer import PgBouncer
    from sqlalchemy.ext.asyncio import AsyncEngine

effects = Table("pgb_wf_effects", MetaData(), Column("id", Integer, primary_key=True))


def scope_only(scope: Any) -> Any:
    return scope


async def bounced_engine(pgbouncer: PgBouncer, direct: AsyncEngine) -> AsyncEngine:
    async with direct.begin() as connection:
        await connection.run_sync(effects.metadata.create_all)
        await connection.execute(text(f'ALTER DATABASE "{direct.url.database}" SET jit = off'))
    return pgbouncer.engine(str(direct.url.database), max_overflow=10)


async def test_f7_a_workflow_runs_through_pgbouncer(
    pgbouncer: PgBouncer, ship_engine: AsyncEngine
) -> None:
    """F7, D1-D5: through transaction pooling a workflow's plain and transactional steps are
    stored once, its sleep and its event wait suspend and resume (the wait's lock and snapshot
    are transaction-level), a publish from another engine wakes it, and its fan-in ends."""
    await workflow_backend(ship_engine)  # the tables, over the direct connection
    engine = await bounced_engine(pgbouncer, ship_engine)
    other = pgbouncer.engine(str(ship_engine.url.database))
    clock = FrozenClock()
    try:
        backend = await workflow_backend(engine, listen=False, clock=clock)
        publisher = await workflow_backend(other, listen=False, clock=clock)
        uow = create_unit_of_work(engine, repositories=scope_only)
        ran: list[str] = []

        async def child(ctx: Any, payload: Any) -> None:
            return None

        child_job = define_job("pgb.wf.child", child, payload=dict)

        async def handler(ctx: Any, payload: Any) -> None:
            async def plain() -> str:
                ran.append("plain")
                return "p"

            async def write(scope: Any) -> int:
                await scope.connection.execute(insert(effects).values())
                return 1

            await ctx.step("plain", plain)
            await ctx.transaction("write", uow, write)
            await ctx.sleep("nap", 5)
            event = await ctx.wait_for_event("go", "pgb.go", key="k", timeout=600)
            assert event is not None
            assert event.payload == {"n": 1}
            await ctx.spawn("kids", child_job, [{}, {}])
            outcomes = await ctx.wait_for_children("join")
            assert [o.state for o in outcomes] == ["completed", "completed"]

        job = define_job(
            "pgb.wf",
            handler,
            payload=dict,
            concurrency=Concurrency(lease=30),
            retry=RetryPolicy(attempts=3),
        )
        await backend.enqueue(job, {})
        assert (await execute_once(backend, job, clock)).outcome == "suspended"  # the sleep
        clock.advance(6)
        assert (await execute_once(backend, job, clock)).outcome == "suspended"  # the wait
        assert (await execute_once(backend, job, clock)).run is None
        await publisher.publish_event("pgb.go", {"n": 1}, key="k")
        assert (await execute_once(backend, job, clock)).outcome == "suspended"  # the children
        for _ in range(2):
            assert (await execute_once(backend, child_job, clock)).outcome == "completed"
        assert (await execute_once(backend, job, clock)).ended == "completed"
        assert ran == ["plain"]
        async with ship_engine.connect() as connection:
            count = (await connection.execute(select(func.count()).select_from(effects))).scalar()
        assert count == 1
    finally:
        await engine.dispose()
        await other.dispose()
