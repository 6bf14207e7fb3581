"""The outbox's operator surface on real PostgreSQL: ``create_outbox_operations`` gates
``outbox.admin`` (list dead, get, retry, purge delivered) behind ``ship.outbox:manage``, through
the kernel's one permission gate, with signed page cursors (S1, O4)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from ship_sqla._outbox import (
    MANAGE_PERMISSION,
    Outbox,
    create_outbox,
    create_outbox_operations,
    ship_outbox_table,
)
from ship_sqla.errors import (
    BoundExceededError,
    ConfigurationError,
    InvalidCursorError,
    PermissionDeniedError,
)
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)

UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:5432/ship_sqla_outbox_no_such_database"
"""An outbox on this engine fails at its first statement: a refusal that is not
PermissionDeniedError would have reached SQL."""


@pytest.fixture
async def conn(ship_connection: AsyncConnection) -> AsyncConnection:
    await ship_connection.run_sync(metadata.create_all)
    return ship_connection


@pytest.fixture
def outbox(conn: AsyncConnection, ship_clock: FrozenClock) -> Outbox:
    return create_outbox(database=conn, table=table, clock=ship_clock, max_attempts=1)


class Asked:
    """An authorizer that records what it was asked and answers ``answer``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    def __call__(self, permission: str, operation: str) -> Any:
        self.asked.append((permission, operation))
        return self.answer


async def dead_messages(outbox: Outbox, count: int) -> list[Any]:
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(count)]
    for message in await outbox.claim("main", count, lease=10):
        assert await outbox.fail(message, "boom") == "dead"
    return ids


def every_operation(ops: Any, message_id: Any) -> dict[str, Any]:
    return {
        "list_dead": lambda: ops.list_dead("main"),
        "get": lambda: ops.get(message_id),
        "retry": lambda: ops.retry([message_id]),
        "retry_dead_matching": lambda: ops.retry_dead_matching("main"),
        "purge_delivered": lambda: ops.purge_delivered("main", older_than=0),
    }


async def test_every_operation_asks_for_ship_outbox_manage_and_a_refusal_changes_nothing(
    conn, outbox
):
    """S1: each operator operation asks authorizer("ship.outbox:manage", operation) first;
    anything but True (False, a truthy 1, None) raises PermissionDeniedError and changes
    nothing: the dead message stays dead."""
    (message_id,) = await dead_messages(outbox, 1)
    for answer in (False, 1, "yes", None):
        authorizer = Asked(answer)
        ops = create_outbox_operations(outbox, authorizer=authorizer)
        for name, call in every_operation(ops, message_id).items():
            with pytest.raises(PermissionDeniedError, match=MANAGE_PERMISSION) as caught:
                await call()
            assert caught.value.code == "SHIP_SQLA_PERMISSION_DENIED"
            assert caught.value.fix
            # A read asks manage, then (refused) read (S2); a change asks manage only.
            asked = [a for a in authorizer.asked if a[1] == name]
            assert asked[0] == (MANAGE_PERMISSION, name)
            assert asked[1:] in ([], [("ship.outbox:read", name)])
    state = (await conn.execute(select(table.c.state).where(table.c.id == message_id))).scalar()
    assert state == "dead"


async def test_a_refusal_comes_before_any_sql(ship_clock):
    """S1: the gate refuses before a statement runs (the database here is unreachable)."""
    unreachable = create_async_engine(UNREACHABLE)
    try:
        outbox = create_outbox(database=unreachable, table=table, clock=ship_clock)
        ops = create_outbox_operations(outbox, authorizer=Asked(False))
        for call in every_operation(ops, None).values():
            with pytest.raises(PermissionDeniedError):
                await call()
    finally:
        await unreachable.dispose()


