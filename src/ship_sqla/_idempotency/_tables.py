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
from sqlalchemy.sql.elements import conv

from ship_sqla.kernel import ConfigurationError

__all__ = ["DEFAULT_TABLE_NAME", "STATUSES", "ship_idempotency_table"]

DEFAULT_TABLE_NAME = "ship_idempotency"
STATUSES = ("in_progress", "completed")

_MAX_IDENTIFIER_BYTES = 63
_LONGEST_SUFFIX = "_response_check"


def _name(table: str, suffix: str) -> conv:
    return conv(f"{table}{suffix}")


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
    longest = len(f"{name}{_LONGEST_SUFFIX}".encode())
    if longest > _MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"idempotency table name {name!r} is too long: its constraint name"
            f" {name}{_LONGEST_SUFFIX} would be {longest} bytes, over PostgreSQL's"
            f" {_MAX_IDENTIFIER_BYTES}-byte limit (it would be silently truncated).",
            fix=f"use a table name of at most {_MAX_IDENTIFIER_BYTES - len(_LONGEST_SUFFIX)}"
            " bytes.",
        )
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
        PrimaryKeyConstraint("prefix", "tenant_id", "key", name=_name(name, "_pkey")),
        CheckConstraint(f"status IN ({statuses})", name=_name(name, "_status_check")),
        CheckConstraint(
            "status <> 'completed' OR response IS NOT NULL", name=_name(name, "_response_check")
        ),
        # Serves CLEANUP: the expired keys of one prefix, oldest first, LIMIT n.
        Index(_name(name, "_expires_idx"), "prefix", "expires_at"),
        schema=schema,
        comment="ship_sqla idempotency keys (ship_idempotency_table)",
    )
