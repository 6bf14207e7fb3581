"""The audit table (S1): one row per operator action, append-only."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Identity,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP

from ship_sqla._naming import derived_names

__all__ = ["ship_audit_table"]


def ship_audit_table(
    metadata: MetaData, name: str = "ship_audit", schema: str | None = None
) -> Table:
    """The operator audit log, added to ``metadata`` so Alembic autogenerate sees it.

    Columns: ``id`` (identity: insertion order, which pages read newest first through the
    primary key), ``at`` (the database's clock at the insert, or the frozen clock's),
    ``actor`` (who), ``operation`` (what: ``jobs.retry``, ``outbox.retry``...), ``target`` (a
    run, job or outbox id, or a bulk operation's filter), ``count`` (how many it changed),
    ``details`` (jsonb). Retention is the application's: delete old rows by ``id`` or ``at``.
    """
    n = derived_names(name, ("_pkey",), "audit", schema=schema)
    return Table(
        name,
        metadata,
        Column("id", BigInteger, Identity(always=False), nullable=False),
        Column("at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
        Column("actor", Text, nullable=False),
        Column("operation", Text, nullable=False),
        Column("target", Text, nullable=False),
        Column("count", Integer, nullable=False),
        Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        # Serves LIST_AUDIT's newest-first pages.
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        schema=schema,
        comment="ship_sqla operator audit log (ship_audit_table)",
    )
