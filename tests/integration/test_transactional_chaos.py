"""Exactly once under ``kill -9`` (SPEC §8 J13, J14, J6; issue 37): transactional handlers on
real worker processes killed at random, against a plain handler under the same kills.

RUNS runs of a transactional job (``transaction=uow``, an :class:`~ship_sqla.jobs.Inbox` keyed by
the payload's ``key``) and RUNS runs of a plain job, two runs per key (KEYS = RUNS / 2 distinct
keys, the two runs of a key enqueued side by side so they often run at once), are executed by
WORKERS worker processes on the PostgreSQL backend with a short lease. Every KILL_EVERY seconds
the test kills a random READY worker (its runtime started) with SIGKILL and starts a
replacement, provided at least WORKERS_LEFT ready workers remain, until every run is terminal.
A worker killed while it still imports and connects held nothing, and under CPU load starting
takes longer than KILL_EVERY times WORKERS: kills on a timer alone then killed nearly every
worker before it claimed anything, and the runs did not end by the deadline. Each handler
inserts one row into a table with NO unique constraint:

- ``chaos_tx_effects``: written in the transactional handler's unit of work, whose fence, inbox
  mark and completion commit with it (J13). Expected: exactly one row per key, so KEYS rows,
  however often a worker died mid-transaction or a lapsed run was retaken (J6); the second run
  of each key completes as a duplicate, its handler not called.
- ``chaos_plain_effects``: the control. Its handler commits its row in its own ``uow.run`` and
  returns; the batched completer settles the run later. A kill between that commit and the
  completion re-executes the run once its lease lapses (J6: at least once), leaving a second row.

Size: ``SHIP_SQLA_TX_CHAOS_RUNS`` (default 300, under a minute; ``nox -s chaos`` runs 10,000,
where the control must show duplicates; at the default size a handful of kills may land in no
such window, so the control's count is printed, not bounded). The figures are printed
(``pytest -s``) as one ``tx chaos:`` line.
"""

from __future__ import annotations

import json
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

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.kernel._ports import EnqueueRequest

metadata = MetaData()
ship_job_runs_table(metadata)
ship_job_state_table(metadata)
ship_idempotency_table(metadata)

