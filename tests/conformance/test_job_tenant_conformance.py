"""F2 on every backend: a run records the ambient tenant of its enqueue, its claim and its
record carry it, its handler runs in it, and what the handler enqueues inherits it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from job_helpers import claim_request, record_of

from ship_sqla import create_job_operations, define_job, start_job_runtime
from ship_sqla.errors import InvalidCursorError, TenantViolationError
from ship_sqla.jobs import EnqueueRequest, RetryPolicy
from ship_sqla.kernel import failed
from ship_sqla.kernel._tenancy import ambient_tenant, tenant_ambient


async def noop(ctx: Any, payload: Any) -> None:
    return None


def allow(permission: str, operation: str) -> bool:
    return True


async def test_f2_a_run_records_the_tenant_it_was_enqueued_for(clock, job_backend_factory):
    """F2: enqueues (single and many) under an ambient tenant record it on every run; the
    claim hands it to the worker (ClaimedRun.tenant) and the record shows it; an enqueue with
    no ambient tenant records none."""
    backend = job_backend_factory(clock)
    job = define_job("f2.record", noop, payload=dict)
    with tenant_ambient("acme"):
        one = await backend.enqueue(job, {"n": 1})
        many = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in (2, 3)])
    plain = await backend.enqueue(job, {"n": 4})
    for result in (one, *many):
        assert (await record_of(backend, result.run_id)).tenant == "acme"
    assert (await record_of(backend, plain.run_id)).tenant is None
    claimed = await backend.claim(claim_request(job, worker="w", limit=10))
    tenants = {run.run_id: run.tenant for run in claimed}
    assert tenants == {
        one.run_id: "acme",
        many[0].run_id: "acme",
        many[1].run_id: "acme",
        plain.run_id: None,
    }


async def test_f2_a_handler_runs_in_its_runs_tenant(clock, job_backend_factory):
    """F2: the handler's context exposes the run's tenant, the handler's code runs with it as
    the ambient tenant, and a run the handler enqueues records it (a child inherits its
    parent's tenant); a run without a tenant runs with none."""
    backend = job_backend_factory(clock)
    seen: dict[str, tuple[str | None, str | None]] = {}
    done = anyio.Event()
    child = define_job("f2.child", noop, payload=dict)

    async def parent_handler(ctx: Any, payload: Any) -> None:
        seen[payload["name"]] = (ctx.tenant, ambient_tenant())
        if payload["name"] == "tenanted":
            result = await backend.enqueue(child, {})
            seen["child"] = ((await record_of(backend, result.run_id)).tenant, None)
        if len(seen) == 3:
            done.set()

    parent = define_job("f2.parent", parent_handler, payload=dict)
    with tenant_ambient("acme"):
        await backend.enqueue(parent, {"name": "tenanted"})
    await backend.enqueue(parent, {"name": "untenanted"})
    runtime = await start_job_runtime(parent, backend=backend, clock=clock)
    try:
        with anyio.fail_after(10):
            await done.wait()
    finally:
        await runtime.stop(drain_timeout=0)
    assert seen == {
        "tenanted": ("acme", "acme"),
        "untenanted": (None, None),
        "child": ("acme", None),
    }


async def test_f2_operators_list_one_tenants_dead_runs(clock, job_backend_factory):
    """F2, J8: list_dead(tenant=...) pages only that tenant's dead runs (keyset-paged, the
    cursor bound to the tenant); without it every dead run is listed; a blank tenant is
    refused before any query."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = define_job("f2.dead", noop, payload=dict, retry=RetryPolicy(attempts=1))
    for tenant in ("acme", "acme", "acme", "globex", None):
        with tenant_ambient(tenant):
            await backend.enqueue(job, {})
    claimed = await backend.claim(claim_request(job, worker="w", limit=10))
    await backend.settle([failed(run, "boom", None) for run in claimed])
    first = await ops.list_dead(job_id=job.id, tenant="acme", limit=2)
    assert [record.tenant for record in first.items] == ["acme", "acme"]
    assert first.next_cursor is not None
    rest = await ops.list_dead(job_id=job.id, tenant="acme", limit=2, cursor=first.next_cursor)
    assert [record.tenant for record in rest.items] == ["acme"]
    assert rest.next_cursor is None
    with pytest.raises(InvalidCursorError):
        await ops.list_dead(job_id=job.id, tenant="globex", limit=2, cursor=first.next_cursor)
    assert len((await ops.list_dead(job_id=job.id, limit=10)).items) == 5
    with pytest.raises(TenantViolationError):
        await ops.list_dead(tenant=" ")
