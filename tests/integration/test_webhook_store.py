"""The webhook event store on real PostgreSQL: record/link join the unit of work, W1 cleanup."""

from __future__ import annotations

import uuid
from datetime import timedelta

import anyio
import pytest
from sqlalchemy import MetaData, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla import (
    TransactionScope,
    create_idempotency_store,
    create_outbox,
    create_unit_of_work,
    ship_idempotency_table,
    ship_outbox_table,
)
from ship_sqla._webhooks import (
    WebhookEventInProgressError,
    WebhookEventNotFoundError,
    create_webhook_event_store,
    ship_webhook_events_table,
    webhook_idempotency_prefix,
)
from ship_sqla.errors import BoundExceededError, ConfigurationError, TenantViolationError
from ship_sqla.idempotency import IdempotencyStarted, StoredResponse
from ship_sqla.testing import FrozenClock

pytestmark = pytest.mark.anyio

metadata = MetaData()
events = ship_webhook_events_table(metadata)
outbox_table = ship_outbox_table(metadata)
keys = ship_idempotency_table(metadata)


class BoomError(Exception):
    pass


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


@pytest.fixture
async def conn(ship_connection: AsyncConnection) -> AsyncConnection:
    await ship_connection.run_sync(metadata.create_all)
    return ship_connection


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


def make_store(database, clock=None, **options):
    return create_webhook_event_store(
        database=database,
        table=events,
        outbox_table=outbox_table,
        idempotency_table=keys,
        clock=clock,
        **options,
    )


async def count(engine: AsyncEngine, table) -> int:
    async with engine.connect() as c:
        return int((await c.execute(select(func.count()).select_from(table))).scalar_one())


async def test_record_then_duplicate(conn: AsyncConnection) -> None:
    """Events are unique per (webhook, event id): a second record reports the first."""
    store = make_store(conn)
    first = await store.record(
        "stripe", "evt_1", {"a": 1}, headers={"webhook-id": "evt_1"}, raw_body=b'{"a":1}'
    )
    assert not first.duplicate
    assert first.event.payload == {"a": 1}
    assert first.event.headers == {"webhook-id": "evt_1"}
    assert first.event.raw_body == b'{"a":1}'
    again = await store.record("stripe", "evt_1", {"a": 2})
    assert again.duplicate
    assert again.event.id == first.event.id
    assert again.event.payload == {"a": 1}
    other_webhook = await store.record("github", "evt_1", {"a": 3})
    assert not other_webhook.duplicate


async def test_link_and_unknown_event(conn: AsyncConnection) -> None:
    store = make_store(conn)
    await store.record("stripe", "evt_1", {})
    message_id = uuid.uuid4()
    await store.link("stripe", "evt_1", message_id)
    event = await store.get("stripe", "evt_1")
    assert event is not None
    assert event.outbox_message_id == message_id
    with pytest.raises(WebhookEventNotFoundError, match="SHIP_SQLA_WEBHOOK_EVENT_NOT_FOUND"):
        await store.link("stripe", "evt_missing", message_id)


async def test_record_enqueue_link_commit_or_roll_back_together(engine: AsyncEngine) -> None:
    """U1/O1: record, the idempotency claim and the outbox enqueue join one unit of work; a
    rollback leaves no event, no claim and no outbox row."""
    store = make_store(engine)
    idempotency = create_idempotency_store(database=engine, table=keys)
    outbox = create_outbox(database=engine, table=outbox_table)
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def receive(tx: TransactionScope, event_id: str, *, fail: bool) -> None:
        claim = await idempotency.begin(event_id, "fp", prefix=webhook_idempotency_prefix("s"))
        assert isinstance(claim, IdempotencyStarted)
        await store.record("s", event_id, {"n": 1})
        message_id = await outbox.enqueue("webhooks", "webhook.s", {"n": 1})
        await store.link("s", event_id, message_id)
        await claim.claim.complete(StoredResponse(202))
        if fail:
            raise BoomError

    with pytest.raises(BoomError):
        await uow.run(lambda tx: receive(tx, "evt_fail", fail=True))
    assert (await count(engine, events), await count(engine, keys)) == (0, 0)
    assert await count(engine, outbox_table) == 0

    await uow.run(lambda tx: receive(tx, "evt_ok", fail=False))
    assert (await count(engine, events), await count(engine, keys)) == (1, 1)
    assert await count(engine, outbox_table) == 1
    event = await store.get("s", "evt_ok")
    assert event is not None
    assert event.outbox_message_id is not None


async def test_concurrent_uncommitted_record_is_bounded(engine: AsyncEngine) -> None:
    """A record meeting another transaction's uncommitted record of the same event waits at
    most lock_timeout, then raises WebhookEventInProgressError; its transaction stays usable."""
    store = make_store(engine, lock_timeout=timedelta(milliseconds=200))
    uow = create_unit_of_work(engine, repositories=scope_only)
    holding = anyio.Event()
    release = anyio.Event()

    async def first(tx: TransactionScope) -> None:
        await store.record("s", "evt", {})
        holding.set()
        await release.wait()

    async def second(tx: TransactionScope) -> str:
        with pytest.raises(WebhookEventInProgressError) as caught:
            await store.record("s", "evt", {})
        await store.record("s", "evt_other", {})  # the transaction is intact
        return caught.value.code

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(uow.run, first)
            await holding.wait()
            code = await uow.run(second)
            release.set()
    assert code == "SHIP_SQLA_WEBHOOK_EVENT_IN_PROGRESS"
    assert await count(engine, events) == 2


