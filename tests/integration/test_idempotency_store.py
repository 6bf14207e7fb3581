"""The idempotency store on real PostgreSQL: outcomes, unit of work, concurrency, cleanup."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._idempotency import (
    IdempotencyClaimLostError,
    IdempotencyFingerprintMismatch,
    IdempotencyInProgress,
    IdempotencyKeyError,
    IdempotencyReplay,
    IdempotencyStarted,
    IdempotencyStore,
    StoredResponse,
    create_idempotency_store,
    ship_idempotency_table,
)
from ship_sqla.errors import BoundExceededError, ConfigurationError, TenantViolationError
from ship_sqla.testing import FrozenClock

# Module-level marker: anyio then requests its backend fixture at collection, which keeps
# pytest.mark.parametrize on async tests (marking later, in the conftest, drops the parameters).
pytestmark = pytest.mark.anyio

metadata = MetaData()
keys = ship_idempotency_table(metadata)
effects = Table(
    "idem_effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request", String, nullable=False),
)

OK = StoredResponse(201, [("content-type", "text/plain")], b"created")


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


async def count(bind: AsyncEngine | AsyncConnection, table: Table) -> int:
    statement = select(func.count()).select_from(table)
    if isinstance(bind, AsyncConnection):
        return int((await bind.execute(statement)).scalar_one())
    async with bind.connect() as c:
        return int((await c.execute(statement)).scalar_one())


# -- outcomes ---------------------------------------------------------------------------------


async def test_started_then_replay_then_mismatch(conn: AsyncConnection) -> None:
    """I2: every outcome is explicit: started, replay of the stored response, mismatch (422)."""
    store = create_idempotency_store(database=conn, table=keys)
    first = await store.begin("k1", "fp-a", prefix="http")
    assert isinstance(first, IdempotencyStarted)
    completed_at = await first.claim.complete(OK)
    again = await store.begin("k1", "fp-a", prefix="http")
    assert isinstance(again, IdempotencyReplay)
    assert again.response == OK
    assert again.completed_at == completed_at
    other = await store.begin("k1", "fp-b", prefix="http")
    assert isinstance(other, IdempotencyFingerprintMismatch)
    assert other.http_status == 422
    record = await store.get("k1", prefix="http")
    assert record is not None
    assert record.status == "completed"
    assert record.response == OK


async def test_keys_are_scoped_by_prefix_and_tenant(conn: AsyncConnection) -> None:
    """The same key under another prefix or tenant is another key; the tenant defaults to the
    unit of work's."""
    store = create_idempotency_store(database=conn, table=keys)
    assert isinstance(await store.begin("k", "fp", prefix="a"), IdempotencyStarted)
    assert isinstance(await store.begin("k", "fp", prefix="b"), IdempotencyStarted)
    assert isinstance(await store.begin("k", "fp", prefix="a", tenant="t1"), IdempotencyStarted)
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def in_tenant(tx: TransactionScope) -> object:
        return await store.begin("k", "fp", prefix="a")

    assert isinstance(await uow.run(in_tenant, tenant="t2"), IdempotencyStarted)
    assert isinstance(await uow.run(in_tenant, tenant="t1"), IdempotencyInProgress)
    assert (await store.get("k", prefix="a", tenant="t2")) is not None


async def test_binary_and_nul_bodies_round_trip(conn: AsyncConnection) -> None:
    """Stored responses keep any bytes (base64 where jsonb text cannot hold them)."""
    store = create_idempotency_store(database=conn, table=keys)
    for i, body in enumerate([b"\xff\xfe\x00binary", b"nul \x00 inside", "héllo".encode()]):
        started = await store.begin(f"bin-{i}", "fp")
        assert isinstance(started, IdempotencyStarted)
        response = StoredResponse(200, [("set-cookie", "a=1"), ("set-cookie", "b=2")], body)
        await started.claim.complete(response)
        replay = await store.begin(f"bin-{i}", "fp")
        assert isinstance(replay, IdempotencyReplay)
        assert replay.response == response


@pytest.mark.parametrize("bad_key", ["", "x" * 256, "line\nbreak"])
async def test_invalid_keys_are_refused(conn: AsyncConnection, bad_key: str) -> None:
    store = create_idempotency_store(database=conn, table=keys)
    with pytest.raises(IdempotencyKeyError, match="SHIP_SQLA_IDEMPOTENCY_KEY_INVALID"):
        await store.begin(bad_key, "fp")


