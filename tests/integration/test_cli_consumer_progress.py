"""C3 from the shell: ``ship-sqla jobs show`` prints a consumer run's recorded progress (lag,
last batch time, the run's batches and items), in text and ``--json``; PostgreSQL stores it in
the batch's transaction and keeps it once the run completed."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from job_helpers import claim_request
from sqlalchemy import MetaData

from ship_sqla import (
    create_job_backend,
    create_unit_of_work,
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.jobs import Concurrency, IdempotencyPolicy
from ship_sqla.kernel import completed
from ship_sqla.kernel._consumers import run_progress

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


async def _noop(ctx: Any, payload: Any) -> None:
    return None


FEED = define_job(
    "cli.feed",
    _noop,
    payload=dict,
    idempotency=IdempotencyPolicy(key=lambda p: p["key"]),
    concurrency=Concurrency(single_runner=True, key=lambda p: p["key"]),
)


async def _ship_sqla(*args: str, cwd: Path) -> tuple[int, str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args], cwd=cwd, env=environment, check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_c3_jobs_show_prints_a_consumer_runs_progress(
    tmp_path: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """C3: a run whose batch recorded its progress (lag 42 at 12:30:05, 3 batches, 250 items)
    then completed: ``jobs show`` prints it on one line, ``--json`` as the object; a run that
    recorded none prints ``-`` (JSON null)."""
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_history_table(metadata)  # J16: the default shape; `jobs show` reads both tables
    ship_job_state_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine)
    await backend.enqueue(FEED, {"key": "orders"})
    await backend.enqueue(FEED, {"key": "refunds"})
    runs = {r.key: r for r in await backend.claim(claim_request(FEED, worker="w", limit=2))}
    at = datetime(2030, 1, 2, 12, 30, 5, tzinfo=UTC)
    progress = run_progress(lag=42, at=at, batch_items=50, batches=3, items=250)

    async def batch(repositories: Any) -> None:
        assert await backend.record_progress(runs["orders"], progress)

    await create_unit_of_work(ship_engine, repositories=lambda scope: scope).run(batch)
    assert await backend.settle([completed(runs["orders"])]) == ["completed"]
    url = ("--database-url", ship_engine_url)

    code, out, err = await _ship_sqla("jobs", "show", runs["orders"].run_id, *url, cwd=tmp_path)
    assert (code, err) == (0, ""), err
    assert "state:            completed" in out
    assert (
        "progress:         lag 42, last batch 2030-01-02T12:30:05+00:00, 3 batches, 250 items"
        in out
    )
    code, out, _ = await _ship_sqla(
        "jobs", "show", runs["orders"].run_id, *url, "--json", cwd=tmp_path
    )
    assert code == 0
    assert json.loads(out)["progress"] == progress

    code, out, _ = await _ship_sqla("jobs", "show", runs["refunds"].run_id, *url, cwd=tmp_path)
    assert code == 0
    assert "progress:         -\n" in out
    code, out, _ = await _ship_sqla(
        "jobs", "show", runs["refunds"].run_id, *url, "--json", cwd=tmp_path
    )
    assert json.loads(out)["progress"] is None
