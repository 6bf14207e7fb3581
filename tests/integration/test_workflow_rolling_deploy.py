"""A rolling deploy under ``kill -9`` (SPEC §13 D7, D9, D10; §8 J5, J6; issue #38 item 6):
builds replaced one by one on four real worker processes, one of them incompatible, then a
rollback.

RUNS runs of a five-step workflow (``s1``, ``s2``, a wait for the run's ``gate`` event, ``s3``,
``s4``, ``s5``; every step a ``ctx.transaction`` whose effect row, in a table with NO unique
constraint, records the run, the step, the handler version that executed it and the build) go
through four builds of one job:

- build A: ``version=1``. Half the runs (wave 1) are enqueued under it, their gates published
  as they reach them, and the workers are replaced one by one by build B while they run, each
  by SIGKILL (its runs lapse and are retaken, J5, J6);
- build B: ``version=2, previous={1: v1}`` (D9): wave 1 finishes on the old handler, wave 2 is
  enqueued under version 2 and stops at its gate (a worker of B is killed mid-wave too);
- build C, deliberately incompatible: its v2 handler renames ``s1``. It replaces B one by one;
  the gates of a quarter of the runs open when two of its workers are up (they meet B and C
  workers), the rest once all four are: every wave-2 run a C worker replays diverges at
  position 0 (D7) and parks (D10), its step never run and no attempt spent;
- the rollback to build B under a new build id: the C workers are killed, then B's are started
  one by one; the first unparks the parked runs once (D10) and they finish on v2.

The rollback retires C first on purpose: a worker of the bad build still running after the
fix's first worker unparked would re-park what it claims, and those runs would wait for the
next build or an operator (D10's once per build, docs/workflows-evolution.md).

Asserted: 0 lost runs (all completed), 0 duplicated transactional effects (each (run, step)
exactly once, D2), every effect executed by the run's recorded version (D9), parks > 0 during
build C and none left after the rollback. Printed as one ``rolling deploy:`` line (runs, kills,
parks, unparked, duration). Size: ``SHIP_SQLA_ROLLING_DEPLOY_RUNS`` (default 120, about half a
minute; ``nox -s chaos`` runs 1,000).
"""

from __future__ import annotations

import json
import os
import random
import textwrap
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import MetaData, text
from worker_fleet import WorkerFleet

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
)
from ship_sqla.kernel._ports import EnqueueRequest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
steps = ship_job_steps_table(metadata)
events = ship_job_events_table(metadata)
ship_job_workers_table(metadata)

RUNS = int(os.environ.get("SHIP_SQLA_ROLLING_DEPLOY_RUNS", "120"))
HALF = RUNS // 2
WORKERS = 4
LEASE = 2.0
DEADLINE = 60.0 + RUNS * 0.2
"""Seconds each phase may take at most."""
JOB = "evo.flow"
EVENT = "evo.gate"
STEPS = ("s1", "s2", "s3", "s4", "s5")

