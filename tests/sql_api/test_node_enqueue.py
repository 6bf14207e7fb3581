"""A real second language (SPEC §18, E1-E3, K7, K8): node-postgres (``pg`` from the npm
registry, pinned by tests/sql_api/node/package-lock.json) enqueues through
``<runs>_enqueue_v1`` while a real ship worker (``start_job_runtime``, its poll far away)
runs what it enqueues. Node from the system; a missing node fails in CI (``CI`` or
``SHIP_SQLA_REQUIRE_NODE`` set, as .ci/run does) and is skipped elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from global_tracer import global_tracer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from test_sql_enqueue import CAPPED, PLAIN, SMALL, defs, metadata, runs, state
from wake_helpers import parked

from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend
from ship_sqla._jobs._sql_api import sync_job_definitions
from ship_sqla.kernel._plans.announce import bound

NODE_DIR = Path(__file__).parent / "node"
CHANNEL = "ship_sqla.jobs:ship_job_runs"
RUNS = 900
POLL = 30.0
"""The worker's poll: far beyond the run, so every start was woken by an announcement or the
listener's recheck (K1, K8), never by polling."""


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI") or os.environ.get("SHIP_SQLA_REQUIRE_NODE"):
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


class Starts:
    """The worker's handler: when each run (by its payload's ``n``) started, in ms since the
    epoch (Node reports its commits on the same clock). A run stays running until ``release``:
    Node's repeated keys then meet live runs (J1 deduplicates against a run not yet
    terminal)."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.all = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, _ctx: object, payload: dict[str, Any]) -> None:
        self.at.setdefault(payload["n"], time.time() * 1000)
        if len(self.at) == RUNS:
            self.all.set()
        await self.release.wait()


async def _run_node(node: str, dsn: str) -> dict[str, Any]:
    done = await asyncio.to_thread(
        subprocess.run,
        [node, str(NODE_DIR / "enqueue.js")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SHIP_DSN": dsn},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


class Stalls:
    """How late this process's event loop ran a callback asked for every ``TICK`` seconds, in
    ms: a stall of the worker's own process (a collection of the test session's heap, the CPU
    taken by others) that K8's premise ("no statement takes longer than round_trip") does not
    cover. The longest is added to the bound, and every stall over 10 ms is printed."""

    TICK = 0.005

    def __init__(self) -> None:
        self.seen: list[float] = []
        self._handle: asyncio.TimerHandle | None = None

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        asked = loop.time() + self.TICK
        self._handle = loop.call_at(asked, self._tick, loop, asked)

    def _tick(self, loop: asyncio.AbstractEventLoop, asked: float) -> None:
        self.seen.append(max((loop.time() - asked) * 1000, 0.0))
        self._next(loop)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self._next(asyncio.get_running_loop())
        try:
            yield
        finally:
            if self._handle is not None:
                self._handle.cancel()

    @property
    def longest(self) -> float:
        return max(self.seen, default=0.0)

    def over(self, ms: float) -> list[int]:
        return [round(s) for s in self.seen if s > ms]


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """The test session's heap (thousands of tests' objects, which a worker process does not
    carry) out of the collector's reach while the pickup is measured: a full collection of it
    took the whole bound on CI (p99 811 and 837 ms on two fresh clones, never reproduced
    alone)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _at(waits: list[float], fraction: float) -> float:
    return waits[min(int(len(waits) * fraction), len(waits) - 1)]


