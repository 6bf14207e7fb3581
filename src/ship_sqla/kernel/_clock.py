"""One clock for the whole process, injectable so tests freeze and advance time.

Production uses :class:`SystemClock`. Tests use :class:`FrozenClock`, whose ``sleep`` returns
only when the test advances time past the sleeper's deadline: no test ever waits on the wall
clock for an event.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import reprlib
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from ship_sqla.kernel._errors import ConfigurationError


@runtime_checkable
class Clock(Protocol):
    """What ship_sqla reads time from. ``now`` is timezone-aware UTC."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    @property
    def frozen(self) -> bool:
        """True when SQL must be given ``now`` instead of using the database's ``now()``."""
        ...


class SystemClock:
    """The wall clock. SQL uses the database's ``now()`` when this clock is in force."""

    frozen = False

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def _as_seconds(delta: float | timedelta) -> float:
    return delta.total_seconds() if isinstance(delta, timedelta) else float(delta)


class FrozenClock:
    """A clock that moves only when told to.

    ``sleep`` parks the caller until :meth:`advance` (or :meth:`set`) moves time to or past its
    deadline; ``sleep(0)`` yields once. Not thread-safe: use it from one event loop.
    """

    frozen = True

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            start = datetime(2030, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            msg = "FrozenClock needs a timezone-aware start; pass datetime(..., tzinfo=UTC)."
            raise ValueError(msg)
        self._now = start.astimezone(UTC)
        self._mono = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many tasks are parked in :meth:`sleep` (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def advance(self, delta: float | timedelta) -> datetime:
        """Move time forward by ``delta`` (seconds or a timedelta) and wake due sleepers."""
        seconds = _as_seconds(delta)
        if seconds < 0:
            msg = f"FrozenClock.advance cannot go backwards (got {seconds} s); use set()."
            raise ValueError(msg)
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        self._wake_due()
        return self._now

    def set(self, when: datetime) -> datetime:
        """Jump to ``when`` (timezone-aware); only forward jumps wake sleepers."""
        if when.tzinfo is None:
            msg = "FrozenClock.set needs a timezone-aware datetime."
            raise ValueError(msg)
        delta = (when - self._now).total_seconds()
        self._now = when.astimezone(UTC)
        self._mono += max(0.0, delta)
        self._wake_due()
        return self._now

    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


def require_aware(when: object, name: str) -> datetime:
    """``when`` itself; anything but a datetime (a str, an int, a ``date``), a naive datetime (no
    time zone, or a tzinfo whose ``utcoffset()`` is None), or one that leaves the datetime range
    when converted to UTC is a :class:`ConfigurationError` naming ``name``. Every time a caller
    hands the library goes through here (enqueue's ``run_at``, settlements, ``sleep_until``)."""
    if not isinstance(when, datetime):
        raise ConfigurationError(
            f"{name} must be a timezone-aware datetime, got {type(when).__name__}"
            f" {reprlib.repr(when)}.",
            fix="pass datetime(..., tzinfo=UTC) or clock.now() + timedelta(...); parse text"
            " with datetime.fromisoformat first.",
        )
    # A tzinfo whose utcoffset() is None is no time zone at all: naive, like no tzinfo (J23).
    if when.tzinfo is None or when.utcoffset() is None:
        raise ConfigurationError(
            f"{name} must be timezone-aware, got the naive datetime {when.isoformat()}.",
            fix="pass datetime(..., tzinfo=UTC) or clock.now() + timedelta(...).",
        )
    try:
        when.astimezone(UTC)
    except OverflowError:
        # datetime.max at UTC-23h, datetime.min at UTC+23h: accepted, then unstorable (J23).
        raise ConfigurationError(
            f"{name} {when.isoformat()} is out of range once converted to UTC.",
            fix="pass a time between the years 1 and 9999 in UTC.",
        ) from None
    return when
