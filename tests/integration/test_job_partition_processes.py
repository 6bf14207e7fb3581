"""Partitioned limits across OS processes (F8 per-tenant rate limits, F9 per-tenant caps),
audited by triggers.

Two worker processes run the kernel runtime on two jobs: one with ``RateLimit(5, 0.5 s,
partition="tenant")``, one with ``Concurrency(max=2, partition="tenant")``, each with runs of
eight tenants. A trigger on the runs table records every start (each claim of a run: its new
fencing token) with the start time its partition's gate recorded (the run's ``updated_at``);
another keeps, per (job, tenant), the number of running runs as each transition commits (row
locked, so in commit order) and the most it ever reached. The audit then checks every window
and every count. Real processes: the test waits for database facts, each wait with a deadline.
"""

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
from ship_sqla.kernel._tenancy import tenant_ambient

metadata = MetaData()
runs = ship_job_runs_table(metadata, partitioned_claims=True, partition_keys=True)
state = ship_job_state_table(metadata)

LIMIT = 5
PERIOD = 0.5
CAP = 2
TENANTS = [f"t{n}" for n in range(8)]
PER_TENANT = 15
PROCESSES = 2

WORKER = textwrap.dedent(
    """
    import asyncio, signal, sys
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import define_job, start_job_runtime
    from ship_sqla.jobs import Concurrency, RateLimit

    async def work(ctx, payload):
        await asyncio.sleep(0.02)

    async def main(url, name, limit, period, cap):
        engine = create_async_engine(url, pool_size=4)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md, partitioned_claims=True, partition_keys=True),
            state_table=ship_job_state_table(md),
            listen=False,
        )
        jobs = [
            define_job(
                "part.rated",
                work,
                payload=dict,
                rate_limit=RateLimit(limit, period, partition="tenant"),
            ),
            define_job(
                "part.capped",
                work,
                payload=dict,
                concurrency=Concurrency(max=cap, partition="tenant"),
            ),
            define_job(
                "part.by_key",
                work,
                payload=dict,
                rate_limit=RateLimit(limit, period, partition="key"),
                partition_key=lambda payload: payload["customer"],
            ),
        ]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(
            jobs, backend=backend, worker_id=name, poll_interval=0.2, max_in_flight=16
        )
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
        "CREATE TABLE part_starts (job_id text NOT NULL, tenant text, run_id text NOT NULL,"
        " started_at timestamptz NOT NULL)"
    ),
    (
        "CREATE TABLE part_running (job_id text NOT NULL, tenant text NOT NULL,"
        " n integer NOT NULL, most integer NOT NULL, PRIMARY KEY (job_id, tenant))"
    ),
    (
        "CREATE FUNCTION part_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.state = 'running' AND NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN"
        "   INSERT INTO part_starts VALUES"
        "   (NEW.job_id, coalesce(NEW.partition_key, NEW.tenant_id), NEW.id, NEW.updated_at);"
        " END IF;"
        " IF NEW.state = 'running' AND OLD.state <> 'running' THEN"
        "   INSERT INTO part_running"
        "   VALUES (NEW.job_id, coalesce(NEW.partition_key, NEW.tenant_id), 1, 1)"
        "   ON CONFLICT (job_id, tenant) DO UPDATE SET n = part_running.n + 1,"
        "     most = greatest(part_running.most, part_running.n + 1);"
        " ELSIF OLD.state = 'running' AND NEW.state <> 'running' THEN"
        "   UPDATE part_running SET n = n - 1"
        "   WHERE job_id = NEW.job_id AND tenant = coalesce(NEW.partition_key, NEW.tenant_id);"
        " END IF;"
        " RETURN NEW; END $$"
    ),
    (
        "CREATE TRIGGER part_audit AFTER UPDATE ON ship_job_runs FOR EACH ROW"
        " EXECUTE FUNCTION part_audit()"
    ),
]

# Per tenant, every window of PERIOD seconds: the (i + LIMIT)-th start comes at least PERIOD
# after the i-th.
CROWDED_WINDOWS = (
    "SELECT count(*) FROM (SELECT started_at, lead(started_at, :limit) OVER"
    " (PARTITION BY tenant ORDER BY started_at) AS later FROM part_starts WHERE job_id = :job) w"
    " WHERE later IS NOT NULL AND later - started_at < make_interval(secs => :period)"
)


async def noop(ctx: object, payload: object) -> None:
    return None


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as connection:
        return (await connection.execute(text(sql), params)).scalar_one()


def start_workers(script: Path, url: str) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, str(script), url, f"w{n}", str(LIMIT), str(PERIOD), str(CAP)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]


async def drained(engine: AsyncEngine, total: int) -> int:
    """The completed runs, once all ``total`` are (or at the deadline)."""
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline:
        done = await scalar(engine, "SELECT count(*) FROM ship_job_runs WHERE state = 'completed'")
        if done == total:
            break
        await anyio.sleep(0.1)
    return int(done)


@pytest.mark.timeout(180)
async def test_f8_f9_per_tenant_limits_hold_across_processes(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """F8, F9 across two processes: 8 tenants x 15 runs of a job with RateLimit(5, 0.5 s,
    partition='tenant') and of one with Concurrency(max=2, partition='tenant'), and 8 customers
    x 15 runs of a job with RateLimit(5, 0.5 s, partition='key') keyed by the payload's
    customer. The audit of every start shows no window of 0.5 s with more than 5 starts of one
    tenant or one key (F8); the
    per-tenant running count, kept in commit order, never went above 2 (F9) and reached 2 (the
    cap bound, and both processes served one tenant at once); every run started and completed
    exactly once; the rated drain lasted at least (15 / 5 - 1) periods (the limit bound) and
    not much more (the tenants were served side by side: work-conserving)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for statement in AUDIT:
            await connection.execute(text(statement))
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)
    rated = define_job(
        "part.rated", noop, payload=dict, rate_limit=RateLimit(LIMIT, PERIOD, partition="tenant")
    )
    capped = define_job(
        "part.capped", noop, payload=dict, concurrency=Concurrency(max=CAP, partition="tenant")
    )
    by_key = define_job(
        "part.by_key",
        noop,
        payload=dict,
        rate_limit=RateLimit(LIMIT, PERIOD, partition="key"),
        partition_key=lambda payload: payload["customer"],
    )
    script = tmp_path / "partition_worker.py"
    script.write_text(WORKER)
    workers = start_workers(script, ship_engine_url)
    total = 3 * len(TENANTS) * PER_TENANT
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        began = time.monotonic()
        for tenant in TENANTS:
            with tenant_ambient(tenant):
                for job in (rated, capped):
                    requests = [EnqueueRequest({"n": n}) for n in range(PER_TENANT)]
                    await backend.enqueue_many(job, requests)
        for customer in TENANTS:  # no tenant: the payload's customer is the partition key
            requests = [EnqueueRequest({"customer": customer, "n": n}) for n in range(PER_TENANT)]
            await backend.enqueue_many(by_key, requests)
        done = await drained(ship_engine, total)
        elapsed = time.monotonic() - began
        assert done == total
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)
            if worker.stdout is not None:
                worker.stdout.close()
    crowded = await scalar(ship_engine, CROWDED_WINDOWS, limit=LIMIT, period=PERIOD, job=rated.id)
    assert crowded == 0, f"{crowded} windows of {PERIOD} s above {LIMIT} starts of a tenant"
    for job in (rated, capped):
        starts = await scalar(
            ship_engine, "SELECT count(*) FROM part_starts WHERE job_id = :job", job=job.id
        )
        assert starts == len(TENANTS) * PER_TENANT  # each run started once
    most = await scalar(
        ship_engine, "SELECT max(most) FROM part_running WHERE job_id = :job", job=capped.id
    )
    assert most == CAP
    assert elapsed >= (PER_TENANT / LIMIT - 1) * PERIOD
    assert elapsed < 30  # 8 tenants side by side: about 3 periods, not 24
