"""The outbox store on real PostgreSQL: O1 (unit of work), O2 (claim), O3 (fencing), O4 (retry,
dead letters, retry)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from sqlalchemy import MetaData, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._outbox import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    Backoff,
    Outbox,
    OutboxDeadLetteredError,
    OutboxIntent,
    OutboxLeaseStaleError,
    OutboxOperations,
    OutboxPayloadError,
    OutboxPayloadTooLargeError,
    OutboxRelay,
    create_outbox,
    create_outbox_operations,
    ship_outbox_table,
)
from ship_sqla._outbox._store import DEFAULT_MAX_PAYLOAD_BYTES, MAX_OUTBOX_ID_LENGTH
from ship_sqla.errors import (
    BoundExceededError,
    ConfigurationError,
    InvalidCursorError,
    InvalidKeyError,
    TenantViolationError,
)
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)
BACKOFF = Backoff(base=10.0, factor=2.0, max_delay=1000.0, jitter="none")


class BoomError(Exception):
    pass


@pytest.fixture
async def conn(ship_connection: AsyncConnection) -> AsyncConnection:
    await ship_connection.run_sync(metadata.create_all)
    return ship_connection


@pytest.fixture
def errors() -> list[BaseException]:
    return []


@pytest.fixture
def outbox(conn: AsyncConnection, ship_clock: FrozenClock, errors: list[BaseException]) -> Outbox:
    return create_outbox(
        database=conn,
        table=table,
        clock=ship_clock,
        max_attempts=3,
        backoff=BACKOFF,
        on_error=errors.append,
    )


def allow(permission: str, operation: str) -> bool:
    return permission == "ship.outbox:manage"


@pytest.fixture
def ops(outbox: Outbox) -> OutboxOperations:
    """The operator surface (list dead, retry, purge), behind an authorizer that allows."""
    return create_outbox_operations(outbox, authorizer=allow)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


async def rows(bind: AsyncConnection | AsyncEngine) -> list[dict[str, object]]:
    query = select(table).order_by(table.c.created_at, table.c.id)
    if isinstance(bind, AsyncConnection):
        result = await bind.execute(query)
        return [dict(r._mapping) for r in result]
    async with bind.connect() as c:
        return [dict(r._mapping) for r in await c.execute(query)]


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


# -- O1 ---------------------------------------------------------------------------------------


async def test_enqueue_in_rolled_back_unit_of_work_leaves_no_row(conn, outbox):
    """O1: enqueue joins the unit of work; a rolled-back run leaves no outbox row."""
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def handler(scope: TransactionScope) -> None:
        await outbox.enqueue("main", "order.placed", {"id": 1}, scope=scope)
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(handler)
    assert await rows(conn) == []

    async def ok(scope: TransactionScope) -> uuid.UUID:
        return await outbox.enqueue("main", "order.placed", {"id": 2})  # ambient scope

    message_id = await uow.run(ok)
    (row,) = await rows(conn)
    assert row["id"] == message_id
    assert row["payload"] == {"id": 2}
    assert row["state"] == "pending"


async def test_committed_enqueue_wakes_local_relays_after_commit_only(engine, ship_clock):
    """O1: a committed enqueue wakes this process's relays after the commit, never on rollback."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock)
    wakeup = outbox.subscribe("main")
    other = outbox.subscribe("other")
    uow = create_unit_of_work(engine, repositories=scope_only)
    seen_inside: list[int] = []

    async def handler(scope: TransactionScope) -> None:
        await outbox.enqueue("main", "t", {}, scope=scope)
        # Not yet committed: a relay woken now would find nothing to claim.
        async with engine.connect() as c:
            seen_inside.append(len((await c.execute(select(table.c.id))).all()))
        assert not wakeup._event.is_set()

    async def failing(scope: TransactionScope) -> None:
        await outbox.enqueue("main", "t", {}, scope=scope)
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(failing)
    assert not wakeup._event.is_set()
    await uow.run(handler)
    assert seen_inside == [0]
    with anyio.fail_after(5):
        assert await wakeup.wait(3600, ship_clock) is True
    assert not other._event.is_set()