WORKER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla import (
        create_job_backend, create_unit_of_work, define_job, ship_job_events_table,
        ship_job_runs_table, ship_job_state_table, ship_job_steps_table, start_job_runtime,
    )
    from ship_sqla.jobs import Concurrency, RetryPolicy

    EFFECT = text(
        "INSERT INTO evo_effects (run_id, step, version, build, worker)"
        " VALUES (:run_id, :step, :version, :build, :worker)"
    )

    async def main(url, build, build_id, lease, event):
        # A small pool: four of these share the server with everything else.
        engine = create_async_engine(url, pool_size=4, max_overflow=3)
        worker = f"{build_id}:{os.getpid()}"
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)

        def handler(version, first):
            async def flow(ctx, payload):
                def effect(step):
                    async def write(scope):
                        row = dict(run_id=ctx.run_id, step=step, version=version,
                                   build=build_id, worker=worker)
                        await scope.connection.execute(EFFECT, row)
                        return step
                    return write
                for step in (first, "s2"):
                    await ctx.transaction(step, uow, effect(step))
                await ctx.wait_for_event("gate", event, key=ctx.run_id)
                for step in ("s3", "s4", "s5"):
                    await ctx.transaction(step, uow, effect(step))
            return flow

        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            steps_table=ship_job_steps_table(md),
            events_table=ship_job_events_table(md),
        )
        policy = dict(
            payload=dict,
            concurrency=Concurrency(lease=lease),
            retry=RetryPolicy(attempts=50, base_delay=0.05),
        )
        v1 = handler(1, "s1")
        if build == "A":
            job = define_job("evo.flow", v1, version=1, **policy)
        elif build == "B":
            job = define_job("evo.flow", handler(2, "s1"), version=2, previous={1: v1}, **policy)
        else:  # C: v2 renames its first step, so runs that stored "s1" diverge at position 0
            job = define_job(
                "evo.flow", handler(2, "s1-renamed"), version=2, previous={1: v1}, **policy
            )
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runtime = await start_job_runtime(
            [job], backend=backend, worker_id=worker, poll_interval=0.2, max_in_flight=6,
            build_id=build_id,
        )
        print("ready", flush=True)
        await stop.wait()
        await runtime.stop(drain_timeout=5)
        await engine.dispose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]))
    """
)

WAITING_AT_GATE = (
    "SELECT s.run_id FROM ship_job_steps s WHERE s.name = 'gate' AND s.state = 'waiting'"
)
WAVE = "SELECT count(*) FROM ship_job_runs WHERE handler_version = :v"
COMPLETED = WAVE + " AND state = 'completed'"
PARKED = "SELECT count(*) FROM ship_job_runs WHERE wait_for = '#diverged' AND state = 'waiting'"


async def nothing(ctx: object, payload: object) -> None:
    return None


async def query(engine: AsyncEngine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        return [tuple(row) for row in await connection.execute(text(sql), params)]


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    [(value,)] = await query(engine, sql, **params)
    return value


class Deploy:
    """The fleet of one test, the builds it runs, and the gates it opens: a run's gate event is
    published once its wait is stored and its run is among ``opened``."""

    def __init__(self, engine: AsyncEngine, fleet: WorkerFleet, script: Path, url: str) -> None:
        self.engine, self.fleet, self.script, self.url = engine, fleet, script, url
        self.backend = create_job_backend(
            database=engine,
            table=runs,
            state_table=state,
            steps_table=steps,
            events_table=events,
            listen=False,
        )
        self.rng = random.Random(int(os.environ.get("SHIP_SQLA_CHAOS_SEED", "38")))
        self.opened: set[str] = set()
        self.published: set[str] = set()
        self.started = 0

    async def start(self, build: str, build_id: str) -> None:
        name = f"{build_id}-{self.started}"
        self.started += 1
        await self.fleet.start(name, self.script, self.url, build, build_id, str(LEASE), EVENT)

    async def replace(self, old: str, build: str, build_id: str) -> None:
        """SIGKILL a random worker of build id ``old`` and start one of ``build``."""
        self.fleet.kill_one(self.rng, prefix=f"{old}-")
        await self.start(build, build_id)

    async def enqueue(self, version: int) -> list[str]:
        job = define_job(JOB, nothing, payload=dict, version=version)
        enqueued = await self.backend.enqueue_many(job, [EnqueueRequest({}) for _ in range(HALF)])
        assert all(r.accepted for r in enqueued)
        return sorted(r.run_id for r in enqueued)

    async def publish(self) -> None:
        for (run_id,) in await query(self.engine, WAITING_AT_GATE):
            if run_id in self.opened and run_id not in self.published:
                await self.backend.publish_event(EVENT, {"run": run_id}, key=run_id)
                self.published.add(run_id)

    async def until(self, what: str, check: Callable[[], Awaitable[bool]]) -> None:
        """Publish the opened gates and poll ``check`` until it holds (real processes: the test
        waits for database facts by polling, with a deadline)."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            await self.publish()
            if await check():
                return
            await anyio.sleep(0.05)
        by_state = await query(
            self.engine,
            "SELECT handler_version, state, wait_for, count(*) FROM ship_job_runs GROUP BY 1, 2, 3",
        )
        raise AssertionError(f"not reached in {DEADLINE} s: {what}; runs: {by_state}")

    async def effects_at_least(self, version: int, count: int) -> bool:
        n = await scalar(
            self.engine, "SELECT count(*) FROM evo_effects WHERE version = :v", v=version
        )
        return bool(n >= count)


