"""A poison run kills every worker that runs it (J15, J6): real processes, real deaths.

The handler of one run calls ``os._exit(1)``: the process executing it dies at once, without
settling anything, exactly as an OOM kill or a crash in native code would. The test plays the
process supervisor (Kubernetes, systemd): it starts a worker, and starts a new one each time the
last one died. With ``RetryPolicy(attempts=25, max_lapses=3)`` the run must end dead at its third
consecutive lapse, with 22 attempts left, instead of killing workers 25 times; the worker that
buried it reports ``JobCrashLoopError`` and lives on.
"""

from __future__ import annotations

import json
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

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
from ship_sqla.kernel._ports import LEASE_LAPSED_CRASH_LOOP

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

LEASE = 1.0
ATTEMPTS = 25
MAX_LAPSES = 3

WORKER = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import start_job_runtime
    from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job

    def emit(**fields):
        sys.stdout.write(json.dumps(fields) + "\\n")
        sys.stdout.flush()

    def on_error(error):
        emit(error=type(error).__name__, code=getattr(error, "code", None))

    async def main(url, lease, attempts, max_lapses):
        engine = create_async_engine(url, pool_size=2)

        async def work(ctx, payload):
            if payload.get("poison"):
                emit(poisoned=ctx.attempt)
                os._exit(1)  # the process dies here, settling nothing

        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            on_error=on_error,
        )
        job = define_job(
            "crash.poison",
            work,
            payload=dict,
            concurrency=Concurrency(lease=lease),
            retry=RetryPolicy(attempts=attempts, max_lapses=max_lapses, base_delay=0.05),
        )
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(
            [job], backend=backend, poll_interval=0.1, max_in_flight=2
        )
        emit(ready=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    """
)


async def noop(ctx: object, payload: object) -> None:
    return None


async def run_state(engine: AsyncEngine, run_id: str) -> tuple[str, int, int, int, str | None]:
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT state, attempt, lapses, consecutive_lapses, last_error"
                    " FROM ship_job_runs WHERE id = :id"
                ),
                {"id": run_id},
            )
        ).one()
    return row[0], row[1], row[2], row[3], row[4]


@pytest.mark.timeout(60)
async def test_j15_poison_run_killing_its_workers_ends_dead_at_max_lapses(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J15, J6: a handler that calls ``os._exit(1)``, under ``RetryPolicy(attempts=25,
    max_lapses=3)``, kills a worker at attempts 1, 2 and 3 (each retake after a lapse spends an
    attempt, J6); the claim that meets its third consecutive lapse dead-letters it with
    SHIP_SQLA_JOB_CRASH_LOOP (lapses 3, in a row 3, 22 attempts left), that worker reports
    JobCrashLoopError and keeps running, and a healthy run enqueued beside it completes."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    job = define_job(
        "crash.poison",
        noop,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=ATTEMPTS, max_lapses=MAX_LAPSES),
    )
    poison = await backend.enqueue(job, {"poison": True})
    assert poison.run_id is not None
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, str(script), ship_engine_url, str(LEASE), str(ATTEMPTS)]
    argv.append(str(MAX_LAPSES))

    deaths: list[int] = []
    survivor: subprocess.Popen[str] | None = None
    # Real processes: wait for process and database facts by polling, under one deadline.
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline:
            worker = subprocess.Popen(  # noqa: ASYNC220 - real processes are the point here
                argv, stdout=subprocess.PIPE, text=True
            )
            while worker.poll() is None and time.monotonic() < deadline:
                if (await run_state(ship_engine, poison.run_id))[0] == "dead":
                    break
                await anyio.sleep(0.05)
            if worker.poll() is None:
                survivor = worker  # the run is dead (or the deadline passed) and it lives
                break
            deaths.append(worker.returncode)
            assert worker.stdout is not None
            worker.stdout.close()
            assert len(deaths) <= MAX_LAPSES, "the crash loop was not ended at max_lapses"
        assert survivor is not None, "the deadline passed"

        state_, attempt, lapses, in_a_row, last_error = await run_state(ship_engine, poison.run_id)
        assert deaths == [1] * MAX_LAPSES  # one worker killed per attempt, no more
        assert (state_, attempt, lapses, in_a_row) == ("dead", MAX_LAPSES, 3, 3)
        assert last_error is not None
        assert last_error.startswith(LEASE_LAPSED_CRASH_LOOP)

        healthy = await backend.enqueue(job, {"poison": False})
        assert healthy.run_id is not None
        while (await run_state(ship_engine, healthy.run_id))[0] != "completed":
            assert time.monotonic() < deadline, "the surviving worker did not run a healthy run"
            await anyio.sleep(0.05)
        assert survivor.poll() is None
    finally:
        if survivor is not None:
            survivor.send_signal(signal.SIGTERM)
            try:
                survivor.wait(timeout=20)
            except subprocess.TimeoutExpired:
                survivor.kill()
                survivor.wait(timeout=10)
    assert survivor.stdout is not None
    lines = [json.loads(line) for line in survivor.stdout.read().splitlines() if line.strip()]
    survivor.stdout.close()
    assert survivor.returncode == 0
    assert {"error": "JobCrashLoopError", "code": LEASE_LAPSED_CRASH_LOOP} in lines
    assert not any("poisoned" in line for line in lines)  # it never ran the poison
