"""concurrency.max across OS processes (J3): several processes claim one job at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.kernel._job_backend import EnqueueRequest
from ship_sqla.kernel._jobs import Concurrency, define_job

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

MAX_RUNNING = 3
RUNS = 240
PROCESSES = 4

WORKER = textwrap.dedent(
    """
    import asyncio, json, random, sys
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla.kernel._jobs import Concurrency, define_job

    async def noop(ctx, payload):
        return None

    LIVE = text(
        "SELECT count(*) FROM ship_job_runs WHERE job_id = 'limited' AND state = 'running'"
        " AND lease_expires_at > now()"
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
            "limited", noop, payload=dict, concurrency=Concurrency(max=max_running, lease=60)
        )
        print("ready", flush=True)
        sys.stdin.readline()
        peak, completed = 0, []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while loop.time() < deadline:
            claimed = await backend.claim(job, worker=name, limit=random.randint(1, max_running))
            if not claimed:
                async with engine.connect() as c:
                    if (await c.execute(LEFT)).scalar_one() == 0:
                        break
                await asyncio.sleep(0.002)
                continue
            # Our claim has committed: every lease now live is counted here, ours included.
            async with engine.connect() as c:
                peak = max(peak, (await c.execute(LIVE)).scalar_one())
            await asyncio.sleep(random.uniform(0.005, 0.015))
            outcomes = await backend.complete(claimed)
            completed += [r.run_id for r, o in zip(claimed, outcomes) if o == "completed"]
        await engine.dispose()
        print(json.dumps({"peak": peak, "completed": completed}), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


async def noop(ctx: object, payload: object) -> None:
    return None


@pytest.mark.timeout(180)
async def test_concurrency_max_holds_across_processes(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J3: four OS processes claiming one job concurrently never hold more than
    concurrency.max unexpired leases between them (each checks right after its own claim
    committed, while its runs are held), and every run is completed exactly once."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    job = define_job(
        "limited", noop, payload=dict, concurrency=Concurrency(max=MAX_RUNNING, lease=60)
    )
    enqueued = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(RUNS)])
    script = tmp_path / "claimer.py"
    script.write_text(WORKER)
    workers = [
        subprocess.Popen(  # noqa: ASYNC220 - the processes run while this test waits on them
            [sys.executable, str(script), ship_engine_url, f"w{i}", str(MAX_RUNNING)],
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
    peaks = [report["peak"] for report in reports]
    assert max(peaks) <= MAX_RUNNING, peaks
    completed = [run_id for report in reports for run_id in report["completed"]]
    assert sorted(completed) == sorted(r.run_id for r in enqueued)  # each exactly once
    assert sum(1 for report in reports if report["completed"]) >= 2  # they did contend
