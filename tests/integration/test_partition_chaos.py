"""Partitioned limits under kill -9 (F8, F9; issue #35 item 7's chaos case): real worker
processes killed at random and replaced, asserted from the stored history.

Three worker processes run two jobs, each with runs of six tenants: ``RateLimit(5, 0.5 s,
partition="tenant")`` and ``Concurrency(max=2, partition="tenant")``, leases of 1.5 s. Every
second the test kills one ready worker (its runtime started) with SIGKILL and starts a
replacement, while more than one is ready (tests/support/chaos_fleet.py), so runs are left
running under dead holders, their leases lapse, and later claims retake them (a retake is a
start, F8, and moves the run's slot, F9). Triggers keep the history the audit reads: every
start (each claim of a run: its new fencing token) with the start time its partition's gate
recorded, and per (job, tenant) the running runs as each transition commits (in commit order)
and the most ever reached. After the drain:

- F8: no window of 0.5 s holds more than 5 starts of one tenant, retakes included;
- F9: no tenant ever had more than 2 running runs of the capped job, lapsed holders included;
- every run completed; the runs' own histories record the lapses the kills caused.

Size: ``SHIP_SQLA_PARTITION_CHAOS_RUNS`` runs per tenant and job (default 20: 240 runs, about
half a minute; ``nox -s chaos`` runs 150: 1,800). Real processes: the test polls the database
for the drain, with a deadline.
"""

from __future__ import annotations

import os
import random
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from chaos_fleet import ChaosFleet
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import Concurrency, RateLimit
from ship_sqla.kernel._ports import EnqueueRequest
from ship_sqla.kernel._tenancy import tenant_ambient

metadata = MetaData()
runs = ship_job_runs_table(metadata, partitioned_claims=True)
state = ship_job_state_table(metadata)

LIMIT, PERIOD, CAP, LEASE = 5, 0.5, 2, 1.5
TENANTS = [f"t{n}" for n in range(6)]
PER_TENANT = int(os.environ.get("SHIP_SQLA_PARTITION_CHAOS_RUNS", "20"))
WORKERS = 3
KILL_EVERY = 1.0
DEADLINE = 60 + PER_TENANT * 2.0

WORKER = textwrap.dedent(
    """
    import asyncio, signal, sys
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import define_job, start_job_runtime
    from ship_sqla.jobs import Concurrency, RateLimit, RetryPolicy

    async def work(ctx, payload):
        await asyncio.sleep(0.05)

    async def main(url, name, limit, period, cap, lease):
        engine = create_async_engine(url, pool_size=4)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md, partitioned_claims=True),
            state_table=ship_job_state_table(md),
            listen=False,
        )
        retry = RetryPolicy(attempts=50)
        jobs = [
            define_job(
                "chaos.rated", work, payload=dict, retry=retry,
                rate_limit=RateLimit(limit, period, partition="tenant"),
                concurrency=Concurrency(lease=lease),
            ),
            define_job(
                "chaos.capped", work, payload=dict, retry=retry,
                concurrency=Concurrency(max=cap, lease=lease, partition="tenant"),
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

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                     int(sys.argv[5]), float(sys.argv[6])))
    """
)

AUDIT = [
    (
        "CREATE TABLE chaos_starts (job_id text NOT NULL, tenant text, run_id text NOT NULL,"
        " started_at timestamptz NOT NULL)"
    ),
    (
        "CREATE TABLE chaos_running (job_id text NOT NULL, tenant text NOT NULL,"
        " n integer NOT NULL, most integer NOT NULL, PRIMARY KEY (job_id, tenant))"
    ),
    (
        "CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.state = 'running' AND NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN"
        "   INSERT INTO chaos_starts VALUES (NEW.job_id, NEW.tenant_id, NEW.id, NEW.updated_at);"
        " END IF;"
        " IF NEW.state = 'running' AND OLD.state <> 'running' THEN"
        "   INSERT INTO chaos_running VALUES (NEW.job_id, NEW.tenant_id, 1, 1)"
        "   ON CONFLICT (job_id, tenant) DO UPDATE SET n = chaos_running.n + 1,"
        "     most = greatest(chaos_running.most, chaos_running.n + 1);"
        " ELSIF OLD.state = 'running' AND NEW.state <> 'running' THEN"
        "   UPDATE chaos_running SET n = n - 1"
        "   WHERE job_id = NEW.job_id AND tenant = NEW.tenant_id;"
        " END IF;"
        " RETURN NEW; END $$"
    ),
    (
        "CREATE TRIGGER chaos_audit AFTER UPDATE ON ship_job_runs FOR EACH ROW"
        " EXECUTE FUNCTION chaos_audit()"
    ),
]

