"""dashboard: every dashboard page's and filter's server time at scale (issue 36, S2).

Seeds one database once (``INSERT ... SELECT generate_series``, indexes grown by the inserts as
a live table's are), runs ``VACUUM (ANALYZE)``, then requests each page in process through
httpx's ASGI transport (the time includes routing, the reads and the HTML: the server's
share of a request, no network) and reports each page's p50 and p95 over the requests. The
overview's stream (``/live/overview``) is timed to its first overview message, on a fresh
connection each time.

Every GET route of the app is measured: the pages are listed in :func:`_pages` and matched
against ``create_dashboard(...).routes`` as Starlette routes them; a GET route no measured
path reaches fails the run, ``--quick`` too (the CI bench smoke), so a new page cannot go
unmeasured. Only ``/static`` is left out (assets, no reads: the browser test measures their
transfer).

The seeded mix (``N`` runs: 1,000,000; 20,000 with ``--quick``, the CI smoke size;
``SHIP_SQLA_BENCH_DASHBOARD_RUNS`` sets another, e.g. 10,000,000, which first checks the free
disk), J16's default shape (ended runs in the history table):

- the runs table (live, 20 %): ten jobs ``job0..job9``, 10 % of N waiting (priorities -1, 0
  and 1, all due), 10 % running (leases lapsing over the next ``N * 7 ms``, held by workers
  ``w0..w3``); payloads ``{"order": {"id": g % 1000}}``;
- the history table (ended, 80 %): 79 % of N completed (created and finished over the last
  ``N * 7 ms``, no payload, as J18 keeps them), 1 % dead (all of job0's, ``ValueError:
  declined``, payload kept); plus ``job.failing``, 100 dead runs (``RuntimeError: upstream
  down``) and nothing waiting or running (the overview must show it);
- tenants ``t0..t6`` on every run; 20 schedules (``sched1..sched20``); an empty audit log;
- the stats table: one row per job and minute for 7 days (11 jobs x 10,080 minutes), what
  the workers' flushes and the sampler write.

No baseline: the figure is the page's own p95 against the issue's bound (100 ms at 1M runs,
250 ms at 10M). ``SHIP_SQLA_BENCH_DASHBOARD_ONLY=name,name`` times only the pages whose
figure names start with one of those (a re-run of the slow ones; no route check then).
``SHIP_SQLA_BENCH_DASHBOARD_KEEP=1`` seeds into a kept database, ``ship_sqla_bench_dashboard_
<N>`` (not dropped afterwards), and a later run of the same size re-times on it without
seeding (minutes at 10M); drop it with ``DROP DATABASE`` when done. The seeded times are
relative to the seed's ``now()``: the leases lapse over ``N * 7 ms`` from then (19 hours at
10M), so re-time within that. ``SHIP_SQLA_BENCH_DASHBOARD_TENANT_INDEXES=1`` adds the runs
table's tenant indexes after the seed (``partitioned_claims``: ``<runs>_tenant_idx`` and
``<runs>_running_idx``, built by ``CREATE INDEX CONCURRENTLY``), which a bulk preview by job and
tenant reads; a kept database of that shape is ``ship_sqla_bench_dashboard_<N>_tenant``.

Run: ``python -m benchmarks dashboard`` (opt-in; ``--quick`` for the smoke size).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import MetaData, text
from starlette.routing import Match, Mount, Route

from benchmarks._harness import Bench, BenchmarkError, Figure, Target, percentile
from ship_sqla._audit import create_audit_log, ship_audit_table
from ship_sqla._dashboard import create_dashboard
from ship_sqla._jobs import create_job_backend, ship_job_runs_table
from ship_sqla._jobs._stats import create_job_stats, ship_job_stats_table
from ship_sqla._jobs._tables import partitioned_claims_ddl

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from starlette.applications import Starlette

    from benchmarks._harness import BenchDatabase

__all__ = ["NAME", "run"]

NAME = "dashboard"
QUICK_RUNS = 20_000
FULL_RUNS = 1_000_000
RUNS_ENV = "SHIP_SQLA_BENCH_DASHBOARD_RUNS"
ONLY_ENV = "SHIP_SQLA_BENCH_DASHBOARD_ONLY"
KEEP_ENV = "SHIP_SQLA_BENCH_DASHBOARD_KEEP"
TENANT_ENV = "SHIP_SQLA_BENCH_DASHBOARD_TENANT_INDEXES"
SEEDED = "ship_bench_seeded"
"""The kept database's marker table: one row, written after a finished seed."""
BYTES_PER_RUN = 1_500
"""Free disk asked per seeded run before a large seed (the table, its indexes and the WAL of
the load, measured at 1M runs with room to spare)."""
UNMEASURED = {"/static": "assets, no reads: the browser test measures their transfer"}
"""GET routes (or mounts) left out of the timing, with the reason."""
BUDGET = 10.0
"""Seconds a page's timing takes at most, past its first MIN_REQUESTS (a page of seconds
would hold the run for minutes: its figure is far past the bound whatever the count)."""
MIN_REQUESTS = 5
OK = (200, 303, 307)
"""The answers a timed request may give (/goto and /refresh redirect)."""

