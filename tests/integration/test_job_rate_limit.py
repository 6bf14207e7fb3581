"""A fleet-wide rate limit (F3) across OS processes, audited by a trigger.

Three worker processes run the kernel runtime on one rate-limited job (and one of them a
capped one too, F1); a trigger on the runs table records every start (each claim of a run: its
new fencing token) with the start time the claim recorded for it (the run's ``updated_at``,
which the claim gate sets). The audit then looks at every window of ``period``: none holds more
than ``limit`` starts, and the limit did bind (the drain took about as long as the rate
allows). Real processes: the test waits for database facts, each wait with a deadline."""

from __future__ import annotations

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

from ship_sqla import define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import Concurrency, RateLimit
from ship_sqla.kernel._ports import EnqueueRequest

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

LIMIT = 20
PERIOD = 0.5
RUNS = 200
PROCESSES = 3
CAP = 4

WORKER = textwrap.dedent(
    """
    import asyncio, signal, sys
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import define_job, start_job_runtime
    from ship_sqla.jobs import Concurrency, RateLimit

    async def work(ctx, payload):
        await asyncio.sleep(0.005)

    async def main(url, name, limit, period, cap):
        engine = create_async_engine(url, pool_size=4)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            listen=False,
        )
        jobs = [
            define_job("rated", work, payload=dict, rate_limit=RateLimit(limit, period)),
            define_job(
                "rated.capped",
                work,
                payload=dict,
                rate_limit=RateLimit(limit, period),
                concurrency=Concurrency(max=cap),
            ),
        ]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(jobs, backend=backend, worker_id=name, poll_interval=5.0)
        print("ready", flush=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    )
    """
)

AUDIT = [
    (
        "CREATE TABLE rate_audit (job_id text NOT NULL, run_id text NOT NULL,"
        " started_at timestamptz NOT NULL)"
    ),
    (
        "CREATE FUNCTION rate_audit_start() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO rate_audit VALUES (NEW.job_id, NEW.id, NEW.updated_at); RETURN NEW; END $$"
    ),
    # A claim sets state running with a new token; heartbeats and settles keep the token.
    (
        "CREATE TRIGGER rate_audit_start AFTER UPDATE ON ship_job_runs FOR EACH ROW"
        " WHEN (NEW.state = 'running' AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)"
        " EXECUTE FUNCTION rate_audit_start()"
    ),
]

# Every window of PERIOD seconds: the (i + LIMIT)-th start comes at least PERIOD after the i-th.
CROWDED_WINDOWS = (
    "SELECT count(*) FROM (SELECT started_at, lead(started_at, :limit) OVER"
    " (ORDER BY started_at) AS later FROM rate_audit WHERE job_id = :job) w"
    " WHERE later IS NOT NULL AND later - started_at < make_interval(secs => :period)"
)


async def noop(ctx: object, payload: object) -> None:
    return None


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as connection:
        return (await connection.execute(text(sql), params)).scalar_one()


@pytest.mark.timeout(180)
async def test_f3_no_window_of_the_period_sees_more_than_the_limit_across_processes(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """F3 across processes: three worker processes drain 200 runs of a job with
    RateLimit(20, 0.5 s), and 200 of a job that also has Concurrency(max=4) (F1); the trigger's
    audit of every start shows no window of 0.5 s with more than 20 starts for either job, every
    run started and completed exactly once, and the drain lasted at least
    (200 / 20 - 1) periods: the limit bound."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for statement in AUDIT:
            await connection.execute(text(statement))
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)
    rated = define_job("rated", noop, payload=dict, rate_limit=RateLimit(LIMIT, PERIOD))
    capped = define_job(
        "rated.capped",
        noop,
        payload=dict,
        rate_limit=RateLimit(LIMIT, PERIOD),
        concurrency=Concurrency(max=CAP),
    )
    script = tmp_path / "rate_worker.py"
    script.write_text(WORKER)
    workers = [
        subprocess.Popen(  # noqa: ASYNC220 - real processes are the point of this test
            [
                sys.executable,
                str(script),
                ship_engine_url,
                f"w{n}",
                str(LIMIT),
                str(PERIOD),
                str(CAP),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        began = time.monotonic()
        for job in (rated, capped):
            await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(RUNS)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = await scalar(
                ship_engine, "SELECT count(*) FROM ship_job_runs WHERE state = 'completed'"
            )
            if done == 2 * RUNS:
                break
            await anyio.sleep(0.1)
        elapsed = time.monotonic() - began
        assert done == 2 * RUNS
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)
            if worker.stdout is not None:
                worker.stdout.close()
    for job in (rated, capped):
        crowded = await scalar(ship_engine, CROWDED_WINDOWS, limit=LIMIT, period=PERIOD, job=job.id)
        assert crowded == 0, f"{job.id}: {crowded} windows of {PERIOD} s above {LIMIT} starts"
        starts = await scalar(
            ship_engine, "SELECT count(*) FROM rate_audit WHERE job_id = :job", job=job.id
        )
        assert starts == RUNS  # each run started once: nothing lapsed, nothing ran twice
    assert elapsed >= (RUNS / LIMIT - 1) * PERIOD
