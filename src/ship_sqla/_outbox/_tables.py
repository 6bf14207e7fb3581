"""The outbox table factory.

The two partial indexes are the seed's, exactly: ``<table>_pending_idx`` serves the due-row scan
of a claim, ``<table>_lease_idx`` the lapsed-lease scan. A third, ``<table>_ordering_idx``, exists
only for the ordered claim (see :data:`ORDERING_INDEX_SUFFIX`). Every name is explicit and
wrapped in ``conv()`` so an application's naming convention cannot rename it (T1), and every
predicate is written in the exact words the claim statements in ``_sql.py`` use, because
PostgreSQL uses a partial index only when the query's predicate implies the index's.
"""

from __future__ import annotations

import uuid

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
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

from ship_sqla._naming import check_derived_names, derived_name
from ship_sqla._storage_options import CHURN_OPTIONS, declare_storage_options

__all__ = [
    "DEFAULT_TABLE_NAME",
    "LEASE_INDEX_PREDICATE",
    "ORDERING_INDEX_PREDICATE",
    "PENDING_INDEX_PREDICATE",
    "STATES",
    "ship_outbox_table",
]

DEFAULT_TABLE_NAME = "ship_outbox"
STATES = ("pending", "claimed", "delivered", "dead")

PENDING_INDEX_PREDICATE = "state = 'pending'"
LEASE_INDEX_PREDICATE = "state = 'claimed'"
ORDERING_INDEX_PREDICATE = "ordering_key IS NOT NULL AND state IN ('pending', 'claimed')"

_LONGEST_SUFFIX = "_ordering_idx"


def ship_outbox_table(
    metadata: MetaData, name: str = DEFAULT_TABLE_NAME, schema: str | None = None
) -> Table:
    """The outbox table, added to ``metadata`` so Alembic autogenerate sees it.

    Columns: ``id`` uuid pk; ``outbox_id``, ``topic`` text; ``payload``, ``headers`` jsonb;
    ``ordering_key``, ``tenant_id`` text null; ``state`` text (pending | claimed | delivered |
    dead); ``attempts``, ``max_attempts`` int; ``available_at``, ``created_at`` timestamptz;
    lease fields ``lease_expires_at``, ``lease_token`` uuid, ``claimed_by``; ``delivered_at``;
    ``last_error``.
    """
    check_derived_names(name, (_LONGEST_SUFFIX,), "outbox", schema=schema)
    states = ", ".join(f"'{s}'" for s in STATES)
    table = Table(
        name,
        metadata,
        # Generated client-side (time-ordered, see _store.new_message_id) so rows enqueued in one
        # transaction keep their order; the server default serves bulk loads and raw SQL.
        Column(
            "id",
            UUID(as_uuid=True),
            nullable=False,
            default=uuid.uuid4,
            server_default=text("gen_random_uuid()"),
        ),
        Column("outbox_id", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("payload", JSONB, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("ordering_key", Text, nullable=True),
        Column("tenant_id", Text, nullable=True),
        Column("state", Text, nullable=False, server_default=text("'pending'")),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("max_attempts", Integer, nullable=False),
        Column(
            "available_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
        ),
        Column(
            "created_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
        ),
        Column("lease_expires_at", TIMESTAMP(timezone=True), nullable=True),
        Column("lease_token", UUID(as_uuid=True), nullable=True),
        Column("claimed_by", Text, nullable=True),
        Column("delivered_at", TIMESTAMP(timezone=True), nullable=True),
        Column("last_error", Text, nullable=True),
        PrimaryKeyConstraint("id", name=derived_name(name, "_pkey")),
        CheckConstraint(f"state IN ({states})", name=derived_name(name, "_state_check")),
        # Serves CLAIM's due-row scan (and nothing else): equality on outbox_id, then
        # available_at, created_at order, so a claim reads about batch_size entries.
        Index(
            derived_name(name, "_pending_idx"),
            "outbox_id",
            "available_at",
            "created_at",
            postgresql_where=text(PENDING_INDEX_PREDICATE),
        ),
        # Serves CLAIM's lapsed-lease scan: claimed rows of one outbox in lease order.
        Index(
            derived_name(name, "_lease_idx"),
            "outbox_id",
            "lease_expires_at",
            postgresql_where=text(LEASE_INDEX_PREDICATE),
        ),
        # Serves only the ordered claim's "does this key have an earlier undelivered row?"
        # probe (CLAIM_ORDERED's NOT EXISTS): the first entry of (outbox_id, ordering_key)
        # answers it. Without it the probe would walk every pending row of the outbox for
        # each candidate. Holds keyed, undelivered rows only, so it stays small.
        Index(
            derived_name(name, "_ordering_idx"),
            "outbox_id",
            "ordering_key",
            "created_at",
            "id",
            postgresql_where=text(ORDERING_INDEX_PREDICATE),
        ),
        schema=schema,
        comment="ship_sqla transactional outbox (ship_outbox_table)",
    )
    # J21: claimed, settled and purged like job runs (see ship_sqla._storage_options).
    return declare_storage_options(table, CHURN_OPTIONS)
