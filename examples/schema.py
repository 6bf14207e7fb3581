"""The example application's schema: its own tables and every ship table, on one MetaData.

This is what Alembic's ``target_metadata`` points at (alembic/env.py), so autogenerate creates
the ship tables with their partial indexes beside the application's. Not runnable: imported
by the quickstart and Alembic. Extras: none.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
)

from ship_sqla import (
    ship_audit_table,
    ship_idempotency_table,
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_stats_table,
    ship_job_steps_table,
    ship_job_workers_table,
    ship_outbox_table,
    ship_webhook_events_table,
)
from ship_sqla.backfills import ship_backfills_table

metadata = MetaData()

# The ship tables, on the application's own metadata so Alembic autogenerates them.
outbox = ship_outbox_table(metadata)
idempotency = ship_idempotency_table(metadata)
webhook_events = ship_webhook_events_table(metadata)
job_runs = ship_job_runs_table(metadata)
# Finished runs (J16-J18): partitioned by state class and day; its partitions are maintenance's,
# kept out of autogenerate by ship_include_object (alembic/env.py).
job_history = ship_job_history_table(metadata)
job_state = ship_job_state_table(metadata)
job_workers = ship_job_workers_table(metadata)
job_stats = ship_job_stats_table(metadata)  # one-minute job history (issue #36)
job_steps = ship_job_steps_table(metadata)  # durable workflows' steps (SPEC §13)
job_events = ship_job_events_table(metadata)  # and their events
audit = ship_audit_table(metadata)  # the operator audit log (S1)
backfills = ship_backfills_table(metadata)  # the backfill ledger (C4, C5)

orders = Table(
    "orders",
    metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("id", BigInteger, nullable=False),
    Column("customer", String(200), nullable=False),
    Column("status", String(20), nullable=False, server_default="open"),
    Column("total", Numeric(12, 2), nullable=False),
    Column("version", Integer, nullable=False, server_default="1"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("tenant_id", "id", name="orders_pkey"),
    CheckConstraint("status in ('open', 'paid', 'cancelled')", name="orders_status_check"),
    Index("orders_tenant_created_idx", "tenant_id", "created_at", "id"),
)
