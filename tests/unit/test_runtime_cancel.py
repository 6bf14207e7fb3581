"""The runtime's side of an operator's cancel (K2) on the in-memory backend: the paths a plain
end-to-end run does not take (a cancel before the handler started, a handler that swallows
its cancellation, a request for a run held elsewhere, the watch's lifetime). End-to-end cancel
on every backend: tests/conformance/test_job_cancel_pause_conformance.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from job_helpers import ErrorLog, record_of, settle_loop
from spy_backend import SpyBackend

from ship_sqla import create_job_operations, define_job, start_job_runtime
from ship_sqla.jobs import Concurrency
from ship_sqla.kernel import InMemoryJobBackend, InMemoryLockProvider
from ship_sqla.testing import FrozenClock


def allow(permission: str, operation: str) -> bool:
    return True


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


class GatedLocks:
    """A lock provider whose ``acquire`` waits for ``gate``: a run stays between its claim and
    its handler's start for as long as the test wants."""

    def __init__(self, clock: FrozenClock) -> None:
        self.inner = InMemoryLockProvider(clock)
        self.gate = anyio.Event()
        self.asked = anyio.Event()

    async def acquire(self, key: str, lease: float) -> Any:
        self.asked.set()
        await self.gate.wait()
        return await self.inner.acquire(key, lease)


async def test_k2_a_run_cancelled_before_its_handler_started_never_runs(clock):
    """K2: a cancel that arrives while the run waits for its single-runner lock stops it before
    the handler starts: the handler never runs, the run ends cancelled, attempt counted."""
    errors = ErrorLog()
    locks = GatedLocks(clock)
    backend = SpyBackend(InMemoryJobBackend(clock=clock, on_error=errors))
    ops = create_job_operations(backend.inner, authorizer=allow)
    ran: list[str] = []

    async def handler(ctx: Any, payload: Any) -> None:
        ran.append(ctx.run_id)

    job = define_job(
        "k2.unstarted",
        handler,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda _payload: "k"),
    )
    result = await backend.enqueue(job, {})
    assert result.run_id is not None
    async with await start_job_runtime([job], backend=backend, lock_provider=locks):
        with anyio.fail_after(10):
            await locks.asked.wait()
        assert (await ops.cancel(result.run_id)).outcome == "requested"
        await settle_loop()
        locks.gate.set()
        await backend.wait_settled("cancel", 1)
    assert ran == []
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("cancelled", 1)
    assert errors.errors == []


async def test_k2_a_handler_that_swallows_its_cancel_still_ends_the_run_cancelled(clock):
    """K2: a handler that catches the cancellation and returns may have stopped half-way, so its
    run still ends cancelled (not completed), after one attempt."""
    backend = SpyBackend(InMemoryJobBackend(clock=clock))
    ops = create_job_operations(backend.inner, authorizer=allow)
    started = anyio.Event()

    async def stubborn(ctx: Any, payload: Any) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except BaseException:
            return

    job = define_job("k2.swallowed", stubborn, payload=dict)
    result = await backend.enqueue(job, {})
    assert result.run_id is not None
    async with await start_job_runtime([job], backend=backend):
        with anyio.fail_after(10):
            await started.wait()
        await ops.cancel(result.run_id)
        await backend.wait_settled("cancel", 1)
    assert backend.settled("complete") == []
    assert (await record_of(backend, result.run_id)).state == "cancelled"


async def test_k2_a_cancel_of_a_run_another_process_holds_changes_nothing_here(clock):
    """K2: a runtime told of a cancel of a run it does not hold (another process's, or finished
    here already) cancels nothing and reports nothing; its own runs go on."""
    errors = ErrorLog()
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    done = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        done.set()

    job = define_job("k2.elsewhere", handler, payload=dict)
    async with await start_job_runtime([job], backend=backend):
        backend._cancel_requested("a-run-held-elsewhere")
        result = await backend.enqueue(job, {})
        with anyio.fail_after(10):
            await done.wait()
        backend._cancel_requested(str(result.run_id))
        await settle_loop()
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert errors.errors == []


async def test_k2_a_runtime_watches_cancel_requests_only_while_it_runs(clock):
    """K2: a worker runtime subscribes to its backend's cancel requests when it starts and
    unsubscribes when it stopped (an enqueue-only runtime never does)."""
    backend = InMemoryJobBackend(clock=clock)

    async def _noop(_ctx: object, _payload: object) -> None:
        return None

    job = define_job("k2.watch", _noop, payload=dict)
    watchers = backend._cancel_watchers
    enqueue_only = await start_job_runtime([job], backend=backend, mode="enqueue-only")
    assert watchers == []
    await enqueue_only.stop()
    runtime = await start_job_runtime([job], backend=backend)
    assert len(watchers) == 1
    await runtime.stop()
    assert watchers == []