LIVE = """
INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, run_at, created_at,
                           updated_at, tenant_id, priority, lease_expires_at, lease_token,
                           claimed_by)
SELECT 'r' || lpad(g::text, 10, '0'), 'job' || ((g / 10) % 10),
       CASE WHEN g % 10 = 1 THEN 'waiting' ELSE 'running' END,
       jsonb_build_object('order', jsonb_build_object('id', g % 1000)), 5,
       now() - ((g / 1000) * interval '7 seconds'), now() - (g * interval '7 milliseconds'),
       now(), 't' || (g % 7), CASE WHEN g % 10 = 1 THEN (g / 100) % 3 - 1 ELSE 0 END,
       CASE WHEN g % 10 = 2 THEN now() + (g * interval '7 milliseconds') END,
       CASE WHEN g % 10 = 2 THEN g END, CASE WHEN g % 10 = 2 THEN 'w' || (g % 4) END
FROM generate_series({first}, {last}) g WHERE g % 10 IN (1, 2) AND g % 100 <> 0
"""
ENDED = """
INSERT INTO ship_job_history (seq, id, job_id, state, payload, attempt, max_attempts, run_at,
                              created_at, started_at, finished_at, tenant_id, claimed_by,
                              last_error)
SELECT g, 'r' || lpad(g::text, 10, '0'), 'job' || ((g / 10) % 10),
       CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'completed' END,
       CASE WHEN g % 100 = 0 THEN jsonb_build_object('order', jsonb_build_object('id', g % 1000))
       END, CASE WHEN g % 100 = 0 THEN 5 ELSE 1 END, 5,
       now() - (g * interval '7 milliseconds'), now() - (g * interval '7 milliseconds'),
       now() - (g * interval '7 milliseconds'), now() - (g * interval '7 milliseconds'),
       't' || (g % 7), 'w' || (g % 4),
       CASE WHEN g % 100 = 0 THEN 'ValueError: declined' END
FROM generate_series({first}, {last}) g WHERE g % 10 NOT IN (1, 2) OR g % 100 = 0
"""
FAILING = """
INSERT INTO ship_job_history (seq, id, job_id, state, payload, attempt, max_attempts, run_at,
                              created_at, finished_at, tenant_id, claimed_by, last_error)
SELECT 2000000000 + g, 'f' || lpad(g::text, 10, '0'), 'job.failing', 'dead', '{}'::jsonb, 3, 3,
       now() - g * interval '1 minute', now() - g * interval '1 minute',
       now() - g * interval '1 minute', 't' || (g % 7), 'w0', 'RuntimeError: upstream down'
FROM generate_series(1, 100) g
"""
SCHEDULES = """
INSERT INTO ship_job_state (job_id, next_at, trigger)
SELECT 'sched' || g, now(), 'cron:* * * * *' FROM generate_series(1, 20) g
"""
STATS = """
INSERT INTO ship_job_stats (job_id, minute, completed, retried, dead, cancelled, run_hist,
                            wait_hist, waiting, oldest_due_age)
SELECT j, date_trunc('minute', now()) - m * interval '1 minute', 60 + m % 7, m % 3, m % 2, 0,
       '{1,4,9,16,9,4,1}', '{2,8,12,8,2}', 1000 + m % 100, (m % 60)::float8
FROM unnest(ARRAY['job0','job1','job2','job3','job4','job5','job6','job7','job8','job9',
                  'job.failing']) j, generate_series(0, 7 * 1440 - 1) m
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
    metadata = MetaData()
    ship_job_stats_table(metadata)
    ship_audit_table(metadata)
    async with db.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    for first in range(1, n + 1, CHUNK):
        last = min(n, first + CHUNK - 1)
        async with db.engine.begin() as connection:
            await connection.execute(text(LIVE.format(first=first, last=last)))
            await connection.execute(text(ENDED.format(first=first, last=last)))
        bench.log(f"seeded {last:,} of {n:,} runs")
    async with db.engine.begin() as connection:
        for statement in (FAILING, SCHEDULES, STATS):
            await connection.execute(text(statement))
        await connection.execute(text(f"CREATE TABLE {SEEDED} (runs bigint NOT NULL)"))
        await connection.execute(text(f"INSERT INTO {SEEDED} VALUES ({n})"))
    if os.environ.get(TENANT_ENV):
        await db.maintain(*partitioned_claims_ddl(ship_job_runs_table(MetaData())))
    await db.maintain("VACUUM (ANALYZE)")
    bench.log(f"seed and VACUUM (ANALYZE): {time.perf_counter() - began:.1f} s")


def _iso(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - seconds_ago))


def _pages(n: int) -> list[tuple[str, str]]:
    """(figure name, path) for every page and filter timed."""
    span = n * 7 // 1000  # seconds the completed runs' creation times span
    since, until = _iso(span * 0.6), _iso(span * 0.4)
    ahead = _iso(-span * 0.5)  # half way through the running runs' leases
    return [
        ("overview", "/"),
        ("overview.stream", "/live/overview?format=html"),
        ("overview.stream_json", "/live/overview"),
        ("health", "/health"),
        ("goto", "/goto?run=r0000000003"),
        ("refresh", "/refresh?every=30&next=/"),
        *_runs_pages(since, until),
        ("run.live", "/runs/r0000000011"),
        ("run.completed", "/runs/r0000000003"),
        ("run.dead", "/runs/r0000000100"),
        ("dead", "/dead"),
        ("dead.job_tenant", "/dead?job=job0&tenant=t2"),
        ("dead.failing_job", "/dead?job=job.failing"),
        ("schedules", "/schedules"),
        ("schedule", "/schedules/sched3"),
        ("job", "/jobs/job3"),
        *((f"job.range_{r}", f"/jobs/job3?range={r}") for r in ("1h", "6h", "24h", "7d")),
        ("job.failing", "/jobs/job.failing"),
        ("errors", "/errors"),
        ("errors.job", "/errors?job=job0"),
        *_search_pages(since, until, ahead),
        ("bulk.retry.job", "/bulk/retry?job=job0&state=dead"),
        ("bulk.retry.failing", "/bulk/retry?job=job.failing"),
        ("bulk.retry.error", "/bulk/retry?error=upstream"),
        ("bulk.cancel.job_tenant", "/bulk/cancel?job=job3&tenant=t3"),
        ("bulk.discard.dead", "/bulk/discard?state=dead"),
        ("bulk.task", "/bulk/tasks/unknown"),
        ("workers", "/workers"),
        ("consumers", "/consumers"),
        ("outbox", "/outbox"),
        ("webhooks", "/webhooks"),
        ("upkeep", "/upkeep"),
        ("audit", "/audit"),
    ]


def _runs_pages(since: str, until: str) -> list[tuple[str, str]]:
    return [
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
            f"/runs?state=completed&job=job3&since={since[:19]}&until={until[:19]}",
        ),
    ]


def _search_pages(since: str, until: str, ahead: str) -> list[tuple[str, str]]:
    def q(**fields: str) -> str:
        return "/search?" + str(httpx.QueryParams(fields))

    return [
        ("search", "/search"),
        ("search.id", q(id="r0000000003")),
        ("search.job", q(job="job3")),
        ("search.tenant", q(tenant="t3")),
        ("search.state", q(state="completed")),
        ("search.job_state_tenant", q(job="job3", state="completed", tenant="t3")),
        ("search.range.completed", q(state="completed", to=until, **{"from": since})),
        ("search.range.running", q(state="running", to=ahead)),
        ("search.worker", q(state="running", worker="w1")),
        ("search.error", q(error="upstream")),
        ("search.error.none", q(error="no such text")),
        ("search.payload", q(payload="order.id=7")),
        ("search.payload.job", q(job="job3", payload="order.id=31")),
    ]


def _covered(app: Starlette, paths: list[str]) -> list[str]:
    """The GET routes of ``app`` that no path of ``paths`` reaches (Starlette's own routing:
    the first route that fully matches a GET of the path takes it)."""
    reached: set[int] = set()
    for path in paths:
        scope: dict[str, Any] = {"type": "http", "method": "GET", "path": path.split("?")[0]}
        for index, route in enumerate(app.routes):
            if route.matches(scope)[0] == Match.FULL:
                reached.add(index)
                break
    missing = []
    for index, route in enumerate(app.routes):
        gets = isinstance(route, Mount) or (
            isinstance(route, Route) and "GET" in (route.methods or ())
        )
        path = getattr(route, "path", repr(route))
        if gets and index not in reached and path not in UNMEASURED:
            missing.append(path)
    return missing


async def _sample(measure: Callable[[], Awaitable[float]], requests: int, warm: int) -> list[float]:
    """``requests`` timings of ``measure`` (ms) after ``warm`` untimed ones (the plan cache,
    the buffers); past the first MIN_REQUESTS, no more than BUDGET seconds of them."""
    for _ in range(warm):
        await measure()
    times: list[float] = []
    least = min(requests, MIN_REQUESTS)
    budget = time.perf_counter() + BUDGET
    while len(times) < requests and (len(times) < least or time.perf_counter() < budget):
        times.append(await measure())
    return times


def _page(client: httpx.AsyncClient, path: str) -> Callable[[], Awaitable[float]]:
    async def measure() -> float:
        began = time.perf_counter()
        response = await client.get(path)
        elapsed = (time.perf_counter() - began) * 1e3
        if response.status_code not in OK and not path.startswith("/bulk/tasks/"):
            raise BenchmarkError(f"GET {path} answered {response.status_code}")
        return elapsed

    return measure


async def _first_event(app: Starlette, path: str) -> float:
    """Milliseconds from a fresh GET of the stream ``path`` to its first overview message
    (httpx's ASGI transport reads a whole body: an endless stream is driven by hand)."""
    route, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": route, "raw_path": route.encode(), "root_path": "",
        "query_string": query.encode(), "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1), "server": ("bench", 80),
    }  # fmt: skip
    seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            seen.set_exception(BenchmarkError(f"GET {path} answered {message['status']}"))
        elif b"event: overview" in message.get("body", b"") and not seen.done():
            seen.set_result(time.perf_counter())

    began = time.perf_counter()
    task = asyncio.create_task(app(scope, receive, send))  # type: ignore[arg-type]
    try:
        at = await asyncio.wait_for(seen, 30)
    finally:
        gone.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return (at - began) * 1e3


