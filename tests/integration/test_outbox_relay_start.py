"""Issue 27, items 4 and 7, for the outbox relay: its table is checked at its start (the one
probe: MissingTablesError naming the table and the command), and a lifespan given instead of
a sink opens the sink's resources before the first claim and closes them after the drain."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._outbox import OutboxMessage, create_outbox, ship_outbox_table, start_outbox_relay
from ship_sqla.errors import ConfigurationError, LifespanFailedError, MissingTablesError
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ship_sqla._outbox import OutboxSink


async def _ignore(message: OutboxMessage) -> None:
    return None


async def test_friction_7_a_relay_without_its_table_refuses_to_start(
    ship_engine: AsyncEngine,
) -> None:
    """Issue 27 item 7: start_outbox_relay on a database without the outbox table raises
    MissingTablesError naming it and the `schema apply` command, instead of logging a claim
    error at every poll."""
    outbox = create_outbox(database=ship_engine, table=ship_outbox_table(MetaData()))
    with pytest.raises(MissingTablesError) as refused:
        await start_outbox_relay(outbox, "main", _ignore, listen=False)
    assert refused.value.missing == ("ship_outbox",)
    assert "the outbox relay needs ship_outbox" in refused.value.message
    assert refused.value.fix is not None
    assert "`ship-sqla schema apply --only outbox --outbox-table ship_outbox`" in refused.value.fix


@pytest.fixture
async def outbox(ship_engine: AsyncEngine, ship_clock: FrozenClock):
    metadata = MetaData()
    table = ship_outbox_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_outbox(database=ship_engine, table=table, clock=ship_clock)


async def test_friction_4_a_relay_lifespan_opens_the_sink_and_closes_it_after_the_drain(
    outbox,
) -> None:
    """Issue 27 item 4, O3: the lifespan is entered before the first claim and yields the
    sink; stop() lets the message in the sink finish, then exits the lifespan, once."""
    log: list[str] = []
    entered, proceed = anyio.Event(), anyio.Event()

    @contextlib.asynccontextmanager
    async def opens_the_sink() -> AsyncIterator[OutboxSink]:
        log.append("open")

        async def sink(message: OutboxMessage) -> None:
            log.append(f"publish {message.payload['n']}")
            entered.set()
            await proceed.wait()

        try:
            yield sink
        finally:
            log.append("close")

    await outbox.enqueue("main", "t", {"n": 1})
    relay = await start_outbox_relay(
        outbox, "main", lifespan=opens_the_sink, poll_interval=3600, listen=False
    )
    with anyio.fail_after(10):
        await entered.wait()
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.stop)
        with anyio.fail_after(10):
            await anyio.wait_all_tasks_blocked()
        assert log == ["open", "publish 1"]  # draining: the sink's resources stay open
        proceed.set()
    assert log == ["open", "publish 1", "close"]
    await relay.stop()
    assert log.count("close") == 1
    assert relay.delivered == 1


async def test_friction_4_a_relay_lifespan_that_raises_refuses_the_start(outbox) -> None:
    """Issue 27 item 4: a lifespan that raises refuses the start (LifespanFailedError, the
    cause chained); a sink and a lifespan, or neither, is refused with the fix."""

    @contextlib.asynccontextmanager
    async def broken() -> AsyncIterator[OutboxSink]:
        message = "the broker is down"
        raise ConnectionError(message)
        yield _ignore  # pragma: no cover

    with pytest.raises(LifespanFailedError, match="ConnectionError: the broker is down") as e:
        await start_outbox_relay(outbox, "main", lifespan=broken, listen=False)
    assert isinstance(e.value.__cause__, ConnectionError)
    with pytest.raises(ConfigurationError, match="a sink, or a lifespan that yields one"):
        await start_outbox_relay(outbox, "main", listen=False)
    with pytest.raises(ConfigurationError, match="a sink, or a lifespan that yields one"):
        await start_outbox_relay(outbox, "main", _ignore, lifespan=broken, listen=False)
