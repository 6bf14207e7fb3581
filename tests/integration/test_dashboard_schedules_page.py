"""The schedules pages (issue 36) on PostgreSQL: each schedule's last 20 occurrences with the
run each tick inserted (J9: its durable id), run now (audited, ``jobs.run_now``; its CLI verb
``ship-sqla jobs run-now``), pause behind a confirmation page (no JavaScript) and resume, the
JSON twins, an unknown schedule's 404. Time is a FrozenClock moved by the test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from dashboard_support import MAIL, actor, authorizer, csrf_of, dashboard_tables

from ship_sqla import create_audit_log, create_dashboard, create_job_backend, define_job
from ship_sqla.jobs import Schedule
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

ADMIN = {"x-user": "admin"}
VIEWER = {"x-user": "viewer"}
JSON = {"accept": "application/json"}
START = datetime(2030, 1, 1, 0, 30, tzinfo=UTC)


async def _tick(_payload: dict[str, Any]) -> None:
    return None


HOURLY = define_job(
    "sp.hourly", _tick, payload=dict, schedule=Schedule(interval=timedelta(hours=1))
)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
async def backend(ship_engine: AsyncEngine, clock: FrozenClock) -> Any:
    metadata, runs, state, workers, _audit = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers, clock=clock
    )
    await backend.install_schedules([HOURLY])
    return backend


@pytest.fixture
def audit(ship_engine: AsyncEngine) -> Any:
    return create_audit_log(database=ship_engine)


@pytest.fixture
def client(backend: Any, audit: Any) -> httpx.AsyncClient:
    app = create_dashboard(
        backend, authorizer=authorizer, actor=actor, audit=audit, definitions=[HOURLY, MAIL]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def _three_ticks(backend: Any, clock: FrozenClock) -> None:
    """Three occurrences fired (01:00, 02:00, 03:00), one run each."""
    for _ in range(3):
        clock.advance(3600)
        assert await backend.tick_schedules([HOURLY]) == 1


async def test_j9_a_schedules_page_lists_its_last_20_occurrences_with_their_runs(
    client: httpx.AsyncClient, backend: Any, clock: FrozenClock
) -> None:
    """J9, issue 36: the list links each schedule to its page, which lists its last 20
    occurrences newest first, each with the run its tick inserted (by its durable id) and that
    run's state; the occurrences before the first tick have none. The JSON twins carry the
    same."""
    await _three_ticks(backend, clock)
    listing = await client.get("/schedules", headers=ADMIN)
    assert listing.status_code == 200
    assert 'href="/schedules/sp.hourly"' in listing.text
    page = await client.get("/schedules/sp.hourly", headers=ADMIN)
    assert page.status_code == 200, page.text
    for hour in (1, 2, 3):
        assert f'href="/runs/sp.hourly/2030-01-01T0{hour}%3A00%3A00Z"' in page.text
    twin = (await client.get("/schedules/sp.hourly", headers={**ADMIN, **JSON})).json()
    occurrences = twin["data"]["occurrences"]
    assert len(occurrences) == 20
    assert occurrences[0]["at"] == "2030-01-01T03:00:00+00:00"
    assert [o["state"] for o in occurrences[:4]] == ["waiting", "waiting", "waiting", None]
    listed = (await client.get("/schedules", headers={**ADMIN, **JSON})).json()
    [row] = listed["data"]["schedules"]
    assert (row["job_id"], row["last_at"]) == ("sp.hourly", "2030-01-01T03:00:00+00:00")


async def test_run_now_adds_one_due_run_outside_the_schedule_and_is_audited(
    client: httpx.AsyncClient, backend: Any, audit: Any
) -> None:
    """Issue 36, S1: a manager's Run now (a POST with the session's CSRF token) enqueues one run
    of the job with its schedule's payload, due now; the next occurrence is unchanged; the
    audit log names the run. A job without a schedule is refused (400, nothing changed)."""
    before = (await client.get("/schedules", headers={**ADMIN, **JSON})).json()
    page = await client.get("/schedules", headers=ADMIN)
    assert 'action="/schedules/sp.hourly/run-now"' in page.text
    done = await client.post(
        "/schedules/sp.hourly/run-now",
        data={"csrf_token": csrf_of(page.text), "next": "/schedules"},
        headers=ADMIN,
    )
    assert done.status_code == 303, done.text
    assert "is+due+now" in done.headers["location"]
    [entry] = [e for e in await audit.list_entries(limit=10) if e.operation == "jobs.run_now"]
    run_id = entry.details["run_id"]
    record = await backend.admin.get_run(run_id)
    assert (record.job_id, record.state, record.payload) == ("sp.hourly", "waiting", {})
    after = (await client.get("/schedules", headers={**ADMIN, **JSON})).json()
    assert after["data"]["schedules"][0]["next_at"] == before["data"]["schedules"][0]["next_at"]
    refused = await client.post(
        "/schedules/dash.mail/run-now",
        data={"csrf_token": csrf_of(page.text), "next": "/schedules"},
        headers=ADMIN,
    )
    assert refused.status_code == 400
    assert "has no schedule" in refused.text


async def test_pause_asks_first_on_its_own_page_then_pauses_and_resume_undoes_it(
    client: httpx.AsyncClient, backend: Any, audit: Any
) -> None:
    """K3, issue 36: "Pause…" is a link to the schedule's page with ``?confirm=pause``, which
    says what a pause does and holds the confirming form; nothing is paused before it is
    posted. Then the list shows the pause and a Resume button; a read-only user gets neither
    form nor confirmation."""
    listing = await client.get("/schedules", headers=ADMIN)
    assert 'href="/schedules/sp.hourly?confirm=pause"' in listing.text
    assert 'action="/jobs/sp.hourly/pause"' not in listing.text
    confirm = await client.get("/schedules/sp.hourly?confirm=pause", headers=ADMIN)
    assert 'id="pause-confirm"' in confirm.text
    assert 'action="/jobs/sp.hourly/pause"' in confirm.text
    assert await backend.admin.paused(limit=10) == []
    done = await client.post(
        "/jobs/sp.hourly/pause",
        data={"csrf_token": csrf_of(confirm.text), "next": "/schedules/sp.hourly"},
        headers=ADMIN,
    )
    assert done.status_code == 303
    assert done.headers["location"].startswith("/schedules/sp.hourly?done=")
    listing = await client.get("/schedules", headers=ADMIN)
    assert "paused since" in listing.text
    assert 'action="/jobs/sp.hourly/resume"' in listing.text
    assert [e.operation for e in await audit.list_entries(limit=10)] == ["jobs.pause"]
    viewer = await client.get("/schedules/sp.hourly?confirm=pause", headers=VIEWER)
    assert viewer.status_code == 200
    assert 'method="post"' not in viewer.text
    assert 'id="pause-confirm"' not in viewer.text


async def test_an_unknown_schedule_is_a_404_in_html_and_json(client: httpx.AsyncClient) -> None:
    """Issue 36: a job id with no stored schedule answers 404, saying where to pick one."""
    page = await client.get("/schedules/no.such.job", headers=ADMIN)
    assert page.status_code == 404
    assert "Fix: pick one on the Schedules page" in page.text
    twin = await client.get("/schedules/no.such.job", headers={**ADMIN, **JSON})
    assert twin.status_code == 404
    assert "No schedule is stored" in twin.json()["error"]