async def test_configuration_is_checked(conn: AsyncConnection) -> None:
    with pytest.raises(ConfigurationError, match="lock_timeout"):
        create_idempotency_store(database=conn, table=keys, lock_timeout=timedelta(0))
    with pytest.raises(ConfigurationError, match="ttl"):
        create_idempotency_store(
            database=conn, table=keys, ttl=timedelta(seconds=5), claim_lease=timedelta(minutes=1)
        )
    with pytest.raises(ConfigurationError, match="ship_idempotency_table"):
        create_idempotency_store(database=conn, table=effects)


def test_names_are_explicit_and_fit() -> None:
    """T1: every index and constraint of the idempotency table is named from the table name."""
    md = MetaData()
    table = ship_idempotency_table(md, name="x" * 48)
    for item in (*table.indexes, *table.constraints):
        assert item.name is not None
        assert str(item.name).startswith("x" * 48)
        assert len(str(item.name).encode()) <= 63
    with pytest.raises(ConfigurationError, match="too long"):
        ship_idempotency_table(MetaData(), name="x" * 49)


# -- I1: the unit of work --------------------------------------------------------------------


async def test_claim_effect_and_response_commit_together(engine: AsyncEngine) -> None:
    """I1: the claim, the business write and the stored response commit together."""
    store = create_idempotency_store(database=engine, table=keys)
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def handler(tx: TransactionScope) -> None:
        started = await store.begin("order-1", "fp", prefix="http")
        assert isinstance(started, IdempotencyStarted)
        await tx.connection.execute(insert(effects).values(request="order-1"))
        await started.claim.complete(OK, scope=tx)

    await uow.run(handler)
    assert await count(engine, effects) == 1
    record = await store.get("order-1", prefix="http")
    assert record is not None
    assert record.status == "completed"


async def test_rollback_leaves_no_claim(engine: AsyncEngine) -> None:
    """I1: a rolled-back unit of work leaves neither the claim nor the response behind, so a
    retry with the same key runs the effect."""
    store = create_idempotency_store(database=engine, table=keys)
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def failing(tx: TransactionScope) -> None:
        started = await store.begin("order-2", "fp", prefix="http", scope=tx)
        assert isinstance(started, IdempotencyStarted)
        await tx.connection.execute(insert(effects).values(request="order-2"))
        await started.claim.complete(OK, scope=tx)
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(failing)
    assert await store.get("order-2", prefix="http") is None
    assert await count(engine, effects) == 0
    async with engine.connect() as c:
        rows = (await c.execute(select(func.count()).select_from(keys))).scalar_one()
    assert rows == 0

    async def retry(tx: TransactionScope) -> object:
        return await store.begin("order-2", "fp", prefix="http")

    assert isinstance(await uow.run(retry), IdempotencyStarted)


async def test_begin_restores_the_unit_of_works_lock_timeout(engine: AsyncEngine) -> None:
    """I2's bound applies to the claim only: the rest of the unit of work keeps its setting."""
    store = create_idempotency_store(
        database=engine, table=keys, lock_timeout=timedelta(milliseconds=250)
    )
    uow = create_unit_of_work(engine, repositories=scope_only)

    async def handler(tx: TransactionScope) -> tuple[str, str]:
        await tx.connection.execute(text("SET LOCAL lock_timeout = '7s'"))
        await store.begin("k", "fp")
        after_started = (await tx.connection.execute(text("SHOW lock_timeout"))).scalar_one()
        await store.begin("k", "fp")  # in progress (our own claim): a read, then restore
        after_read = (await tx.connection.execute(text("SHOW lock_timeout"))).scalar_one()
        return after_started, after_read

    assert await uow.run(handler) == ("7s", "7s")


# -- I2: concurrent duplicates ---------------------------------------------------------------


