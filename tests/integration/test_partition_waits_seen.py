"""Partitioned limits seen (F8, F9; issue #35 item 6) where an operator and an autoscaler look:
the dashboard's overview lists, per partition, the due runs waiting on a limit and until when,
and the demand endpoint (F5) adds them to each job it reports when given the definitions. On
the in-memory backend (the rule and the query are the conformance suite's)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from dashboard_support import actor, authorizer
from job_helpers import claim_request
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_dashboard, create_job_operations, define_job
from ship_sqla.asgi import DemandEndpoint
from ship_sqla.jobs import Concurrency, EnqueueRequest, RateLimit
from ship_sqla.kernel import InMemoryJobBackend, completed
from ship_sqla.kernel._tenancy import tenant_ambient
from ship_sqla.testing import FrozenClock


async def noop(ctx: Any, payload: Any) -> None:
    return None


RATED = define_job(
    "seen.rated",
    noop,
    payload=dict,
    rate_limit=RateLimit(1, 60.0, partition="tenant"),
    concurrency=Concurrency(lease=30.0),
)
CAPPED = define_job(
    "seen.capped", noop, payload=dict, concurrency=Concurrency(max=1, partition="tenant")
)


async def _throttled(backend: InMemoryJobBackend) -> None:
    """Tenant acme: one rated run started (its window full for 60 s) and two due; tenant
    globex: one capped run running and one due."""
    for job, tenant, count in ((RATED, "acme", 3), (CAPPED, "globex", 2)):
        with tenant_ambient(tenant):
            await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(count)])
    done = await backend.claim(claim_request(RATED, worker="w", limit=10))
    await backend.settle([completed(run) for run in done])
    assert len(await backend.claim(claim_request(CAPPED, worker="w", limit=10))) == 1


async def test_f8_f9_the_dashboard_shows_what_waits_on_a_limit_and_until_when(
    ship_clock: FrozenClock,
) -> None:
    """F8/F9 seen: the overview's "Waiting on a limit" table names acme (rate, until the
    window frees, 2 due) and globex (concurrency, until a run ends, 1 due)."""
    backend = InMemoryJobBackend(clock=ship_clock)
    await _throttled(backend)
    dashboard = create_dashboard(
        backend, authorizer=authorizer, actor=actor, audit=None, definitions=[RATED, CAPPED]
    )
    app = Starlette(routes=[Mount("/ops", app=dashboard)])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://app"
    ) as client:
        page = (await client.get("/ops/", headers={"x-user": "viewer"})).text
    section = page[page.index('id="limit-waits"') :]
    until = (ship_clock.now() + timedelta(seconds=60)).strftime("%Y-%m-%d %H:%M:%S")
    assert "<td>seen.rated</td><td>acme</td><td>2</td><td>0</td><td>1</td><td>rate</td>" in section
    assert until in section
    assert "<td>globex</td><td>1</td><td>1</td><td>0</td><td>concurrency</td>" in section
    assert "until a run ends" in section


async def test_f5_f8_the_demand_endpoint_adds_the_partitions_waiting_on_a_limit(
    ship_clock: FrozenClock,
) -> None:
    """F5 with F8/F9 seen: given the definitions, the demand document lists under each job
    reported its partitions waiting on a limit (partition, due, running, starts in the
    window, the limits, until); without them, the document is as before."""
    backend = InMemoryJobBackend(clock=ship_clock)
    await _throttled(backend)
    ops = create_job_operations(backend, authorizer=lambda _p, _o: True)
    seen = DemandEndpoint(ops, definitions=[RATED, CAPPED])
    plain = DemandEndpoint(ops)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=seen), base_url="http://ship"
    ) as client:
        document = (await client.get("/")).json()
    by_job = {job["job_id"]: job for job in document["jobs"]}
    until = (ship_clock.now() + timedelta(seconds=60)).isoformat()
    assert by_job["seen.rated"]["waiting_on_limits"] == [
        {
            "partition": "acme",
            "due": 2,
            "running": 0,
            "started": 1,
            "waiting_on": ["rate"],
            "until": until,
            "capped": False,
        }
    ]
    [capped] = by_job["seen.capped"]["waiting_on_limits"]
    assert (capped["partition"], capped["waiting_on"], capped["until"]) == (
        "globex",
        ["concurrency"],
        None,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=plain), base_url="http://ship"
    ) as client:
        document = (await client.get("/")).json()
    assert all("waiting_on_limits" not in job for job in document["jobs"])