async def roll_out_b(deploy: Deploy) -> list[str]:
    """Build A, wave 1 running, replaced by B one worker at a time as wave 1 progresses; then
    wave 2 under B with one more kill mid-way. Wave 2's run ids."""
    for _ in range(WORKERS):
        await deploy.start("A", "A")
    deploy.opened.update(await deploy.enqueue(1))
    for i in range(WORKERS):
        await deploy.until(
            "wave 1 progressing", lambda i=i: deploy.effects_at_least(1, (i + 1) * HALF * 5 // 6)
        )
        await deploy.replace("A", "B", "B")
    wave2 = await deploy.enqueue(2)
    await deploy.until("wave 2 started", lambda: deploy.effects_at_least(2, HALF // 2))
    await deploy.replace("B", "B", "B")

    async def settled() -> bool:
        at_gate = await scalar(
            deploy.engine,
            "SELECT count(*) FROM ship_job_steps s JOIN ship_job_runs r ON r.id = s.run_id"
            " WHERE s.name = 'gate' AND s.state = 'waiting' AND r.handler_version = 2",
        )
        return bool(at_gate == HALF and await scalar(deploy.engine, COMPLETED, v=1) == HALF)

    await deploy.until("wave 1 completed and wave 2 at its gate", settled)
    return wave2


async def roll_out_c(deploy: Deploy, wave2: list[str]) -> int:
    """Build C replaces B one worker at a time; a quarter of wave 2's gates open once two C
    workers are up, the rest once all four are. The runs parked once wave 2 is settled."""
    for i in range(WORKERS):
        await deploy.replace("B", "C", "C")
        if i == 1:
            deploy.opened.update(wave2[: HALF // 2])
            await deploy.until("a quarter of the gates published", _published(deploy, HALF // 2))
    deploy.opened.update(wave2)

    async def settled() -> bool:
        done = await scalar(deploy.engine, COMPLETED, v=2)
        return bool(done + await scalar(deploy.engine, PARKED) == HALF)

    await deploy.until("wave 2 completed or parked", settled)
    return int(await scalar(deploy.engine, PARKED))


def _published(deploy: Deploy, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(deploy.published) >= HALF + count

    return check


async def roll_back(deploy: Deploy) -> None:
    """The C workers killed, then build B started again one worker at a time under a new build
    id; its first worker unparks the parked runs (D10)."""
    for name in sorted(n for n in deploy.fleet.live if n.startswith("C-")):
        deploy.fleet.kill(name)
    for _ in range(WORKERS):
        await deploy.start("B", "B-rollback")

    async def all_completed() -> bool:
        return bool(
            await scalar(
                deploy.engine, "SELECT count(*) FROM ship_job_runs WHERE state = 'completed'"
            )
            == RUNS
        )

    await deploy.until("every run completed after the rollback", all_completed)


@pytest.mark.timeout(int(DEADLINE) * 5 + 120)
@pytest.mark.slow
async def test_d7_d9_d10_a_rolling_deploy_with_kills_and_a_rollback(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """D7, D9, D10 with J5, J6 under kill -9 (see the module): through builds A -> B -> C
    (incompatible) -> B again, each worker replaced by SIGKILL: no run lost (all completed),
    each (run, step) transactional effect exactly once (D2), every effect executed by the
    handler of the run's recorded version (D9), runs parked under C (D7 divergence at position
    0, D10) and none left parked after the rollback's first worker unparked them (D10); the
    workers still running at the end drain on SIGTERM (J12)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                "CREATE TABLE evo_effects (run_id text NOT NULL, step text NOT NULL,"
                " version integer NOT NULL, build text NOT NULL, worker text NOT NULL)"
            )
        )
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    fleet = WorkerFleet(tmp_path)
    deploy = Deploy(ship_engine, fleet, script, ship_engine_url)
    began = time.monotonic()
    try:
        wave2 = await roll_out_b(deploy)
        parks = await roll_out_c(deploy, wave2)
        assert parks > 0, "build C parked nothing: the incompatible build proved nothing"
        await roll_back(deploy)
        wall = time.monotonic() - began
    finally:
        fleet.stop()

    by_state = dict(
        await query(ship_engine, "SELECT state, count(*) FROM ship_job_runs GROUP BY 1")
    )
    assert by_state == {"completed": RUNS}, by_state
    assert await scalar(ship_engine, PARKED) == 0

    # D2: each transactional step of each run exactly once, however often it was replayed.
    duplicated = await query(
        ship_engine,
        "SELECT run_id, step, count(*) FROM evo_effects GROUP BY 1, 2 HAVING count(*) <> 1",
    )
    assert duplicated == []
    per_step = dict(await query(ship_engine, "SELECT step, count(*) FROM evo_effects GROUP BY 1"))
    assert per_step == dict.fromkeys(STEPS, RUNS)

    # D9: every effect came from the handler of the version its run recorded at enqueue.
    [(foreign,)] = await query(
        ship_engine,
        "SELECT count(*) FROM evo_effects e JOIN ship_job_runs r ON r.id = e.run_id"
        " WHERE e.version IS DISTINCT FROM r.handler_version",
    )
    assert foreign == 0
    by_build = {
        f"v{v}@{b}": n
        for v, b, n in await query(
            ship_engine,
            "SELECT version, build, count(*) FROM evo_effects GROUP BY 1, 2 ORDER BY 1, 2",
        )
    }
    assert sum(n for key, n in by_build.items() if key.startswith("v1@")) == HALF * len(STEPS)

    # D10: the parks are in the runs' histories; the rollback's build unparked them once.
    [(diverged_runs, divergences)] = await query(
        ship_engine,
        "SELECT count(DISTINCT id), count(*) FROM ship_job_runs,"
        " jsonb_array_elements(history) h WHERE h ->> 'kind' = 'diverged'",
    )
    assert diverged_runs == parks
    [(unparked,)] = await query(
        ship_engine,
        "SELECT count(*) FROM ship_job_runs"
        " WHERE state = 'completed' AND history @> '[{\"kind\": \"diverged\"}]'",
    )
    assert unparked == parks
    [(unparked_by,)] = await query(
        ship_engine,
        "SELECT trigger FROM ship_job_state WHERE job_id = :row",
        row=f"{JOB}#unparked-by",
    )
    assert unparked_by == "B-rollback"
    [(retaken,)] = await query(ship_engine, "SELECT count(*) FROM ship_job_runs WHERE lapses > 0")
    figures = {
        "runs": RUNS,
        "workers": WORKERS,
        "kills": fleet.kills,
        "parks": parks,
        "unparked": unparked,
        "divergences_recorded": divergences,
        "runs_retaken_after_a_kill": retaken,
        "effects_by_version_and_build": by_build,
        "duration_s": round(wall, 1),
    }
    print(f"\nrolling deploy: {json.dumps(figures)}")  # noqa: T201 - the figures the report quotes
