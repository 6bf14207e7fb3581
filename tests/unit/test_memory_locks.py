"""InMemoryLockProvider: the in-process reference of the LockProvider contract (L1, L2)."""

from __future__ import annotations

import pytest

from ship_sqla.kernel import (
    ConfigurationError,
    FrozenClock,
    InMemoryLockProvider,
    LockProvider,
    RenewableLock,
)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


async def test_one_holder_per_key(clock):
    """L1: at most one holder per key; other keys are independent."""
    locks = InMemoryLockProvider(clock)
    assert isinstance(locks, LockProvider)
    first = await locks.acquire("a", 10)
    assert first is not None
    assert isinstance(first, RenewableLock)
    assert await locks.acquire("a", 10) is None
    assert await locks.acquire("b", 10) is not None


async def test_release_frees_the_key(clock):
    """L1: a lock is freed at release; release is idempotent."""
    locks = InMemoryLockProvider(clock)
    first = await locks.acquire("a", 10)
    assert first is not None
    await first.release()
    await first.release()
    assert not first.lost
    second = await locks.acquire("a", 10)
    assert second is not None


async def test_lease_expiry_frees_the_key_and_marks_the_holder_lost(clock):
    """L1/L2: at lease expiry (by the clock) the key is free and the old holder sees ``lost``."""
    locks = InMemoryLockProvider(clock)
    first = await locks.acquire("a", 10)
    assert first is not None
    clock.advance(9.9)
    assert not first.lost
    assert await locks.acquire("a", 10) is None
    clock.advance(0.1)
    assert first.lost
    assert locks.holder("a") is None
    second = await locks.acquire("a", 10)
    assert second is not None
    assert locks.holder("a") is second


async def test_a_lost_holder_never_frees_or_extends_the_new_holders_lock(clock):
    """L2: the paused (lost) holder's release and extend change nothing for the new holder."""
    locks = InMemoryLockProvider(clock)
    first = await locks.acquire("a", 10)
    assert first is not None
    clock.advance(11)
    second = await locks.acquire("a", 10)
    assert second is not None
    await first.release()
    assert not await first.extend(10)
    assert locks.holder("a") is second
    assert await locks.acquire("a", 10) is None


async def test_extend_restarts_the_lease(clock):
    """L2: a live holder extends its lease from now; a released one cannot."""
    locks = InMemoryLockProvider(clock)
    lock = await locks.acquire("a", 10)
    assert lock is not None
    clock.advance(8)
    assert await lock.extend(10)
    clock.advance(8)
    assert not lock.lost
    assert await locks.acquire("a", 10) is None
    await lock.release()
    assert not await lock.extend(10)


async def test_lease_must_be_positive(clock):
    locks = InMemoryLockProvider(clock)
    with pytest.raises(ConfigurationError, match="positive"):
        await locks.acquire("a", 0)
