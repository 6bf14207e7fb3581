"""Waits computed from a deadline on the injected clock: a deadline that time passed before the
wait was registered fires at once (a frozen clock moved by a test while the runtime was busy
must not park it until time moves again; a real clock always moves)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import anyio
from job_helpers import ErrorLog, record_of
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._waiting import wait_event
from ship_sqla.testing import FrozenClock

LIMIT = 10.0
"""Real seconds a test gives the runtime to do what frozen time already made due (a timeout on
a failure, never a wait: every step here is a few event-loop turns)."""


async def _noop(ctx, payload):
    return None


async def test_j3_a_poll_interval_that_passed_during_the_pass_claims_again_at_once() -> None:
    """J3: the poll interval is counted from the pass's start. Time moved past it while the
    pass's claim was on the wire (after the claim read ``now``, so it saw nothing due): the
    run due meanwhile is claimed at once, without the clock moving again."""
    clock = FrozenClock()
    errors = ErrorLog()
    spy = SpyBackend(InMemoryJobBackend(clock=clock, on_error=errors))
    job = define_job("frozen.poll", _noop)
    result = await spy.enqueue(job, {}, run_at=clock.now() + timedelta(seconds=1))
    await spy.wait_for_work(0)  # consume the wake the enqueue left pending: only the poll is left
    moved = False

    async def claim_then_move_time(request):
        nonlocal moved
        claimed = await spy.inner.claim(request)
        if not moved:
            moved = True
            clock.advance(1.0)  # the test's advance, landing during the claim's round trip
        return claimed

    spy.answers["claim"] = claim_then_move_time
    async with await start_job_runtime([job], backend=spy, poll_interval=1.0):
        await spy.wait_settled("complete", 1, limit=LIMIT)
    assert [len(call.result) for call in spy.answered("claim")][:2] == [0, 1]
    assert (await record_of(spy.inner, result.run_id)).state == "completed"
    assert clock.monotonic() == 1.0
    assert errors.errors == []


async def test_wait_event_times_out_at_once_when_time_passed_before_its_sleep_registered() -> None:
    """A wait's deadline is fixed when the wait is asked: time moved past it before the clock
    sleep behind the wait ran (it starts in a task of its own) ends the wait at once."""
    clock = FrozenClock()
    event = asyncio.Event()
    waiter = asyncio.ensure_future(wait_event(event, clock, 1.0))
    await asyncio.sleep(0)  # one loop turn: the wait has begun, its clock sleep not yet
    clock.advance(1.0)
    with anyio.fail_after(LIMIT):
        assert await waiter is False
    assert clock.sleepers == 0
