"""The advisory-lock LockProvider on real PostgreSQL: L1 (one holder, freed at release, at lease
expiry and at process death) and L2 (loss observable, documented 64-bit key space)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._locks import AdvisoryLock, advisory_lock_key, advisory_lock_provider
from ship_sqla.kernel import ConfigurationError, FrozenClock
from ship_sqla.kernel._errors import DatabaseUnavailableError
from ship_sqla.kernel._ports import LockProvider, RenewableLock


@pytest.fixture
async def other_engine(ship_engine_url: str) -> AsyncIterator[AsyncEngine]:
    """A second engine (its own pool) on the same database: another 'process' for L1."""
    engine = create_async_engine(ship_engine_url)
    try:
        yield engine
    finally:
        await engine.dispose()


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


async def test_one_holder_across_engines_until_release(
    ship_engine: AsyncEngine, other_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """L1: at most one holder per key across two engines (two pools, two sessions); release
    frees the key for the other; different keys do not interfere."""
    mine = advisory_lock_provider(ship_engine, clock=ship_clock)
    theirs = advisory_lock_provider(other_engine, clock=ship_clock)
    assert isinstance(mine, LockProvider)
    lock = await mine.acquire("report", 30)
    assert isinstance(lock, AdvisoryLock)
    assert isinstance(lock, RenewableLock)
    assert lock.held
    assert not lock.lost
    assert mine.lock_id("report") in await held_lock_ids(ship_engine)
    assert await theirs.acquire("report", 30) is None
    assert await mine.acquire("report", 30) is None  # not re-entrant either
    other_key = await theirs.acquire("invoice", 30)
    assert other_key is not None
    await lock.release()
    assert not lock.lost
    assert not lock.held
    with anyio.fail_after(5):
        await lock.wait_freed()
    again = await theirs.acquire("report", 30)
    assert again is not None
    await again.release()
    await other_key.release()
    await lock.release()  # twice is harmless
    assert await held_lock_ids(ship_engine) == set()


async def test_lease_expiry_frees_the_lock_and_is_observable(
    ship_engine: AsyncEngine, other_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """L1, L2: when the local lease timer fires the transaction is rolled back and another
    session can take the key; the holder sees lost at once, and extend answers False."""
    mine = advisory_lock_provider(ship_engine, clock=ship_clock)
    theirs = advisory_lock_provider(other_engine, clock=ship_clock)
    lock = await mine.acquire("nightly", 10)
    assert lock is not None
    ship_clock.advance(9)
    assert not lock.lost
    ship_clock.advance(1)
    assert lock.lost
    assert not lock.held
    with anyio.fail_after(5):
        await lock.wait_freed()
    assert not await lock.extend(10)
    successor = await theirs.acquire("nightly", 10)
    assert successor is not None
    await lock.release()  # a lost holder's release cannot free the successor's lock
    assert await mine.acquire("nightly", 10) is None
    await successor.release()


async def test_extend_restarts_the_lease(ship_engine: AsyncEngine, ship_clock: FrozenClock) -> None:
    """L2: extend restarts the lease (the runtime extends at every heartbeat), so the timer does
    not fire while the holder keeps extending."""
    provider = advisory_lock_provider(ship_engine, clock=ship_clock)
    lock = await provider.acquire("long", 10)
    assert lock is not None
    for _ in range(3):
        ship_clock.advance(8)
        assert await lock.extend(10)
        await asyncio.sleep(0)
        assert not lock.lost
    assert provider.lock_id("long") in await held_lock_ids(ship_engine)
    await lock.release()


async def test_a_dead_session_is_reported_lost_on_extend(
    ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """L1, L2: when the server ends the holding session (restart, idle timeout) the lock is
    gone; the holder learns it at its next extend."""
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


@pytest.mark.parametrize("lease", [0, -1, float("nan"), float("inf"), 1e12])
async def test_lease_must_be_finite_positive_and_bounded(
    ship_engine: AsyncEngine, lease: float
) -> None:
    """L2: a lease the local timer could never honour (0, negative, nan, inf, 1e12 s) is
    refused before a connection is taken, naming the option."""
    provider = advisory_lock_provider(ship_engine)
    with pytest.raises(ConfigurationError, match="lock lease"):
        await provider.acquire("k", lease)


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


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._locks import advisory_lock_provider

    async def main(url):
        provider = advisory_lock_provider(create_async_engine(url))
        lock = await provider.acquire("singleton", 600)
        print("held" if lock is not None else "refused", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.timeout(60)
async def test_lock_is_freed_when_the_holder_process_dies(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """L1: a subprocess acquires the lock and is killed (SIGKILL, no cleanup): PostgreSQL ends
    its session, so the key is free again without waiting for the lease."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen(  # noqa: ASYNC220 - a real process is the point of this test
        [sys.executable, str(script), ship_engine_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        provider = advisory_lock_provider(ship_engine)
        assert await provider.acquire("singleton", 30) is None
        holder.kill()
        holder.wait(timeout=10)
        # A real process died: poll the database for its session's end, with a deadline.
        deadline = time.monotonic() + 20
        lock = await provider.acquire("singleton", 30)
        while lock is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            lock = await provider.acquire("singleton", 30)
        assert lock is not None, "the dead holder's lock was never freed"
        await lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