async def test_enqueue_many_is_ordered_and_takes_the_scope_tenant(conn, outbox, ship_clock):
    """O1: enqueue_many writes every intent in one statement, ids increasing in intent order."""
    later = ship_clock.now() + timedelta(minutes=5)
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def handler(scope: TransactionScope) -> list[uuid.UUID]:
        return await outbox.enqueue_many(
            "main",
            [
                OutboxIntent("a", {"n": 1}, headers={"trace": "x"}, ordering_key="k"),
                OutboxIntent("b", [1, 2], ordering_key="k"),
                OutboxIntent("c", "text", available_at=later),
            ],
            scope=scope,
        )

    ids = await uow.run(handler, tenant="acme")
    assert ids == sorted(ids)
    got = await rows(conn)
    assert [r["id"] for r in got] == ids
    assert [r["topic"] for r in got] == ["a", "b", "c"]
    assert got[0]["headers"] == {"trace": "x"}
    assert got[1]["headers"] == {}
    assert {r["tenant_id"] for r in got} == {"acme"}
    assert got[2]["available_at"] == later
    assert got[0]["created_at"] == ship_clock.now()
    assert {r["max_attempts"] for r in got} == {3}

    async def wrong_tenant(scope: TransactionScope) -> None:
        await outbox.enqueue("main", "t", {}, tenant="globex")

    with pytest.raises(TenantViolationError):
        await uow.run(wrong_tenant, tenant="acme")


async def test_enqueue_refuses_bad_input_with_a_fix(outbox):
    with pytest.raises(OutboxPayloadError, match="Fix:"):
        await outbox.enqueue("main", "t", {"when": datetime.now(UTC)})
    with pytest.raises(OutboxPayloadError):
        await outbox.enqueue("main", "t", {"x": float("nan")})
    with pytest.raises(OutboxPayloadError, match="NUL"):
        await outbox.enqueue("main", "t", {"x": "a\x00b"})
    with pytest.raises(OutboxPayloadError, match="headers"):
        await outbox.enqueue("main", "t", {}, headers={"x": object()})
    literal = await outbox.enqueue("main", "t", {"x": "a\\u0000b"})  # the text, not a NUL
    assert (await outbox.get(literal)).payload == {"x": "a\\u0000b"}
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        await outbox.enqueue("main", "t", {}, available_at=datetime(2030, 1, 1))  # noqa: DTZ001
    with pytest.raises(ConfigurationError, match="max_attempts"):
        await outbox.enqueue("main", "t", {}, max_attempts=0)
    with pytest.raises(ConfigurationError, match="batch_size"):
        await outbox.claim("main", 0, 10)
    with pytest.raises(ConfigurationError, match="lease"):
        await outbox.claim("main", 1, 0)
    assert await outbox.enqueue_many("main", []) == []


# -- O2 ---------------------------------------------------------------------------------------


async def test_claim_takes_lapsed_leases_before_pending(conn, outbox, ship_clock):
    """O2: lease-expired claimed rows are claimed before pending ones, with a new token and one
    more attempt."""
    first = [await outbox.enqueue("main", "t", {"n": n}) for n in range(2)]
    held = await outbox.claim("main", 2, lease=10, worker="A")
    assert [m.id for m in held] == first
    assert all(m.attempt == 1 and m.claimed_by == "A" for m in held)
    ship_clock.advance(5)
    fresh = [await outbox.enqueue("main", "t", {"n": n}) for n in range(2, 4)]
    assert await outbox.claim("main", 5, lease=10, worker="B") != []  # only the fresh ones
    ship_clock.advance(60)  # every lease lapsed: A's at t=10, B's at t=15
    retaken = await outbox.claim("main", 2, lease=10, worker="C")
    assert [m.id for m in retaken] == first  # A's lapsed first (earliest lease), not B's
    assert all(m.attempt == 2 and m.claimed_by == "C" for m in retaken)
    assert {m.token for m in retaken}.isdisjoint({m.token for m in held})
    assert len({m.token for m in retaken}) == 2
    rest = await outbox.claim("main", 10, lease=10, worker="C")
    assert [m.id for m in rest] == fresh


async def test_claim_mixes_lapsed_and_due_within_one_batch(conn, outbox, ship_clock):
    """O2: a batch is topped up with due pending rows after the lapsed ones."""
    a = await outbox.enqueue("main", "t", {})
    await outbox.claim("main", 1, lease=10)
    b = await outbox.enqueue("main", "t", {})
    c = await outbox.enqueue("main", "t", {})
    ship_clock.advance(11)
    got = await outbox.claim("main", 2, lease=10)
    assert {m.id for m in got} == {a, b}
    assert (await outbox.claim("main", 2, lease=10))[0].id == c


