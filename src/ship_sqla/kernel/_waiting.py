"""Waiting on an event for at most some time on an injected :class:`Clock`.

With :class:`SystemClock` a timeout is a plain ``asyncio.timeout``. Any other clock (the frozen
one in tests) may only move time through its own ``sleep``, so the wait races ``event.wait()``
against a clock sleep in two tasks.

A wait's deadline is fixed on the clock's ``monotonic`` when the wait is asked, and the clock
sleep behind it asks only for what is left of it when it starts (:func:`sleep_until`): the task
running it starts a loop turn or more later, and a frozen clock moved by a test in between must
not push the deadline out (the sleep would then wait until time moved again). A deadline already
passed ends the wait at once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._clock import Clock, SystemClock

if TYPE_CHECKING:
    from collections.abc import Coroutine

__all__ = ["LocalWake", "first_done", "sleep_until", "wait_event", "wait_event_until"]


async def first_done(*coroutines: Coroutine[Any, Any, Any]) -> int:
    """Run ``coroutines`` concurrently; return the index of the first to finish after cancelling
    (and awaiting) the others. An exception from the first to finish is raised."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also on our own cancellation: no task is ever left running behind the caller.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    winner = next(index for index, task in enumerate(tasks) if task in done)
    tasks[winner].result()
    return winner


async def sleep_until(clock: Clock, deadline: float) -> None:
    """Sleep on ``clock`` until its ``monotonic()`` reaches ``deadline``; at once (one yield)
    when it already has. The time left is read when the sleep starts, not when it was asked."""
    await clock.sleep(deadline - clock.monotonic())


async def wait_event(event: asyncio.Event, clock: Clock, seconds: float | None) -> bool:
    """True once ``event`` is set; False when ``seconds`` passed on ``clock`` first (None: no
    limit). The seconds count from this call."""
    if event.is_set():
        return True
    if seconds is None:
        await event.wait()
        return True
    return await wait_event_until(event, clock, clock.monotonic() + seconds)


async def wait_event_until(event: asyncio.Event, clock: Clock, deadline: float) -> bool:
    """True once ``event`` is set; False when ``clock.monotonic()`` reached ``deadline`` first
    (at once when it already has)."""
    if event.is_set():
        return True
    remaining = deadline - clock.monotonic()
    if remaining <= 0:
        return False
    if isinstance(clock, SystemClock):
        try:
            async with asyncio.timeout(remaining):
                await event.wait()
        except TimeoutError:
            return event.is_set()
        return True
    await first_done(event.wait(), sleep_until(clock, deadline))
    return event.is_set()


class LocalWake:
    """A job backend's local wake (J3): ``wake()`` returns every loop waiting in :meth:`wait`;
    with none waiting, it is kept, so the next wait returns at once: a wake landing while the
    loop is busy claiming is never lost."""

    __slots__ = ("_event", "_pending", "_waiters")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._pending = False
        self._waiters = 0

    def wake(self) -> None:
        if self._waiters:
            self._event.set()
            self._event = asyncio.Event()
        else:
            self._pending = True

    async def wait(self, clock: Clock, seconds: float) -> None:
        """Until woken, or ``seconds`` passed on ``clock``."""
        if self._pending:
            self._pending = False
            return
        self._waiters += 1
        try:
            await wait_event(self._event, clock, seconds)
        finally:
            self._waiters -= 1
