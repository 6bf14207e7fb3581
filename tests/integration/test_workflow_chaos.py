"""Workflows under chaos (SPEC §13, D1-D5): real worker processes, ``kill -9`` at random points.

RUNS runs of a workflow (a plain step, a transactional step, a durable sleep, a wait for an
event keyed by the run, a fan-out of CHILDREN child runs and the fan-in, a second
transactional step, a second plain step) are executed by WORKERS worker processes on the
PostgreSQL backend with a short lease. While this test publishes each run's event (once its
wait is stored), it kills a random worker with SIGKILL every KILL_EVERY seconds and starts a
replacement, KILLS times. Every effect lands in an app table with no unique constraint, so a
duplicate shows:

- ``chaos_tx``: one row per transactional step, written through ``create_unit_of_work`` in the
  step's transaction (exactly once, D2), the children's included;
- ``chaos_plain``: one row per execution of a plain step, written OUTSIDE any transaction (at
  least once, D1): the re-executions are counted and reported, not bounded.

Size: ``SHIP_SQLA_CHAOS_RUNS`` (default 100; ``nox -s chaos`` runs 1,000); the kills scale with
it. The figures are printed (``pytest -s``) as one ``chaos:`` line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
)
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel._ports import EnqueueRequest

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
steps = ship_job_steps_table(metadata)
events = ship_job_events_table(metadata)
ship_job_workers_table(metadata)

RUNS = int(os.environ.get("SHIP_SQLA_CHAOS_RUNS", "100"))
WORKERS = 3
CHILDREN = 3
LEASE = float(os.environ.get("SHIP_SQLA_CHAOS_LEASE", "2"))
KILLS = max(4, RUNS // 50)
KILL_EVERY = (0.4, 1.2)
"""Seconds between kills, drawn uniformly: random points of the runs' progress."""
DEADLINE = 60.0 + RUNS * 0.25
EVENT = "chaos.go"
FLOW = "chaos.flow"
CHILD = "chaos.child"