RUNS = int(os.environ.get("SHIP_SQLA_TX_CHAOS_RUNS", "300"))
KEYS = max(1, RUNS // 2)
CHAOS_SIZE = 10_000
WORKERS = 4
WORKERS_LEFT = WORKERS // 2
LEASE = 2.0
KILL_EVERY = 0.5
DEADLINE = 45.0 + RUNS * 0.05
TX_JOB = "chaos.tx"
PLAIN_JOB = "chaos.plain"

WORKER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla import (
        create_idempotency_store, create_job_backend, create_unit_of_work, define_job,
        ship_idempotency_table, ship_job_runs_table, ship_job_state_table, start_job_runtime,
    )
    from ship_sqla.jobs import Concurrency, Inbox, RetryPolicy

    TX = text("INSERT INTO chaos_tx_effects (key, run_id, worker) VALUES (:key, :run_id, :w)")
    PLAIN = text(
        "INSERT INTO chaos_plain_effects (key, run_id, worker) VALUES (:key, :run_id, :w)"
    )

    async def main(url, lease):
        # A small pool: four of these share the server with everything else.
        engine = create_async_engine(url, pool_size=4, max_overflow=3)
        worker = str(os.getpid())
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            listen=False,
        )
        inbox = create_idempotency_store(database=engine, table=ship_idempotency_table(md))

        async def transactional(ctx, payload, scope):
            row = {"key": payload["key"], "run_id": ctx.run_id, "w": worker}
            await scope.connection.execute(TX, row)

        async def plain(ctx, payload):
            async def write(scope):
                row = {"key": payload["key"], "run_id": ctx.run_id, "w": worker}
                await scope.connection.execute(PLAIN, row)
            await uow.run(write)

        policy = dict(
            concurrency=Concurrency(lease=lease),
            retry=RetryPolicy(attempts=1000, base_delay=0.05),
        )
        tx_job = define_job(
            "chaos.tx",
            transactional,
            payload=dict,
            transaction=uow,
            inbox=Inbox(inbox, key=lambda p: p["key"], held_delay=0.1),
            **policy,
        )
        plain_job = define_job("chaos.plain", plain, payload=dict, **policy)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(
            [tx_job, plain_job],
            backend=backend,
            worker_id=worker,
            poll_interval=0.1,
            max_in_flight=6,
        )
        print("ready", flush=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
    """
)


async def nothing(ctx: object, payload: object) -> None:
    return None


async def query(engine: AsyncEngine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        return [tuple(row) for row in await connection.execute(text(sql), params)]


@pytest.mark.timeout(int(DEADLINE) + 120)
@pytest.mark.slow
async def test_transactional_handlers_run_exactly_once_under_kill_9(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J13, J14, J6 under kill -9: every run of both jobs completes; the transactional job's
    effect rows equal its distinct inbox keys exactly (one per key, in a table with no unique
    constraint), its other runs completed as duplicates without calling the handler; the
    plain-handler control under the same kills ran every run at least once, and its
    re-executions (duplicate rows) are counted: more than none at the chaos size."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for table in ("chaos_tx_effects", "chaos_plain_effects"):
            await connection.execute(
                text(
                    f"CREATE TABLE {table} (key text NOT NULL, run_id text NOT NULL,"
                    " worker text NOT NULL)"
                )
            )
    backend = create_job_backend(
        database=ship_engine,
        table=metadata.tables["ship_job_runs"],
        state_table=metadata.tables["ship_job_state"],
        listen=False,
    )
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [sys.executable, str(script), ship_engine_url, str(LEASE)]
    fleet = ChaosFleet(lambda _n: command, tmp_path, keep=WORKERS_LEFT)
    rng = random.Random(int(os.environ.get("SHIP_SQLA_CHAOS_SEED", "37")))
    began = time.monotonic()
    kills = 0
    terminal = 0
    try:
        for _ in range(WORKERS):
            fleet.start()
        # Both runs of a key side by side: they are often claimed together, so one meets the
        # other's open transaction on the inbox key (held: snoozed, its attempt unspent).
        requests = [EnqueueRequest({"key": f"k{i // 2}"}) for i in range(RUNS)]
        for job_id in (TX_JOB, PLAIN_JOB):
            job = define_job(job_id, nothing, payload=dict)
            enqueued = await backend.enqueue_many(job, requests)
            assert all(r.accepted for r in enqueued)
        next_kill = time.monotonic() + KILL_EVERY
        deadline = time.monotonic() + DEADLINE
        # Real processes: the test polls the database for the runs' end, with a deadline.
        while time.monotonic() < deadline:
            if time.monotonic() >= next_kill and fleet.kill_and_replace(rng):
                kills += 1
                next_kill = time.monotonic() + KILL_EVERY
            [(terminal,)] = await query(
                ship_engine,
                "SELECT count(*) FROM ship_job_runs"
                " WHERE state IN ('completed', 'dead', 'cancelled', 'discarded')",
            )
            if terminal == 2 * RUNS:
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
    assert by_state == {f"{TX_JOB}:completed": RUNS, f"{PLAIN_JOB}:completed": RUNS}, (
        f"after {wall:.1f} s, {kills} kills: {by_state}"
    )

    # J13, J14: exactly one effect per inbox key, however the kills fell.
    [(tx_rows, tx_keys)] = await query(
        ship_engine, "SELECT count(*), count(DISTINCT key) FROM chaos_tx_effects"
    )
    assert (tx_rows, tx_keys) == (KEYS, KEYS)
    [(duplicates,)] = await query(
        ship_engine,
        "SELECT count(*) FROM ship_job_runs WHERE job_id = :job"
        " AND history -> -1 ->> 'kind' = 'duplicate'",
        job=TX_JOB,
    )
    assert duplicates == RUNS - KEYS

    # J6: the control ran every run at least once; its re-executions are what kill -9 costs.
    [(plain_rows, plain_runs)] = await query(
        ship_engine, "SELECT count(*), count(DISTINCT run_id) FROM chaos_plain_effects"
    )
    assert plain_runs == RUNS
    plain_duplicates = plain_rows - plain_runs
    if RUNS >= CHAOS_SIZE:
        assert plain_duplicates > 0, "the control saw no duplicate: the kills proved nothing"
    [(retaken,)] = await query(
        ship_engine,
        "SELECT count(*) FROM ship_job_runs WHERE job_id = :job AND attempt > 1",
        job=TX_JOB,
    )
    figures = {
        "runs_per_job": RUNS,
        "keys": KEYS,
        "workers": WORKERS,
        "kills": kills,
        "wall_s": round(wall, 1),
        "tx_effect_rows": tx_rows,
        "tx_duplicate_completions": duplicates,
        "tx_runs_with_attempt_over_1": retaken,
        "plain_effect_rows": plain_rows,
        "plain_duplicate_rows": plain_duplicates,
    }
    print(f"\ntx chaos: {json.dumps(figures)}")  # noqa: T201 - the figures the report quotes