async def test_cleanup_keeps_events_whose_intent_is_pending_or_claimed(
    engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """W1: cleanup deletes events past retention ONLY when their outbox intent is no longer
    pending or claimed (delivered, dead, gone, or never linked); recent events and other
    webhooks are kept; expired idempotency claims under the webhook's prefix are deleted."""
    store = make_store(engine, clock=ship_clock)
    outbox = create_outbox(database=engine, table=outbox_table, clock=ship_clock)
    idempotency = create_idempotency_store(
        database=engine, table=keys, clock=ship_clock, ttl=timedelta(days=3)
    )
    statuses = {"evt_pending": "pending", "evt_claimed": "claimed", "evt_delivered": "delivered"}
    statuses |= {"evt_dead": "dead"}
    for event_id, status in statuses.items():
        await store.record("s", event_id, {})
        message_id = await outbox.enqueue("webhooks", "webhook.s", {})
        await store.link("s", event_id, message_id)
        async with engine.begin() as c:
            await c.execute(
                update(outbox_table).where(outbox_table.c.id == message_id).values(state=status)
            )
    await store.record("s", "evt_unlinked", {})
    await store.record("s", "evt_linked_to_deleted", {})
    await store.link("s", "evt_linked_to_deleted", uuid.uuid4())
    await store.record("other", "evt_delivered_elsewhere", {})
    for key in ("a", "b"):
        await idempotency.begin(key, "fp", prefix=webhook_idempotency_prefix("s"))
    await idempotency.begin("c", "fp", prefix=webhook_idempotency_prefix("other"))

    ship_clock.advance(timedelta(days=8))
    await store.record("s", "evt_recent", {})
    await idempotency.begin("fresh", "fp", prefix=webhook_idempotency_prefix("s"))

    result = await store.cleanup("s", retention=timedelta(days=7))
    assert (result.events_deleted, result.claims_deleted) == (4, 2)
    async with engine.connect() as c:
        left = set((await c.execute(select(events.c.event_id))).scalars())
        left_keys = set((await c.execute(select(keys.c.key))).scalars())
    assert left == {"evt_pending", "evt_claimed", "evt_recent", "evt_delivered_elsewhere"}
    assert left_keys == {"c", "fresh"}


async def test_cleanup_is_bounded(engine: AsyncEngine, ship_clock: FrozenClock) -> None:
    """W1: each cleanup call deletes at most `limit` events and `limit` claims."""
    store = make_store(engine, clock=ship_clock)
    idempotency = create_idempotency_store(
        database=engine, table=keys, clock=ship_clock, ttl=timedelta(days=1)
    )
    for i in range(5):
        await store.record("s", f"evt_{i}", {})
        await idempotency.begin(f"k{i}", "fp", prefix=webhook_idempotency_prefix("s"))
    ship_clock.advance(timedelta(days=10))
    first = await store.cleanup("s", retention=timedelta(days=7), limit=3)
    second = await store.cleanup("s", retention=timedelta(days=7), limit=3)
    assert (first.events_deleted, first.claims_deleted) == (3, 3)
    assert (second.events_deleted, second.claims_deleted) == (2, 2)
    with pytest.raises(BoundExceededError):
        await store.cleanup("s", retention=timedelta(days=7), limit=0)
    with pytest.raises(ConfigurationError, match="retention"):
        await store.cleanup("s", retention=timedelta(0))


async def test_tables_are_checked(conn: AsyncConnection) -> None:
    with pytest.raises(ConfigurationError, match="outbox_table"):
        create_webhook_event_store(
            database=conn, table=events, outbox_table=keys, idempotency_table=keys
        )


def test_names_are_explicit_and_fit() -> None:
    """T1: every index and constraint of the events table is named from the table name."""
    table = ship_webhook_events_table(MetaData(), name="w" * 45)
    names = {str(i.name) for i in (*table.indexes, *table.constraints)}
    assert names == {
        f"{'w' * 45}_pkey",
        f"{'w' * 45}_webhook_event_key",
        f"{'w' * 45}_retention_idx",
    }
    assert all(len(n.encode()) <= 63 for n in names)
    with pytest.raises(ConfigurationError, match="too long"):
        ship_webhook_events_table(MetaData(), name="w" * 46)


async def test_another_tenant_is_refused_inside_a_tenant_scope(conn: AsyncConnection) -> None:
    """R2/U2: inside a unit of work for one tenant, record refuses to file the event for
    another tenant."""
    store = make_store(conn)
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def record_for_other(tx: TransactionScope) -> object:
        return await store.record("stripe", "evt_t", {"a": 1}, tenant="t2")

    with pytest.raises(TenantViolationError, match="inside a unit of work for tenant 't1'"):
        await uow.run(record_for_other, tenant="t1")