def _only() -> tuple[str, ...]:
    return tuple(name for name in os.environ.get(ONLY_ENV, "").split(",") if name)


async def _seeded(db: BenchDatabase) -> int | None:
    """The runs a kept database was seeded with (None: not seeded, or the seed was cut off)."""
    async with db.engine.connect() as connection:
        exists = await connection.scalar(text(f"SELECT to_regclass('{SEEDED}') IS NOT NULL"))
        if not exists:
            return None
        return int(await connection.scalar(text(f"SELECT runs FROM {SEEDED}")))


@asynccontextmanager
async def _database(bench: Bench, n: int) -> AsyncIterator[BenchDatabase]:
    """A freshly seeded database, or with KEEP_ENV the kept one (seeded when it is not yet)."""
    if not os.environ.get(KEEP_ENV):
        async with bench.database(NAME) as db:
            await _seed(bench, db, n)
            yield db
        return
    label = f"{NAME}_{n}" + ("_tenant" if os.environ.get(TENANT_ENV) else "")
    async with bench.kept_database(label) as db:
        seeded = await _seeded(db)
    if seeded == n:
        bench.log(f"re-timing on the kept database {db.name} ({n:,} runs, not re-seeded)")
    else:
        await bench.drop_database(db.name)
    async with bench.kept_database(label) as db:
        if seeded != n:
            await _seed(bench, db, n)
        yield db


