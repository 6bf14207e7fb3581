"""F1 on real PostgreSQL: freed fleet slots of a capped job wake the other processes.

Two backends on one engine stand for two processes (each has its own listener and sender
token). Both runtimes run on one FrozenClock that the test never moves: their polls never fire,
so a run the second runtime starts was started by an announcement."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine
from wake_helpers import parked

from ship_sqla import define_job, start_job_runtime
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import Concurrency, EnqueueRequest
from ship_sqla.testing import FrozenClock

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


async def test_f1_freed_fleet_slots_wake_the_other_processes(ship_engine: AsyncEngine) -> None:
    """F1: with Concurrency(max=2), runtime A holds both slots and runtime B, finding no room,
    parks (its poll never fires); once A's runs settle (A is stopping, so it claims no more),
    A's backend announces the job's freed slots and B claims and runs the other two runs.

    The slots are freed only once B's listener is live (K1): an announcement committed before
    a listener's first LISTEN is not delivered to it, and waits for its poll (the module
    docstring of ship_sqla._notify); a parked loop alone does not mean B can hear yet."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    clock = FrozenClock()
    backends = {
        name: create_job_backend(database=ship_engine, table=runs, state_table=state, clock=clock)
        for name in "AB"
    }
    release = asyncio.Event()
    ran: list[str] = []
    b_done = anyio.Event()

    a_started = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        ran.append(ctx.worker_id)
        if ctx.worker_id == "A":
            if ran.count("A") == 2:
                a_started.set()
            await release.wait()
        elif ran.count("B") == 2:
            b_done.set()

    job = define_job("f1.room", handler, payload=dict, concurrency=Concurrency(max=2))
    await backends["A"].enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(4)])
    runtime_a = await start_job_runtime(
        job, backend=backends["A"], worker_id="A", clock=clock, poll_interval=60
    )
    runtime_b = None
    try:
        with anyio.fail_after(10):
            await a_started.wait()
        runtime_b = await start_job_runtime(
            job, backend=backends["B"], worker_id="B", clock=clock, poll_interval=60
        )
        listener = backends["B"].listener
        assert listener is not None
        with anyio.fail_after(10):
            await listener.wait_live()
        await parked(backends["B"])
        assert "B" not in ran  # the cap is held by A
        stopping = asyncio.create_task(runtime_a.stop(drain_timeout=10))
        await anyio.lowlevel.checkpoint()
        release.set()
        with anyio.fail_after(10):
            await b_done.wait()
        await stopping
    finally:
        release.set()
        if runtime_b is not None:
            await runtime_b.stop(drain_timeout=0)
        await runtime_a.stop(drain_timeout=0)
    assert sorted(ran) == ["A", "A", "B", "B"]


async def test_f1_slots_freed_inside_the_throttle_window_are_announced_at_its_end(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """F1: slots of one job freed twice inside the 250 ms window (two settle batches landing
    back to back) are announced twice: at once, and again at the window's end, never dropped;
    a runtime parked on the cap would otherwise wait for its poll."""
    import asyncpg  # noqa: PLC0415 - a raw listener, to count the announcements

    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, clock=FrozenClock()
    )
    heard: list[str] = []
    twice = anyio.Event()

    def on_notify(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
        heard.append(payload)
        if len(heard) == 2:
            twice.set()

    listener = await asyncpg.connect(ship_engine_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await listener.add_listener(backend.wake_channel, on_notify)
        backend.room_freed(["f1.window"])
        backend.room_freed(["f1.window"])  # inside the window: not dropped, deferred
        with anyio.fail_after(10):
            await twice.wait()
    finally:
        await listener.close()
    assert len(heard) == 2
    assert all("f1.window" in payload for payload in heard)


async def test_f1_a_stop_announces_what_the_window_held_and_leaves_nothing_behind(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """F1, J12: when the last runtime of a backend stops, slots freed inside the throttle window
    are announced at once (not at the window's end, after the stop) and every announcement under
    way has ended: nothing of the backend's runs after the stop (the demo dropped its database
    and then read "database ... does not exist" from a late announcement)."""
    import asyncpg  # noqa: PLC0415 - a raw listener, to count the announcements

    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, clock=FrozenClock()
    )
    heard: list[str] = []
    listener = await asyncpg.connect(ship_engine_url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await listener.add_listener(
            backend.wake_channel, lambda _c, _p, _ch, payload: heard.append(payload)
        )
        backend.start_listening(["f1.stop"])
        backend.room_freed(["f1.stop"])
        backend.room_freed(["f1.stop"])  # inside the window: deferred to its end
        await backend.stop_listening(["f1.stop"])
        assert backend._room_trailing is None  # nothing left to fire
        assert not backend._room_tasks  # nothing under way
        # Both announcements committed before the stop returned; their notifications reach
        # the listener's connection in order, after a round trip on it.
        await listener.execute("SELECT 1")
    finally:
        await listener.close()
    assert len(heard) == 2