async def test_claim_honours_available_at_and_outbox_id(conn, outbox, ship_clock):
    """O2: only due rows of the asked outbox are claimed."""
    later = await outbox.enqueue(
        "main", "t", {}, available_at=ship_clock.now() + timedelta(seconds=30)
    )
    await outbox.enqueue("other", "t", {})
    assert await outbox.claim("main", 10, lease=10) == []
    ship_clock.advance(30)
    assert [m.id for m in await outbox.claim("main", 10, lease=10)] == [later]


async def test_claim_skips_rows_locked_by_another_transaction(engine, ship_clock):
    """O2: the claim uses FOR UPDATE SKIP LOCKED: a row another transaction locked is passed
    over instead of waited for."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock)
    locked = await outbox.enqueue("main", "t", {})
    free = await outbox.enqueue("main", "t", {})
    async with engine.connect() as other, other.begin():
        await other.execute(select(table.c.id).where(table.c.id == locked).with_for_update())
        with anyio.fail_after(5):
            got = await outbox.claim("main", 10, lease=10)
    assert [m.id for m in got] == [free]


async def test_claim_runs_in_its_own_transaction_not_the_unit_of_work(engine, ship_clock):
    """O2: a claim inside a uow.run commits on its own: its locks do not live as long as the
    caller's transaction, and rolling the caller back does not undo the claim."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock)
    await outbox.enqueue("main", "t", {})
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def handler(scope: TransactionScope) -> None:
        assert len(await outbox.claim("main", 10, lease=10)) == 1
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(handler)
    (row,) = await rows(engine)
    assert row["state"] == "claimed"


# -- O3 ---------------------------------------------------------------------------------------


async def test_stale_holder_changes_nothing_and_is_told(conn, outbox, ship_clock):
    """O3: after a lease lapsed and the row was retaken, the old holder's complete, fail and
    release change nothing and report "stale" (or raise SHIP_SQLA_OUTBOX_LEASE_STALE); a second
    complete by the delivering claim is idempotent ("delivered", nothing changes)."""
    await outbox.enqueue("main", "t", {})
    (old,) = await outbox.claim("main", 1, lease=10, worker="A")
    ship_clock.advance(11)
    (new,) = await outbox.claim("main", 1, lease=10, worker="B")
    before = await rows(conn)
    assert await outbox.complete(old) == "stale"
    assert await outbox.fail(old, "boom") == "stale"
    assert await outbox.release(old) == "stale"
    assert await outbox.heartbeat([old], 100) == [False]
    assert await rows(conn) == before
    with pytest.raises(OutboxLeaseStaleError) as caught:
        await outbox.complete(old, raise_if_stale=True)
    assert caught.value.code == "SHIP_SQLA_OUTBOX_LEASE_STALE"
    assert caught.value.message_id == old.id
    with pytest.raises(OutboxLeaseStaleError):
        await outbox.fail(old, "boom", raise_if_stale=True)
    with pytest.raises(OutboxLeaseStaleError):
        await outbox.release(old, raise_if_stale=True)
    assert await rows(conn) == before
    assert await outbox.complete(new) == "delivered"
    (row,) = await rows(conn)
    assert row["state"] == "delivered"
    assert row["lease_token"] == new.token  # kept: it makes a retried complete idempotent
    assert row["delivered_at"] == ship_clock.now()
    # Completing again with the delivering claim answers "delivered" and changes nothing
    # (a retry after a lost reply); the superseded claim is still stale; other settles of a
    # delivered row are stale.
    ship_clock.advance(5)
    assert await outbox.complete(new) == "delivered"
    assert await outbox.complete(old) == "stale"
    assert await outbox.fail(new, "late") == "stale"
    assert await outbox.release(new) == "stale"
    assert await rows(conn) == [row]


async def test_current_holder_may_settle_after_its_lease_lapsed_if_nobody_retook_it(
    conn, outbox, ship_clock
):
    """O3: fencing is on the token, not the clock: a late but unretaken claim still settles."""
    await outbox.enqueue("main", "t", {})
    (message,) = await outbox.claim("main", 1, lease=10)
    ship_clock.advance(60)
    assert await outbox.complete(message) == "delivered"


