"""Job metrics on the PostgreSQL backend, read back through the OpenTelemetry SDK (J10)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
    start_job_runtime,
)
from ship_sqla.jobs import (
    JOB_METRIC_NAMES,
    EnqueueRequest,
    PostgresJobBackend,
    QueueDepth,
    RetryPolicy,
)
from ship_sqla.kernel._metrics import job_metrics_for

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


async def test_the_runtime_records_through_its_meter_provider(ship_engine: AsyncEngine) -> None:
    """J10: start_job_runtime(meter_provider=...) is where the runtime records ship.job.runs,
    ship.job.run.duration and ship.job.dead_letter.count, with the ship.job.id attribute."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    settled = 0
    all_settled = anyio.Event()

    async def handler(_ctx: Any, payload: dict[str, bool]) -> None:
        nonlocal settled
        settled += 1
        if settled == 3:
            all_settled.set()
        if payload["fail"]:
            message = "boom"
            raise RuntimeError(message)

    job = define_job("metered.pg", handler, payload=dict, retry=RetryPolicy(attempts=1))
    async with await start_job_runtime([job], backend=backend, meter_provider=provider) as runtime:
        await runtime.enqueue_many(job, [EnqueueRequest({"fail": f}) for f in (False, False, True)])
        with anyio.fail_after(30):
            await all_settled.wait()
    found = {
        metric.name: metric
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert set(found) <= set(JOB_METRIC_NAMES)
    outcomes = {
        p.attributes["ship.job.outcome"]: p.value for p in found["ship.job.runs"].data.data_points
    }
    assert outcomes == {"completed": 2, "dead": 1}
    assert all(
        p.attributes["ship.job.id"] == "metered.pg" for p in found["ship.job.runs"].data.data_points
    )
    [dead] = found["ship.job.dead_letter.count"].data.data_points
    assert dead.value == 1
    assert sum(p.count for p in found["ship.job.run.duration"].data.data_points) == 3


class _SampledBackend(PostgresJobBackend):
    """Signals each finished queue sample, so the test waits on an event, not on time."""

    sampled: anyio.Event

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        depths = await super().queue_depths(job_ids)
        self.sampled.set()
        return depths


async def test_queue_gauges_report_the_database_queue(ship_engine: AsyncEngine) -> None:
    """J10: a worker runtime on the PostgreSQL backend samples ship.job.queue.depth (waiting
    runs, delayed ones included) and ship.job.queue.oldest_waiting_age per registered job, read
    back as values through the SDK's in-memory reader; queue_depths ages the oldest due run."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    backend.__class__ = _SampledBackend
    assert isinstance(backend, _SampledBackend)
    backend.sampled = anyio.Event()
    job = define_job("gauged.pg", _noop, payload=dict)
    idle = define_job("gauged.idle", _noop, payload=dict)
    later = datetime.now(UTC) + timedelta(hours=1)
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}, run_at=later) for n in range(4)])

    job_metrics_for(provider)  # the runtime's instruments, made before the collection below
    reader.get_metrics_data()  # a reader collects: from now on a sample is worth its query
    async with await start_job_runtime(
        [job, idle], backend=backend, meter_provider=provider, queue_sample_interval=0.2
    ):
        with anyio.fail_after(30):
            await backend.sampled.wait()
        found = {
            metric.name: {p.attributes["ship.job.id"]: p.value for p in metric.data.data_points}
            for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
    assert found["ship.job.queue.depth"] == {"gauged.pg": 4, "gauged.idle": 0}
    assert found["ship.job.queue.oldest_waiting_age"] == {"gauged.pg": 0.0, "gauged.idle": 0.0}

    async with ship_engine.begin() as connection:
        await connection.execute(
            text(f"UPDATE {runs.name} SET run_at = now() - interval '1 minute'")
        )
    depths = await backend.queue_depths([job.id])
    assert depths[job.id].depth == 4
    assert 60.0 <= depths[job.id].oldest_due_age < 600.0


async def _noop(_ctx: Any, _payload: dict[str, Any]) -> None:
    return None
