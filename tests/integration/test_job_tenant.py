"""F2 through units of work on PostgreSQL: a run enqueued inside ``uow.run(tenant=...)``
records the tenant, and a unit of work its handler opens without naming a tenant runs in it."""

from __future__ import annotations

from typing import Any

import anyio
from job_helpers import record_of
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import create_unit_of_work, current_scope, define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


def scope_only(scope: Any) -> Any:
    return scope


async def test_f2_uow_tenant_is_recorded_and_the_handlers_uow_defaults_to_it(
    ship_engine: AsyncEngine,
) -> None:
    """F2: an enqueue inside uow.run(tenant="acme") records acme (committed with the unit of
    work); its handler sees ctx.tenant == "acme", and a uow.run it opens without a tenant has
    scope.tenant == "acme"; a run enqueued in an untenanted unit of work has none, and so does
    its handler's unit of work."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    uow = create_unit_of_work(ship_engine, repositories=scope_only)
    seen: dict[str, tuple[str | None, str | None]] = {}
    done = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        async def inside(scope: Any) -> str | None:
            assert current_scope() is scope
            return scope.tenant  # type: ignore[no-any-return]

        seen[payload["name"]] = (ctx.tenant, await uow.run(inside))
        if len(seen) == 2:
            done.set()

    job = define_job("f2.uow", handler, payload=dict)

    async def enqueue(name: str) -> str:
        async def work(scope: Any) -> str:
            result = await backend.enqueue(job, {"name": name})
            assert result.run_id is not None
            return result.run_id

        return await uow.run(work, tenant="acme" if name == "acme" else None)

    acme_id = await enqueue("acme")
    plain_id = await enqueue("plain")
    assert (await record_of(backend, acme_id)).tenant == "acme"
    assert (await record_of(backend, plain_id)).tenant is None
    runtime = await start_job_runtime(job, backend=backend)
    try:
        with anyio.fail_after(20):
            await done.wait()
    finally:
        await runtime.stop()
    assert seen == {"acme": ("acme", "acme"), "plain": (None, None)}
