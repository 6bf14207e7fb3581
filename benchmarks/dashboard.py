"""dashboard: every dashboard page's server time at scale (issue 36, S2).

Seeds one database once (``INSERT ... SELECT generate_series``, indexes grown by the inserts as
a live table's are), runs ``VACUUM (ANALYZE)``, then requests each page in process through
httpx's ASGI transport (the time includes routing, the reads and the HTML: the server's
share of a request, no network) and reports each page's p50 and p95 over the requests.

The seeded mix (``N`` runs: 1,000,000; 20,000 with ``--quick``, the CI smoke size;
``SHIP_SQLA_BENCH_DASHBOARD_RUNS`` sets another, e.g. 10,000,000, which first checks the free
disk): ten jobs ``job0..job9`` with runs in every state, 79 % completed (finished over the
last ``N * 7 ms``), 10 % waiting (priorities -1, 0 and 1, all due), 10 % running (leases
lapsing over the next ``N * 7 ms``), 1 % dead, tenants ``t0..t6``; plus one failing job,
``job.failing``, whose 100 runs are all dead (nothing waiting or running: the overview must
show it), and 20 schedules. No baseline: the figure is the page's own p95 against the issue's
bound (100 ms at 1M runs, 250 ms at 10M).

Run: ``python -m benchmarks dashboard`` (opt-in; ``--quick`` for the smoke size).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING

import httpx
from sqlalchemy import text

from benchmarks._harness import Bench, BenchmarkError, Figure, Target, percentile
from ship_sqla._dashboard import create_dashboard
from ship_sqla._jobs import create_job_backend

if TYPE_CHECKING:
    from benchmarks._harness import BenchDatabase

__all__ = ["NAME", "run"]

NAME = "dashboard"
QUICK_RUNS = 20_000
FULL_RUNS = 1_000_000
RUNS_ENV = "SHIP_SQLA_BENCH_DASHBOARD_RUNS"
BYTES_PER_RUN = 1_500
"""Free disk asked per seeded run before a large seed (the table, its indexes and the WAL of
the load, measured at 1M runs with room to spare)."""

SEED = """
INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, run_at, created_at,
                           updated_at, finished_at, tenant_id, priority, lease_expires_at,
                           lease_token, claimed_by, last_error)
SELECT 'r' || lpad(g::text, 10, '0'), 'job' || ((g / 10) % 10),
       CASE WHEN g % 100 = 0 THEN 'dead' WHEN g % 10 = 1 THEN 'waiting'
            WHEN g % 10 = 2 THEN 'running' ELSE 'completed' END,
       '{{}}'::jsonb, 5, now() - ((g / 1000) * interval '7 seconds'),
       now() - (g * interval '7 milliseconds'), now(),
       CASE WHEN g % 10 IN (1, 2) THEN NULL ELSE now() - (g * interval '7 milliseconds') END,
       't' || (g % 7), CASE WHEN g % 10 = 1 THEN (g / 100) % 3 - 1 ELSE 0 END,
       CASE WHEN g % 10 = 2 THEN now() + (g * interval '7 milliseconds') END,
       CASE WHEN g % 10 = 2 THEN g END, CASE WHEN g % 10 = 2 THEN 'w' END,
       CASE WHEN g % 100 = 0 THEN 'ValueError: declined' END
FROM generate_series({first}, {last}) g
"""
FAILING = """
INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, attempt, run_at,
                           created_at, updated_at, finished_at, tenant_id, last_error)
SELECT 'f' || lpad(g::text, 10, '0'), 'job.failing', 'dead', '{}'::jsonb, 3, 3,
       now() - g * interval '1 minute', now() - g * interval '1 minute', now(),
       now() - g * interval '1 minute', 't' || (g % 7), 'RuntimeError: upstream down'
