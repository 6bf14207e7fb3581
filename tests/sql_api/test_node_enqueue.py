"""A real second language (SPEC §18, E1-E3, K7, K8): node-postgres (``pg`` from the npm
registry, pinned by tests/sql_api/node/package-lock.json) enqueues through
``<runs>_enqueue_v1``. Node from the system; a missing node fails under CI (``CI`` set) and is
skipped elsewhere."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from test_sql_enqueue import CAPPED, PLAIN, SMALL, defs, metadata

from ship_sqla._jobs._sql_api import sync_job_definitions
from ship_sqla.kernel._plans.announce import RECHECKS, bound

NODE_DIR = Path(__file__).parent / "node"
CHANNEL = "ship_sqla.jobs:ship_job_runs"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is missing: the SQL enqueue's second-language test must run in CI")
        pytest.skip("node is not installed")
    if not (NODE_DIR / "node_modules" / "pg").exists():
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed to install pg from package-lock.json"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True)
    return node


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await sync_job_definitions(connection, defs, [PLAIN, SMALL, CAPPED])
    return ship_engine


async def test_node_enqueues_900_runs_of_1000_calls_with_its_trace_parent(
    engine: AsyncEngine,
) -> None:
    """E1, E2, E3, J1, K7, K8: 1,000 enqueues from Node with 10 % repeated dedupe keys store
    exactly 900 runs, each with Node's trace context (the parent of the run's span); every
    committed run is announced, or covered by the listener's recheck after the last
    announcement, within K8's bound at p99; notifications stay within the announce budget."""
    node = _node()
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    listener = await asyncpg.connect(dsn)
    heard: list[float] = []
    await listener.add_listener(CHANNEL, lambda *_: heard.append(time.time() * 1000))
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [node, str(NODE_DIR / "enqueue.js")],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "SHIP_DSN": dsn},
            timeout=120,
        )
        await listener.execute("SELECT 1")  # every notification sent so far is delivered
    finally:
        await listener.close()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcomes"] == {"inserted": 900, "deduplicated": 100, "queue-full": 0}
    assert report["bulk"] == ["deduplicated"]
    async with engine.connect() as connection:
        found = await connection.execute(
            text(
                "SELECT count(*), count(DISTINCT trace_context ->> 'traceparent'),"
                " min(trace_context ->> 'traceparent') FROM ship_job_runs"
            )
        )
        assert tuple(found.one()) == (900, 1, report["traceparent"])
    waits = []
    for committed in report["committed"]:
        after = [at for at in heard if at >= committed - 1]
        woken = after[0] if after else heard[-1] + RECHECKS[0] * 1000
        waits.append(max(woken - committed, 0.0))
    waits.sort()
    limit_ms = bound(0.005) * 1000
    print(  # noqa: T201 - the figures the issue asks to see
        f"node: {len(heard)} notifications for 900 runs; pickup wait median"
        f" {waits[len(waits) // 2]:.1f} ms, p99 {waits[int(len(waits) * 0.99)]:.1f} ms,"
        f" max {waits[-1]:.1f} ms (K8 bound {limit_ms:.0f} ms)"
    )
    # p99, not the max: a shared CI machine stalls now and then (the max is printed above).
    assert waits[int(len(waits) * 0.99)] <= limit_ms
    span = (report["committed"][-1] - report["committed"][0]) / 1000
    assert len(heard) <= 500 * max(span, 1.0) + 1
