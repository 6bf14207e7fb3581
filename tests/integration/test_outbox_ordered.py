"""Ordered delivery with several relays on one database (SPEC section 10, per-key ordering)."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict

import anyio
import pytest
from sqlalchemy import MetaData, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._outbox import (
    Backoff,
    OutboxIntent,
    OutboxMessage,
    create_outbox,
    ship_outbox_table,
    start_outbox_relay,
)
from ship_sqla.kernel import SystemClock
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)

KEYS = [f"order-{n}" for n in range(8)]
PER_KEY = 40
UNKEYED = 20


class FlakyError(Exception):
    pass


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


async def test_two_ordered_relays_deliver_each_key_in_enqueue_order_one_at_a_time(engine):
    """O2/O3 ordered mode: with two relays claiming concurrently from one database while a
    producer keeps enqueuing (several messages of one key per transaction at times) and the sink
    fails at random, every key's messages are published in enqueue order and never two of one
    key are in flight (claimed and not yet settled) at once."""
    rng = random.Random(20240611)
    errors: list[BaseException] = []
    outbox = create_outbox(
        database=engine,
        table=table,
        clock=SystemClock(),
        max_attempts=1000,
        backoff=Backoff(kind="fixed", base=0.0, jitter="none"),
        on_error=errors.append,
    )
    in_flight: set[str] = set()
    next_seq: dict[str, int] = defaultdict(int)
    published: dict[str | None, list[int]] = defaultdict(list)
    violations: list[str] = []
    total = len(KEYS) * PER_KEY + UNKEYED
    all_done = anyio.Event()
    successes = 0

    # Settling ends a message's flight: clear its key just before the settle is sent, so the
    # check never blames a claim that the settle's commit made legitimate. The relay settles a
    # batch (completions and failures alike) in one call of the outbox's settle.
    real_settle = outbox.settle
    key_of: dict[uuid.UUID, str] = {}

    async def settle(settlements, **kwargs):
        for s in settlements:
            in_flight.discard(key_of.pop(s.message_id, ""))
        return await real_settle(settlements, **kwargs)

    outbox.settle = settle  # type: ignore[method-assign]

    async def sink(message: OutboxMessage) -> None:
        nonlocal successes
        key = message.ordering_key
        seq = message.payload["seq"]
        key_of[message.id] = key or ""
        if key is not None:
            if key in in_flight:
                violations.append(f"{key}: seq {seq} handed out while another was in flight")
            if seq != next_seq[key]:
                violations.append(f"{key}: seq {seq} handed out, expected {next_seq[key]}")
            in_flight.add(key)
        for _ in range(rng.randrange(4)):
            await anyio.lowlevel.checkpoint()
        if rng.random() < 0.1:
            raise FlakyError(f"{key} {seq}")
        published[key].append(seq)
        if key is not None:
            next_seq[key] = seq + 1
        successes += 1
        if successes >= total:
            all_done.set()

    plan: list[tuple[str | None, int]] = []
    cursors = dict.fromkeys(KEYS, 0)
    while any(c < PER_KEY for c in cursors.values()):
        key = rng.choice([k for k, c in cursors.items() if c < PER_KEY])
        plan.append((key, cursors[key]))
        cursors[key] += 1
    for n in range(UNKEYED):
        plan.insert(rng.randrange(len(plan)), (None, n))

    uow = create_unit_of_work(engine, repositories=scope_only)

    async def produce() -> None:
        position = 0
        while position < len(plan):
            chunk = plan[position : position + rng.randrange(1, 12)]
            position += len(chunk)
            if rng.random() < 0.5:

                async def many(scope: TransactionScope, chunk=chunk) -> None:
                    intents = [OutboxIntent("t", {"seq": s}, ordering_key=k) for k, s in chunk]
                    await outbox.enqueue_many("orders", intents, scope=scope)

                await uow.run(many)
            else:

                async def one_by_one(scope: TransactionScope, chunk=chunk) -> None:
                    for k, s in chunk:
                        await outbox.enqueue("orders", "t", {"seq": s}, ordering_key=k)

                await uow.run(one_by_one)
            await anyio.lowlevel.checkpoint()

    relays = [
        await start_outbox_relay(
            outbox, "orders", sink, batch_size=5, poll_interval=0.05, ordered=True, worker=name
        )
        for name in ("A", "B")
    ]
    async with relays[0], relays[1]:
        await produce()
        with anyio.fail_after(60):
            await all_done.wait()

    assert violations == []
    for key in KEYS:
        assert published[key] == list(range(PER_KEY)), key
    assert sorted(published[None]) == list(range(UNKEYED))
    assert all(r.delivered > 0 for r in relays), [r.delivered for r in relays]
    assert sum(r.delivered for r in relays) == total
    async with engine.connect() as c:
        counts = dict(
            (await c.execute(select(table.c.state, func.count()).group_by(table.c.state))).all()
        )
    assert counts == {"delivered": total}


async def test_ordered_claim_hands_out_only_the_earliest_undelivered_row_per_key(
    ship_connection, ship_clock: FrozenClock
):
    """O2 ordered mode: a row waits while any earlier row of its key is pending (even one not
    yet due) or claimed; a dead row stops blocking; rows without a key are not held back."""
    await ship_connection.run_sync(metadata.create_all)
    outbox = create_outbox(database=ship_connection, table=table, clock=ship_clock)
    later = ship_clock.now().replace(year=2031)
    k1 = await outbox.enqueue("o", "t", {"n": 1}, ordering_key="k")
    k2 = await outbox.enqueue("o", "t", {"n": 2}, ordering_key="k")
    j1 = await outbox.enqueue("o", "t", {"n": 1}, ordering_key="j", available_at=later)
    j2 = await outbox.enqueue("o", "t", {"n": 2}, ordering_key="j")
    free = await outbox.enqueue("o", "t", {})
    first = await outbox.claim("o", 10, lease=10, ordered=True)
    assert {m.id for m in first} == {k1, free}  # k2 behind k1, j2 behind the not-yet-due j1
    assert await outbox.claim("o", 10, lease=10, ordered=True) == []  # k1 claimed blocks k2
    (m_k1,) = [m for m in first if m.id == k1]
    assert await outbox.fail(m_k1, "boom", permanent=True) == "dead"
    (m_k2,) = await outbox.claim("o", 10, lease=10, ordered=True)
    assert m_k2.id == k2
    assert await outbox.complete_many([m_k2, *(m for m in first if m.id == free)]) == [
        "delivered",
        "delivered",
    ]
    ship_clock.set(later)
    assert [m.id for m in await outbox.claim("o", 10, lease=10, ordered=True)] == [j1]
    # Unordered claims ignore keys: j2 is handed out although j1 is in flight.
    assert [m.id for m in await outbox.claim("o", 10, lease=10)] == [j2]
