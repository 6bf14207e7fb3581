"""concurrency.max across OS processes (J3, F1): several processes claim one job at once, some
stalling past their lease while others retake their runs and heartbeats race the claims."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
from ship_sqla.kernel._ports import EnqueueRequest

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

MAX_RUNNING = 3
RUNS = 240
PROCESSES = 4
ATTEMPTS = 1000
"""Far more than any run lapses: no run is dead-lettered for lapsing (J6)."""

WORKER = textwrap.dedent(
    """
    import asyncio, json, random, sys
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
    from ship_sqla.kernel import completed as completion
    from ship_sqla.kernel._ports import ClaimRequest

    async def noop(ctx, payload):
        return None

    # Every running run holds a slot, live lease or lapsed (J3): the stronger count.
    RUNNING = text(
        "SELECT count(*) FROM ship_job_runs WHERE job_id = 'limited' AND state = 'running'"
    )
    LEFT = text(
        "SELECT count(*) FROM ship_job_runs WHERE job_id = 'limited'"
        " AND state IN ('waiting', 'running')"
    )

    async def main(url, name, max_running):
        engine = create_async_engine(url, pool_size=3)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
        )
        job = define_job(
            "limited",
            noop,
            payload=dict,
            concurrency=Concurrency(max=max_running, lease=LEASE),
            retry=RetryPolicy(attempts=1000),
        )
        print("ready", flush=True)
        sys.stdin.readline()
        peak, completed, buried, refused, drained = 0, [], [], 0, False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while loop.time() < deadline:
            request = ClaimRequest(
                job.id, name, random.randint(1, max_running), max_running, LEASE
            )
            claimed = await backend.claim(request)
            # J6: a run whose final attempt lapsed is dead-lettered by the claim that meets
            # it, and named here, not claimed: none must be (the runs have 1000 attempts).
            buried += [b.run_id for b in claimed.buried]
            if not claimed:
                async with engine.connect() as c:
                    if (await c.execute(LEFT)).scalar_one() == 0:
                        drained = True
                        break
                await asyncio.sleep(0.002)
                continue
            # Our claim has committed: every running run is counted here, ours included.
            async with engine.connect() as c:
                peak = max(peak, (await c.execute(RUNNING)).scalar_one())
            if random.random() < STALL:
                # Stalled past the lease: others may retake these runs meanwhile, and the
                # heartbeat that follows must not revive a lapsed lease (J5).
                await asyncio.sleep(LEASE * 1.5)
            else:
                await asyncio.sleep(random.uniform(0.005, 0.015))
            alive = await backend.heartbeat(claimed)
            refused += alive.count(False)
            outcomes = await backend.settle([completion(r) for r in claimed])
            completed += [r.run_id for r, o in zip(claimed, outcomes) if o == "completed"]
        await engine.dispose()
        report = {
            "peak": peak,
            "completed": completed,
            "buried": buried,
            "refused": refused,
            "drained": drained,
        }
        print(json.dumps(report), flush=True)

    LEASE, STALL = float(sys.argv[4]), 0.15
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)
LEASE = 0.25


async def noop(ctx: object, payload: object) -> None:
    return None


async def _rows_of(engine: AsyncEngine, run_ids: list[str]) -> list[dict[str, object]]:
    """The stored state of ``run_ids`` (none when empty): what a failure shows."""
    if not run_ids:
        return []
    async with engine.connect() as connection:
        found = await connection.execute(
            text(
                "SELECT id, state, attempt, lapses, consecutive_lapses, lease_token,"
                " lease_expires_at, finished_at, history FROM ship_job_runs WHERE id = ANY(:ids)"
            ),
            {"ids": run_ids},
        )
        return [dict(row._mapping) for row in found]


@pytest.mark.timeout(180)
async def test_concurrency_max_holds_across_processes(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J3 (F1), J5, J6: four OS processes claiming one job concurrently never have more than
    concurrency.max running runs between them, live leases and lapsed ones alike (each checks
    right after its own claim committed, while its runs are held), although some stall past
    their short lease, others retake those runs, and the stalled ones' heartbeats (refused:
    a lapsed lease is never revived) race the claims; every run is completed exactly once and
    none is dead-lettered (the runs have ATTEMPTS attempts)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    # The runs' max_attempts is the ENQUEUING definition's retry.attempts, stored with each run
    # (the workers' RetryPolicy never reaches the rows): with the default 5, a run whose fifth
    # attempt lapsed was dead-lettered by the claim that met it (J6, correct), and so completed
    # by nobody (CI: 239 of 240 completed, under load, where lapses are frequent).
    job = define_job(
        "limited",
        noop,
        payload=dict,
        concurrency=Concurrency(max=MAX_RUNNING, lease=60),
        retry=RetryPolicy(attempts=ATTEMPTS),
    )
    enqueued = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(RUNS)])
    script = tmp_path / "claimer.py"
    script.write_text(WORKER)
    workers = [
        subprocess.Popen(  # noqa: ASYNC220 - the processes run while this test waits on them
            [sys.executable, str(script), ship_engine_url, f"w{i}", str(MAX_RUNNING), str(LEASE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        reports = []
        for worker in workers:
            out, _ = worker.communicate(timeout=150)
            assert worker.returncode == 0
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    buried = [run_id for report in reports for run_id in report["buried"]]
    assert not buried, (buried, await _rows_of(ship_engine, buried), reports)
    # A worker stops at its deadline (90 s) even with runs left: said apart from a lost run.
    assert any(report["drained"] for report in reports), reports
    peaks = [report["peak"] for report in reports]
    assert max(peaks) <= MAX_RUNNING, peaks
    completed = [run_id for report in reports for run_id in report["completed"]]
    missing = sorted({r.run_id for r in enqueued} - set(completed))
    rows = await _rows_of(ship_engine, missing)
    # Each exactly once; a run no worker completed is shown as stored (failed once in CI:
    # 239 of 240, the other neither waiting nor running when the workers stopped).
    assert sorted(completed) == sorted(r.run_id for r in enqueued), (missing, rows, reports)
    assert sum(1 for report in reports if report["completed"]) >= 2  # they did contend
    assert sum(report["refused"] for report in reports) > 0  # leases did lapse
