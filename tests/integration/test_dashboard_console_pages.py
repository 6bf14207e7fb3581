"""Issue 36 item 6, the pages still missing pieces: the workers page links each worker to its
in-flight runs, the outbox page shows its pending trend, the audit page filters its entries and
links them to their runs and jobs (each with its JSON twin)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from dashboard_support import MAIL, actor, authorizer
from job_helpers import claim_request
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_dashboard
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._workers import WorkerEntry
from ship_sqla.operators import InMemoryAuditLog

ADMIN = {"x-user": "admin"}
JSON = {**ADMIN, "accept": "application/json"}


@pytest.fixture
def backend(ship_clock: Any) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=ship_clock)


@pytest.fixture
def audit(ship_clock: Any) -> InMemoryAuditLog:
    return InMemoryAuditLog(ship_clock)


@pytest.fixture
def client(backend: InMemoryJobBackend, audit: InMemoryAuditLog) -> httpx.AsyncClient:
    dashboard = create_dashboard(
        backend, authorizer=authorizer, actor=actor, audit=audit, definitions=[MAIL]
    )
    app = Starlette(routes=[Mount("/ops", app=dashboard)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def _worker(backend: InMemoryJobBackend, worker_id: str, in_flight: int) -> list[str]:
    """Register ``worker_id`` and have it claim ``in_flight`` runs of MAIL (running)."""
    now = datetime.now(UTC)
    entry = WorkerEntry(worker_id, "host", 1, now, (MAIL.id,), in_flight, draining=False)
    await backend.workers.heartbeat(entry)
    for i in range(in_flight):
        await backend.enqueue(MAIL, {"by": worker_id, "i": i})
    claimed = await backend.claim(claim_request(MAIL, worker=worker_id, limit=in_flight))
    return [run.run_id for run in claimed]


async def test_f6_each_worker_links_to_its_in_flight_runs(
    client: httpx.AsyncClient, backend: InMemoryJobBackend
) -> None:
    """F6, S2 (issue 36 item 6): each worker's in-flight count links to the search page's
    running runs of that worker, which lists exactly that worker's runs; the JSON twin carries
    the same link."""
    mine = await _worker(backend, "w-one", 2)
    theirs = await _worker(backend, "w-two", 1)
    page = await client.get("/ops/workers", headers=ADMIN)
    assert page.status_code == 200
    link = "/ops/search?state=running&amp;worker=w-one"
    assert f'<a href="{link}">2 running →</a>' in page.text
    twin = (await client.get("/ops/workers", headers=JSON)).json()["data"]["workers"]
    hrefs = {w["worker_id"]: w["in_flight_href"] for w in twin}
    assert hrefs["w-one"] == "/ops/search?state=running&worker=w-one"
    found = await client.get(hrefs["w-one"], headers=ADMIN)
    assert found.status_code == 200
    assert all(run_id in found.text for run_id in mine)
    assert not any(run_id in found.text for run_id in theirs)
    assert unquote(hrefs["w-two"]).endswith("worker=w-two")
