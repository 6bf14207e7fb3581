"""The relay's pipelining on real PostgreSQL: while a full batch is completed the next one is
already being claimed. Nothing may be completed before it is published, ordered mode keeps
each key's order, a batch claimed ahead is handed back when the relay stops, and a failed
completion is retried in place rather than republished."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._outbox import (
    Backoff,
    Outbox,
    OutboxIntent,
    OutboxMessage,
    create_outbox,
    ship_outbox_table,
    start_outbox_relay,
)
from ship_sqla.kernel import OutboxSettlement
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)


class AckFailedError(Exception):
    pass


class ClaimFailedError(Exception):
    pass


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def errors() -> list[BaseException]:
    return []


@pytest.fixture
def outbox(engine: AsyncEngine, ship_clock: FrozenClock, errors: list[BaseException]) -> Outbox:
    return create_outbox(
        database=engine,
        table=table,
        clock=ship_clock,
        max_attempts=5,
        backoff=Backoff(base=10.0, jitter="none"),
        on_error=errors.append,
    )


class Traced:
    """Wraps an outbox's claim and settle (the relay's one batch settle: completions, failures
    and releases) to record how they overlap."""

    def __init__(self, outbox: Outbox) -> None:
        self.completing = 0
        self.claims_during_complete = 0
        self.completed: set[uuid.UUID] = set()
        self.fail_next_complete = False
        self.fail_next_claim_during_complete = False
        self._claim = outbox.claim
        self._settle = outbox.settle
        outbox.claim = self.claim  # type: ignore[method-assign]
        outbox.settle = self.settle  # type: ignore[method-assign]

    async def claim(self, *args: Any, **kwargs: Any) -> list[OutboxMessage]:
        if self.completing:
            self.claims_during_complete += 1
            if self.fail_next_claim_during_complete:
                self.fail_next_claim_during_complete = False
                raise ClaimFailedError("database unreachable")
        return await self._claim(*args, **kwargs)

    async def settle(self, settlements: list[OutboxSettlement], **kwargs: Any) -> list[Any]:
        self.completing += 1
        try:
            await anyio.lowlevel.checkpoint()  # let a claim started alongside begin
            if self.fail_next_complete:
                self.fail_next_complete = False
                raise AckFailedError("completion lost")
            outcomes = await self._settle(settlements, **kwargs)
        finally:
            self.completing -= 1
        for settlement, outcome in zip(settlements, outcomes, strict=True):
            if outcome == "delivered":
                self.completed.add(settlement.message_id)
        return outcomes


async def statuses(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with engine.connect() as c:
        result = await c.execute(
            select(table.c.state, table.c.attempts).order_by(table.c.created_at, table.c.id)
        )
        return [(r.state, r.attempts) for r in result]


async def until_parked(clock: FrozenClock) -> None:
    with anyio.fail_after(10):
        while clock.sleepers < 1:
            await anyio.lowlevel.checkpoint()


async def test_ordered_pipelined_relay_keeps_each_keys_order_and_completes_after_publish(
    engine, outbox, ship_clock
):
    """O2/O3 ordered mode with pipelining: the next batch is claimed while the previous one is
    completed, yet each key's messages are published in enqueue order, each only after the
    key's previous message was completed, and every message is delivered exactly once."""
    keys = [f"k{n}" for n in range(4)]
    intents = [OutboxIntent("t", {"n": n}, ordering_key=keys[n % 4]) for n in range(40)]
    ids = await outbox.enqueue_many("main", intents)
    key_of = {i: keys[n % 4] for n, i in enumerate(ids)}
    traced = Traced(outbox)
    published: list[uuid.UUID] = []
    out_of_turn: list[uuid.UUID] = []
    done = anyio.Event()

    async def sink(message: OutboxMessage) -> None:
        earlier = [i for i in ids[: ids.index(message.id)] if key_of[i] == message.ordering_key]
        if earlier and earlier[-1] not in traced.completed:
            out_of_turn.append(message.id)
        published.append(message.id)
        if len(published) == len(ids):
            done.set()

    async with await start_outbox_relay(
        outbox, "main", sink, batch_size=4, ordered=True, poll_interval=3600
    ) as relay:
        with anyio.fail_after(20):
            await done.wait()
    assert out_of_turn == []
    by_key: dict[str, list[uuid.UUID]] = defaultdict(list)
    for message_id in published:
        by_key[key_of[message_id]].append(message_id)
    assert by_key == {k: [i for i in ids if key_of[i] == k] for k in keys}
    assert sorted(published) == sorted(ids)
    assert traced.claims_during_complete > 0  # the pipeline did run
    assert await statuses(engine) == [("delivered", 1)] * 40
    assert relay.delivered == 40


