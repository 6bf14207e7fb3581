"""Issue 27, item 7: missing tables are refused at the start of every surface (the job runtime,
the dashboard, the Idempotency-Key middleware) by the one probe, with MissingTablesError naming
them and the ``ship-sqla schema apply`` command; a poll's failure log carries no statement."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ship_sqla import create_dashboard, define_job, start_job_runtime
from ship_sqla._idempotency import create_idempotency_store, ship_idempotency_table
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.asgi import IdempotencyKeyMiddleware
from ship_sqla.errors import MissingTablesError
from ship_sqla.jobs import Fairness


async def _noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("missing.job", _noop, payload=dict)
FAIR = define_job("missing.fair", _noop, payload=dict, fairness=Fairness())


async def test_friction_7_a_worker_on_missing_tables_refuses_to_start_naming_the_command(
    ship_engine: AsyncEngine,
) -> None:
    """Issue 27 item 7: start_job_runtime on a database without the job tables raises
    MissingTablesError at once (not a claim error at every poll), naming both tables and the
    exact `schema apply` command (with --fair-claims when a job is fair)."""
    backend = create_job_backend(database=ship_engine, listen=False)
    with pytest.raises(MissingTablesError) as refused:
        await start_job_runtime(JOB, backend=backend)
    error = refused.value
    assert error.code == "SHIP_SQLA_TABLES_MISSING"
    assert error.missing == ("ship_job_runs", "ship_job_state")
    assert "the job worker needs ship_job_runs, ship_job_state" in error.message
    assert error.fix is not None
    assert (
        "`ship-sqla schema apply --only jobs --runs-table ship_job_runs"
        " --state-table ship_job_state`" in error.fix
    )

    metadata = MetaData()
    runs = ship_job_runs_table(metadata, name="odd runs", schema="ops")
    state = ship_job_state_table(metadata, name="odd_state", schema="ops")
    other = create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)
    with pytest.raises(MissingTablesError) as fair_refused:
        await start_job_runtime([JOB, FAIR], backend=other)
    assert fair_refused.value.missing == ('ops."odd runs"', "ops.odd_state")
    assert fair_refused.value.fix is not None
    assert (
        "--only jobs --schema ops --runs-table odd runs --state-table odd_state --fair-claims"
        in fair_refused.value.fix
    )


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.arrived = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.levelno >= logging.ERROR:
            self.arrived.set()


async def test_friction_7_a_failing_poll_logs_no_statement_text(ship_engine: AsyncEngine) -> None:
    """Issue 27 item 7, J11: tables dropped under a running worker make its claims fail; the
    absorbed error is logged as one short line (type and driver message), never the claim's
    SQL text nor a traceback that would repeat it."""
    metadata = MetaData()
    runs, state = ship_job_runs_table(metadata), ship_job_state_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)
    records = _Records()
    logger = logging.getLogger("ship_sqla")
    logger.addHandler(records)
    try:
        runtime = await start_job_runtime(JOB, backend=backend, queue_sample_interval=None)
        async with ship_engine.begin() as connection:
            await connection.execute(text("DROP TABLE ship_job_runs, ship_job_state"))
        backend.wake()
        with anyio.fail_after(10):
            await records.arrived.wait()
        await runtime.stop()
    finally:
        logger.removeHandler(records)
    errors = [r for r in records.records if r.levelno >= logging.ERROR]
    assert errors, records.records
    for record in errors:
        line = record.getMessage()
        assert "does not exist" in line
        assert "SELECT" not in line
        assert "[SQL:" not in line
        assert record.exc_info is None


def _allow(request: Any, permission: str, operation: str) -> bool:
    return True


async def test_friction_7_the_dashboard_on_missing_tables_answers_what_to_run(
    ship_engine: AsyncEngine,
) -> None:
    """Issue 27 item 7: the dashboard on a database without the job tables fails its startup
    with MissingTablesError when served alone, and answers a mounted request with a 503 naming
    the tables and the command, not a bare 500."""
    backend = create_job_backend(database=ship_engine, listen=False)
    app = create_dashboard(backend, authorizer=_allow, audit=None)
    with pytest.raises(MissingTablesError, match="the dashboard needs ship_job_runs"):
        async with app.router.lifespan_context(app):
            pass
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ops") as client:
        response = await client.get("/")
    assert response.status_code == 503
    assert "SHIP_SQLA_TABLES_MISSING" in response.text
    assert "ship-sqla schema apply --only jobs" in response.text
    assert response.headers["x-content-type-options"] == "nosniff"


async def _created(request: Request) -> Response:
    return PlainTextResponse("created", 201)


async def _startup(app: Any) -> list[dict[str, Any]]:
    """Drive the ASGI lifespan's startup; the messages the application sent."""
    sent: list[dict[str, Any]] = []
    started = anyio.Event()

    async def receive() -> dict[str, Any]:
        if not sent and not started.is_set():
            return {"type": "lifespan.startup"}
        await started.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"].startswith("lifespan.startup"):
            started.set()

    with anyio.fail_after(10):
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    return sent


async def test_friction_7_the_middleware_on_a_missing_table_names_the_command(
    ship_engine: AsyncEngine,
) -> None:
    """Issue 27 item 7: the Idempotency-Key middleware without its table fails the
    application's startup naming the table and the command; without a lifespan, the first
    protected request raises MissingTablesError, not the driver's ProgrammingError."""
    store = create_idempotency_store(database=ship_engine, table=ship_idempotency_table(MetaData()))
    app = Starlette(
        routes=[Route("/items", _created, methods=["POST"])],
        middleware=[Middleware(IdempotencyKeyMiddleware, store=store)],
    )
    sent = await _startup(app)
    assert sent[0]["type"] == "lifespan.startup.failed"
    assert "SHIP_SQLA_TABLES_MISSING" in sent[0]["message"]
    assert "the Idempotency-Key middleware needs ship_idempotency" in sent[0]["message"]
    assert "`ship-sqla schema apply --only idempotency" in sent[0]["message"]

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        with pytest.raises(MissingTablesError, match="ship_idempotency"):
            await client.post("/items", headers={"Idempotency-Key": "k1"}, content=b"{}")
