"""Fenced locks (SPEC §12, F4) on both providers: the in-process reference
(``InMemoryLockProvider``) and PostgreSQL advisory locks with the fence table
(``advisory_lock_provider(..., fence_table=ship_lock_fences_table(metadata))``).

A ``FenceWorld`` makes a provider per "process" and performs a fenced write: the check and the
write in one transaction (for PostgreSQL a ``uow.run`` whose INSERT lands only if the check
passed; in memory the check then a list append). The SIGSTOPped holder, a real paused process,
is in tests/integration/test_fenced_locks.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import attrs
import pytest
from fenced_holder import fences, metadata, writes
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import TransactionScope, advisory_lock_provider, create_unit_of_work
from ship_sqla.errors import ConfigurationError, LockHeldError, StaleFenceError
from ship_sqla.kernel import InMemoryLockProvider
from ship_sqla.locks import FencedLock, FencingLockProvider
from ship_sqla.testing import FrozenClock

TTL = 10.0


@attrs.define
class FenceWorld:
    name: str
    clock: FrozenClock
    provider: Callable[[int], Any]
    write: Callable[[Any, str, int], Awaitable[None]]
    count: Callable[[], Awaitable[int]]


def _memory_world() -> FenceWorld:
    clock = FrozenClock()
    store = InMemoryLockProvider(clock)
    landed: list[tuple[str, int]] = []

    async def write(provider: Any, key: str, fence: int) -> None:
        await provider.check_fence(key, fence)
        landed.append((key, fence))

    async def count() -> int:
        return len(landed)

    return FenceWorld("memory", clock, lambda _process: store, write, count)


@pytest.fixture
async def postgres_fence_world(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> AsyncIterator[FenceWorld]:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    clock = FrozenClock()
    other = create_async_engine(ship_engine_url)
    engines = {0: ship_engine, 1: other}
    providers = {
        n: advisory_lock_provider(engine, clock=clock, fence_table=fences)
        for n, engine in engines.items()
    }
    uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)

    async def write(provider: Any, key: str, fence: int) -> None:
        async def guarded(scope: TransactionScope) -> None:
            await provider.check_fence(key, fence)
            await scope.connection.execute(insert(writes).values(key=key, fence=fence))

        await uow.run(guarded)

    async def count() -> int:
        async with ship_engine.connect() as connection:
            return int(
                (await connection.execute(select(func.count()).select_from(writes))).one()[0]
            )

    try:
        yield FenceWorld("postgres", clock, providers.__getitem__, write, count)
    finally:
        await other.dispose()


@pytest.fixture(params=["memory", "postgres"])
def world(request: pytest.FixtureRequest) -> FenceWorld:
    if request.param == "memory":
        return _memory_world()
    return request.getfixturevalue("postgres_fence_world")  # type: ignore[no-any-return]


async def test_f4_every_holding_draws_a_greater_fence(world: FenceWorld) -> None:
    """F4: each ``with_lock`` of a key yields a fence greater than every earlier one, whichever
    process holds it; keys have fences of their own; the lock is released on exit."""
    mine, theirs = world.provider(0), world.provider(1)
    assert isinstance(mine, FencingLockProvider)
    seen = []
    for provider in (mine, theirs, mine, theirs):
        async with provider.with_lock("ledger", TTL) as held:
            assert isinstance(held, FencedLock)
            assert not held.lost
            seen.append(held.fence)
    assert seen == sorted(set(seen))
    async with mine.with_lock("other-key", TTL) as held:
        assert held.fence == 1


async def test_f4_a_held_key_is_refused_not_waited_for(world: FenceWorld) -> None:
    """F4 over L1: ``with_lock`` on a key another holder has raises LockHeldError at once and
    draws no fence."""
    mine, theirs = world.provider(0), world.provider(1)
    async with mine.with_lock("ledger", TTL) as held:
        with pytest.raises(LockHeldError, match="ledger"):
            async with theirs.with_lock("ledger", TTL):
                pass  # pragma: no cover - never entered
    async with theirs.with_lock("ledger", TTL) as after:
        assert after.fence == held.fence + 1


async def test_f4_a_stale_holder_has_every_fenced_write_refused(world: FenceWorld) -> None:
    """F4: a holder whose ttl ended (the pause hazard, L2) while another took the lock still
    believes it may write; every write it fences is refused with StaleFenceError and nothing
    of it lands, while the newer holder's writes land."""
    mine, theirs = world.provider(0), world.provider(1)
    async with mine.with_lock("ledger", TTL) as stale:
        await world.write(mine, "ledger", stale.fence)
        world.clock.advance(TTL + 1)
        assert stale.lost
        freed = getattr(stale.lock, "wait_freed", None)
        if freed is not None:  # the advisory lock's timer rolls its transaction back
            with anyio.fail_after(5):
                await freed()
        async with theirs.with_lock("ledger", TTL) as fresh:
            await world.write(theirs, "ledger", fresh.fence)
            for _ in range(5):
                with pytest.raises(StaleFenceError, match="another holder took the lock"):
                    await world.write(mine, "ledger", stale.fence)
    assert await world.count() == 2


async def test_f4_bad_fences_are_refused(world: FenceWorld) -> None:
    """F4: a fence never drawn for the key, or not an int, is refused like a stale one."""
    provider = world.provider(0)
    for fence in (1, 0):
        with pytest.raises(StaleFenceError, match="no fence was ever drawn"):
            await world.write(provider, "never-locked", fence)
    with pytest.raises(StaleFenceError, match="is the int with_lock gave"):
        await world.write(provider, "never-locked", True)  # type: ignore[arg-type]
    assert await world.count() == 0


@pytest.mark.parametrize("world", ["postgres"], indirect=True)
async def test_f4_postgres_checks_only_inside_a_unit_of_work(world: FenceWorld) -> None:
    """F4 (PostgreSQL): a fence check outside any unit of work protects nothing and is refused;
    a provider without a fence table says what it needs."""
    provider = world.provider(0)
    async with provider.with_lock("ledger", TTL) as held:
        with pytest.raises(ConfigurationError, match="outside any unit of work"):
            await provider.check_fence("ledger", held.fence)
    bare = advisory_lock_provider(provider._engine)
    with pytest.raises(ConfigurationError, match="fence table"):
        bare.with_lock("ledger", TTL)
