"""The injectable clock: FrozenClock moves only when told to, and wakes sleepers on time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

from ship_sqla.kernel import Clock, SystemClock
from ship_sqla.testing import FrozenClock


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SystemClock(), Clock)
    assert isinstance(FrozenClock(), Clock)
    assert FrozenClock().frozen
    assert not SystemClock().frozen


def test_frozen_clock_needs_an_aware_start() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        FrozenClock(datetime(2030, 1, 1))  # noqa: DTZ001 - the naive value is the point


def test_advance_moves_now_and_monotonic_together() -> None:
    clock = FrozenClock(datetime(2030, 1, 1, tzinfo=UTC))
    clock.advance(1.5)
    clock.advance(timedelta(seconds=2))
    assert clock.now() == datetime(2030, 1, 1, 0, 0, 3, 500000, tzinfo=UTC)
    assert clock.monotonic() == 3.5
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


async def test_sleep_returns_only_when_time_passes_its_deadline() -> None:
    clock = FrozenClock()
    woke: list[float] = []

    async def sleeper(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(seconds)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper, 10.0)
        tg.start_soon(sleeper, 5.0)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 2
        clock.advance(4.9)
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        clock.advance(0.1)
        await anyio.wait_all_tasks_blocked()
        assert woke == [5.0]
        clock.set(clock.now() + timedelta(seconds=60))
    assert woke == [5.0, 10.0]


async def test_cancelled_sleeper_is_not_counted() -> None:
    clock = FrozenClock()
    with anyio.move_on_after(0.01):
        await clock.sleep(100)
    assert clock.sleepers == 0
