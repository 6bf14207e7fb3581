"""The service's tables: its own two and the ship tables it uses, on one ``MetaData`` (what
Alembic's autogenerate would read; the app creates them at its startup for the example)."""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import UUID

from ship_sqla import (
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
    ship_outbox_table,
)

metadata = MetaData()

orders = Table(
    "service_orders",
    metadata,
    Column("id", UUID(as_uuid=True), nullable=False),
    Column("customer", Text, nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("status", Text, nullable=False, server_default="placed"),  # then "confirmed"
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("confirmed_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("id", name="service_orders_pkey"),
    CheckConstraint("total_cents > 0", name="service_orders_total_check"),
)

deliveries = Table(
    "service_deliveries",
    metadata,
    # What the relay's default sink wrote: one row per outbox message, and how often it came
    # (a consumer deduplicating on the message id; `deliveries` > 1 is a redelivery).
    Column("message_id", UUID(as_uuid=True), nullable=False),
    Column("topic", Text, nullable=False),
    Column("order_id", UUID(as_uuid=True), nullable=False),
    Column("deliveries", Integer, nullable=False, server_default="1"),
    Column("delivered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("message_id", name="service_deliveries_pkey"),
)

# The ship tables, with their default names (`ship-sqla schema apply` creates the same ones).
outbox_table = ship_outbox_table(metadata)
idempotency_table = ship_idempotency_table(metadata)
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)
job_workers = ship_job_workers_table(metadata)  # the worker registry `ship-sqla worker` joins
