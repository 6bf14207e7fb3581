"""The webhook events table factory.

One row per delivered event, unique per ``(webhook, event_id)`` (the Standard Webhooks
``webhook-id``, stable across the sender's retries) under the named constraint
``<table>_webhook_event_key``. Every name is explicit and wrapped in ``conv()`` (T1).
"""

from __future__ import annotations

import uuid

from sqlalchemy import (
    Column,
    Index,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

from ship_sqla._naming import check_derived_names, derived_name

__all__ = ["DEFAULT_TABLE_NAME", "UNIQUE_SUFFIX", "ship_webhook_events_table"]

DEFAULT_TABLE_NAME = "ship_webhook_events"
UNIQUE_SUFFIX = "_webhook_event_key"


def ship_webhook_events_table(
    metadata: MetaData, name: str = DEFAULT_TABLE_NAME, schema: str | None = None
) -> Table:
    """The webhook events table, added to ``metadata`` so Alembic autogenerate sees it.

    Columns: ``id`` uuid pk; ``webhook`` (the endpoint's name), ``event_id`` (``webhook-id``);
    ``tenant_id``; ``received_at``; ``signed_at`` (``webhook-timestamp`` of the recorded attempt);
    ``payload`` jsonb and ``headers`` jsonb as received; ``raw_body`` bytea (optional: kept when
    the receiver is asked to, so a delivery can be re-verified); ``outbox_message_id`` linking
    the outbox intent the event produced; ``idempotency_key`` (the key claimed under the
    webhook's prefix).
    """
    check_derived_names(name, (UNIQUE_SUFFIX,), "webhook events", schema=schema)
    return Table(
        name,
        metadata,
        Column(
            "id",
            UUID(as_uuid=True),
            nullable=False,
            default=uuid.uuid4,
            server_default=text("gen_random_uuid()"),
        ),
        Column("webhook", Text, nullable=False),
        Column("event_id", Text, nullable=False),
        Column("tenant_id", Text, nullable=True),
        Column(
            "received_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
        ),
        Column("signed_at", TIMESTAMP(timezone=True), nullable=True),
        Column("payload", JSONB, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("raw_body", LargeBinary, nullable=True),
        Column("outbox_message_id", UUID(as_uuid=True), nullable=True),
        Column("idempotency_key", Text, nullable=True),
        PrimaryKeyConstraint("id", name=derived_name(name, "_pkey")),
        # Deduplicates deliveries (a retry carries the same webhook-id) and serves RECORD's
        # conflict arbiter, GET and LINK.
        UniqueConstraint("webhook", "event_id", name=derived_name(name, UNIQUE_SUFFIX)),
        # Serves CLEANUP: one webhook's events past retention, oldest first, LIMIT n.
        Index(derived_name(name, "_retention_idx"), "webhook", "received_at"),
        schema=schema,
        comment="ship_sqla received webhook events (ship_webhook_events_table)",
    )