FROM generate_series(1, 100) g
"""
SCHEDULES = """
INSERT INTO ship_job_state (job_id, next_at, trigger)
SELECT 'sched' || g, now(), 'cron:* * * * *' FROM generate_series(1, 20) g
"""
CHUNK = 1_000_000


def _size(bench: Bench) -> int:
    configured = os.environ.get(RUNS_ENV)
    if configured:
        return int(configured)
    return QUICK_RUNS if bench.quick else FULL_RUNS


def _check_disk(n: int) -> None:
    free = shutil.disk_usage("/").free
    wanted = n * BYTES_PER_RUN
    if n > FULL_RUNS and free < wanted:
        raise BenchmarkError(
            f"seeding {n:,} runs needs about {wanted / 1e9:.0f} GB free on the server's disk;"
            f" {free / 1e9:.0f} GB are. Fix: free disk or set a smaller {RUNS_ENV}."
        )


async def _seed(bench: Bench, db: BenchDatabase, n: int) -> None:
    began = time.perf_counter()
    await db.create_job_tables()
    for first in range(1, n + 1, CHUNK):
        last = min(n, first + CHUNK - 1)
        async with db.engine.begin() as connection:
            await connection.execute(text(SEED.format(first=first, last=last)))
        bench.log(f"seeded {last:,} of {n:,} runs")
    async with db.engine.begin() as connection:
        await connection.execute(text(FAILING))
        await connection.execute(text(SCHEDULES))
    await db.maintain("VACUUM (ANALYZE)")
    bench.log(f"seed and VACUUM (ANALYZE): {time.perf_counter() - began:.1f} s")


def _pages(n: int) -> list[tuple[str, str]]:
    """(figure name, path) for every page and filter timed."""
    span = n * 7 // 1000  # seconds the completed runs' creation times span
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - span * 0.6))
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - span * 0.4))
    return [
        ("overview", "/"),
        ("runs.waiting", "/runs"),
        ("runs.running", "/runs?state=running"),
        ("runs.completed", "/runs?state=completed"),
        ("runs.dead", "/runs?state=dead"),
        ("runs.waiting.job", "/runs?state=waiting&job=job3"),
        ("runs.waiting.job_tenant", "/runs?state=waiting&job=job3&tenant=t3"),
        ("runs.running.job", "/runs?state=running&job=job3"),
        ("runs.completed.job_tenant", "/runs?state=completed&job=job3&tenant=t3"),
        (
            "runs.completed.job_range",
            f"/runs?state=completed&job=job3&since={since}&until={until}",
        ),
        ("run", "/runs/r0000000003"),
        ("dead", "/dead"),
        ("dead.job_tenant", "/dead?job=job0&tenant=t2"),
        ("dead.failing_job", "/dead?job=job.failing"),
        ("schedules", "/schedules"),
        ("workers", "/workers"),
    ]


async def _time_page(client: httpx.AsyncClient, path: str, requests: int) -> list[float]:
    for _ in range(2):  # warm: the plan cache, the buffers
        response = await client.get(path)
        if response.status_code != 200:
            raise BenchmarkError(f"GET {path} answered {response.status_code}")
    times = []
    for _ in range(requests):
        began = time.perf_counter()
        await client.get(path)
        times.append((time.perf_counter() - began) * 1e3)
    return times


async def run(bench: Bench) -> list[Figure]:
    n = _size(bench)
    _check_disk(n)
    requests = 5 if bench.quick else 40
    bound = 100.0 if n <= FULL_RUNS else 250.0
    figures: list[Figure] = []
    async with bench.database(NAME) as db:
        await _seed(bench, db, n)
        backend = create_job_backend(database=db.engine, listen=False, announce=False)
        app = create_dashboard(backend, authorizer=lambda _r, _p, _o: True, audit=None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            overview = (await client.get("/")).text
            if "job.failing" not in overview:
                bench.log("the overview does not list job.failing (all dead, nothing waiting)")
            for name, path in _pages(n):
                sample = await _time_page(client, path, requests)
                p50, p95 = percentile(sample, 0.5), percentile(sample, 0.95)
                bench.log(f"{name:28} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  {path}")
                figures.append(
                    Figure(
                        name=f"dashboard.{name}.p95",
                        value=p95,
                        unit="ms",
                        baseline=None,
                        baseline_label="",
                        ratio=None,
                        targets=(Target("value", "<=", bound),),
                        rounds=tuple(sample),
                        note=f"p50 {p50:.1f} ms over {requests} requests; {n:,} runs; GET {path}",
                    )
                )
    return figures
