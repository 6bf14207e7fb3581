"""The outbound webhooks' tables (SPEC §16): endpoints and deliveries. Every name is explicit
and derived from the table's (T1)."""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP

from ship_sqla._naming import derived_names

__all__ = ["ship_webhook_deliveries_table", "ship_webhook_endpoints_table"]

_TSTZ = TIMESTAMP(timezone=True)


def ship_webhook_endpoints_table(
    metadata: MetaData, name: str = "ship_webhook_endpoints", schema: str | None = None
) -> Table:
    """The webhook endpoints (W2, W4), added to ``metadata`` so Alembic autogenerate sees it
    (``ship-sqla schema apply --only webhooks_out`` creates it without Alembic).

    ``id``; ``tenant``; ``url``; ``topics`` (text[]; ``*``: every topic); ``secrets`` (jsonb:
    ``[{"value", "added_at", "expires_at"}]``, several while one is rotated; read by the sender
    at send time only, never copied into a run, a delivery or a log); ``state`` (enabled |
    disabled) and ``disabled_reason``; ``consecutive_failures`` (W4's streak);
    ``created_at``, ``updated_at``. Small: read by primary key, or whole for a topic's
    subscribers.
    """
    n = derived_names(name, ("_pkey", "_state_check"), "webhook endpoints", schema=schema)
    return Table(
        name,
        metadata,
        Column("id", Text, nullable=False),
        Column("tenant", Text, nullable=True),
        Column("url", Text, nullable=False),
        Column("topics", ARRAY(Text), nullable=False),
        Column("secrets", JSONB, nullable=False),
        Column("state", Text, nullable=False, server_default=text("'enabled'")),
        Column("disabled_reason", Text, nullable=True),
        Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
        Column("created_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("updated_at", _TSTZ, nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        CheckConstraint("state IN ('enabled', 'disabled')", name=n["_state_check"]),
        schema=schema,
        comment="ship_sqla outbound webhook endpoints (ship_webhook_endpoints_table)",
    )


def ship_webhook_deliveries_table(
    metadata: MetaData, name: str = "ship_webhook_deliveries", schema: str | None = None
) -> Table:
    """The webhook deliveries (W1, W3), one row per delivery of one event to one endpoint.

    ``id`` (the ``webhook-id``, stable across retries); ``endpoint_id``; ``tenant``; ``topic``;
    ``payload`` (jsonb: the event, the body sent); ``state`` (pending | delivered | failed |
    paused); ``attempts`` (jsonb list, one ``{"at", "status", "duration", "body", "error"}``
    per attempt, the body a bounded excerpt); ``created_at``, ``updated_at``.
    """
    n = derived_names(
        name, ("_pkey", "_state_check", "_endpoint_idx"), "webhook deliveries", schema=schema
    )
    return Table(
        name,
        metadata,
        Column("id", Text, nullable=False),
        Column("endpoint_id", Text, nullable=False),
        Column("tenant", Text, nullable=True),
        Column("topic", Text, nullable=False),
        Column("payload", JSONB, nullable=False),
        Column("state", Text, nullable=False),
        Column("attempts", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
        Column("created_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("updated_at", _TSTZ, nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        CheckConstraint(
            "state IN ('pending', 'delivered', 'failed', 'paused')", name=n["_state_check"]
        ),
        # Serves RESUME_PAUSED and an endpoint's deliveries (LIST_DELIVERIES by endpoint).
        Index(n["_endpoint_idx"], "endpoint_id", "state"),
        schema=schema,
        comment="ship_sqla outbound webhook deliveries (ship_webhook_deliveries_table)",
    )