async def test_node_enqueues_900_runs_a_ship_worker_picks_up_with_nodes_trace_parent(
    engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    """E1, E2, E3, J1, K1, K7, K8: 1,000 enqueues from Node with 10 % repeated dedupe keys
    store exactly 900 runs, each with Node's trace context; a real ship worker, parked with its
    poll 30 s away, starts every one of them (each runs until Node is done, so a repeated key
    meets a live run), within K8's bound (``bound(round_trip)``, Node's p99 call as the round
    trip) at p99 of Node's commit (the
    figures are printed for the CI log), and each run's span has Node's span as its parent
    (same trace); notifications stay within the announce budget."""
    node = _node()
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    starts = Starts()
    job = define_job("sql.plain", starts, payload=dict, priority=2, version=3)  # PLAIN's row
    backend = create_job_backend(database=engine, table=runs, state_table=state)
    listener = await asyncpg.connect(dsn)
    heard: list[float] = []
    await listener.add_listener(CHANNEL, lambda *_: heard.append(time.time() * 1000))
    stalls = Stalls()
    try:
        with global_tracer() as exporter, _frozen_heap():
            frozen = gc.get_freeze_count()
            runtime = await start_job_runtime(
                job, backend=backend, poll_interval=POLL, max_in_flight=RUNS
            )
            async with runtime:
                assert backend.listener is not None
                with anyio.fail_after(10):
                    await backend.listener.wait_live()
                await parked(backend)
                with stalls.watching():
                    report = await _run_node(node, dsn)
                    with anyio.fail_after(60):
                        await starts.all.wait()
                starts.release.set()
            spans = [s for s in exporter.get_finished_spans() if s.name == "process sql.plain"]
    finally:
        await listener.close()
    assert report["outcomes"] == {"inserted": RUNS, "deduplicated": 100, "queue-full": 0}
    assert report["bulk"] == ["deduplicated"]
    async with engine.connect() as connection:
        found = await connection.execute(
            text(
                "SELECT count(*), count(DISTINCT trace_context ->> 'traceparent'),"
                " min(trace_context ->> 'traceparent') FROM ship_job_runs"
            )
        )
        assert tuple(found.one()) == (RUNS, 1, report["traceparent"])
    _, trace_id, span_id, _ = report["traceparent"].split("-")
    assert len(spans) == RUNS
    assert {(s.parent.trace_id, s.parent.span_id) for s in spans if s.parent} == {
        (int(trace_id, 16), int(span_id, 16))
    }
    assert all(s.parent is not None for s in spans)
    waits = sorted(max(at - report["committed"][n], 0.0) for n, at in starts.at.items())
    # K8's bound holds "when no statement takes longer than round_trip": the round trip is
    # Node's own, measured (p99 of its calls, at least 5 ms), so a loaded machine is allowed
    # for as the rule says, not by a looser constant; and while the worker's process runs: its
    # event loop's longest stall, measured, is added.
    committed = report["committed"]
    calls = sorted(b - a for a, b in itertools.pairwise(committed))
    round_trip_ms = max(_at(calls, 0.99), 5.0)
    limit_ms = bound(round_trip_ms / 1000) * 1000 + stalls.longest
    span_s = (committed[-1] - committed[0]) / 1000
    slowest = sorted(((at - committed[n], n) for n, at in starts.at.items()), reverse=True)[:10]
    with capsys.disabled():
        print(  # noqa: T201 - the figures the issue asks to see in the CI log
            f"\nnode -> ship worker pickup (K8), {RUNS} runs of 1,000 calls in {span_s:.2f} s:"
            f" median {_at(waits, 0.5):.1f} ms, p90 {_at(waits, 0.9):.1f} ms,"
            f" p99 {_at(waits, 0.99):.1f} ms, max {waits[-1]:.1f} ms (bound {limit_ms:.0f} ms"
            f" for a call's p99 round trip of {round_trip_ms:.1f} ms);"
            f" {len(heard)} notifications; {frozen:,} objects frozen;"
            f" worker loop stalls over 10 ms: {stalls.over(10)}"
            f" (bound includes the longest, {stalls.longest:.0f} ms); slowest (ms, commit"
            f" offset ms): {[(round(w), round(committed[n] - committed[0])) for w, n in slowest]}"
        )
    # p99, not the max: a shared CI machine stalls now and then (the max is printed above).
    assert _at(waits, 0.99) <= limit_ms
    assert len(heard) <= 500 * max(span_s, 1.0) + 1