CROWDED_WINDOWS = (
    # Per tenant: the (i + LIMIT)-th start comes at least PERIOD after the i-th.
    "SELECT count(*) FROM (SELECT started_at, lead(started_at, :limit) OVER"
    " (PARTITION BY tenant ORDER BY started_at) AS later FROM chaos_starts WHERE job_id = :job) w"
    " WHERE later IS NOT NULL AND later - started_at < make_interval(secs => :period)"
)


async def noop(ctx: object, payload: object) -> None:
    return None


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as connection:
        return (await connection.execute(text(sql), params)).scalar_one()


@pytest.mark.timeout(int(DEADLINE) + 120)
@pytest.mark.slow
async def test_f8_f9_partitioned_limits_hold_under_kill_9(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """F8, F9 under kill -9 (see the module): from the stored history, no tenant's 0.5 s window
    holds more than 5 starts (retakes of lapsed leases included), no tenant ever had more than
    2 running runs of the capped job (lapsed holders included), and every run completed."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for statement in AUDIT:
            await connection.execute(text(statement))
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state, listen=False)
    rated = define_job(
        "chaos.rated", noop, payload=dict, rate_limit=RateLimit(LIMIT, PERIOD, partition="tenant")
    )
    capped = define_job(
        "chaos.capped", noop, payload=dict, concurrency=Concurrency(max=CAP, partition="tenant")
    )
    script = tmp_path / "chaos_worker.py"
    script.write_text(WORKER)
    args = [str(LIMIT), str(PERIOD), str(CAP), str(LEASE)]
    fleet = ChaosFleet(
        lambda n: [sys.executable, str(script), ship_engine_url, f"w{n}", *args],
        tmp_path,
        keep=WORKERS // 2,
    )
    rng = random.Random(int(os.environ.get("SHIP_SQLA_CHAOS_SEED", "35")))
    total = 2 * len(TENANTS) * PER_TENANT
    kills, done = 0, 0
    began = time.monotonic()
    try:
        for _ in range(WORKERS):
            fleet.start()
        for tenant in TENANTS:
            with tenant_ambient(tenant):
                for job in (rated, capped):
                    requests = [EnqueueRequest({"n": n}) for n in range(PER_TENANT)]
                    await backend.enqueue_many(job, requests)
        next_kill = time.monotonic() + KILL_EVERY
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if time.monotonic() >= next_kill and fleet.kill_and_replace(rng):
                kills += 1
                next_kill = time.monotonic() + KILL_EVERY
            done = await scalar(
                ship_engine, "SELECT count(*) FROM ship_job_runs WHERE state = 'completed'"
            )
            if done == total:
                break
            await anyio.sleep(0.05)
        wall = time.monotonic() - began
    finally:
        fleet.stop()
    lapses = await scalar(ship_engine, "SELECT coalesce(sum(lapses), 0) FROM ship_job_runs")
    lapsed_entries = await scalar(
        ship_engine,
        "SELECT count(*) FROM ship_job_runs r, jsonb_array_elements(r.history) h"
        " WHERE h->>'kind' = 'lapsed'",
    )
    print(  # noqa: T201 - the chaos figures, for the log
        f"partition chaos: {total} runs, {kills} kills, {lapses} lapses, {wall:.1f} s"
    )
    assert done == total, f"after {wall:.1f} s and {kills} kills: {done} of {total} completed"
    assert kills >= 1
    assert lapsed_entries == lapses  # each lapse a claim met is in its run's history
    crowded = await scalar(ship_engine, CROWDED_WINDOWS, limit=LIMIT, period=PERIOD, job=rated.id)
    assert crowded == 0, f"{crowded} windows of {PERIOD} s above {LIMIT} starts of a tenant"
    most = await scalar(
        ship_engine, "SELECT max(most) FROM chaos_running WHERE job_id = :job", job=capped.id
    )
    assert most <= CAP
    starts = await scalar(
        ship_engine,
        "SELECT count(*) FROM chaos_starts WHERE job_id = :job",
        job=rated.id,
    )
    assert starts >= len(TENANTS) * PER_TENANT  # every run started, some more than once
