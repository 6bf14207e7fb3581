"""J22 on PostgreSQL: the storage health read from the statistics and catalog views, the
held-snapshot warning of the fleet's sampler, its gauges, ``ship-sqla jobs health`` and the
dashboard's banner. The held snapshot is a REPEATABLE READ transaction on a second connection;
bounds are injected (a bound of a microsecond is crossed at once), never waited for."""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import MetaData, text

from ship_sqla import (
    advisory_lock_provider,
    create_dashboard,
    create_job_backend,
    create_job_operations,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla._cli import cli
from ship_sqla._dashboard import _app as dashboard_app
from ship_sqla.jobs import HealthBounds
from ship_sqla.kernel._health import HORIZON_HELD
from ship_sqla.kernel._metrics import JobMetrics
from ship_sqla.kernel._runtime.depth import DepthSampler
from ship_sqla.kernel._runtime.wiring import Plumbing
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
workers = ship_job_workers_table(metadata)

HOLDER = "j22-holder"
QUERY_TEXT = "query-text-never-logged-j22"
AT_ONCE = HealthBounds(horizon_alarm=1e-6)
"""A bound every held snapshot has crossed by the time it is read."""


def allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


def _backend(engine: AsyncEngine, bounds: HealthBounds | None = None) -> Any:
    return create_job_backend(
        database=engine,
        table=runs,
        state_table=state,
        workers_table=workers,
        listen=False,
        health_bounds=bounds,
    )


@asynccontextmanager
async def held_snapshot(engine: AsyncEngine) -> AsyncIterator[int]:
    """A REPEATABLE READ transaction on its own connection that read once and stays open (the
    shape of a forgotten report or psql session); its pid."""
    async with engine.connect() as plain:
        connection = await plain.execution_options(isolation_level="REPEATABLE READ")
        await connection.execute(text(f"SET application_name = '{HOLDER}'"))
        await connection.execute(text(f"SELECT '{QUERY_TEXT}', count(*) FROM pg_class"))
        pid = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        try:
            yield int(pid)
        finally:
            await connection.rollback()


async def test_j22_health_reads_the_tables_and_names_the_holder_of_a_held_snapshot(
    engine: AsyncEngine,
) -> None:
    """J22: the health lists the backend's tables (a missing one left out) with their sizes, no
    held snapshot while none is (the reader's own session excluded), then the holder of one:
    its pid, application_name and age, with every session in view (superuser)."""
    backend = _backend(engine)
    health = await backend.storage_health()
    assert health.known
    assert health.status == "healthy"
    assert {t.table for t in health.tables} == {"runs", "state", "workers"}  # no workflows
    assert all(t.size_bytes > 0 for t in health.tables)
    assert health.horizon is None
    assert health.horizon_scope == "all"
    async with held_snapshot(engine) as pid:
        held = await backend.storage_health()
    assert held.horizon is not None
    assert (held.horizon.pid, held.horizon.application_name) == (pid, HOLDER)
    assert held.horizon.kind == "session"
    assert 0 <= held.horizon.age < 600
    assert held.status == "healthy"  # 300 s by default
    assert (await backend.storage_health()).horizon is None


async def test_j22_a_held_advisory_lock_is_no_horizon_holder(engine: AsyncEngine) -> None:
    """J22 (J-A11): the advisory-lock provider's held transactions take no snapshot between
    statements (no backend_xmin), so a held single-runner lock is never named as a holder."""
    provider = advisory_lock_provider(engine)
    lock = await provider.acquire("j22.key", 30.0)
    assert lock is not None
    try:
        health = await _backend(engine, AT_ONCE).storage_health()
        assert health.horizon is None
        assert health.status == "healthy"
    finally:
        await lock.release()


async def test_j22_the_sampler_warns_of_a_held_snapshot_throttled_and_exports_gauges(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """J22: with each queue sample the fleet's sampler reads the health: the storage gauges
    (tuples and sizes per table, the horizon's age) and, past the bound, one WARNING
    SHIP_SQLA_DB_HORIZON_HELD naming the holder (pid, application_name, age; never its query),
    again only after warn_every on the sampler's clock."""
    backend = _backend(engine, AT_ONCE)
    reader = InMemoryMetricReader()
    metrics = JobMetrics(MeterProvider(metric_readers=[reader]))
    clock = FrozenClock()
    errors: list[BaseException] = []
    shared = Plumbing(clock, errors.append, lambda _n: 0.1)
    sampler = DepthSampler(backend, metrics, ["j22.job"], shared)
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        async with held_snapshot(engine) as pid:
            await sampler.sample()
            await sampler.sample()
            clock.advance(AT_ONCE.warn_every)
            await sampler.sample()
            data = reader.get_metrics_data()
    assert errors == []
    warnings = [r for r in caplog.records if HORIZON_HELD in r.getMessage()]
    assert len(warnings) == 2
    message = warnings[0].getMessage()
    assert f"pid {pid}" in message
    assert HOLDER in message
    assert QUERY_TEXT not in message
    assert all(QUERY_TEXT not in r.getMessage() for r in caplog.records)
    points = {
        metric.name: {
            tuple(sorted((p.attributes or {}).items())): p.value for p in metric.data.data_points
        }  # type: ignore[union-attr]
        for resource in data.resource_metrics  # type: ignore[union-attr]
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert points["ship.job.queue.depth"] == {(("ship.job.id", "j22.job"),): 0}
    assert set(points["ship.db.table.size"]) == {
        (("ship.db.table", role),) for role in ("runs", "state", "workers")
    }
    assert "ship.db.table.dead_tuples" in points
    [age] = points["ship.db.horizon.age"].values()
    assert age > 0
    sampler.close()


async def test_j22_operations_cli_and_dashboard_report_the_alarm(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J22: the health is data through the operator surface (JobOperations.storage_health),
    ``ship-sqla jobs health`` (JSON, exit 3 on an alarm, 0 when healthy) and the dashboard,
    whose every page shows the banner while the alarm holds and none otherwise (read at most
    every BANNER_HEALTH_TTL seconds, issue 36: the page after the alarm is past it)."""
    now = [0.0]
    monkeypatch.setattr(dashboard_app, "monotonic", lambda: now[0])
    backend = _backend(engine, AT_ONCE)
    ops = create_job_operations(backend, authorizer=allow)
    dashboard = create_dashboard(
        backend, authorizer=lambda _r, _p, _o: True, actor=lambda _r: "ops", audit=None
    )
    url = engine.url.render_as_string(hide_password=False)
    args = ["jobs", "health", "--database-url", url, "--json"]

    def run_cli(*extra: str) -> Any:
        return CliRunner().invoke(cli, [*args, *extra])

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=dashboard), base_url="http://app"
    ) as client:
        assert "health-banner" not in (await client.get("/")).text
        healthy = await anyio.to_thread.run_sync(run_cli)
        assert healthy.exit_code == 0, healthy.output
        assert json.loads(healthy.output)["status"] == "healthy"
        async with held_snapshot(engine) as pid:
            assert (await ops.storage_health()).status == "alarm"
            now[0] += dashboard_app.BANNER_HEALTH_TTL
            page = (await client.get("/")).text
            alarmed = await anyio.to_thread.run_sync(run_cli, "--horizon-alarm", "1ms")
    assert 'id="health-banner"' in page
    assert f"pid {pid}" in page
    assert alarmed.exit_code == 3, alarmed.output
    body = json.loads(alarmed.output)
    assert body["status"] == "alarm"
    assert body["horizon"]["pid"] == pid
    assert [a["kind"] for a in body["alarms"]] == ["horizon"]
