"""The LockProvider contract (SPEC §7, L1 and L2), run against every provider: the in-process
reference (``InMemoryLockProvider`` on a FrozenClock) and PostgreSQL advisory locks
(``advisory_lock_provider`` on a real database, its lease timers on the same FrozenClock).

A ``LockWorld`` stands for one store of locks (one process's memory, one database): it makes
providers in a namespace for a "process" (for PostgreSQL, process 1 has an engine and a pool of
its own; in memory every process shares the one store, as every session shares one database)
and waits until a lock the clock or a release ended is free for others. Time moves only through
the FrozenClock; nothing sleeps on the wall clock. Tests that need something only one provider
has are parametrized to it and say why (the in-process store has no holder process to kill).

Provider-specific tests stay next to their provider: the advisory key hash, the refused
connection, the killed session and the pause hazard in tests/integration/test_advisory_locks.py,
the reference's ``holder()`` inspection in tests/unit/test_memory_locks.py.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import attrs
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import advisory_lock_provider
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import InMemoryLockProvider, Lock, LockProvider, RenewableLock
from ship_sqla.locks import advisory_lock_key
from ship_sqla.testing import FrozenClock

LEASE = 10.0
NAMESPACE = "ship_sqla"


@attrs.define
class LockWorld:
    """One store of locks and the providers on it (see the module docstring)."""

    name: str
    clock: FrozenClock
    make: Callable[[str, int], LockProvider]
    wait_freed: Callable[[Lock], Awaitable[None]]
    made: dict[tuple[str, int], LockProvider] = attrs.Factory(dict)

    def provider(self, *, namespace: str = NAMESPACE, process: int = 0) -> LockProvider:
        """The provider of ``process`` in ``namespace``: made once, then the same one."""
        key = (namespace, process)
        if key not in self.made:
            self.made[key] = self.make(namespace, process)
        return self.made[key]

    async def until_freed(self, lock: Lock) -> None:
        """Once ``lock`` was released or its lease ended: wait until its key is free for others
        (the advisory provider frees it by rolling its transaction back a moment later)."""
        with anyio.fail_after(5):
            await self.wait_freed(lock)


async def _nothing_to_wait_for(lock: Lock) -> None:
    return None


def _memory_world() -> LockWorld:
    clock = FrozenClock()
    stores: dict[str, InMemoryLockProvider] = {}

    def make(namespace: str, process: int) -> LockProvider:
        # One in-process store per namespace, shared by every "process" (there is one).
        return stores.setdefault(namespace, InMemoryLockProvider(clock))

    return LockWorld("memory", clock, make, _nothing_to_wait_for)


@pytest.fixture
async def postgres_lock_world(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> AsyncIterator[LockWorld]:
    clock = FrozenClock()
    other = create_async_engine(ship_engine_url)
    engines = {0: ship_engine, 1: other}

    def make(namespace: str, process: int) -> LockProvider:
        return advisory_lock_provider(engines[process], namespace=namespace, clock=clock)

    async def wait_freed(lock: Lock) -> None:
        await lock.wait_freed()  # type: ignore[attr-defined]

    world = LockWorld("postgres", clock, make, wait_freed)
    try:
        yield world
    finally:
        await other.dispose()


@pytest.fixture(params=["memory", "postgres"])
def locks(request: pytest.FixtureRequest) -> LockWorld:
    if request.param == "memory":
        return _memory_world()
    return request.getfixturevalue("postgres_lock_world")  # type: ignore[no-any-return]


async def acquired(provider: LockProvider, key: str, lease: float = LEASE) -> RenewableLock:
    lock = await provider.acquire(key, lease)
    assert lock is not None, f"{key!r} was expected to be free"
    assert isinstance(lock, RenewableLock)
    return lock


# --- L1: at most one holder per key -------------------------------------------------------------


async def test_one_holder_per_key_across_processes(locks: LockWorld) -> None:
    """L1: at most one holder per key, for another process and for the holder itself (not
    re-entrant); other keys are independent; a refused acquire answers None at once."""
    mine, theirs = locks.provider(), locks.provider(process=1)
    assert isinstance(mine, LockProvider)
    lock = await acquired(mine, "report")
    assert lock.held
    assert not lock.lost
    assert await theirs.acquire("report", LEASE) is None
    assert await mine.acquire("report", LEASE) is None
    other_key = await acquired(theirs, "invoice")
    await other_key.release()
    await lock.release()


async def test_concurrent_acquires_have_exactly_one_winner(locks: LockWorld) -> None:
    """L1: acquires racing for one key from two processes: exactly one gets it."""
    providers = [locks.provider(), locks.provider(process=1)]
    results: list[Lock | None] = []

    async def attempt(provider: LockProvider) -> None:
        results.append(await provider.acquire("race", LEASE))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for index in range(8):
                group.start_soon(attempt, providers[index % 2])
    winners = [lock for lock in results if lock is not None]
    assert len(results) == 8
    assert len(winners) == 1
    await winners[0].release()


async def test_release_frees_the_key(locks: LockWorld) -> None:
    """L1: a lock is freed at release (for another process, and for the holder again); release
    is idempotent and a released lock is neither held nor lost."""
    mine, theirs = locks.provider(), locks.provider(process=1)
    lock = await acquired(mine, "report")
    await lock.release()
    assert not lock.held
    assert not lock.lost
    await locks.until_freed(lock)
    successor = await acquired(theirs, "report")
    await lock.release()  # twice: changes nothing, above all not the successor's holding
    assert await mine.acquire("report", LEASE) is None
    await successor.release()
    await locks.until_freed(successor)
    again = await acquired(mine, "report")
    await again.release()


async def test_lease_expiry_frees_the_key(locks: LockWorld) -> None:
    """L1: the key is held until the lease ends on the clock, and is free from then on without
    a release."""
    mine, theirs = locks.provider(), locks.provider(process=1)
    lock = await acquired(mine, "nightly")
    locks.clock.advance(LEASE - 0.5)
    assert await theirs.acquire("nightly", LEASE) is None
    locks.clock.advance(0.5)
    await locks.until_freed(lock)
    successor = await acquired(theirs, "nightly")
    await successor.release()
    await lock.release()


# Only a provider whose holders live in other processes can lose one to a kill: the in-process
# store's holders die with the store itself.
@pytest.mark.parametrize("locks", ["postgres"], indirect=True)
async def test_the_key_is_freed_when_the_holder_process_dies(
    locks: LockWorld, ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """L1: a holder process killed with SIGKILL (no cleanup) frees its key without waiting for
    the lease: PostgreSQL ends the dead session's transaction."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    provider = locks.provider()
    async with await anyio.open_process(
        [sys.executable, str(script), ship_engine_url, NAMESPACE]
    ) as holder:
        assert holder.stdout is not None
        with anyio.fail_after(30):
            assert (await holder.stdout.receive()).strip() == b"held"
        assert await provider.acquire("singleton", LEASE) is None
        holder.kill()
        with anyio.fail_after(10):
            await holder.wait()
    # Wait on PostgreSQL's own lock queue, not a poll: the blocking lock is granted the moment
    # the server has ended the dead session.
    async with ship_engine.connect() as connection, connection.begin():
        await connection.execute(text("SET LOCAL lock_timeout = '20s'"))
        await connection.execute(
            text("SELECT pg_advisory_xact_lock(CAST(:id AS bigint))"),
            {"id": advisory_lock_key(NAMESPACE, "singleton")},
        )
    lock = await acquired(provider, "singleton")
    await lock.release()


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla import advisory_lock_provider

    async def main(url, namespace):
        provider = advisory_lock_provider(create_async_engine(url), namespace=namespace)
        lock = await provider.acquire("singleton", 600)
        print("held" if lock is not None else "refused", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main(*sys.argv[1:]))
    """
)


# --- L2: the holder can observe that its lease ended --------------------------------------------


async def test_the_holder_sees_its_lease_end(locks: LockWorld) -> None:
    """L2: ``lost`` turns true exactly when the lease ends on the clock (no release, no timer
    needed to see it) and stays true after release; ``extend`` then answers False and never
    revives the lock."""
    lock = await acquired(locks.provider(), "nightly")
    locks.clock.advance(LEASE - 0.001)
    assert lock.held
    assert not lock.lost
    locks.clock.advance(0.001)
    assert lock.lost
    assert not lock.held
    assert not await lock.extend(LEASE)
    assert lock.lost
    await locks.until_freed(lock)
    await lock.release()
    assert lock.lost
    assert not lock.held


async def test_a_lost_holder_never_touches_its_successors_lock(locks: LockWorld) -> None:
    """L2 (the pause hazard): a holder paused past its lease comes back after another process
    took the key: its release frees nothing and its extend fails; the successor keeps the key."""
    mine, theirs = locks.provider(), locks.provider(process=1)
    paused = await acquired(mine, "nightly")
    locks.clock.advance(LEASE + 1)
    await locks.until_freed(paused)
    successor = await acquired(theirs, "nightly")
    assert paused.lost
    assert not await paused.extend(LEASE)
    await paused.release()
    assert successor.held
    assert await mine.acquire("nightly", LEASE) is None
    await successor.release()


# --- extend: the runtime renews a single-runner lock at every heartbeat ------------------------


async def test_extend_restarts_the_lease_from_now(locks: LockWorld) -> None:
    """L1, L2: ``extend(lease)`` restarts the lease at ``lease`` seconds from now, as often as the
    holder renews; the key stays taken meanwhile and is freed when the last lease ends."""
    mine, theirs = locks.provider(), locks.provider(process=1)
    lock = await acquired(mine, "long")
    for _ in range(3):
        locks.clock.advance(LEASE - 2)
        assert await lock.extend(LEASE)
        assert lock.held
        assert await theirs.acquire("long", LEASE) is None
    assert await lock.extend(2 * LEASE)  # a longer lease than the first one
    locks.clock.advance(2 * LEASE - 1)
    assert not lock.lost
    assert await theirs.acquire("long", LEASE) is None
    locks.clock.advance(1)
    assert lock.lost
    await locks.until_freed(lock)
    successor = await acquired(theirs, "long")
    await successor.release()


async def test_a_released_lock_cannot_be_extended(locks: LockWorld) -> None:
    """L2: after release, ``extend`` answers False and takes nothing back."""
    mine, theirs = locks.provider(), locks.provider(process=1)
    lock = await acquired(mine, "done")
    await lock.release()
    assert not await lock.extend(LEASE)
    assert not lock.held
    await locks.until_freed(lock)
    successor = await acquired(theirs, "done")
    await successor.release()


@pytest.mark.parametrize("lease", [0, -1, float("nan"), float("inf"), 1e12, True])
async def test_a_lease_no_timer_could_honour_is_refused(locks: LockWorld, lease: float) -> None:
    """L2: a lease that would never end or never start (0, negative, nan, inf, 1e12 s, a bool)
    is refused by acquire and by extend, naming the option, before anything is taken."""
    provider = locks.provider()
    with pytest.raises(ConfigurationError, match="lock lease"):
        await provider.acquire("k", lease)
    lock = await acquired(provider, "k")
    with pytest.raises(ConfigurationError, match="lock lease"):
        await lock.extend(lease)
    assert lock.held
    await lock.release()


# --- keys and namespaces ------------------------------------------------------------------------


async def test_keys_are_namespaced(locks: LockWorld) -> None:
    """L2: a key belongs to its provider's namespace: the same key in two namespaces has two
    holders, while one namespace is shared by every process on the store."""
    ours = await acquired(locks.provider(namespace="app_a"), "singleton")
    theirs = await acquired(locks.provider(namespace="app_b", process=1), "singleton")
    assert await locks.provider(namespace="app_a", process=1).acquire("singleton", LEASE) is None
    await ours.release()
    await theirs.release()


@pytest.mark.parametrize(
    ("first", "second"),
    [("a", "A"), ("a", "a "), ("café", "cafe\u0301"), ("x" * 500, "x" * 499 + "y"), ("", " ")],
)
async def test_keys_are_compared_exactly(locks: LockWorld, first: str, second: str) -> None:
    """L1: keys that differ in case, spacing, Unicode normalization or their last character of
    a long key are different keys (no normalization, no truncation)."""
    provider = locks.provider()
    one = await acquired(provider, first)
    other = await acquired(provider, second)
    await one.release()
    await other.release()
