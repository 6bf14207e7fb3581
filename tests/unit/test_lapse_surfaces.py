"""J15's counters where operators read them: ``ship-sqla jobs show``'s text and the dashboard's
run page show a run's ``lapses`` and ``consecutive_lapses`` (its JSON has both as fields).
In memory: no database."""

from __future__ import annotations

import httpx
from dashboard_support import actor, authorizer
from job_helpers import claim_request, record_of
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_dashboard, define_job
from ship_sqla._cli._output import format_run, record_dict
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.testing import FrozenClock

LEASE = 30.0


async def _noop(ctx, payload):
    return None


JOB = define_job(
    "lapses.surface",
    _noop,
    payload=dict,
    concurrency=Concurrency(lease=LEASE),
    retry=RetryPolicy(attempts=5),
)


async def _twice_lapsed() -> tuple[InMemoryJobBackend, str]:
    """A run retaken after two lapses in a row (lapses 2, in a row 2), and its backend."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)
    result = await backend.enqueue(JOB, {"n": 1})
    assert result.run_id is not None
    await backend.claim(claim_request(JOB, worker="A"))
    for worker in ("B", "C"):
        clock.advance(LEASE)
        await backend.claim(claim_request(JOB, worker=worker))
    return backend, result.run_id


async def test_j15_jobs_show_prints_the_lapse_counters():
    """J15: ``jobs show`` prints ``lapses: 2 (2 in a row)``; ``--json`` has both fields."""
    backend, run_id = await _twice_lapsed()
    record = await record_of(backend, run_id)

    text = format_run(record)

    assert "lapses:           2 (2 in a row)" in text.splitlines()
    fields = record_dict(record)
    assert (fields["lapses"], fields["consecutive_lapses"]) == (2, 2)


async def test_j15_the_dashboards_run_page_shows_the_lapse_counters():
    """J15: the dashboard's page of a run has a Lapses row: in all, and in a row."""
    backend, run_id = await _twice_lapsed()
    app = Starlette(
        routes=[
            Mount(
                "/ops",
                app=create_dashboard(backend, authorizer=authorizer, actor=actor, audit=None),
            )
        ]
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://app"
    ) as client:
        page = await client.get(f"/ops/runs/{run_id}", headers={"x-user": "viewer"})

    assert page.status_code == 200
    assert "<td>Lapses</td><td>2 (2 in a row)</td>" in page.text.replace("\n", "")
