"""What only the in-process reference LockProvider has: its ``holder()`` inspection, which the
runtime tests read. The contract it shares with the advisory provider (L1, L2) is
tests/conformance/test_lock_conformance.py."""

from __future__ import annotations

from ship_sqla.kernel import InMemoryLockProvider
from ship_sqla.testing import FrozenClock


async def test_holder_names_the_live_holder_only() -> None:
    """L1, L2: ``holder(key)`` is the live holder: none once released or once its lease ended,
    the successor once another took the key."""
    clock = FrozenClock()
    locks = InMemoryLockProvider(clock)
    assert locks.holder("a") is None
    first = await locks.acquire("a", 10)
    assert first is not None
    assert locks.holder("a") is first
    clock.advance(10)
    assert locks.holder("a") is None
    second = await locks.acquire("a", 10)
    assert second is not None
    assert locks.holder("a") is second
    await first.release()  # the lost holder's release leaves the successor in place
    assert locks.holder("a") is second
    await second.release()
    assert locks.holder("a") is None
    assert repr(second) == "InMemoryLock('a', released)"
