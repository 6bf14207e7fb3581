"""The idempotency table factory.

One row per ``(prefix, tenant_id, key)``: the prefix is the namespace a caller claims keys in
(``"http"`` for the Idempotency-Key middleware, ``"webhook:<name>"`` for a webhook receiver), the
tenant keeps one tenant's keys from ever answering another's requests (``''`` when there is
none: primary-key columns cannot be NULL). Every name is explicit and wrapped in ``conv()`` so an
application's naming convention cannot rename it (T1).
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

from ship_sqla._naming import check_derived_names, derived_name

__all__ = ["DEFAULT_TABLE_NAME", "STATUSES", "ship_idempotency_table"]

DEFAULT_TABLE_NAME = "ship_idempotency"
STATUSES = ("in_progress", "completed")

_LONGEST_SUFFIX = "_response_check"


def ship_idempotency_table(
    metadata: MetaData, name: str = DEFAULT_TABLE_NAME, schema: str | None = None
) -> Table:
    """The idempotency table, added to ``metadata`` so Alembic autogenerate sees it.

    Columns: ``prefix``, ``tenant_id`` (``''`` = none), ``key`` (together the primary key);
    ``fingerprint`` of the request that claimed the key; ``status`` (in_progress | completed);
    ``claim_token`` fencing ``complete``/``release``; ``response`` jsonb (status, headers, body as
    text or base64); ``locked_until`` (an in-progress claim left committed, e.g. by a crashed
    process, may be retaken after it); ``expires_at`` (when the key is forgotten, and when
    cleanup may delete it); ``created_at``, ``completed_at``.
    """
    check_derived_names(name, (_LONGEST_SUFFIX,), "idempotency", schema=schema)
    statuses = ", ".join(f"'{s}'" for s in STATUSES)
    return Table(
        name,
        metadata,
        Column("prefix", Text, nullable=False),
        Column("tenant_id", Text, nullable=False, server_default=text("''")),
        Column("key", Text, nullable=False),
        Column("fingerprint", Text, nullable=False),
        Column("status", Text, nullable=False, server_default=text("'in_progress'")),
        Column("claim_token", UUID(as_uuid=True), nullable=True),
        Column("response", JSONB, nullable=True),
        Column("locked_until", TIMESTAMP(timezone=True), nullable=True),
        Column("expires_at", TIMESTAMP(timezone=True), nullable=False),
        Column(
            "created_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")
        ),
        Column("completed_at", TIMESTAMP(timezone=True), nullable=True),
        # Serves every per-key statement (claim, take-over, read, complete, release).
        PrimaryKeyConstraint("prefix", "tenant_id", "key", name=derived_name(name, "_pkey")),
        CheckConstraint(f"status IN ({statuses})", name=derived_name(name, "_status_check")),
        CheckConstraint(
            "status <> 'completed' OR response IS NOT NULL",
            name=derived_name(name, "_response_check"),
        ),
        # Serves CLEANUP: the expired keys of one prefix, oldest first, LIMIT n.
        Index(derived_name(name, "_expires_idx"), "prefix", "expires_at"),
        schema=schema,
        comment="ship_sqla idempotency keys (ship_idempotency_table)",
    )
