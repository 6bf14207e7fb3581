"""Every statement the webhook event store runs, built once per set of tables and named.

Built from the application's :class:`~sqlalchemy.Table` objects (their names and schemas are the
application's choice). Time is ``coalesce(:now, now())``. Status literals that name the outbox's
states are SQL literals, not bind parameters, so the plan does not depend on a parameter's value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    Integer,
    LargeBinary,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    exists,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ship_sqla._sql_time import TSTZ, now_param, seconds_param
from ship_sqla._webhooks._tables import UNIQUE_SUFFIX

if TYPE_CHECKING:
    from sqlalchemy.sql.dml import Delete, ReturningInsert, ReturningUpdate
    from sqlalchemy.sql.selectable import Select

__all__ = ["WebhookStatements", "build_statements"]

_OUTBOX_UNSETTLED = (literal_column("'pending'", Text), literal_column("'claimed'", Text))


@attrs.frozen
class WebhookStatements:
    """The store's statements. Parameters are listed on each."""

    record: ReturningInsert[Any]
    """:w_id, :w_webhook, :w_event, :w_tenant, :w_signed_at, :w_payload (jsonb), :w_headers
    (jsonb), :w_raw_body, :w_idempotency_key, :now -> the new row; no row when the event was
    recorded before (after waiting for an uncommitted recorder: the caller bounds that wait)."""

    get: Select[Any]
    """:w_webhook, :w_event -> the event's row, if any."""

    link: ReturningUpdate[Any]
    """:w_webhook, :w_event, :w_message -> the row's id when the event exists."""

    cleanup: Delete
    """:w_webhook, :retention (seconds), :limit, :now -> deletes up to ``limit`` events past
    retention whose outbox intent is not pending or claimed (W1)."""


def build_statements(events: Table, outbox: Table) -> WebhookStatements:
    e = events.c
    o = outbox.c
    event_matches = and_(
        e.webhook == bindparam("w_webhook", type_=Text),
        e.event_id == bindparam("w_event", type_=Text),
    )
    columns = [
        e.id,
        e.webhook,
        e.event_id,
        e.tenant_id,
        e.received_at,
        e.signed_at,
        e.payload,
        e.headers,
        e.raw_body,
        e.outbox_message_id,
        e.idempotency_key,
    ]
    # Served by <events>_webhook_event_key (the ON CONFLICT arbiter).
    record = (
        pg_insert(events)
        .values(
            id=bindparam("w_id", type_=UUID(as_uuid=True)),
            webhook=bindparam("w_webhook", type_=Text),
            event_id=bindparam("w_event", type_=Text),
            tenant_id=bindparam("w_tenant", type_=Text),
            received_at=now_param(),
            signed_at=bindparam("w_signed_at", type_=TSTZ),
            payload=bindparam("w_payload", type_=JSONB),
            headers=bindparam("w_headers", type_=JSONB),
            raw_body=bindparam("w_raw_body", type_=LargeBinary),
            idempotency_key=bindparam("w_idempotency_key", type_=Text),
        )
        .on_conflict_do_nothing(constraint=f"{events.name}{UNIQUE_SUFFIX}")
        .returning(*columns)
    )
    # Served by <events>_webhook_event_key.
    get = select(*columns).where(event_matches)
    # Served by <events>_webhook_event_key.
    link = (
        update(events)
        .where(event_matches)
        .values(outbox_message_id=bindparam("w_message", type_=UUID(as_uuid=True)))
        .returning(e.id)
    )
    # Served by <events>_retention_idx (webhook, received_at) for the range, and the outbox's
    # primary key for the per-event probe. Events whose intent is still pending or claimed are
    # skipped (W1): deleting them would let a redelivery of the same webhook-id enqueue twice.
    intent_unsettled = exists(
        select(literal_column("1")).where(
            o.id == e.outbox_message_id, o.state.in_(_OUTBOX_UNSETTLED)
        )
    )
    victims = (
        select(e.id)
        .where(
            e.webhook == bindparam("w_webhook", type_=Text),
            e.received_at <= now_param() - seconds_param("retention"),
            ~intent_unsettled,
        )
        .order_by(e.received_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True, of=events)
    )
    cleanup = delete(events).where(e.id.in_(victims))
    return WebhookStatements(record=record, get=get, link=link, cleanup=cleanup)