async def test_uncommitted_claim_answers_in_progress_within_lock_timeout(
    engine: AsyncEngine,
) -> None:
    """I2: a duplicate that meets an uncommitted claim (an INSERT waiting on another
    transaction's row) is told "in progress" after lock_timeout instead of hanging, and its own
    unit of work stays usable."""
    store = create_idempotency_store(
        database=engine, table=keys, lock_timeout=timedelta(milliseconds=200)
    )
    uow = create_unit_of_work(engine, repositories=scope_only)
    holding = anyio.Event()
    release = anyio.Event()

    async def first(tx: TransactionScope) -> None:
        started = await store.begin("slow", "fp")
        assert isinstance(started, IdempotencyStarted)
        holding.set()
        await release.wait()
        await started.claim.complete(OK)

    async def duplicate(tx: TransactionScope) -> object:
        outcome = await store.begin("slow", "fp")
        # The duplicate's transaction is intact: it can still write and commit.
        await tx.connection.execute(insert(effects).values(request="after-409"))
        return outcome

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(uow.run, first)
            await holding.wait()
            outcome = await uow.run(duplicate)
            release.set()
    assert isinstance(outcome, IdempotencyInProgress)
    assert outcome.locked_until is None
    assert await count(engine, effects) == 1
    with anyio.fail_after(10):
        replay = await uow.run(duplicate)
    assert isinstance(replay, IdempotencyReplay)


async def test_twenty_concurrent_requests_run_the_effect_once(engine: AsyncEngine) -> None:
    """I2: 20 concurrent requests with one key, each in its own uow.run: the effect runs exactly
    once; every other request replays or is told "in progress"; none hangs."""
    store = create_idempotency_store(
        database=engine, table=keys, lock_timeout=timedelta(milliseconds=300)
    )
    uow = create_unit_of_work(engine, repositories=scope_only)
    release_first = anyio.Event()
    outcomes: list[object] = []
    in_progress = 0

    async def request(i: int) -> None:
        nonlocal in_progress

        async def handler(tx: TransactionScope) -> object:
            outcome = await store.begin("same-key", "same-fp", prefix="http")
            if isinstance(outcome, IdempotencyStarted):
                await tx.connection.execute(insert(effects).values(request=f"r{i}"))
                # Hold the claim uncommitted so that duplicates meet it in flight.
                await release_first.wait()
                await outcome.claim.complete(OK)
            return outcome

        outcome = await uow.run(handler)
        outcomes.append(outcome)
        if isinstance(outcome, IdempotencyInProgress):
            in_progress += 1
            if in_progress >= 5:
                release_first.set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(request, i)
    started = [o for o in outcomes if isinstance(o, IdempotencyStarted)]
    replays = [o for o in outcomes if isinstance(o, IdempotencyReplay)]
    assert len(outcomes) == 20
    assert len(started) == 1
    assert len(replays) + in_progress == 19
    assert in_progress >= 5
    assert all(r.response == OK for r in replays)
    assert await count(engine, effects) == 1
    with anyio.fail_after(10):
        late = await store.begin("same-key", "same-fp", prefix="http")
    assert isinstance(late, IdempotencyReplay)


# -- claims outside a unit of work -----------------------------------------------------------


