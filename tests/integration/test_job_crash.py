"""Worker processes on one database, one killed with SIGKILL mid-run (J6, at-least-once).

Three worker processes run the kernel runtime on the PostgreSQL backend. One run, the victim,
blocks on its first attempt; the process executing it is killed with ``kill -9``. Every run must
still complete: the victim is retaken by a surviving worker once its lease lapses, as attempt 2.
Each handler records its start and its end in a side table (no unique constraint), so a run
executed to its end twice would show up there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine
from worker_fleet import stop_processes

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
from ship_sqla.kernel._ports import EnqueueRequest

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

RUNS = 120
WORKERS = 3
LEASE = 1.5

WORKER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import start_job_runtime
    from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job

    RECORD = text(
        "INSERT INTO crash_effects (run_id, attempt, worker, phase)"
        " VALUES (:run_id, :attempt, :worker, :phase)"
    )

    async def main(url, lease):
        engine = create_async_engine(url, pool_size=4)
        worker = str(os.getpid())

        async def record(ctx, phase):
            async with engine.begin() as c:
                row = {"run_id": ctx.run_id, "attempt": ctx.attempt, "phase": phase}
                await c.execute(RECORD, {**row, "worker": worker})

        async def work(ctx, payload):
            await record(ctx, "start")
            if payload.get("victim") and ctx.attempt == 1:
                await asyncio.sleep(3600)  # killed here
            await asyncio.sleep(0.02)
            await record(ctx, "end")

        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
        )
        job = define_job(
            "crash.work",
            work,
            payload=dict,
            concurrency=Concurrency(max=100, lease=lease),
            retry=RetryPolicy(attempts=3, base_delay=0.1),
        )
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(
            [job], backend=backend, worker_id=worker, poll_interval=0.2, max_in_flight=8
        )
        print("ready", flush=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
    """
)


async def noop(ctx: object, payload: object) -> None:
    return None


async def query(engine: AsyncEngine, sql: str) -> list[tuple[object, ...]]:
    async with engine.connect() as connection:
        return [tuple(row) for row in await connection.execute(text(sql))]


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_killed_worker_run_is_retaken_and_every_run_completes(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J6: kill -9 a worker mid-run: every run still completes; the killed run is retaken by a
    surviving worker after its lease lapses (attempt 2); no run is executed to its end twice
    except, at most, runs the killed process had in flight (at-least-once)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                "CREATE TABLE crash_effects (run_id text NOT NULL, attempt int NOT NULL,"
                " worker text NOT NULL, phase text NOT NULL)"
            )
        )
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    job = define_job(
        "crash.work",
        noop,
        payload=dict,
        concurrency=Concurrency(max=100, lease=LEASE),
        retry=RetryPolicy(attempts=3),
    )
    [victim] = await backend.enqueue_many(job, [EnqueueRequest({"victim": True})])
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    workers = [
        subprocess.Popen(  # noqa: ASYNC220 - real processes are the point of this test
            [sys.executable, str(script), ship_engine_url, str(LEASE)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        # Real processes: wait for database facts by polling, each with a deadline.
        deadline = time.monotonic() + 30
        holder: list[tuple[object, ...]] = []
        while not holder and time.monotonic() < deadline:
            await anyio.sleep(0.05)
            holder = await query(
                ship_engine,
                f"SELECT worker FROM crash_effects WHERE run_id = '{victim.run_id}'"
                " AND phase = 'start'",
            )
        assert holder, "no worker started the victim run"
        killed_pid = int(str(holder[0][0]))
        await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(RUNS)])
        await anyio.sleep(0.1)  # let the doomed worker take some of the new runs too
        os.kill(killed_pid, signal.SIGKILL)

        deadline = time.monotonic() + 90
        open_runs = [(None,)]
        while open_runs and time.monotonic() < deadline:
            await anyio.sleep(0.1)
            open_runs = await query(
                ship_engine, "SELECT id FROM ship_job_runs WHERE state <> 'completed'"
            )
        assert not open_runs, f"runs never completed: {open_runs}"
    finally:
        stop_processes(workers)

    [(attempt,)] = await query(
        ship_engine, f"SELECT attempt FROM ship_job_runs WHERE id = '{victim.run_id}'"
    )
    assert attempt == 2  # retaken after the lease, one attempt spent by the dead process
    ends = await query(
        ship_engine,
        "SELECT run_id, worker, attempt FROM crash_effects WHERE phase = 'end' ORDER BY run_id",
    )
    by_run: dict[object, list[tuple[object, object]]] = {}
    for run_id, worker_pid, run_attempt in ends:
        by_run.setdefault(run_id, []).append((worker_pid, run_attempt))
    assert len(by_run) == RUNS + 1  # every run's handler reached its end
    victim_ends = by_run[victim.run_id]
    assert [a for _, a in victim_ends] == [2]
    assert victim_ends[0][0] != str(killed_pid)
    for run_id, executions in by_run.items():
        survivors = [w for w, _ in executions if w != str(killed_pid)]
        assert len(survivors) <= 1, f"run {run_id} executed to its end twice: {executions}"