async def test_complete_many_settles_in_one_statement_per_message_outcomes(
    conn, outbox, ship_clock
):
    """O3: batch complete fences each message on its own token; outcomes in order."""
    for n in range(3):
        await outbox.enqueue("main", "t", {"n": n})
    a, b, c = await outbox.claim("main", 3, lease=10)
    assert await outbox.release(b) == "released"
    assert await outbox.complete_many([a, b, c]) == ["delivered", "stale", "delivered"]
    assert await outbox.complete_many([]) == []
    assert [r["state"] for r in await rows(conn)] == ["delivered", "pending", "delivered"]


async def test_release_gives_the_attempt_back_and_extend_moves_the_lease(conn, outbox, ship_clock):
    """O3: release returns the message unpublished without spending an attempt; extend keeps a
    current claim alive."""
    await outbox.enqueue("main", "t", {})
    (m,) = await outbox.claim("main", 1, lease=10)
    assert await outbox.heartbeat([m], 100) == [True]
    ship_clock.advance(50)
    assert await outbox.claim("main", 1, lease=10) == []  # lease now ends at t=100
    assert await outbox.release(m) == "released"
    (row,) = await rows(conn)
    assert (row["state"], row["attempts"], row["lease_token"]) == ("pending", 0, None)
    (again,) = await outbox.claim("main", 1, lease=10)
    assert again.attempt == 1


# -- O4 ---------------------------------------------------------------------------------------


async def test_failures_retry_with_backoff_then_end_dead(conn, outbox, ops, ship_clock):
    """O4: each failure makes the row pending after the backoff of that attempt; the failure
    on the last attempt makes it dead, with the error kept."""
    message_id = await outbox.enqueue("main", "t", {})
    (m,) = await outbox.claim("main", 1, lease=10)
    assert await outbox.fail(m, BoomError("first")) == "retrying"
    (row,) = await rows(conn)
    assert row["available_at"] == ship_clock.now() + timedelta(seconds=10)  # BACKOFF(1)
    assert row["last_error"] == "BoomError: first"
    assert await outbox.claim("main", 1, lease=10) == []
    ship_clock.advance(10)
    (m,) = await outbox.claim("main", 1, lease=10)
    assert m.attempt == 2
    assert await outbox.fail(m, "second") == "retrying"
    (row,) = await rows(conn)
    assert row["available_at"] == ship_clock.now() + timedelta(seconds=20)  # BACKOFF(2)
    ship_clock.advance(20)
    (m,) = await outbox.claim("main", 1, lease=10)
    assert m.attempt == 3
    assert await outbox.fail(m, "third") == "dead"
    ship_clock.advance(10_000)
    assert await outbox.claim("main", 1, lease=10) == []
    (row,) = await rows(conn)
    assert (row["state"], row["attempts"], row["last_error"]) == ("dead", 3, "third")
    page = await ops.list_dead("main")
    assert [r.id for r in page.items] == [message_id]
    assert page.next_cursor is None


async def test_fail_permanent_and_explicit_delay(conn, outbox, ship_clock):
    """O4: a permanent failure is dead at once; retry_in overrides the backoff."""
    await outbox.enqueue("main", "t", {})
    await outbox.enqueue("main", "t", {})
    a, b = await outbox.claim("main", 2, lease=10)
    assert await outbox.fail(a, "bad payload", permanent=True) == "dead"
    assert await outbox.fail(b, "later", retry_in=0) == "retrying"
    assert [m.id for m in await outbox.claim("main", 2, lease=10)] == [b.id]
    with pytest.raises(ConfigurationError):
        await outbox.fail(b, "x", retry_in=-1)


async def test_lease_lapsing_on_the_final_attempt_is_dead_not_retried(
    conn, outbox, ship_clock, errors
):
    """O4: a lease that lapses on the final attempt dead-letters the row (reported to on_error)
    instead of handing it out forever; attempts never exceed max_attempts."""
    message_id = await outbox.enqueue("main", "t", {})
    for attempt in range(1, 4):
        (m,) = await outbox.claim("main", 1, lease=10)
        assert m.attempt == attempt
        ship_clock.advance(11)
    assert await outbox.claim("main", 1, lease=10) == []
    (row,) = await rows(conn)
    assert (row["state"], row["attempts"]) == ("dead", 3)
    assert row["last_error"] == LEASE_LAPSED_FINAL_ATTEMPT
    assert row["lease_token"] is None
    (error,) = errors
    assert isinstance(error, OutboxDeadLetteredError)
    assert error.record.id == message_id
    assert error.code == "SHIP_SQLA_OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT"