async def test_failed_completion_is_retried_in_place_and_nothing_is_published_twice(
    engine, outbox, ship_clock, errors
):
    """O3/O4 with pipelining: when a batch's completion fails, the relay keeps the batch in
    memory and retries the completion after its error backoff (fenced on the lease token)
    instead of dropping it and republishing it after the lease; the batch claimed ahead waits
    and is published next. Every message is published once and ends delivered on attempt 1."""
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(6)]
    traced = Traced(outbox)
    traced.fail_next_complete = True
    published: list[uuid.UUID] = []

    async def sink(message: OutboxMessage) -> None:
        published.append(message.id)

    async with await start_outbox_relay(
        outbox, "main", sink, batch_size=3, lease=10, poll_interval=60
    ) as relay:
        with anyio.fail_after(10):
            while not errors:
                await anyio.lowlevel.checkpoint()
        assert [type(e) for e in errors] == [AckFailedError]
        assert traced.claims_during_complete == 1
        await until_parked(ship_clock)  # the retry waits out its error backoff
        assert published == ids[:3]
        assert relay.delivered == 0
        ship_clock.advance(1)  # ERROR_BACKOFF.max_delay: the retried completion lands
        with anyio.fail_after(10):
            while relay.delivered < 6:
                await anyio.lowlevel.checkpoint()
    assert published == ids
    assert await statuses(engine) == [("delivered", 1)] * 6
    assert [type(e) for e in errors] == [AckFailedError]


async def test_a_failed_claim_ahead_is_reported_once_and_the_loop_goes_on(
    engine, outbox, ship_clock, errors
):
    """O4 with pipelining: a claim made ahead that fails is reported once, like an inline poll
    failure; after its backoff the relay claims afresh and delivers everything exactly once."""
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(9)]
    traced = Traced(outbox)
    traced.fail_next_claim_during_complete = True
    published: list[uuid.UUID] = []
    done = anyio.Event()

    async def sink(message: OutboxMessage) -> None:
        published.append(message.id)
        if len(published) == len(ids):
            done.set()

    async with await start_outbox_relay(
        outbox, "main", sink, batch_size=3, poll_interval=3600
    ) as relay:
        with anyio.fail_after(10):
            while not errors:
                await anyio.lowlevel.checkpoint()
        await until_parked(ship_clock)  # the loop backs off after the failure
        ship_clock.advance(1)
        with anyio.fail_after(10):
            await done.wait()
            while relay.delivered < len(ids):
                await anyio.lowlevel.checkpoint()
    assert [type(e) for e in errors] == [ClaimFailedError]
    assert published == ids
    assert await statuses(engine) == [("delivered", 1)] * 9


async def test_stop_releases_the_batch_claimed_ahead(engine, outbox, ship_clock):
    """O3: a relay stopped while it completes a full batch and has claimed the next one
    already releases that next batch (attempt given back) without publishing any of it."""
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(6)]
    traced = Traced(outbox)
    completing = anyio.Event()
    proceed = anyio.Event()
    real_settle = traced.settle

    async def slow_settle(settlements: list[OutboxSettlement], **kwargs: Any) -> list[Any]:
        completing.set()
        await proceed.wait()
        return await real_settle(settlements, **kwargs)

    outbox.settle = slow_settle  # type: ignore[method-assign]
    published: list[uuid.UUID] = []

    async def sink(message: OutboxMessage) -> None:
        published.append(message.id)

    relay = await start_outbox_relay(outbox, "main", sink, batch_size=3, poll_interval=3600)
    with anyio.fail_after(10):
        await completing.wait()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.stop)
            await anyio.lowlevel.checkpoint()
            proceed.set()
    assert published == ids[:3]
    assert await statuses(engine) == [("delivered", 1)] * 3 + [("pending", 0)] * 3
    assert not relay.running


async def test_hard_stop_while_waiting_for_the_claim_ahead_still_releases_it(
    engine, outbox, ship_clock
):
    """O3: cancelling the relay (stop with grace) while it waits for the batch claimed ahead
    does not cancel that claim: its messages are released, not left to their lease."""
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(6)]
    traced = Traced(outbox)
    claim_ahead_started = anyio.Event()
    proceed = anyio.Event()
    real_claim = traced.claim

    async def slow_claim_ahead(*args: Any, **kwargs: Any) -> list[OutboxMessage]:
        ahead = bool(traced.completing)
        messages = await real_claim(*args, **kwargs)
        if ahead:  # claimed in the database; the answer is slow to come back
            claim_ahead_started.set()
            await proceed.wait()
        return messages

    outbox.claim = slow_claim_ahead  # type: ignore[method-assign]
    published: list[uuid.UUID] = []

    async def sink(message: OutboxMessage) -> None:
        published.append(message.id)

    relay = await start_outbox_relay(outbox, "main", sink, batch_size=3, poll_interval=3600)
    task = relay._task  # to observe the cancellation
    assert task is not None
    with anyio.fail_after(10):
        await claim_ahead_started.wait()
        while relay.delivered < 3:  # the first batch is completed; the claim ahead hangs
            await anyio.lowlevel.checkpoint()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: relay.stop(drain_timeout=0.01))
            while not task.cancelling():
                await anyio.lowlevel.checkpoint()
            proceed.set()
    assert published == ids[:3]
    assert await statuses(engine) == [("delivered", 1)] * 3 + [("pending", 0)] * 3
    assert not relay.running
