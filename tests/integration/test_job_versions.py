"""D9 on real PostgreSQL: the version gauges through the fleet's sampler (F5, with the worker
registry of F6 reporting the versions each worker serves), and the deploy gate
``ship-sqla workflows versions --registry APP:REGISTRY``. The rules on every backend are
tests/conformance/test_job_versions_conformance.py."""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cli_runner import ship_sqla
from job_helpers import settle_loop
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import MetaData

from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.kernel._metrics import WORKFLOW_RUNS, WORKFLOW_RUNS_STRANDED, job_metrics_for
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
runs = ship_job_runs_table(metadata)
ship_job_history_table(metadata)  # J16: the default shape create_job_backend() reads
state = ship_job_state_table(metadata)
workers = ship_job_workers_table(metadata)

JOB = "orders.fulfil"


async def _never(ctx: Any, payload: Any) -> None:
    raise AssertionError("the delayed runs of this test never run")


V1 = define_job(JOB, _never, payload=dict, version=1)
V2_ONLY = define_job(JOB, _never, payload=dict, version=2)

APP = textwrap.dedent(
    f"""
    from ship_sqla import define_job

    async def handler(ctx, payload):
        pass

    keeps = [define_job({JOB!r}, handler, payload=dict, version=2, previous={{1: handler}})]
    drops = [define_job({JOB!r}, handler, payload=dict, version=2)]
    renamed = [define_job("orders.other", handler, payload=dict, version=1)]
    """
)


@pytest.fixture
async def tables(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


async def _enqueue_delayed(backend: Any, clock: FrozenClock) -> None:
    """Two v1 runs and one v2 run of JOB, due in a day (so nothing executes them)."""
    later = clock.now() + timedelta(days=1)
    await backend.enqueue_many(V1, [EnqueueRequest({}, run_at=later) for _ in range(2)])
    await backend.enqueue(V2_ONLY, {}, run_at=later)


def _points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[Any, ...], Any]]:
    found: dict[str, dict[tuple[Any, ...], Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = {
                    tuple(sorted(p.attributes.items())): p.value for p in metric.data.data_points
                }
    return found


@pytest.mark.timeout(60)
async def test_d9_gauges_count_live_runs_per_version_and_the_stranded_ones(
    tables: AsyncEngine,
) -> None:
    """D9, F5, F6: a v2-only worker registers the versions it serves; as the fleet's sampler it
    reports ship.workflow.runs per (job, version, state) and ship.workflow.runs.stranded for
    the v1 runs nobody serves; once a worker serving v1 too joins the fleet, stranded goes
    to nothing."""
    clock = FrozenClock()
    backend = create_job_backend(
        database=tables, state_table=state, workers_table=workers, clock=clock, listen=False
    )
    await _enqueue_delayed(backend, clock)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    job_metrics_for(provider)
    reader.get_metrics_data()  # collected once: the runtime samples from now on
    attrs = (("ship.job.id", JOB), ("ship.job.version", 1))
    keeps_v1 = define_job(JOB, _never, payload=dict, version=2, previous={1: _never})
    async with await start_job_runtime(
        [V2_ONLY], backend=backend, worker_id="w-v2", meter_provider=provider,
        queue_sample_interval=5.0,
    ):  # fmt: skip
        with anyio.fail_after(30):
            while _points(reader).get(WORKFLOW_RUNS_STRANDED, {}).get(attrs) != 2:
                clock.advance(1.0)
                await settle_loop(5)
                await anyio.sleep(0.01)
        waiting = ("ship.job.state", "waiting")
        assert _points(reader)[WORKFLOW_RUNS] == {
            tuple(sorted((*attrs, waiting))): 2,
            tuple(sorted((("ship.job.id", JOB), ("ship.job.version", 2), waiting))): 1,
        }
        other = create_job_backend(
            database=tables, state_table=state, workers_table=workers, clock=clock, listen=False
        )
        async with await start_job_runtime([keeps_v1], backend=other, worker_id="w-both"):
            with anyio.fail_after(30):
                while _points(reader).get(WORKFLOW_RUNS_STRANDED, {}).get(attrs) is not None:
                    clock.advance(1.0)
                    await settle_loop(5)
                    await anyio.sleep(0.01)


async def test_d9_workflows_versions_fails_a_deploy_that_would_strand_live_runs(
    tables: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D9: `ship-sqla workflows versions --registry APP:REGISTRY` lists the live runs per job and
    version; it exits 0 for a registry that keeps v1 as previous=, and 1 for one that drops v1
    (or the job), naming the job, the version and the count."""
    clock = FrozenClock()
    backend = create_job_backend(database=tables, state_table=state, clock=clock, listen=False)
    await _enqueue_delayed(backend, clock)
    (tmp_path / "versions_app.py").write_text(APP)
    url = ("--database-url", ship_engine_url)

    code, out, err = await ship_sqla(
        "workflows", "versions", *url, "--registry", "versions_app:keeps", "--json", cwd=tmp_path
    )
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {
        "versions": [
            {"job_id": JOB, "version": 1, "waiting": 2, "running": 0, "served": True},
            {"job_id": JOB, "version": 2, "waiting": 1, "running": 0, "served": True},
        ],
        "stranded": [],
    }

    code, out, err = await ship_sqla(
        "workflows", "versions", *url, "--registry", "versions_app:drops", cwd=tmp_path
    )
    assert code == 1, (out, err)
    assert f"{JOB} v1: 2 waiting, 0 running (NOT SERVED)" in out
    assert f"job '{JOB}' has 2 live runs of version 1" in err
    assert "Fix:" in err

    code, out, err = await ship_sqla(
        "workflows", "versions", *url, "--registry", "versions_app:renamed", cwd=tmp_path
    )
    assert code == 1, (out, err)
    assert (
        f"job '{JOB}' has 2 live runs of version 1; job '{JOB}' has 1 live run of version 2" in err
    )
