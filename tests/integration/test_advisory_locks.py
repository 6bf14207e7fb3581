"""What only the advisory-lock provider has (SPEC §7): its documented 64-bit key space, what
PostgreSQL itself shows, a session the server ends, a database that refuses connections, and
the pause hazard of a lease kept by the holder's clock.

The LockProvider contract both providers share (L1: one holder per key, freed at release, at
lease expiry and when the holder process dies; L2: the holder sees its lease end; extend; bad
leases; namespaces) is tests/conformance/test_lock_conformance.py.
"""

from __future__ import annotations

import hashlib
import socket

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import advisory_lock_provider
from ship_sqla.errors import ConfigurationError, DatabaseUnavailableError
from ship_sqla.locks import AdvisoryLock, advisory_lock_key
from ship_sqla.testing import FrozenClock


async def held_lock_ids(engine: AsyncEngine) -> set[int]:
    async with engine.connect() as connection:
        result = await connection.execute(
            text(
                "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks"
                " WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
            )
        )
        return {(value + 2**63) % 2**64 - 2**63 for value in result.scalars()}


def test_key_hash_is_documented_and_stable() -> None:
    """L2: keys are hashed with their namespace into one signed 64-bit space: the first 8 bytes
    of sha256(namespace + NUL + key), big-endian."""
    digest = hashlib.sha256(b"ship_sqla\x00jobs:report").digest()
    assert advisory_lock_key("ship_sqla", "jobs:report") == int.from_bytes(
        digest[:8], "big", signed=True
    )
    assert advisory_lock_key("ship_sqla", "k") != advisory_lock_key("other_app", "k")
    assert -(2**63) <= advisory_lock_key("x", "y") < 2**63


async def test_postgres_shows_the_lock_until_release_or_lease_end(
    ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """L1: the lock is PostgreSQL's advisory lock on the documented id (``pg_locks`` shows it,
    granted) and is gone from ``pg_locks`` once released or once the lease timer has rolled its
    transaction back."""
    provider = advisory_lock_provider(ship_engine, clock=ship_clock)
    released = await provider.acquire("report", 30)
    expiring = await provider.acquire("nightly", 10)
    assert isinstance(released, AdvisoryLock)
    assert isinstance(expiring, AdvisoryLock)
    assert (
        released.lock_id == provider.lock_id("report") == advisory_lock_key("ship_sqla", "report")
    )
    assert await held_lock_ids(ship_engine) == {released.lock_id, expiring.lock_id}
    await released.release()
    ship_clock.advance(10)
    with anyio.fail_after(5):
        await released.wait_freed()
        await expiring.wait_freed()
    assert await held_lock_ids(ship_engine) == set()


async def test_pause_hazard_lost_is_read_off_the_clock_before_the_key_is_freed(
    ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """L2 (the pause hazard): PostgreSQL never expires an advisory lock; the lease is the
    holder's clock. The instant the lease ends, ``lost`` is true, before the lease timer has
    even run to free the key (as in a holder paused past its lease): a holder that checks
    ``lost`` before acting never acts on an ended lease."""
    provider = advisory_lock_provider(ship_engine, clock=ship_clock)
    lock = await provider.acquire("nightly", 10)
    assert isinstance(lock, AdvisoryLock)
    ship_clock.advance(10)
    # No await since the advance: the timer task has not run, the transaction is still open.
    assert lock.lost
    assert not lock._freed.is_set()
    with anyio.fail_after(5):
        await lock.wait_freed()
    assert lock.lock_id not in await held_lock_ids(ship_engine)


async def test_a_session_the_server_ends_is_reported_lost_on_extend(
    ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """L1, L2: when the server ends the holding session (restart, idle timeout) the lock is
    gone; the holder learns it at its next extend (False, then ``lost``), never by raising."""
    provider = advisory_lock_provider(ship_engine, clock=ship_clock)
    lock = await provider.acquire("fragile", 30)
    assert lock is not None
    async with ship_engine.connect() as admin:
        await admin.execute(
            text(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()"
            )
        )
        await admin.commit()
    assert not await lock.extend(30)
    assert lock.lost
    other = await provider.acquire("fragile", 30)
    assert other is not None
    await other.release()


async def test_acquire_on_a_refused_connection_is_the_typed_error() -> None:
    """L1 (outage): acquire on a database that refuses connections raises
    DatabaseUnavailableError (the driver's OSError chained); no lock is held."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{port}/none")
    try:
        with pytest.raises(DatabaseUnavailableError) as raised:
            await advisory_lock_provider(engine).acquire("k", 30)
        assert isinstance(raised.value.__cause__, OSError)
    finally:
        await engine.dispose()


async def test_the_provider_needs_an_engine_and_a_namespace(ship_engine: AsyncEngine) -> None:
    """L1, L2: each held lock needs a connection of its own (an AsyncEngine, not a connection)
    and keys need a namespace: both refused when the provider is made."""
    async with ship_engine.connect() as connection:
        with pytest.raises(ConfigurationError, match="needs an AsyncEngine"):
            advisory_lock_provider(connection)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="namespace must not be empty"):
        advisory_lock_provider(ship_engine, namespace="")
