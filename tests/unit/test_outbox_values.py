"""Cursors, errors and wake-ups of the outbox, without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import MetaData

from ship_sqla._outbox import (
    OutboxDeadLetteredError,
    OutboxLeaseStaleError,
    OutboxMessage,
    OutboxPublishError,
    OutboxRecord,
    ship_outbox_table,
)
from ship_sqla._outbox._operations import dead_page_cursor, dead_page_position
from ship_sqla._outbox._sql import CLAIM_RETURNING
from ship_sqla._outbox._store import Wakeup
from ship_sqla.errors import InvalidCursorError
from ship_sqla.testing import FrozenClock

SECRET = b"s" * 32
TABLE = ship_outbox_table(MetaData())

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def record(created_at: datetime = NOW, message_id: uuid.UUID | None = None) -> OutboxRecord:
    return OutboxRecord(
        id=message_id or uuid.uuid4(),
        outbox_id="main",
        topic="t",
        payload={},
        headers={},
        ordering_key=None,
        tenant=None,
        state="dead",
        attempts=3,
        max_attempts=3,
        available_at=created_at,
        created_at=created_at,
        lease_expires_at=None,
        claimed_by=None,
        delivered_at=None,
        last_error="boom",
    )


def message() -> OutboxMessage:
    return OutboxMessage(
        id=uuid.uuid4(),
        outbox_id="main",
        topic="t",
        payload={},
        headers={},
        ordering_key=None,
        tenant=None,
        attempt=2,
        max_attempts=3,
        token=uuid.uuid4(),
        claimed_by="w",
        lease_expires_at=NOW,
        available_at=NOW,
        created_at=NOW,
        last_error=None,
    )


@given(
    st.text(min_size=1, max_size=40),
    st.datetimes(timezones=st.just(UTC)),
    st.uuids(),
)
def test_cursor_round_trips(outbox_id, created_at, message_id):
    """O4: a list_dead cursor (signed, the kernel's codec) encodes exactly the (created_at, id)
    the next page starts after."""
    cursor = dead_page_cursor(TABLE, outbox_id, record(created_at, message_id), SECRET)
    assert dead_page_position(TABLE, outbox_id, cursor, SECRET) == (created_at, message_id)


@pytest.mark.parametrize("cursor", ["", "!!!", "bm90IGpzb24", "WzEsMl0"])
def test_broken_cursors_are_refused(cursor):
    with pytest.raises(InvalidCursorError, match="Fix:"):
        dead_page_position(TABLE, "main", cursor, SECRET)


def test_a_cursor_of_another_outbox_table_or_secret_is_refused():
    """A cursor is valid only for the outbox, table and signing secret that issued it."""
    cursor = dead_page_cursor(TABLE, "billing", record(), SECRET)
    with pytest.raises(InvalidCursorError, match="different query"):
        dead_page_position(TABLE, "main", cursor, SECRET)
    other_table = ship_outbox_table(MetaData(), name="other_outbox")
    with pytest.raises(InvalidCursorError, match="different query"):
        dead_page_position(other_table, "billing", cursor, SECRET)
    with pytest.raises(InvalidCursorError, match="signature"):
        dead_page_position(TABLE, "billing", cursor, b"t" * 32)


def test_errors_carry_codes_what_happened_and_the_fix():
    """O3: the stale error names the message and the operation, with a stable code."""
    m = message()
    stale = OutboxLeaseStaleError(m.id, "complete")
    assert stale.code == "SHIP_SQLA_OUTBOX_LEASE_STALE"
    assert str(m.id) in str(stale)
    assert "Fix:" in str(stale)
    published = OutboxPublishError(m, "dead", "BoomError: x")
    assert "attempt 2/3" in str(published)
    assert "dead" in str(published)
    lapsed = OutboxDeadLetteredError(record())
    assert lapsed.code == "SHIP_SQLA_OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT"


async def test_wakeup_is_level_triggered_and_times_out_on_the_clock():
    clock = FrozenClock()
    wakeup = Wakeup()
    wakeup.set()
    assert await wakeup.wait(60, clock) is True  # set before the wait: returns at once
    results: list[bool] = []

    async def waiter() -> None:
        results.append(await wakeup.wait(60, clock))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        with anyio.fail_after(5):
            while clock.sleepers == 0:
                await anyio.lowlevel.checkpoint()
        clock.advance(60)
    assert results == [False]
    assert clock.sleepers == 0


def test_the_claim_returns_the_message_fields_in_their_order():
    """O2: the claim's RETURNING lists OutboxMessage's fields in its field order (messages are
    built positionally), each column named after its field."""
    renamed = {"tenant": "tenant_id", "attempt": "attempts", "token": "lease_token"}
    fields = [renamed.get(f.name, f.name) for f in attrs.fields(OutboxMessage)]
    assert list(CLAIM_RETURNING[: len(fields)]) == fields
