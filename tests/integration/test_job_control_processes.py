"""Pause (K3) and cancel (K2) across OS processes: two worker processes run the kernel runtime
on the PostgreSQL backend, one listening for notifications and one polling only (listen=False,
as behind PgBouncer); the operator acts from this test's process, through its own backend.

Each handler records what it did in a side table, so the test reads facts from the database
(real processes: it polls for them, each wait with a deadline)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine
from worker_fleet import stop_processes

from ship_sqla import create_job_operations, define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel._ports import EnqueueRequest

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

WORKS = 20
LISTENING_LEASE = 30.0
"""The listening worker's lease: its first heartbeat is 10 s after a claim, so a cancel it
observes sooner came by notification."""
POLLING_LEASE = 3.0
"""The polling worker's lease: it learns of a cancel at its next heartbeat, within 1 s."""

WORKER = textwrap.dedent(
    """
    import asyncio, signal, sys, time
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import define_job, start_job_runtime
    from ship_sqla.jobs import Concurrency

    RECORD = text(
        "INSERT INTO ctl_effects (run_id, worker, phase, detail)"
        " VALUES (:run_id, :worker, :phase, :detail)"
    )

    async def main(url, name, listen, lease):
        engine = create_async_engine(url, pool_size=4)

        async def record(ctx, phase, detail=""):
            async with engine.begin() as c:
                await c.execute(
                    RECORD,
                    {"run_id": ctx.run_id, "worker": name, "phase": phase, "detail": detail},
                )

        async def work(ctx, payload):
            await record(ctx, "end")

        async def block(ctx, payload):
            await record(ctx, "start")
            began = time.monotonic()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                elapsed = time.monotonic() - began
                await asyncio.shield(record(ctx, "cancelled", f"{ctx.cancel_reason}:{elapsed}"))
                raise

        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            listen=listen,
        )
        concurrency = Concurrency(max=10, lease=lease)
        jobs = [
            define_job("ctl.work", work, payload=dict, concurrency=concurrency),
            define_job(f"ctl.marker.{name}", work, payload=dict, concurrency=concurrency),
            define_job(f"ctl.block.{name}", block, payload=dict, concurrency=concurrency),
        ]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(jobs, backend=backend, worker_id=name, poll_interval=0.1)
        print("ready", flush=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "listen", float(sys.argv[4])))
    """
)


async def noop(ctx: object, payload: object) -> None:
    return None


def allow(permission: str, operation: str) -> bool:
    return True


