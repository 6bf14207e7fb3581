"""Fenced locks (F4): a lock whose every holding carries a fence number, and the rule a write
checks it by.

A lease-based lock cannot stop a holder that was paused past its lease (a stop-the-world pause,
a suspended container, a session the server ended) from still believing it holds the lock while
another process has taken it (L2's pause hazard). A fence closes that window where it matters,
at the write: every ``with_lock(key, ttl)`` draws a number greater than every earlier one for
``key`` (durably: the PostgreSQL provider keeps it in a table), and a write that carries a fence
asks the store to check it in the write's own transaction (``check_fence``): one older than the
key's newest raises :class:`StaleFenceError`, so the write's transaction rolls back.

The rule is written once here (:func:`require_current_fence`); each provider keeps its fences
(the in-memory reference in a dict, the advisory-lock provider in ``ship_lock_fences``) and holds
the lock with :func:`hold_fenced`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from ship_sqla.kernel._errors import RefusedError, StaleLeaseError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from ship_sqla.kernel._ports import Lock

__all__ = [
    "FencedLock",
    "FencingLockProvider",
    "LockHeldError",
    "StaleFenceError",
    "hold_fenced",
    "require_current_fence",
]


class LockHeldError(RefusedError, RuntimeError):
    """``with_lock`` found the key held by another holder (it never waits)."""

    code = "SHIP_SQLA_LOCK_HELD"


class StaleFenceError(StaleLeaseError, RuntimeError):
    """A fenced write carried a fence older than its key's newest: another holder took the lock
    since (F4). Raised inside the write's transaction, which must not commit."""

    code = "SHIP_SQLA_LOCK_FENCE_STALE"


@attrs.frozen
class FencedLock:
    """One holding of ``key`` (F4): ``fence`` is greater than every earlier holding's; ``lock``
    is the provider's lock (``lock.lost`` turns true when the ttl ended, L2)."""

    key: str
    fence: int
    lock: Lock = attrs.field(repr=False)

    @property
    def lost(self) -> bool:
        return self.lock.lost


@runtime_checkable
class FencingLockProvider(Protocol):
    """A lock provider with fences (F4): both providers are."""

    def with_lock(self, key: str, ttl: float) -> contextlib.AbstractAsyncContextManager[FencedLock]:
        """Hold ``key`` for at most ``ttl`` seconds with a new fence; :class:`LockHeldError` when
        another holder has it. Released when the block exits."""
        ...

    async def check_fence(self, key: str, fence: int, *, scope: Any = None) -> None:  # noqa: ANN401 - a TransactionScope
        """Refuse (:class:`StaleFenceError`) a write carrying ``fence`` when ``key`` has a newer
        one; call it inside the write's transaction (``scope``, or the ambient unit of work)."""
        ...


def require_current_fence(key: str, fence: int, newest: int | None) -> None:
    """F4's rule: a write carrying ``fence`` goes ahead only while it is ``key``'s newest
    (``newest`` None: no fence was ever drawn for ``key``)."""
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise StaleFenceError(
            f"lock {key!r}: a fence is the int with_lock gave, got {fence!r}.",
            fix="pass held.fence from `async with provider.with_lock(key, ttl) as held`.",
        )
    if newest is None or fence < newest:
        raise StaleFenceError(
            f"lock {key!r}: this write carries fence {fence}, but "
            + ("no fence was ever drawn for the key" if newest is None else f"fence {newest}")
            + " is the newest: another holder took the lock since (its ttl ended, or this"
            " process was paused past it). The write must not happen.",
            fix="do not retry the write with this fence: take the lock again (a new fence) and"
            " re-read what the write depends on.",
        )


@contextlib.asynccontextmanager
async def hold_fenced(
    key: str,
    ttl: float,
    *,
    acquire: Callable[[str, float], Awaitable[Lock | None]],
    next_fence: Callable[[str], Awaitable[int]],
) -> AsyncIterator[FencedLock]:
    """``with_lock`` for any provider: take the lock (never waiting), draw the key's next fence,
    yield both, release the lock on the way out (also when drawing the fence failed)."""
    lock = await acquire(key, ttl)
    if lock is None:
        raise LockHeldError(
            f"lock {key!r} is held by another holder.",
            fix="try again later, or use provider.acquire(key, lease) to test without raising.",
        )
    try:
        fence = await next_fence(key)
        yield FencedLock(key, fence, lock)
    finally:
        await lock.release()