async def test_list_dead_pages_by_keyset_and_retry_revives(conn, outbox, ops, ship_clock):
    """O4: dead messages are listed page by page (nothing skipped, nothing repeated) and
    retry moves them back to pending with a fresh attempt budget."""
    ids = [await outbox.enqueue("main", "t", {"n": n}, max_attempts=1) for n in range(5)]
    await outbox.enqueue("other", "t", {}, max_attempts=1)
    for m in await outbox.claim("main", 10, lease=10):
        assert await outbox.fail(m, "boom") == "dead"
    seen = []
    cursor = None
    while True:
        page = await ops.list_dead("main", limit=2, cursor=cursor)
        seen.extend(r.id for r in page.items)
        assert all(r.state == "dead" and r.last_error == "boom" for r in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ids
    with pytest.raises(InvalidCursorError):
        await ops.list_dead("other", cursor=cursor)
    with pytest.raises(InvalidCursorError):
        await ops.list_dead("main", cursor="not-a-cursor")
    with pytest.raises(BoundExceededError):
        await ops.list_dead("main", limit=1001)

    unknown = uuid.uuid4()
    assert await ops.retry([ids[0], ids[1], unknown, ids[0]]) == [ids[0], ids[1]]
    assert await ops.retry([ids[0]]) == []  # no longer dead: left alone, and reported
    record = await outbox.get(ids[0])
    assert record is not None
    assert (record.state, record.attempts) == ("pending", 0)
    assert [m.id for m in await outbox.claim("main", 10, lease=10)] == ids[:2]
    assert await outbox.get(unknown) is None


async def test_nothing_is_dropped_every_message_is_accounted_for(conn, outbox, ops, ship_clock):
    """O4: after a mix of successes, failures and lapses every enqueued message is delivered,
    dead (listed), or still pending/claimed: none vanishes."""
    ids = {await outbox.enqueue("main", "t", {"n": n}) for n in range(12)}
    for round_ in range(8):
        for i, m in enumerate(await outbox.claim("main", 4, lease=10)):
            if (i + round_) % 3 == 0:
                await outbox.complete(m)
            elif (i + round_) % 3 == 1:
                await outbox.fail(m, "boom", retry_in=0)
            # else: left to lapse
        ship_clock.advance(11)
    statuses = {r["id"]: r["state"] for r in await rows(conn)}
    assert set(statuses) == ids
    dead = {r.id for r in (await ops.list_dead("main", limit=100)).items}
    assert dead == {i for i, s in statuses.items() if s == "dead"}
    assert all(r["attempts"] <= r["max_attempts"] for r in await rows(conn))


async def test_time_comes_from_the_injected_clock(conn, ship_clock):
    """O2: available_at / lease arithmetic uses coalesce(:now, now()) with the frozen clock."""
    start = datetime(2040, 6, 1, tzinfo=UTC)
    clock = FrozenClock(start)
    outbox = create_outbox(database=conn, table=table, clock=clock)
    await outbox.enqueue("main", "t", {})
    (m,) = await outbox.claim("main", 1, lease=7.5)
    assert m.created_at == start
    assert m.lease_expires_at == start + timedelta(seconds=7.5)


async def test_a_second_outbox_table_name_is_independent(conn, ship_clock):
    """T1: tables built with another name carry their own derived index names."""
    md = MetaData()
    other = ship_outbox_table(md, name="billing_outbox")
    await conn.run_sync(md.create_all)
    names = set(
        (
            await conn.execute(
                text("SELECT indexname FROM pg_indexes WHERE tablename = 'billing_outbox'")
            )
        ).scalars()
    )
    assert names == {
        "billing_outbox_pkey",
        "billing_outbox_pending_idx",
        "billing_outbox_lease_idx",
        "billing_outbox_ordering_idx",
    }
    outbox = create_outbox(database=conn, table=other, clock=ship_clock)
    await outbox.enqueue("main", "t", {})
    assert len(await outbox.claim("main", 1, lease=1)) == 1
    await conn.execute(update(other).values(state="dead"))


async def test_a_batch_holding_a_stale_and_a_current_claim_of_one_message(conn, outbox, ship_clock):
    """O3: when a batch carries both an old and the current claim of the same message, only the
    current one is "delivered" (found by the state machine: outcomes were matched by id)."""
    await outbox.enqueue("main", "t", {})
    (old,) = await outbox.claim("main", 1, lease=10)
    assert await outbox.release(old) == "released"
    (new,) = await outbox.claim("main", 1, lease=10)
    assert await outbox.heartbeat([old, new], 30) == [False, True]
    assert await outbox.complete_many([old, new]) == ["stale", "delivered"]


# -- settling on an engine: autocommit alone, joined inside a unit of work ---------------------


async def test_settles_on_an_engine_commit_alone_or_join_the_unit_of_work(engine, ship_clock):
    """O3 on an engine: outside a unit of work a settle is its own (autocommit) statement and is
    visible at once; with an explicit or ambient scope it joins that transaction and rolls back
    with it."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock, backoff=BACKOFF)
    for n in range(4):
        await outbox.enqueue("main", "t", {"n": n})
    a, b, c, d = await outbox.claim("main", 4, lease=10)
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def explicit(scope: TransactionScope) -> None:
        assert await outbox.complete(a, scope=scope) == "delivered"
        assert await outbox.fail(b, "boom", scope=scope) == "retrying"
        raise BoomError

    async def ambient(scope: TransactionScope) -> None:
        assert await outbox.complete_many([a, b]) == ["delivered", "delivered"]
        assert await outbox.release(c) == "released"
        raise BoomError

    for handler in (explicit, ambient):
        with pytest.raises(BoomError):
            await uow.run(handler)
        assert [r["state"] for r in await rows(engine)] == ["claimed"] * 4
    assert await outbox.complete_many([a, b]) == ["delivered", "delivered"]
    assert await outbox.fail(c, "boom") == "retrying"
    assert await outbox.release(d) == "released"
    assert [r["state"] for r in await rows(engine)] == [
        "delivered",
        "delivered",
        "pending",
        "pending",
    ]


async def test_complete_many_on_an_engine_answers_each_pair(engine, ship_clock):
    """O3: all-delivered, stale, a duplicated message, a retried completion (idempotent) and
    a stale plus the current claim of one message each get their own outcome, in order."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock)
    for n in range(3):
        await outbox.enqueue("main", "t", {"n": n})
    a, b, c = await outbox.claim("main", 3, lease=10)
    assert await outbox.complete_many([a, a]) == ["delivered", "delivered"]
    assert await outbox.complete_many([a]) == ["delivered"]  # a retry: idempotent
    assert await outbox.release(b) == "released"
    (b2,) = await outbox.claim("main", 1, lease=10)
    assert await outbox.complete_many([b, c, b2]) == ["stale", "delivered", "delivered"]
    assert [r["state"] for r in await rows(engine)] == ["delivered"] * 3


async def test_release_and_retry_now_on_an_engine_wake_local_relays(engine, ship_clock):
    """O3: a release, or a failure due again at once, wakes this process's relays after it
    committed, as the joined path does after its commit."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock)
    wakeup = outbox.subscribe("main")
    await outbox.enqueue("main", "t", {})
    await outbox.enqueue("main", "t", {})
    with anyio.fail_after(5):
        assert await wakeup.wait(0, ship_clock) is True
    a, b = await outbox.claim("main", 2, lease=10)
    assert await outbox.release(a) == "released"
    with anyio.fail_after(5):
        assert await wakeup.wait(0, ship_clock) is True
    assert await outbox.fail(b, "boom", retry_in=0) == "retrying"
    with anyio.fail_after(5):
        assert await wakeup.wait(0, ship_clock) is True


async def test_claim_hands_out_headers_and_payload_as_enqueued(engine, ship_clock, errors):
    """O2: the claim returns each message's headers (an empty object as {}) and payload, also
    in the record of a message it dead-letters."""
    outbox = create_outbox(
        database=engine, table=table, clock=ship_clock, max_attempts=1, on_error=errors.append
    )
    await outbox.enqueue_many(
        "main",
        [
            OutboxIntent("a", {"n": 1}, headers={"trace": "x"}, ordering_key="k"),
            OutboxIntent("b", [1, "two"]),
            OutboxIntent("c", None, headers={}),
        ],
        tenant="t1",
    )
    got = await outbox.claim("main", 3, lease=10, worker="w")
    assert [(m.topic, m.payload, m.headers) for m in got] == [
        ("a", {"n": 1}, {"trace": "x"}),
        ("b", [1, "two"], {}),
        ("c", None, {}),
    ]
    first = got[0]
    assert (first.outbox_id, first.ordering_key, first.tenant) == ("main", "k", "t1")
    assert (first.attempt, first.max_attempts, first.claimed_by) == (1, 1, "w")
    assert first.lease_expires_at == ship_clock.now() + timedelta(seconds=10)
    assert first.available_at == first.created_at == ship_clock.now()
    assert first.last_error is None
    assert got[1].headers is not got[2].headers  # never one shared dict
    ship_clock.advance(11)
    assert await outbox.claim("main", 3, lease=10) == []
    dead = [e.record for e in errors if isinstance(e, OutboxDeadLetteredError)]
    assert sorted((r.topic, r.headers, r.state) for r in dead) == [
        ("a", {"trace": "x"}, "dead"),
        ("b", {}, "dead"),
        ("c", {}, "dead"),
    ]


# -- inputs refused before any SQL runs ---------------------------------------------------------


async def no_sink(message: object) -> None:
    return None


UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:5432/ship_sqla_outbox_no_such_database"
"""An outbox on this engine fails at its first statement: a check that raises something else
ran before any SQL."""


async def test_payload_size_limit_is_checked_before_any_sql(conn, ship_clock):
    """O1: a message whose encoded JSON (payload plus headers) exceeds max_payload_bytes is
    refused with SHIP_SQLA_OUTBOX_PAYLOAD_TOO_LARGE before any SQL runs; one oversized intent
    refuses the whole enqueue_many (nothing half-written); exactly the limit is accepted."""
    outbox = create_outbox(database=conn, table=table, clock=ship_clock, max_payload_bytes=64)
    assert outbox.max_payload_bytes == 64
    # {"s":"..."} is 8 bytes of JSON around the string; headers {} are 2 more.
    exact = await outbox.enqueue("main", "t", {"s": "x" * 54})
    assert (await outbox.get(exact)).payload == {"s": "x" * 54}
    with pytest.raises(OutboxPayloadTooLargeError, match="65 bytes") as caught:
        await outbox.enqueue("main", "t", {"s": "x" * 55})
    error = caught.value
    assert (error.code, error.size, error.limit, error.index) == (
        "SHIP_SQLA_OUTBOX_PAYLOAD_TOO_LARGE",
        65,
        64,
        0,
    )
    assert isinstance(error, OutboxPayloadError)
    assert error.fix
    with pytest.raises(OutboxPayloadTooLargeError):  # headers count too
        await outbox.enqueue("main", "t", {"s": "x"}, headers={"h": "y" * 60})
    # Non-ASCII is escaped (\uXXXX): each such character is 6 bytes of the encoded JSON.
    with pytest.raises(OutboxPayloadTooLargeError):
        await outbox.enqueue("main", "t", {"s": "é" * 10})
    intents = [OutboxIntent("t", {"n": 1}), OutboxIntent("t", {"s": "x" * 100})]
    with pytest.raises(OutboxPayloadTooLargeError) as caught:
        await outbox.enqueue_many("main", intents)
    assert caught.value.index == 1
    assert [r["id"] for r in await rows(conn)] == [exact]  # the call wrote nothing

    unreachable = create_async_engine(UNREACHABLE)
    try:
        remote = create_outbox(database=unreachable, table=table, max_payload_bytes=10)
        with pytest.raises(OutboxPayloadTooLargeError):
            await remote.enqueue("main", "t", {"s": "x" * 10})
    finally:
        await unreachable.dispose()


async def test_payload_size_limit_defaults_to_one_mib_and_is_configurable(conn, ship_clock):
    """O1: the default bound is 1 MiB; None lifts it; a bound that is not a positive int is a
    ConfigurationError."""
    outbox = create_outbox(database=conn, table=table, clock=ship_clock)
    assert outbox.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    with pytest.raises(OutboxPayloadTooLargeError):
        await outbox.enqueue("main", "t", "x" * (1024 * 1024))
    unbounded = create_outbox(database=conn, table=table, clock=ship_clock, max_payload_bytes=None)
    await unbounded.enqueue("main", "t", "x" * (1024 * 1024))
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigurationError, match="max_payload_bytes"):
            create_outbox(database=conn, table=table, max_payload_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("outbox_id", ["", " ", "\t\n", "a\x00b", "x" * 256, None])
async def test_blank_or_unstorable_outbox_ids_are_refused_before_any_sql(outbox_id):
    """O1/O2: an outbox_id that is empty, blank, holds a NUL character, is longer than 255
    characters or is not a string is refused by enqueue, enqueue_many, claim, list_dead,
    purge_delivered and OutboxRelay (start_outbox_relay) with InvalidKeyError
    (SHIP_SQLA_KEY_INVALID, the kernel's rule for keys), before any SQL runs."""
    unreachable = create_async_engine(UNREACHABLE)
    try:
        outbox = create_outbox(database=unreachable, table=table)
        ops = create_outbox_operations(outbox, authorizer=allow)
        calls = [
            outbox.enqueue(outbox_id, "t", {}),
            outbox.enqueue_many(outbox_id, [OutboxIntent("t", {})]),
            outbox.enqueue_many(outbox_id, []),
            outbox.claim(outbox_id, 1, 10),
            ops.list_dead(outbox_id),
            ops.purge_delivered(outbox_id, older_than=60),
        ]
        for call in calls:
            with pytest.raises(InvalidKeyError, match="outbox_id") as caught:
                await call
            assert caught.value.code == "SHIP_SQLA_KEY_INVALID"
            assert caught.value.fix
        with pytest.raises(InvalidKeyError, match="outbox_id"):
            OutboxRelay(outbox, outbox_id, no_sink)
    finally:
        await unreachable.dispose()
    assert MAX_OUTBOX_ID_LENGTH == 255


async def test_unstorable_topics_and_ordering_keys_are_refused_before_any_sql(conn, outbox):
    """O1: a topic that is not text or holds a NUL, and an ordering key that is empty, holds a
    NUL or is longer than 255 characters (it is indexed), refuse the whole enqueue before any
    SQL runs: nothing is half-written."""
    bad = [
        OutboxIntent("t\x00", {}),
        OutboxIntent(1, {}),  # type: ignore[arg-type]
        OutboxIntent("t", {}, ordering_key=""),
        OutboxIntent("t", {}, ordering_key="k\x00"),
        OutboxIntent("t", {}, ordering_key="k" * 256),
    ]
    for intent in bad:
        with pytest.raises(InvalidKeyError):
            await outbox.enqueue_many("main", [OutboxIntent("t", {}), intent])
    assert await rows(conn) == []
    await outbox.enqueue("main", "t", {}, ordering_key="k" * 255)


async def test_durations_must_be_finite_and_positive(conn, outbox, ops):
    """O2/O4: a lease, retry delay, retention or relay interval of nan, inf, a negative or an
    absurdly large number of seconds is a ConfigurationError before any SQL runs."""
    await outbox.enqueue("main", "t", {})
    (message,) = await outbox.claim("main", 1, 10)
    for lease in (float("nan"), float("inf"), -1, 0, 1e12):
        with pytest.raises(ConfigurationError, match="lease"):
            await outbox.claim("main", 1, lease)
        with pytest.raises(ConfigurationError, match="lease"):
            await outbox.heartbeat([message], lease)
        with pytest.raises(ConfigurationError, match="lease"):
            OutboxRelay(outbox, "main", no_sink, lease=lease)
        with pytest.raises(ConfigurationError, match="poll_interval"):
            OutboxRelay(outbox, "main", no_sink, poll_interval=lease)
    for delay in (float("nan"), float("inf"), -1):
        with pytest.raises(ConfigurationError, match="retry_in"):
            await outbox.fail(message, "boom", retry_in=delay)
        with pytest.raises(ConfigurationError, match="older_than"):
            await ops.purge_delivered("main", older_than=delay)
        with pytest.raises(ConfigurationError, match="backoff"):
            Backoff(base=delay)
        with pytest.raises(ConfigurationError, match="backoff"):
            Backoff(max_delay=delay)
    with pytest.raises(ConfigurationError, match="factor"):
        Backoff(factor=float("nan"))
    assert await outbox.fail(message, "boom", retry_in=0) == "retrying"
