"""J12, issue 27 item 6: a later ``stop`` with a shorter ``drain_timeout`` cuts a drain short
(the worker's second Ctrl-C calls ``stop(drain_timeout=0)``); a longer one never extends it."""

from __future__ import annotations

import anyio
from job_helpers import record_of

from ship_sqla import define_job, start_job_runtime
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.testing import FrozenClock


async def test_friction_6_a_shorter_stop_cuts_the_drain_short() -> None:
    """J12: the first stop drains for an hour (on a frozen clock: forever); a second
    ``stop(drain_timeout=0)`` cancels the handler at once and both stops return, the run
    waiting again with no attempt spent; a longer timeout given meanwhile changed nothing."""
    clock = FrozenClock()
    backend = InMemoryJobBackend(clock=clock)
    started = anyio.Event()

    async def handler(ctx, payload):
        started.set()
        await anyio.Event().wait()

    job = define_job("blocks", handler, payload=dict)
    run = await backend.enqueue(job, {})
    runtime = await start_job_runtime(job, backend=backend, clock=clock, drain_timeout=3600)
    with anyio.fail_after(5):
        await started.wait()
    returned: list[float | None] = []

    async def stop(drain_timeout: float | None) -> None:
        await runtime.stop(drain_timeout)
        returned.append(drain_timeout)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop, None)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(stop, 7200.0)  # longer: the drain keeps its deadline
            await anyio.wait_all_tasks_blocked()
            assert returned == []
            assert runtime.in_flight == 1
            await runtime.stop(drain_timeout=0)
    assert sorted(returned, key=str) == [7200.0, None]
    record = await record_of(backend, run.run_id)
    assert (record.state, record.attempt) == ("waiting", 0)
