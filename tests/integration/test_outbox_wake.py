"""Push wake for the outbox relay (K1) on real PostgreSQL: an enqueue announces its due messages
in its own transaction, and a listening relay of another process (here: another engine and
``Outbox``, which share nothing with the relay's but the database) wakes when it commits.

The relays run on a FrozenClock the tests never move: their hour-long poll cannot fire, so a
message that is published was published because of an announcement or a reconnect.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from wake_helpers import (
    Errors,
    Recorded,
    connections_refused,
    listener_pids,
    spy_on,
    until_no_listener,
)

from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._notify import ListenerLostError
from ship_sqla._outbox import (
    Outbox,
    OutboxIntent,
    OutboxMessage,
    OutboxRelay,
    create_outbox,
    ship_outbox_table,
    start_outbox_relay,
)
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

metadata = MetaData()
table = ship_outbox_table(metadata)
POLL = 3600.0


class Published(Recorded):
    """A sink that records the payloads it published."""

    async def __call__(self, message: OutboxMessage) -> None:
        self.record(message.payload)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
async def elsewhere(engine: AsyncEngine, ship_engine_url: str) -> AsyncIterator[Outbox]:
    """An outbox on a second engine: the "other process" of these tests."""
    other = create_async_engine(ship_engine_url)
    try:
        yield create_outbox(database=other, table=table)
    finally:
        await other.dispose()


@pytest.fixture
def errors() -> Errors:
    return Errors()


@pytest.fixture
def outbox(engine: AsyncEngine, ship_clock: FrozenClock, errors: Errors) -> Outbox:
    return create_outbox(database=engine, table=table, clock=ship_clock, on_error=errors)


async def live(relay: OutboxRelay) -> None:
    assert relay.listener is not None
    with anyio.fail_after(10):
        await relay.listener.wait_live()


async def parked(clock: FrozenClock) -> None:
    """Until the relay waits out its poll on the frozen clock (its only sleeper here)."""
    with anyio.fail_after(10):
        while clock.sleepers < 1:
            await anyio.lowlevel.checkpoint()


async def test_k1_an_enqueue_committed_elsewhere_wakes_a_listening_relay_never_a_rollback(
    outbox: Outbox,
    elsewhere: Outbox,
    ship_engine_url: str,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K1: an outbox enqueue is announced in its transaction: a rolled-back one is never
    delivered (the relay is not woken), a committed one in another process wakes the parked
    relay, whose clock never reaches its hour-long poll."""
    published = Published()
    uow = create_unit_of_work(elsewhere.database, repositories=lambda scope: scope)

    class Rollback(Exception):  # noqa: N818 - a signal, not an error
        pass

    async def rolled_back(_scope: TransactionScope) -> None:
        await elsewhere.enqueue("orders", "t", {"n": "rolled back"})
        raise Rollback

    async with (
        spy_on(ship_engine_url, outbox.wake_channel) as spy,
        await start_outbox_relay(outbox, "orders", published, poll_interval=POLL) as relay,
    ):
        await live(relay)
        await parked(ship_clock)
        with pytest.raises(Rollback):
            await uow.run(rolled_back)
        assert await spy.everything_before_now() == []
        await elsewhere.enqueue("orders", "t", {"n": "committed"})
        await published.wait_for(1)
        assert await spy.everything_before_now() == ["orders"]
    assert published.payloads == [{"n": "committed"}]
    assert ship_clock.monotonic() == 0.0
    assert errors == []


async def test_k1_a_killed_relay_listener_reconnects_and_publishes_what_it_missed(
    outbox: Outbox,
    elsewhere: Outbox,
    ship_engine_url: str,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K1: the relay's listener connection killed (pg_terminate_backend) is reported and,
    once it can connect again, replaced; an enqueue committed while it was down is published
    at once on the reconnect, without a poll."""
    published = Published()
    await elsewhere.enqueue("warm-up", "t", {})  # the sender's pool holds a connection
    async with await start_outbox_relay(outbox, "orders", published, poll_interval=POLL) as relay:
        await live(relay)
        assert relay.listener is not None
        pid = relay.listener.backend_pid
        async with connections_refused(ship_engine_url) as admin:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            await errors.wait_for(ListenerLostError, count=2)  # the loss, a refused reconnect
            await parked(ship_clock)
            await elsewhere.enqueue("orders", "t", {"n": "in the gap"})
        await live(relay)
        await published.wait_for(1)
        assert relay.listener.connects == 2
    assert published.payloads == [{"n": "in the gap"}]
    assert ship_clock.monotonic() == 0.0
    assert {type(e) for e in errors} == {ListenerLostError}


async def test_k8_outbox_announces_every_due_commit_and_listen_false_keeps_no_listener(
    engine: AsyncEngine, ship_engine_url: str, ship_clock: FrozenClock, errors: Errors
) -> None:
    """K1, K8 (SPEC §11): an outbox announces every committed due message's outbox id (in its
    transaction, or right after its commit, several in one notify-only transaction) and never a
    message that is not due; a relay with listen=False holds no listener (its own outbox's
    commits still wake it), one with listen=True holds one until it stops."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock, on_error=errors)
    published = Published()
    async with spy_on(ship_engine_url, outbox.wake_channel) as spy:
        quiet = await start_outbox_relay(outbox, "a", published, poll_interval=POLL, listen=False)
        async with quiet:
            assert quiet.listener is None
            await outbox.enqueue("a", "t", {"n": 1})
            await outbox.enqueue("a", "t", {"n": 2})  # right behind: after its commit
            later = ship_clock.now() + timedelta(hours=1)
            await outbox.enqueue_many("b", [OutboxIntent("t", {}, available_at=later)])
            await outbox.enqueue("c", "t", {})
            await published.wait_for(2)  # the local wake, after each commit
            assert await listener_pids(ship_engine_url) == []
            assert outbox._announcer is not None
            await outbox._announcer.flush()
            heard = await spy.everything_before_now()
            assert heard[0] == "a"
            assert set(heard) == {"a", "c"}
    listening = await start_outbox_relay(outbox, "a", published, poll_interval=POLL)
    async with listening:
        await live(listening)
        assert listening.listener is not None
        assert await listener_pids(ship_engine_url) == [listening.listener.backend_pid]
    await until_no_listener(ship_engine_url)
    assert errors == []