async def test_an_allowed_caller_lists_gets_and_retries(outbox):
    """S1, O4: allowed (a sync or an async authorizer), the operations do their work: dead
    messages are listed and retried, one message is read by id."""
    ids = await dead_messages(outbox, 2)

    async def allow_async(permission: str, operation: str) -> bool:
        return permission == MANAGE_PERMISSION and bool(operation)

    for authorizer in (Asked(True), allow_async):
        ops = create_outbox_operations(outbox, authorizer=authorizer)
        page = await ops.list_dead("main")
        assert [r.id for r in page.items] == ids
        assert page.next_cursor is None
        record = await ops.get(ids[0])
        assert record is not None
        assert record.state == "dead"
    assert await ops.retry(ids) == ids
    assert (await ops.list_dead("main")).items == ()


async def test_cursors_are_signed_and_a_shared_secret_carries_them_across_processes(outbox):
    """O4 paging: a list_dead cursor is signed (the kernel's codec): another process holding the
    same cursor_secret continues the paging, one with another secret refuses the cursor."""
    ids = await dead_messages(outbox, 3)
    secret = b"k" * 32
    first = create_outbox_operations(outbox, authorizer=Asked(True), cursor_secret=secret)
    page = await first.list_dead("main", limit=2)
    assert [r.id for r in page.items] == ids[:2]
    assert page.next_cursor is not None
    other_process = create_outbox_operations(outbox, authorizer=Asked(True), cursor_secret=secret)
    rest = await other_process.list_dead("main", limit=2, cursor=page.next_cursor)
    assert [r.id for r in rest.items] == ids[2:]
    stranger = create_outbox_operations(outbox, authorizer=Asked(True))
    with pytest.raises(InvalidCursorError, match="signature"):
        await stranger.list_dead("main", limit=2, cursor=page.next_cursor)


async def test_the_outbox_exposes_no_ungated_operator_verbs(outbox):
    """S1: list dead, retry and purge are reached only through the gate (``outbox.admin`` is
    the port the gate uses); a non-callable authorizer is refused when the gate is built."""
    for verb in ("list_dead", "retry", "redrive", "purge_delivered"):
        assert not hasattr(outbox, verb), verb
    for verb in ("list_dead", "retry", "purge_delivered", "get"):
        assert callable(getattr(outbox.admin, verb))
    with pytest.raises(ConfigurationError, match="authorizer"):
        create_outbox_operations(outbox, authorizer=True)  # type: ignore[arg-type]


async def test_s1_o4_retry_dead_matching_redrives_page_by_page_and_is_audited(
    conn, outbox, ship_clock
):
    """S1, O4 (issue 33): retry_dead_matching re-drives every dead message of the outbox in
    pages of batch_size (keyset by creation, so a page never reads the same message twice),
    stops at max_batches with complete=False, and a second call finishes; created_before
    leaves younger messages dead; one audit entry per call with its exact count; a bad bound
    is refused before any statement."""
    from ship_sqla.operators import InMemoryAuditLog  # noqa: PLC0415

    ids = await dead_messages(outbox, 5)
    ship_clock.advance(60)
    cutoff = ship_clock.now()
    [young] = await dead_messages(outbox, 1)
    log = InMemoryAuditLog(ship_clock)
    ops = create_outbox_operations(outbox, authorizer=lambda *_: True, audit=log)
    first = await ops.retry_dead_matching(
        "main", created_before=cutoff, batch_size=2, max_batches=2
    )
    assert (len(first.moved), first.complete) == (4, False)
    rest = await ops.retry_dead_matching("main", created_before=cutoff, batch_size=2)
    assert rest.complete
    assert sorted(first.moved + rest.moved) == sorted(ids)
    assert (await ops.get(young)).state == "dead"
    assert [(e.operation, e.count) for e in log.entries] == [
        ("outbox.retry_dead_matching", 4),
        ("outbox.retry_dead_matching", 1),
    ]
    for bad in (
        {"batch_size": 0},
        {"max_batches": 0},
        {"created_before": cutoff.replace(tzinfo=None)},
    ):
        with pytest.raises((ConfigurationError, BoundExceededError)):
            await ops.retry_dead_matching("main", **bad)
