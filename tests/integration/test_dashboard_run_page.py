"""The run page (issue 36) on PostgreSQL, over a backend whose ended runs move to the history
table (J16, J18: the last attempt's start and worker are stored there): the attempt timeline
with its queue wait, run time and worker; a workflow's steps, the failed step and the
children; the rerun-from-step confirmation (no JavaScript: a page, then a POST with CSRF,
audited, D6); the JSON twin; an unknown id's 404. Time is a FrozenClock moved by the test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from dashboard_support import actor, authorizer, csrf_of
from workflow_helpers import execute_once

from ship_sqla import create_audit_log, create_dashboard, create_job_backend, define_job
from ship_sqla._dashboard._run_page import span
from ship_sqla._jobs import (
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
)
from ship_sqla._schema_apply import apply_ship_schema
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import failed
from ship_sqla.kernel._runtime.state import describe_failure
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

ADMIN = {"x-user": "admin"}
VIEWER = {"x-user": "viewer"}
JSON = {"accept": "application/json"}


async def _child(_payload: dict[str, Any]) -> None:
    return None


CHILD = define_job("rp.child", _child, payload=dict, concurrency=Concurrency(lease=30))


async def _flow(ctx: Any, payload: dict[str, Any]) -> None:
    async def first() -> dict[str, str]:
        return {"card": "4242-secret"}

    async def charge() -> None:
        raise RuntimeError("card declined")

    await ctx.step("reserve", first)
    await ctx.spawn("fan", CHILD, [{"i": 0}, {"i": 1}])
    await ctx.step("charge", charge)


FLOW = define_job(
    "rp.flow",
    _flow,
    payload=dict,
    concurrency=Concurrency(lease=30),
    retry=RetryPolicy(attempts=2),
)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
async def backend(ship_engine: AsyncEngine, clock: FrozenClock) -> Any:
    """Every job table under its default name, the history partitioned by schema apply, and a
    live-only backend (J16) on them with the frozen clock."""
    from sqlalchemy import MetaData  # noqa: PLC0415

    from ship_sqla._schema_apply import ship_tables_metadata  # noqa: PLC0415

    metadata = ship_tables_metadata(components=["jobs", "audit"])
    report = await apply_ship_schema(ship_engine, metadata)
    assert report.ok, report.check
    extra = MetaData()
    steps = ship_job_steps_table(extra, runs_fkey=False)
    events = ship_job_events_table(extra)
    async with ship_engine.begin() as connection:
        await connection.run_sync(extra.create_all)
    return create_job_backend(
        database=ship_engine,
        clock=clock,
        listen=False,
        table=ship_job_runs_table(MetaData()),
        state_table=ship_job_state_table(MetaData()),
        workers_table=ship_job_workers_table(MetaData()),
        history_table=ship_job_history_table(MetaData()),
        steps_table=steps,
        events_table=events,
    )


@pytest.fixture
def audit(ship_engine: AsyncEngine) -> Any:
    return create_audit_log(database=ship_engine)


@pytest.fixture
def client(backend: Any, audit: Any) -> httpx.AsyncClient:
    app = create_dashboard(
        backend, authorizer=authorizer, actor=actor, audit=audit, definitions=[FLOW, CHILD]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def _fail_at_charge(backend: Any, clock: FrozenClock, *, worker: str) -> str:
    """One execution of the flow that fails at its ``charge`` step, settled with the error the
    runtime records (the exception, then its traceback); the run id."""
    execution = await execute_once(backend, FLOW, clock, worker=worker, settle=False)
    assert execution.run is not None
    assert execution.ended == "failed"
    assert execution.error is not None
    clock.advance(2)  # the attempt ran for 2 s
    error = describe_failure(execution.error)
    await backend.settle([failed(execution.run, error, clock.now() + timedelta(seconds=5))])
    return execution.run.run_id


async def _dead_flow(backend: Any, clock: FrozenClock) -> str:
    await backend.enqueue(FLOW, {"order": 7})
    clock.advance(3)  # the first attempt waits 3 s in the queue
    run_id = await _fail_at_charge(backend, clock, worker="worker-a")
    clock.advance(10)  # due again after 5 s: the second attempt waits 5 s more
    assert await _fail_at_charge(backend, clock, worker="worker-b") == run_id
    return run_id


async def test_the_run_page_shows_the_timeline_worker_steps_failed_step_and_children(
    client: httpx.AsyncClient, backend: Any, clock: FrozenClock
) -> None:
    """Issue 36 item 6, J18, D1, D5: a dead workflow run's page lists both attempts (each
    one's end, error, start, worker and run time, from its history entry; the last one's
    queue wait too), its stored
    steps with their results, the step that failed (named from the traceback), and its two
    children, linked; the JSON twin carries the same."""
    run_id = await _dead_flow(backend, clock)
    page = await client.get(f"/runs/{run_id}", headers=ADMIN)
    assert page.status_code == 200, page.text
    html = page.text
    assert html.count('data-attempt="') == 2
    assert "started <time" in html
    assert "on worker-b" in html
    assert "on worker-a · run time 2.0 s" in html  # J18: the first attempt's, from its entry
    assert "queue wait 5.0 s · run time 2.0 s" in html
    assert 'class="wait-run"' in html
    assert "RuntimeError: card declined" in html
    assert 'id="failed-step"' in html
    assert "<strong>charge</strong> (read from the error's traceback)" in html
    assert "4242-secret" in html  # the admin may see payloads and results
    for index in (0, 1):
        child = f"{run_id}/fan/{index}"
        assert f'href="/runs/{child}"' in html
    twin = (await client.get(f"/runs/{run_id}", headers={**ADMIN, **JSON})).json()
    data = twin["data"]
    assert data["run"]["worker"] == "worker-b"
    assert [t["attempt"] for t in data["timeline"]] == [1, 2]
    assert [(t["worker"], t["run_s"]) for t in data["timeline"]] == [
        ("worker-a", 2.0),
        ("worker-b", 2.0),
    ]
    assert data["timeline"][1]["last"]["wait_s"] == 5.0
    assert data["timeline"][1]["last"]["run_s"] == 2.0
    assert data["failed_step"] == {"seq": 2, "name": "charge"}
    assert data["children_total"] == 2
    assert {c["state"] for c in data["children"]} == {"waiting"}


async def test_d6_rerun_from_a_step_asks_first_then_posts_with_csrf_and_is_audited(
    client: httpx.AsyncClient, backend: Any, clock: FrozenClock, audit: Any
) -> None:
    """D6, S1, issue 36: "Re-run from here" is a link to the run page with ``?rerun=STEP``,
    which shows what the re-run drops and the confirming form; nothing changed yet. Posting it
    (with the session's CSRF token) drops the step and those after it, makes the run due, and
    writes ``jobs.rerun_from_step`` to the audit log. A step the run does not have is said on
    the page, and a read-only user gets no form."""
    run_id = await _dead_flow(backend, clock)
    page = (await client.get(f"/runs/{run_id}", headers=ADMIN)).text
    assert f'href="/runs/{run_id}?rerun=fan"' in page
    assert 'action="/runs/' + run_id + '/rerun"' not in page  # no POST before confirmation
    confirm = await client.get(f"/runs/{run_id}?rerun=fan", headers=ADMIN)
    assert confirm.status_code == 200
    assert 'id="rerun-confirm"' in confirm.text
    assert "every step after it (1 in all: fan)" in confirm.text
    record = await backend.admin.get_run(run_id)
    assert record.state == "dead"
    missing = await client.get(f"/runs/{run_id}?rerun=nope", headers=ADMIN)
    assert "has no stored step named &#39;nope&#39;" in missing.text
    viewer = await client.get(f"/runs/{run_id}?rerun=fan", headers=VIEWER)
    assert 'method="post"' not in viewer.text
    assert "needs ship.jobs:manage" in viewer.text
    done = await client.post(
        f"/runs/{run_id}/rerun",
        data={"csrf_token": csrf_of(confirm.text), "next": f"/runs/{run_id}", "step": "fan"},
        headers=ADMIN,
    )
    assert done.status_code == 303, done.text
    record = await backend.admin.get_run(run_id)
    assert record.state == "waiting"
    steps = await backend.workflows.list_steps(run_id)
    assert [s.name for s in steps] == ["reserve"]
    entries = await audit.list_entries(limit=10)
    [entry] = [e for e in entries if e.operation == "jobs.rerun_from_step"]
    assert (entry.actor, entry.target, entry.details) == ("admin", run_id, {"step": "fan"})


async def test_the_run_page_of_an_unknown_id_is_a_404_and_the_json_twin_says_so(
    client: httpx.AsyncClient,
) -> None:
    """Issue 36: an id no run has answers 404 (HTML and JSON), saying how to find the run."""
    page = await client.get("/runs/no-such-run", headers=ADMIN)
    assert page.status_code == 404
    twin = await client.get("/runs/no-such-run", headers={**ADMIN, **JSON})
    assert twin.status_code == 404
    assert "Fix:" in twin.json()["error"]


def test_the_run_pages_durations_read_for_people() -> None:
    """The timeline's duration text: ms under a second, then s, min and s, h, d."""
    assert [span(v) for v in (None, 0.25, 5, 125, 7200, 400_000)] == [
        "—",
        "250 ms",
        "5.0 s",
        "2 min 5 s",
        "2.0 h",
        "4.6 d",
    ]
