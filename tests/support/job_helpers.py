"""Helpers the job runtime's unit and conformance tests share: moving a FrozenClock until
something happened, letting the loop settle, and an ``on_error`` that records what it got.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this module
by its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ship_sqla.kernel import FrozenClock


async def settle_loop(rounds: int = 30) -> None:
    """Let every ready task run a few steps (no wall-clock wait)."""
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()


async def advance_until(
    clock: FrozenClock, done: anyio.Event, *, step: float, limit: float = 10.0
) -> None:
    """Move frozen time forward ``step`` seconds at a time until ``done`` is set.

    Small steps keep the test independent of when exactly a task parked in ``clock.sleep``.
    """
    with anyio.fail_after(limit):
        while not done.is_set():
            clock.advance(step)
            await settle_loop()


async def advance_until_awaited(
    clock: FrozenClock,
    waiting: Callable[[], Awaitable[object]],
    *,
    step: float,
    limit: float = 10.0,
) -> None:
    """Move frozen time forward ``step`` seconds at a time until ``waiting()`` returned (for
    example ``lambda: spy.wait_calls("heartbeat", 2)``)."""
    done = anyio.Event()

    async def watch() -> None:
        await waiting()
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        await advance_until(clock, done, step=step, limit=limit)


class ErrorLog:
    """An ``on_error`` that keeps what it was given and signals each arrival."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self._arrived = anyio.Event()

    def __call__(self, error: BaseException) -> None:
        self.errors.append(error)
        self._arrived.set()
        self._arrived = anyio.Event()

    def codes(self) -> list[str]:
        return [getattr(error, "code", type(error).__name__) for error in self.errors]

    async def wait_count(self, count: int, *, limit: float = 10.0) -> None:
        """Until at least ``count`` errors arrived."""
        with anyio.fail_after(limit):
            while len(self.errors) < count:
                await self._arrived.wait()

    async def wait_for(self, predicate: Any, limit: float = 5.0) -> BaseException:
        """The first error ``predicate`` accepts, waiting for it to arrive."""
        with anyio.fail_after(limit):
            while True:
                for error in self.errors:
                    if predicate(error):
                        return error
                await self._arrived.wait()