async def test_committed_claim_blocks_until_its_lease_then_is_taken_over(
    engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """I2 outside a unit of work: a claim committed without a response answers "in progress"
    until locked_until; then a retry of the same request takes it over, and the old holder's
    complete is refused (fenced by the claim token)."""
    store = create_idempotency_store(
        database=engine, table=keys, clock=ship_clock, claim_lease=timedelta(seconds=30)
    )
    first = await store.begin("k", "fp")
    assert isinstance(first, IdempotencyStarted)
    blocked = await store.begin("k", "fp")
    assert isinstance(blocked, IdempotencyInProgress)
    assert blocked.locked_until == ship_clock.now() + timedelta(seconds=30)
    ship_clock.advance(31)
    assert isinstance(await store.begin("k", "other-fp"), IdempotencyFingerprintMismatch)
    second = await store.begin("k", "fp")
    assert isinstance(second, IdempotencyStarted)
    with pytest.raises(IdempotencyClaimLostError, match="SHIP_SQLA_IDEMPOTENCY_CLAIM_LOST"):
        await first.claim.complete(OK)
    await second.claim.complete(OK)
    assert isinstance(await store.begin("k", "fp"), IdempotencyReplay)


async def test_release_lets_a_retry_run_at_once(engine: AsyncEngine) -> None:
    store = create_idempotency_store(database=engine, table=keys)
    first = await store.begin("k", "fp")
    assert isinstance(first, IdempotencyStarted)
    await first.claim.release()
    with pytest.raises(IdempotencyClaimLostError):
        await first.claim.release()
    assert isinstance(await store.begin("k", "fp"), IdempotencyStarted)


async def test_expired_key_is_forgotten(engine: AsyncEngine, ship_clock: FrozenClock) -> None:
    """A key past its ttl is claimed afresh, even by a different request."""
    store = create_idempotency_store(
        database=engine, table=keys, clock=ship_clock, ttl=timedelta(hours=1)
    )
    first = await store.begin("k", "fp")
    assert isinstance(first, IdempotencyStarted)
    await first.claim.complete(OK)
    ship_clock.advance(timedelta(minutes=59))
    assert isinstance(await store.begin("k", "fp"), IdempotencyReplay)
    ship_clock.advance(timedelta(minutes=2))
    assert isinstance(await store.begin("k", "new-fp"), IdempotencyStarted)


# -- I3: cleanup -----------------------------------------------------------------------------


async def test_cleanup_deletes_expired_keys_of_one_prefix_in_bounded_batches(
    engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """I3: cleanup removes expired keys under the given prefix only, at most `limit` a call,
    and never keys that have not expired."""
    store = create_idempotency_store(
        database=engine, table=keys, clock=ship_clock, ttl=timedelta(hours=1)
    )
    for i in range(5):
        await store.begin(f"old-{i}", "fp", prefix="a", tenant=f"t{i % 2}")
        await store.begin(f"old-{i}", "fp", prefix="b")
    ship_clock.advance(timedelta(hours=2))
    await store.begin("fresh", "fp", prefix="a")
    assert await store.cleanup(prefix="a", limit=2) == 2
    assert await store.cleanup(prefix="a", limit=2) == 2
    assert await store.cleanup(prefix="a", limit=2) == 1
    assert await store.cleanup(prefix="a", limit=2) == 0
    assert await store.get("fresh", prefix="a") is not None
    assert await count(engine, keys) == 6  # prefix b's five and the fresh key
    with pytest.raises(BoundExceededError):
        await store.cleanup(prefix="a", limit=10_001)


async def test_cleanup_is_served_by_the_expiry_index(conn: AsyncConnection) -> None:
    """I3: the cleanup scan is an index range scan on <table>_expires_idx, not a table scan."""
    store: IdempotencyStore = create_idempotency_store(database=conn, table=keys)
    await conn.execute(text("SET LOCAL enable_seqscan = off"))
    compiled = store._sql.cleanup.compile(dialect=conn.dialect)
    params = {"k_prefix": "a", "limit": 10, "now": None}
    plan = "\n".join(
        row[0]
        for row in await conn.exec_driver_sql(
            f"EXPLAIN {compiled}", tuple(compiled.construct_params(params).values())
        )
    )
    assert "ship_idempotency_expires_idx" in plan, plan


async def test_another_tenant_is_refused_inside_a_tenant_scope(conn: AsyncConnection) -> None:
    """R2/I1: inside a unit of work for one tenant, begin and get refuse another tenant's keys
    (a replay would hand out that tenant's stored response)."""
    store = create_idempotency_store(database=conn, table=keys)
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def begin_for_other(tx: TransactionScope) -> object:
        return await store.begin("k", "fp", tenant="t2")

    async def get_for_other(tx: TransactionScope) -> object:
        return await store.get("k", tenant="t2")

    for handler in (begin_for_other, get_for_other):
        with pytest.raises(TenantViolationError, match="inside a unit of work for tenant 't1'"):
            await uow.run(handler, tenant="t1")
    assert await count(conn, keys) == 0


@pytest.mark.parametrize("tenant", ["", " ", "\t\n"])
async def test_an_empty_tenant_never_replays_the_untenanted_response(
    conn: AsyncConnection, tenant: str
) -> None:
    """R2/I2: tenant "" (or blank) is refused before any SQL runs; it used to alias "no
    tenant" and replay the response stored for an untenanted request."""
    store = create_idempotency_store(database=conn, table=keys)
    started = await store.begin("shared", "fp")
    assert isinstance(started, IdempotencyStarted)
    await started.claim.complete(OK)
    with pytest.raises(TenantViolationError, match="tenant"):
        await store.begin("shared", "fp", tenant=tenant)
    with pytest.raises(TenantViolationError, match="tenant"):
        await store.get("shared", tenant=tenant)