async def run(bench: Bench) -> list[Figure]:
    n = _size(bench)
    _check_disk(n)
    requests = 3 if bench.quick else 40
    bound = 100.0 if n <= FULL_RUNS else 250.0
    only = _only()
    pages = [(name, path) for name, path in _pages(n) if not only or name.startswith(only)]
    figures: list[Figure] = []
    async with _database(bench, n) as db:
        backend = create_job_backend(database=db.engine, listen=False, announce=False)
        app = create_dashboard(
            backend,
            authorizer=lambda _r, _p, _o: True,
            audit=create_audit_log(database=db.engine),
            stats=create_job_stats(db.engine),
        )
        missing = [] if only else _covered(app, [path for _, path in pages])
        if missing:
            raise BenchmarkError(
                f"GET routes no page of benchmarks/dashboard.py measures: {', '.join(missing)}."
                " Fix: add each to _pages (or to UNMEASURED, with the reason)."
            )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            overview = (await client.get("/")).text
            if "job.failing" not in overview:
                bench.log("the overview does not list job.failing (all dead, nothing waiting)")
            for name, path in pages:
                measure = (
                    functools.partial(_first_event, app, path)
                    if path.startswith("/live/")
                    else _page(client, path)
                )
                sample = await _sample(measure, requests, warm=1 if bench.quick else 2)
                figures.append(_figure(bench, name, path, sample, n=n, bound=bound))
    return figures


def _figure(
    bench: Bench, name: str, path: str, sample: list[float], *, n: int, bound: float
) -> Figure:
    p50, p95 = percentile(sample, 0.5), percentile(sample, 0.95)
    bench.log(f"{name:28} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  {path}")
    return Figure(
        name=f"dashboard.{name}.p95",
        value=p95,
        unit="ms",
        baseline=None,
        baseline_label="",
        ratio=None,
        targets=(Target("value", "<=", bound),),
        rounds=tuple(sample),
        note=f"p50 {p50:.1f} ms over {len(sample)} requests; {n:,} runs; GET {path}",
    )
