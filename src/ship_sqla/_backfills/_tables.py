"""The backfill ledger table (C4): one row per backfill, updated in place at every page."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION, JSONB, TIMESTAMP

from ship_sqla._naming import derived_names
from ship_sqla.kernel._backfills import BACKFILL_STATES

__all__ = ["ship_backfills_table"]

_TSTZ = TIMESTAMP(timezone=True)


def ship_backfills_table(
    metadata: MetaData, name: str = "ship_backfills", schema: str | None = None
) -> Table:
    """The backfill ledger (C4, C5), added to ``metadata`` so Alembic autogenerate sees it
    (``ship-sqla schema apply --only backfills`` creates it without Alembic).

    One row per backfill, which is also its checkpoint: ``id`` (the backfill's, its job id),
    ``state`` (pending | running | completed | cancelled | failed), ``pages`` and ``rows``
    done, ``last_key`` (jsonb: the key of the last row of the last committed page), ``pace``
    (pages per second) and ``stall_after`` (seconds without progress that make it stalled) as
    last declared, ``required_by`` (the migration that needs it done: the deploy gate),
    ``run_id`` and ``token`` (the holder a checkpoint is fenced on), ``created_at``,
    ``started_at``, ``finished_at``, ``updated_at`` (the last progress), ``error`` (why it
    failed). Small (a handful of rows): every statement reads it by primary key.
    """
    n = derived_names(name, ("_pkey", "_state_check"), "backfills", schema=schema)
    states = ", ".join(f"'{state}'" for state in BACKFILL_STATES)
    return Table(
        name,
        metadata,
        Column("id", Text, nullable=False),
        Column("state", Text, nullable=False),
        Column("pages", BigInteger, nullable=False, server_default=text("0")),
        Column("rows", BigInteger, nullable=False, server_default=text("0")),
        Column("last_key", JSONB, nullable=True),
        Column("pace", DOUBLE_PRECISION, nullable=True),
        Column("stall_after", DOUBLE_PRECISION, nullable=True),
        Column("required_by", Text, nullable=True),
        Column("run_id", Text, nullable=True),
        Column("token", BigInteger, nullable=True),
        Column("created_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("started_at", _TSTZ, nullable=True),
        Column("finished_at", _TSTZ, nullable=True),
        Column("updated_at", _TSTZ, nullable=False, server_default=text("now()")),
        Column("error", Text, nullable=True),
        # Serves every statement of _sql.py (each reads one backfill by id; the list by id).
        PrimaryKeyConstraint("id", name=n["_pkey"]),
        CheckConstraint(f"state IN ({states})", name=n["_state_check"]),
        schema=schema,
        comment="ship_sqla backfill ledger (ship_backfills_table)",
    )
