"""Schedules on the in-memory backend and in the runtime (J9)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from job_helpers import ErrorLog

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._jobs import Schedule
from ship_sqla.testing import FrozenClock

START = datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)


async def _noop(ctx: Any, payload: Any) -> None:
    return None


EVERY_MINUTE = define_job("report.minutely", _noop, schedule=Schedule(cron="* * * * *"))


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def errors() -> ErrorLog:
    return ErrorLog()


@pytest.fixture
def backend(clock: FrozenClock, errors: ErrorLog) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=clock, on_error=errors)


async def test_memory_catch_up_is_one_run_and_restart_keeps_next_at(
    backend: InMemoryJobBackend, clock: FrozenClock
) -> None:
    """J9: ten missed occurrences catch up with ONE run (id <job_id>/<occurrence>), next_at moves
    past now, and re-scheduling the same trigger keeps next_at (a changed one replaces it)."""
    await backend.install_schedules([EVERY_MINUTE])
    assert backend.next_at(EVERY_MINUTE.id) == datetime(2030, 1, 1, 12, 1, tzinfo=UTC)
    clock.advance(timedelta(minutes=10))
    await backend.install_schedules([EVERY_MINUTE])  # a restart: same trigger, next_at kept
    assert backend.next_at(EVERY_MINUTE.id) == datetime(2030, 1, 1, 12, 1, tzinfo=UTC)
    assert await backend.tick_schedules([EVERY_MINUTE]) == 1
    assert await backend.tick_schedules([EVERY_MINUTE]) == 0
    [run] = backend.runs(EVERY_MINUTE.id)
    assert run.run_id == "report.minutely/2030-01-01T12:10:00Z"
    assert run.payload is None
    assert backend.next_at(EVERY_MINUTE.id) == datetime(2030, 1, 1, 12, 11, tzinfo=UTC)
    hourly = define_job(EVERY_MINUTE.id, _noop, schedule=Schedule(cron="0 * * * *"))
    await backend.install_schedules([hourly])
    assert backend.next_at(EVERY_MINUTE.id) == datetime(2030, 1, 1, 13, 0, tzinfo=UTC)


async def test_worker_ticks_and_runs_the_scheduled_job(
    backend: InMemoryJobBackend, clock: FrozenClock
) -> None:
    """J9: a worker runtime installs the schedule at start, ticks as its clock passes the
    occurrence, and runs the scheduled job."""
    ran = anyio.Event()
    seen: list[str] = []

    async def handler(ctx: Any, payload: Any) -> None:
        seen.append(ctx.run_id)
        ran.set()

    job = define_job("report.minutely", handler, schedule=Schedule(cron="* * * * *"))
    async with await start_job_runtime([job], backend=backend):
        assert backend.next_at(job.id) == datetime(2030, 1, 1, 12, 1, tzinfo=UTC)
        with anyio.fail_after(10):
            while not ran.is_set():
                clock.advance(1.0)
                for _ in range(30):
                    await anyio.lowlevel.checkpoint()
    assert seen == ["report.minutely/2030-01-01T12:01:00Z"]


async def test_tick_errors_are_reported_and_the_loop_goes_on(
    clock: FrozenClock, errors: ErrorLog
) -> None:
    """J9 + J11: a failing tick goes to report_error; the next tick fires the occurrence."""

    class Flaky(InMemoryJobBackend):
        failures = 1

        async def tick_schedules(self, definitions: Any) -> int:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("tick failed")
            return await super().tick_schedules(definitions)

    backend = Flaky(clock=clock, on_error=errors)
    async with await start_job_runtime([EVERY_MINUTE], backend=backend):
        await errors.wait_count(1)
        assert str(errors.errors[0]) == "tick failed"
        with anyio.fail_after(10):
            while not backend.runs(EVERY_MINUTE.id):
                clock.advance(1.0)
                for _ in range(30):
                    await anyio.lowlevel.checkpoint()


async def test_worker_refuses_scheduled_jobs_on_a_backend_without_tick(
    backend: InMemoryJobBackend,
) -> None:
    """J9: a backend without install_schedules/tick_schedules is no JobBackend (one contract,
    implemented whole): refused at start, naming what it lacks."""

    class NoSchedules:
        def __getattr__(self, name: str) -> Any:
            if name in {"install_schedules", "tick_schedules"}:
                raise AttributeError(name)
            return getattr(backend, name)

    with pytest.raises(ConfigurationError, match=r"missing: install_schedules, tick_schedules"):
        await start_job_runtime([EVERY_MINUTE], backend=NoSchedules())  # type: ignore[arg-type]
    runtime = await start_job_runtime([EVERY_MINUTE], backend=backend, mode="enqueue-only")
    await runtime.stop()
    assert backend.next_at(EVERY_MINUTE.id) is None