async def query(engine: AsyncEngine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        return [tuple(row) for row in await connection.execute(text(sql), params)]


async def wait_for(engine: AsyncEngine, sql: str, what: str, limit: float = 30, **params: Any):
    """Poll until ``sql`` answers a row (real processes: database facts, with a deadline)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        rows = await query(engine, sql, **params)
        if rows:
            return rows
        await anyio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(180)
async def test_pause_and_cancel_hold_across_processes(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """K3 across processes: after a pause committed in this process, no claim that starts in
    either worker process takes the job's runs (each worker provably claimed again twice
    after they were enqueued, as markers of its own show), while enqueues still land; resume
    lets them all run. K2 across processes: a running run cancelled from this process is
    cancelled in the worker that runs it, by notification in the listening worker (sooner
    than its first heartbeat) and by its heartbeat's answer in the polling one; both end
    cancelled after one attempt, not retried; a waiting run cancelled never runs."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                "CREATE TABLE ctl_effects (run_id text NOT NULL, worker text NOT NULL,"
                " phase text NOT NULL, detail text NOT NULL)"
            )
        )
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)
    ops = create_job_operations(backend, authorizer=allow)
    work = define_job("ctl.work", noop, payload=dict)
    markers = {name: define_job(f"ctl.marker.{name}", noop, payload=dict) for name in "AB"}
    blocks = {name: define_job(f"ctl.block.{name}", noop, payload=dict) for name in "AB"}
    script = tmp_path / "control_worker.py"
    script.write_text(WORKER)
    configs = {"A": ("listen", LISTENING_LEASE), "B": ("poll", POLLING_LEASE)}
    workers = [
        subprocess.Popen(  # noqa: ASYNC220 - real processes are the point of this test
            [sys.executable, str(script), ship_engine_url, name, mode, str(lease)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, (mode, lease) in configs.items()
    ]

    async def marker_round() -> None:
        """One marker of each worker's own, run: each worker claimed after this call began."""
        ids = [(await backend.enqueue(markers[name], {})).run_id for name in "AB"]
        for run_id in ids:
            await wait_for(
                ship_engine,
                "SELECT 1 FROM ctl_effects WHERE run_id = :id AND phase = 'end'",
                f"marker {run_id}",
                id=run_id,
            )

    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"

        # --- K3: pause, enqueue, two more claim passes in each worker: nothing taken ---------
        assert await ops.pause(work.id)
        await marker_round()  # every claim from here on started after the pause committed
        enqueued = await backend.enqueue_many(
            work, [EnqueueRequest({"n": n}) for n in range(WORKS)]
        )
        assert all(result.accepted for result in enqueued)
        await marker_round()
        await marker_round()  # each worker's claim of ctl.work came after the enqueue
        taken = await query(
            ship_engine,
            "SELECT count(*) FROM ship_job_runs WHERE job_id = 'ctl.work'"
            " AND (state <> 'waiting' OR attempt <> 0)",
        )
        assert taken == [(0,)]
        assert (
            await query(
                ship_engine,
                "SELECT 1 FROM ctl_effects WHERE phase = 'end' AND run_id = ANY(:ids)",
                ids=[r.run_id for r in enqueued],
            )
            == []
        )
        assert await ops.resume(work.id)
        await wait_for(
            ship_engine,
            "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM ship_job_runs"
            " WHERE job_id = 'ctl.work' AND state <> 'completed')",
            "every paused run to complete after the resume",
        )

        # --- K2: cancel a running run in each worker, and a waiting one -------------------------
        running = {name: (await backend.enqueue(blocks[name], {})).run_id for name in "AB"}
        for name, run_id in running.items():
            await wait_for(
                ship_engine,
                "SELECT 1 FROM ctl_effects WHERE run_id = :id AND phase = 'start'",
                f"ctl.block.{name} to start",
                id=run_id,
            )
        later = await backend.enqueue(
            work, {"later": True}, run_at=datetime.now(UTC) + timedelta(hours=1)
        )
        assert later.run_id is not None
        assert (await ops.cancel(later.run_id)).outcome == "cancelled"
        for run_id in running.values():
            assert (await ops.cancel(run_id)).outcome == "requested"
        for name, run_id in running.items():
            await wait_for(
                ship_engine,
                "SELECT 1 FROM ship_job_runs WHERE id = :id AND state = 'cancelled'",
                f"ctl.block.{name} to end cancelled",
                id=run_id,
            )
    finally:
        stop_processes(workers)

    for name, run_id in running.items():
        [(worker_name, detail)] = await query(
            ship_engine,
            "SELECT worker, detail FROM ctl_effects WHERE run_id = :id AND phase = 'cancelled'",
            id=run_id,
        )
        reason, elapsed = detail.split(":")
        assert (worker_name, reason) == (name, "cancelled")
        if name == "A":
            assert float(elapsed) < LISTENING_LEASE / 3  # before any heartbeat: notified
        record = await backend.admin.get_run(run_id)
        assert record is not None
        assert (record.state, record.attempt) == ("cancelled", 1)
        assert [entry["kind"] for entry in record.history] == ["cancelled"]
    assert (await backend.admin.get_run(later.run_id)).state == "cancelled"
    assert (
        await query(ship_engine, "SELECT 1 FROM ctl_effects WHERE run_id = :id", id=later.run_id)
        == []
    )
