"""In-process reference :class:`~ship_sqla.kernel.LockProvider` with clock-driven leases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._durations import require_lock_lease
from ship_sqla.kernel._fences import FencedLock, hold_fenced, require_current_fence

if TYPE_CHECKING:
    import contextlib

    from ship_sqla.kernel._clock import Clock

__all__ = ["InMemoryLock", "InMemoryLockProvider"]


class InMemoryLock:
    """One holding of a key. ``lost`` is true once the lease ended before :meth:`release` (L2).

    Like the advisory-lock provider, the lease is enforced by the holder's clock: a holder that
    does not look at ``lost`` can go on believing it holds a key someone else now has. The job
    runtime closes that window with the run's fencing token (J5).
    """

    __slots__ = ("_expires_at", "_lost", "_provider", "_released", "key")

    def __init__(self, provider: InMemoryLockProvider, key: str, expires_at: float) -> None:
        self._provider = provider
        self.key = key
        self._expires_at = expires_at
        self._released = False
        self._lost = False

    @property
    def expires_at(self) -> float:
        """The clock's ``monotonic()`` reading at which the lease ends."""
        return self._expires_at

    @property
    def lost(self) -> bool:
        """True once the lease ended before :meth:`release`; stays true after it (L2)."""
        if self._released:
            return self._lost
        return self._provider.clock.monotonic() >= self._expires_at

    @property
    def held(self) -> bool:
        return not self._released and not self.lost

    async def extend(self, lease: float) -> bool:
        """Restart the lease; False once lost or released (a lost lock is never re-acquired)."""
        lease = require_lock_lease(lease)
        if not self.held:
            return False
        self._expires_at = self._provider.clock.monotonic() + lease
        return True

    async def release(self) -> None:
        """Free the key. Releasing a lost or released lock changes nothing: the key may belong
        to another holder by now, and a stale holder must never free it."""
        if self._released:
            return
        self._lost = self.lost
        self._released = True
        self._provider.forget(self)

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self.lost else "held")
        return f"InMemoryLock({self.key!r}, {state})"


class InMemoryLockProvider:
    """At most one holder per key in this process (L1); a key is freed at release and once the
    holder's lease has passed on ``clock`` (L2). Time comes only from ``clock.monotonic()``."""

    __slots__ = ("_fences", "_holders", "clock")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._holders: dict[str, InMemoryLock] = {}
        self._fences: dict[str, int] = {}

    def with_lock(self, key: str, ttl: float) -> contextlib.AbstractAsyncContextManager[FencedLock]:
        """F4: hold ``key`` for at most ``ttl`` seconds with a fence above every earlier one."""
        return hold_fenced(key, ttl, acquire=self.acquire, next_fence=self._next_fence)

    async def check_fence(self, key: str, fence: int, *, scope: Any = None) -> None:  # noqa: ANN401, ARG002 - the port's
        """F4: :class:`~ship_sqla.errors.StaleFenceError` unless ``fence`` is ``key``'s newest
        (``scope`` is the PostgreSQL provider's; this store has no transactions)."""
        require_current_fence(key, fence, self._fences.get(key))

    async def _next_fence(self, key: str) -> int:
        fence = self._fences.get(key, 0) + 1
        self._fences[key] = fence
        return fence

    async def acquire(self, key: str, lease: float) -> InMemoryLock | None:
        lease = require_lock_lease(lease)
        now = self.clock.monotonic()
        holder = self._holders.get(key)
        if holder is not None and holder.expires_at > now:
            return None
        lock = InMemoryLock(self, key, now + lease)
        self._holders[key] = lock
        return lock

    def forget(self, lock: InMemoryLock) -> None:
        """Drop ``lock`` as the holder of its key, only if it still is the holder."""
        if self._holders.get(lock.key) is lock:
            del self._holders[lock.key]

    def holder(self, key: str) -> InMemoryLock | None:
        """The live holder of ``key`` (expired holders are not live)."""
        lock = self._holders.get(key)
        if lock is None or lock.lost:
            return None
        return lock