WORKER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla import (
        create_job_backend, create_unit_of_work, ship_job_events_table, ship_job_runs_table,
        ship_job_state_table, ship_job_steps_table,
    )
    from ship_sqla import define_job, start_job_runtime
    from ship_sqla.jobs import Concurrency, RetryPolicy

    PLAIN = text("INSERT INTO chaos_plain (run_id, step, worker) VALUES (:run_id, :step, :w)")
    TX = text("INSERT INTO chaos_tx (run_id, step, worker) VALUES (:run_id, :step, :w)")

    async def main(url, lease, children, event):
        engine = create_async_engine(url, pool_size=8)
        worker = str(os.getpid())
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)

        def plain(ctx, name):
            async def run():
                # Outside any transaction: every execution leaves its row (at least once, D1).
                async with engine.begin() as c:
                    await c.execute(PLAIN, {"run_id": ctx.run_id, "step": name, "w": worker})
                return name
            return run

        def tx(ctx, name):
            async def write(scope):
                row = {"run_id": ctx.run_id, "step": name, "w": worker}
                await scope.connection.execute(TX, row)
                return name
            return write

        async def child(ctx, payload):
            await ctx.transaction("mark", uow, tx(ctx, "child"))

        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            steps_table=ship_job_steps_table(md),
            events_table=ship_job_events_table(md),
        )
        retry = RetryPolicy(attempts=50, base_delay=0.05)
        policy = dict(concurrency=Concurrency(lease=lease), retry=retry)
        child_job = define_job("chaos.child", child, payload=dict, **policy)

        async def flow(ctx, payload):
            await ctx.step("plain-a", plain(ctx, "plain-a"))
            await ctx.transaction("tx-1", uow, tx(ctx, "tx-1"))
            await ctx.sleep("nap", 0.1)
            got = await ctx.wait_for_event("go", event, key=ctx.run_id)
            assert got is not None and got.payload == {"run": ctx.run_id}, got
            await ctx.spawn("kids", child_job, [{"i": i} for i in range(children)])
            outcomes = await ctx.wait_for_children("join")
            assert [o.state for o in outcomes] == ["completed"] * children, outcomes
            await ctx.transaction("tx-2", uow, tx(ctx, "tx-2"))
            await ctx.step("plain-b", plain(ctx, "plain-b"))

        flow_job = define_job("chaos.flow", flow, payload=dict, **policy)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(
            [flow_job, child_job],
            backend=backend,
            worker_id=worker,
            poll_interval=0.2,
            max_in_flight=40,
        )
        print("ready", flush=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    """
)


async def nothing(ctx: object, payload: object) -> None:
    return None


async def query(engine: AsyncEngine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        return [tuple(row) for row in await connection.execute(text(sql), params)]


class Fleet:
    """The worker processes: started, killed with SIGKILL, replaced, stopped."""

    def __init__(self, script: Path, url: str, logs: Path) -> None:
        self.command = [sys.executable, str(script), url, str(LEASE), str(CHILDREN), EVENT]
        self.logs = logs
        self.live: list[subprocess.Popen[str]] = []
        self.dead: list[subprocess.Popen[str]] = []

    def start(self) -> subprocess.Popen[str]:
        log = self.logs / f"worker-{len(self.live) + len(self.dead)}.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.live.append(process)
        return process

    async def ready(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        line = await anyio.to_thread.run_sync(process.stdout.readline)
        assert line.strip() == "ready", f"worker {process.pid} did not start: {line!r}"

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.choice(self.live)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        self.live.remove(victim)
        self.dead.append(victim)

    def reported(self, needle: str) -> int:
        """How many lines of the workers' logs name ``needle`` (what their runtimes reported)."""
        return sum(
            line.count(needle)
            for log in self.logs.glob("worker-*.log")
            for line in log.read_text().splitlines()
            if line.startswith("job runtime absorbed")
        )

    def stop(self) -> None:
        for process in self.live:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.live:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for process in self.live + self.dead:
            if process.stdout is not None:
                process.stdout.close()


async def publish_when_waiting(engine: AsyncEngine, backend: Any, published: set[str]) -> None:
    """Publish each run's event once its wait is stored (the wait's snapshot then predates the
    publish, D4): one publish per run, whatever the kills did meanwhile."""
    rows = await query(
        engine,
        "SELECT run_id FROM ship_job_steps WHERE name = 'go' AND state = 'waiting'",
    )
    for (run_id,) in rows:
        if run_id not in published:
            await backend.publish_event(EVENT, {"run": run_id}, key=run_id)
            published.add(run_id)


@pytest.mark.timeout(int(DEADLINE) + 120)
@pytest.mark.slow
async def test_workflows_survive_kill_9_of_their_workers(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D1, D2, D3, D4, D5 under kill -9: every run completes (none lost or dead); each
    transactional step's row exists exactly once per run (the children's too), however often
    the runs were retaken; every child completed, once per parent; each plain step ran at
    least once (its re-executions are counted and reported)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for table in ("chaos_plain", "chaos_tx"):
            await connection.execute(
                text(
                    f"CREATE TABLE {table} (run_id text NOT NULL, step text NOT NULL,"
                    " worker text NOT NULL)"
                )
            )
    backend = create_job_backend(
        database=ship_engine,
        table=runs,
        state_table=state,
        steps_table=steps,
        events_table=events,
        listen=False,
    )
    policy: dict[str, Any] = {
        "concurrency": Concurrency(lease=LEASE),
        "retry": RetryPolicy(attempts=50),
    }
    flow_job = define_job(FLOW, nothing, payload=dict, **policy)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    fleet = Fleet(script, ship_engine_url, tmp_path)
    rng = random.Random(int(os.environ.get("SHIP_SQLA_CHAOS_SEED", "14")))
    published: set[str] = set()
    began = time.monotonic()
    try:
        for process in [fleet.start() for _ in range(WORKERS)]:
            await fleet.ready(process)
        enqueued = await backend.enqueue_many(flow_job, [EnqueueRequest({}) for _ in range(RUNS)])
        assert all(r.accepted for r in enqueued)
        flow_ids = {r.run_id for r in enqueued}

        kills = 0
        next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        deadline = time.monotonic() + DEADLINE
        done = 0
        # Real processes: the test waits for database facts by polling, with a deadline.
        while time.monotonic() < deadline:
            await publish_when_waiting(ship_engine, backend, published)
            if kills < KILLS and time.monotonic() >= next_kill:
                fleet.kill_one(rng)
                kills += 1
                await fleet.ready(fleet.start())
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
            [(done,)] = await query(
                ship_engine,
                "SELECT count(*) FROM ship_job_runs WHERE job_id = :job AND state = 'completed'",
                job=FLOW,
            )
            if done == RUNS and kills == KILLS:
                break
            await anyio.sleep(0.05)
        wall = time.monotonic() - began
    finally:
        fleet.stop()

    by_state = dict(
        await query(
            ship_engine, "SELECT job_id || ':' || state, count(*) FROM ship_job_runs GROUP BY 1"
        )
    )
    assert by_state == {f"{FLOW}:completed": RUNS, f"{CHILD}:completed": RUNS * CHILDREN}, (
        f"after {wall:.1f} s, {kills} kills: {by_state}"
    )

    # D2: exactly one row per transactional step per run, however often it was replayed.
    duplicated = await query(
        ship_engine,
        "SELECT run_id, step, count(*) FROM chaos_tx GROUP BY 1, 2 HAVING count(*) <> 1",
    )
    assert duplicated == []
    per_step = dict(await query(ship_engine, "SELECT step, count(*) FROM chaos_tx GROUP BY 1"))
    assert per_step == {"tx-1": RUNS, "tx-2": RUNS, "child": RUNS * CHILDREN}

    # D5: each parent has its CHILDREN children, each completed once (one attempt's commit).
    children = await query(
        ship_engine,
        "SELECT parent_id, count(*), count(*) FILTER (WHERE state = 'completed')"
        " FROM ship_job_runs WHERE job_id = :job GROUP BY 1",
        job=CHILD,
    )
    assert len(children) == RUNS
    assert all(p in flow_ids and n == c == CHILDREN for p, n, c in children)

    # D1: every plain step ran at least once; the re-executions are what kill -9 costs.
    plain = dict(
        await query(
            ship_engine,
            "SELECT step, count(*) - count(DISTINCT run_id) FROM chaos_plain GROUP BY 1",
        )
    )
    executed = await query(
        ship_engine, "SELECT step, count(DISTINCT run_id) FROM chaos_plain GROUP BY 1"
    )
    assert dict(executed) == {"plain-a": RUNS, "plain-b": RUNS}
    [(retaken,)] = await query(
        ship_engine,
        "SELECT count(*) FROM ship_job_runs WHERE attempt > 1",
    )
    errors = dict(
        await query(
            ship_engine,
            "SELECT left(coalesce(last_error, '(none)'), 60), count(*) FROM ship_job_runs"
            " WHERE attempt > 1 GROUP BY 1",
        )
    )
    figures = {
        "runs": RUNS,
        "children": RUNS * CHILDREN,
        "workers": WORKERS,
        "kills": kills,
        "wall_s": round(wall, 1),
        "plain_reexecutions": plain,
        "runs_with_attempt_over_1": retaken,
        "their_last_errors": errors,
        "events_published": len(published),
        "stale_reports": fleet.reported("SHIP_SQLA_JOB_LEASE_STALE"),
        "errors_reported": fleet.reported("SHIP_SQLA_"),
    }
    print(f"\nchaos: {json.dumps(figures)}")  # noqa: T201 - the figures BENCHMARKS.md reports
