"""A tenant is None or a real tenant, everywhere (issue #10 item 6): ``""``, blank, control
characters, over-long or non-text tenants are refused with TenantViolationError before any SQL
runs, by the one check (``ship_sqla._scope.check_tenant``) that uow.run and every store use."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import MetaData, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ship_sqla import (
    TransactionScope,
    create_idempotency_store,
    create_outbox,
    create_unit_of_work,
    create_webhook_event_store,
    ship_idempotency_table,
    ship_outbox_table,
    ship_webhook_events_table,
)

# Private on purpose: the one tenant rule lives in the scope module, and this test proves every
# store applies that same rule (and its byte bound) rather than a copy of its own.
from ship_sqla._scope import MAX_TENANT_BYTES, check_tenant
from ship_sqla.asgi import WebhookEndpoint
from ship_sqla.errors import IdempotencyKeyError, TenantViolationError
from ship_sqla.idempotency import IdempotencyStarted

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

metadata = MetaData()
outbox_table = ship_outbox_table(metadata)
keys = ship_idempotency_table(metadata)
events = ship_webhook_events_table(metadata)

NOT_TENANTS: list[Any] = ["", " ", "\t\n", "acme\x00", "line\nbreak", "é" * 128, 42, b"acme"]
"""Empty and blank (they would alias "no tenant"), control characters, 256 bytes of UTF-8
(one over the bound), and values that are not text."""


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


@pytest.fixture
async def refused() -> AsyncIterator[AsyncEngine]:
    """An engine whose every connect is refused: a check that ran after connecting would
    raise DatabaseUnavailableError instead of TenantViolationError."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{port}/none")
    yield engine
    await engine.dispose()


@pytest.fixture
async def conn(ship_connection: AsyncConnection) -> AsyncConnection:
    await ship_connection.run_sync(metadata.create_all)
    return ship_connection


def test_the_one_check() -> None:
    """R2: None is "no tenant"; a tenant of 1 to MAX_TENANT_BYTES bytes of printable text is
    kept as given; anything else is TenantViolationError saying what was wrong and the fix."""
    assert check_tenant(None, operation="probe") is None
    assert check_tenant("acme", operation="probe") == "acme"
    assert check_tenant("x" * MAX_TENANT_BYTES, operation="probe") == "x" * MAX_TENANT_BYTES
    for bad in NOT_TENANTS:
        with pytest.raises(TenantViolationError, match="probe was given tenant") as raised:
            check_tenant(bad, operation="probe")
        assert raised.value.fix


@pytest.mark.parametrize("tenant", NOT_TENANTS)
async def test_uow_run_refuses_a_non_tenant_before_connecting(
    refused: AsyncEngine, tenant: Any
) -> None:
    """R2/U2: uow.run(tenant="") and the like are refused before a connection is even asked
    for (the engine here refuses connections), outer and nested runs alike."""
    uow = create_unit_of_work(refused, repositories=scope_only)
    calls: list[int] = []

    async def handler(scope: TransactionScope) -> None:
        calls.append(1)

    with pytest.raises(TenantViolationError, match=r"uow\.run was given tenant"):
        await uow.run(handler, tenant=tenant)
    assert calls == []


async def test_a_nested_run_refuses_a_non_tenant(conn: AsyncConnection) -> None:
    """R2/U5: a nested run naming tenant "" is refused, not taken for "inherit the outer"."""
    uow = create_unit_of_work(conn, repositories=scope_only)

    async def inner(scope: TransactionScope) -> str | None:
        return scope.tenant

    async def outer(scope: TransactionScope) -> str | None:
        return await uow.run(inner, tenant="")

    with pytest.raises(TenantViolationError, match="empty or blank"):
        await uow.run(outer, tenant="acme")


@pytest.mark.parametrize("tenant", ["", " "])
async def test_idempotency_and_webhook_stores_refuse_before_connecting(
    refused: AsyncEngine, tenant: str
) -> None:
    """R2/I1: the idempotency store (begin, get) and the webhook store (record) refuse a
    non-tenant before asking for a connection."""
    store = create_idempotency_store(database=refused, table=keys)
    webhooks = create_webhook_event_store(
        database=refused, table=events, outbox_table=outbox_table, idempotency_table=keys
    )
    with pytest.raises(TenantViolationError):
        await store.begin("k", "fp", tenant=tenant)
    with pytest.raises(TenantViolationError):
        await store.get("k", tenant=tenant)
    with pytest.raises(TenantViolationError):
        await webhooks.record("stripe", "evt_1", {}, tenant=tenant)


@pytest.mark.parametrize("tenant", ["", " "])
async def test_outbox_enqueue_refuses_a_non_tenant_and_writes_nothing(
    conn: AsyncConnection, tenant: str
) -> None:
    """R2/O1: outbox enqueue with tenant "" is refused (through tenant_within) and writes
    nothing."""
    outbox = create_outbox(database=conn, table=outbox_table)
    with pytest.raises(TenantViolationError):
        await outbox.enqueue("orders", "order.placed", {"id": 1}, tenant=tenant)
    written = await conn.execute(select(func.count()).select_from(outbox_table))
    assert written.scalar_one() == 0


def test_a_webhook_endpoint_refuses_a_non_tenant() -> None:
    """R2: a WebhookEndpoint configured with tenant "" is refused when it is declared."""
    with pytest.raises(TenantViolationError, match="WebhookEndpoint"):
        WebhookEndpoint(name="stripe", secrets="whsec_" + "MDEyMzQ1Njc4OWFiY2RlZg==", tenant="")


async def test_idempotency_bounds_are_typed_errors_not_index_row_errors(
    conn: AsyncConnection,
) -> None:
    """I2: keys over 255 bytes and tenants over 255 bytes (UTF-8) are typed errors before any
    SQL (a 3000-byte tenant used to reach PostgreSQL's "index row requires N bytes"); at the
    bounds, with 4-byte characters, a claim fits the primary key's btree row."""
    store = create_idempotency_store(database=conn, table=keys)
    with pytest.raises(IdempotencyKeyError, match="255 bytes"):
        await store.begin("€" * 86, "fp")  # 258 bytes, 86 characters
    with pytest.raises(TenantViolationError, match="over 255"):
        await store.begin("k", "fp", tenant="t" * 3000)
    widest = "\N{MUSICAL SYMBOL G CLEF}"  # 4 bytes of UTF-8
    started = await store.begin(
        widest * 63, "fp", prefix=widest * 50, tenant=widest * 63
    )  # 252 + 200 + 252 bytes
    assert isinstance(started, IdempotencyStarted)
