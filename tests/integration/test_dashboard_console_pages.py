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
from ship_sqla.kernel._audit import AUDIT_SCAN, AuditEntry
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
    assert f'2 · <a href="{link}">its running runs →</a>' in page.text
    twin = (await client.get("/ops/workers", headers=JSON)).json()["data"]["workers"]
    hrefs = {w["worker_id"]: w["in_flight_href"] for w in twin}
    assert hrefs["w-one"] == "/ops/search?state=running&worker=w-one"
    found = await client.get(hrefs["w-one"], headers=ADMIN)
    assert found.status_code == 200
    assert all(run_id in found.text for run_id in mine)
    assert not any(run_id in found.text for run_id in theirs)
    assert unquote(hrefs["w-two"]).endswith("worker=w-two")


async def _entries(audit: InMemoryAuditLog) -> None:
    """An audit log with a run's retry, a job's pause, a bulk action by filter and an outbox's
    re-drive, by two users."""
    await audit.record(AuditEntry("alice", "jobs.retry", "run/1", 1))
    await audit.record(AuditEntry("bob", "jobs.pause", MAIL.id, 1))
    details = {
        "changed_ids": ["run/2", "run/3"],
        "links": {"search": f"/search?job={MAIL.id}&state=dead"},
    }
    await audit.record(AuditEntry("alice", "jobs.retry_filtered", "runs matching x", 2, details))
    await audit.record(AuditEntry("bob", "outbox.retry", "main", 3))


async def test_s1_audit_page_filters_and_links_entries(
    client: httpx.AsyncClient, audit: InMemoryAuditLog
) -> None:
    """S1, S2 (issue 36 item 6): the audit page filters by who, what, target text and time,
    and links each entry to what it acted on (a run's page, a job's page, the bulk action's
    search and changed runs, the outbox page); the JSON twin answers the same entries and
    links."""
    await _entries(audit)
    page = await client.get("/ops/audit", headers=ADMIN)
    assert page.status_code == 200
    for link in (
        "/ops/runs/run/1",
        f"/ops/jobs/{MAIL.id}",
        f"/ops/search?job={MAIL.id}&amp;state=dead",
        "/ops/runs/run/2",
        "/ops/outbox",
    ):
        assert f'href="{link}"' in page.text, link
    alice = await client.get("/ops/audit?actor=alice", headers=JSON)
    assert [e["operation"] for e in alice.json()["data"]["entries"]] == [
        "jobs.retry_filtered",
        "jobs.retry",
    ]
    what = await client.get("/ops/audit?operation=jobs.pause", headers=JSON)
    assert [e["target"] for e in what.json()["data"]["entries"]] == [MAIL.id]
    target = await client.get("/ops/audit?target=RUN/1", headers=JSON)
    data = target.json()["data"]
    assert [e["target"] for e in data["entries"]] == ["run/1"]
    assert data["links"] == [{"run": "/ops/runs/run/1"}]
    later = await client.get("/ops/audit?since=2999-01-01T00:00", headers=ADMIN)
    assert "No entry matches." in later.text
    assert 'value="2999-01-01T00:00"' in later.text  # the form kept as sent


async def test_s2_audit_page_bad_filter_is_a_400_with_the_form_kept(
    client: httpx.AsyncClient, audit: InMemoryAuditLog
) -> None:
    """S2: a date that is not one, or an actor of control characters, is a 400 naming the
    parameter, with the filter form kept (the value escaped) so it can be corrected."""
    await _entries(audit)
    bad = await client.get("/ops/audit?since=<b>soon&actor=alice", headers=ADMIN)
    assert bad.status_code == 400
    assert 'data-parameter="since"' in bad.text
    assert 'id="audit-filters"' in bad.text
    assert 'value="&lt;b&gt;soon"' in bad.text
    assert 'value="alice"' in bad.text
    odd = await client.get("/ops/audit?actor=%01", headers=JSON)
    assert odd.status_code == 400
    assert odd.json()["error"].startswith("actor:")


async def test_s2_audit_page_says_when_its_scan_bound_stopped_it(
    client: httpx.AsyncClient, audit: InMemoryAuditLog
) -> None:
    """S2: a filter matching nothing in the newest 5,000 entries stops there, says so, and its
    "Older" link reads on from the last entry read (keeping the filter)."""
    for n in range(AUDIT_SCAN + 10):
        await audit.record(AuditEntry("carol", "jobs.retry", f"r{n}", 1))
    page = await client.get("/ops/audit?actor=dave", headers=ADMIN)
    assert 'id="audit-stopped"' in page.text
    assert "Read 5,000 entries" in page.text
    assert "before=11" in page.text
    assert "actor=dave" in page.text.split("before=11")[0].rsplit("href=", 1)[-1]
    rest = await client.get("/ops/audit?actor=dave&before=11", headers=JSON)
    assert rest.json()["data"] == {
        "entries": [],
        "links": [],
        "older": None,
        "scanned": 10,
        "stopped": False,
    }
