"""D10 through the operator surfaces (S1): a parked run on the dashboard's run page (its
divergence side by side, an Unpark button whose action is audited), and `ship-sqla workflows
parked | unpark` against PostgreSQL. The rules on every backend are
tests/conformance/test_workflow_parking_conformance.py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import httpx
from cli_runner import ship_sqla
from dashboard_support import actor, authorizer, csrf_of
from job_helpers import ErrorLog, record_of
from starlette.applications import Starlette
from starlette.routing import Mount
from workflow_helpers import workflow_backend

from ship_sqla import create_dashboard, define_job, start_job_runtime
from ship_sqla.errors import WorkflowDivergedError
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.operators import InMemoryAuditLog
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

JOB = "parking.orders"


def _handler(order: tuple[str, ...]) -> Any:
    async def run(ctx: Any, payload: Any) -> None:
        for name in order:

            async def body(name: str = name) -> str:
                return name.upper()

            await ctx.step(name, body)
        await ctx.sleep("nap", 60)

    return run


async def parked_run(backend: Any, clock: FrozenClock, errors: ErrorLog) -> str:
    """A run of (a, b, sleep) woken under a handler that reorders a and b: parked (``errors``:
    the backend's on_error)."""
    v1 = define_job(JOB, _handler(("a", "b")), payload=dict)
    run_id = (await backend.enqueue(v1, {})).run_id
    async with await start_job_runtime([v1], backend=backend, worker_id="w1"):
        with anyio.fail_after(20):
            while (await record_of(backend, run_id)).run_at <= clock.now():
                await anyio.lowlevel.checkpoint()  # a real database answers in real time
    clock.advance(61)
    v2 = define_job(JOB, _handler(("b", "a")), payload=dict)
    async with await start_job_runtime([v2], backend=backend, worker_id="w2"):
        await errors.wait_for(lambda e: isinstance(e, WorkflowDivergedError), limit=20)
    assert (await record_of(backend, run_id)).wait_for == "#diverged"
    return run_id


async def test_d10_s1_the_run_page_shows_the_divergence_and_unparks_audited() -> None:
    """D10, S1: a parked run's page shows what the history recorded beside what the code asked
    for (position 0: a, then b) with an Unpark button; the manager's unpark makes the run due
    (no longer parked) and is audited as jobs.unpark; a second unpark is refused."""
    clock = FrozenClock()
    errors = ErrorLog()
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    run_id = await parked_run(backend, clock, errors)
    audit = InMemoryAuditLog(clock)
    dashboard = create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit)
    app = Starlette(routes=[Mount("/ops", app=dashboard)])
    admin = {"x-user": "admin"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://app"
    ) as client:
        page = await client.get(f"/ops/runs/{run_id}", headers=admin)
        assert page.status_code == 200, page.text
        assert "Parked: diverged from its history" in page.text
        assert "Recorded (history)" in page.text
        assert "Asked for (code)" in page.text
        assert "a (step)" in page.text
        assert "b (step)" in page.text
        assert f"/ops/runs/{run_id}/unpark" in page.text
        done = await client.post(
            f"/ops/runs/{run_id}/unpark",
            data={"csrf_token": csrf_of(page.text), "next": f"/ops/runs/{run_id}"},
            headers=admin,
        )
        assert done.status_code == 303, done.text
        record = await record_of(backend, run_id)
        assert (record.state, record.wait_for) == ("waiting", None)
        [entry] = audit.entries
        assert (entry.actor, entry.operation, entry.target, entry.count) == (
            "admin",
            "jobs.unpark",
            run_id,
            1,
        )
        again = await client.get(f"/ops/runs/{run_id}", headers=admin)
        assert "Parked: diverged" not in again.text


async def test_d10_s1_workflows_parked_and_unpark_from_the_shell(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D10, S1: `ship-sqla workflows parked --json` lists the parked run with its divergence;
    `workflows unpark RUN_ID` makes it due (exit 0), audited; a second unpark is refused
    (exit 1) and the list is empty."""
    clock = FrozenClock()
    errors = ErrorLog()
    backend = await workflow_backend(ship_engine, listen=False, clock=clock, on_error=errors)
    run_id = await parked_run(backend, clock, errors)
    url = ("--database-url", ship_engine_url)

    code, out, err = await ship_sqla("workflows", "parked", *url, "--json", cwd=tmp_path)
    assert (code, err) == (0, ""), err
    [row] = json.loads(out)["parked"]
    assert (row["run_id"], row["job_id"]) == (run_id, JOB)
    assert "diverged from its history at position 0" in row["divergence"]

    code, out, err = await ship_sqla("workflows", "unpark", run_id, *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert "unparked, due now" in out
    assert (await record_of(backend, run_id)).wait_for is None
    code, out, err = await ship_sqla("workflows", "unpark", run_id, *url, cwd=tmp_path)
    assert code == 1, (out, err)
    code, out, err = await ship_sqla("workflows", "parked", *url, cwd=tmp_path)
    assert (code, out.strip()) == (0, "no parked runs.")
