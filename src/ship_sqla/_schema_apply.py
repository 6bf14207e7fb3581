"""``ship-sqla schema apply``: the ship tables for projects without Alembic.

:func:`ship_tables_metadata` builds the ship tables (the default names, or the ones given) with
the same factories an application's migrations use, so their indexes and constraints are
exactly what the stores expect. :func:`apply_ship_schema` creates the tables that are missing,
in one transaction, and leaves every existing table as it is; then it runs the schema check
(T3) on all of them, so an existing table that differs (an older version, a changed index
predicate) is reported, never silently "fixed". Running it again creates nothing: it is
idempotent, and two at once are serialised by a transaction-level advisory lock.

Tables are created, never altered or dropped: an existing table that differs needs a
migration (Alembic autogenerate sees the same factories). One exception, J21's storage options
(:mod:`ship_sqla._storage_options`): a new table gets them with its ``CREATE TABLE``, and an
existing table gets those it lacks (one ``ALTER TABLE ... SET``, a SHARE UPDATE EXCLUSIVE lock
that reads and writes do not wait for); an option set to another value is left as it is and
reported by the check.

The jobs component includes the job definitions table (E8), and apply installs the SQL enqueue
functions (E6, ``<runs>_enqueue_v1`` and the rest) when they are missing or another build:
``CREATE OR REPLACE`` only, never a DROP, so a published signature and the callers' wrappers
and triggers keep working (E5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import MetaData, inspect

from ship_sqla._audit import ship_audit_table
from ship_sqla._backfills import ship_backfills_table
from ship_sqla._idempotency import ship_idempotency_table
from ship_sqla._jobs import (
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_stats_table,
    ship_job_steps_table,
    ship_job_workers_table,
)
from ship_sqla._jobs._sql_api import (
    SKIP_INSTALL_OPTION,
    ship_job_definitions_table,
    sql_enqueue_installs,
    status_of,
)
from ship_sqla._locks import ship_lock_fences_table
from ship_sqla._naming import fill, quoted_table
from ship_sqla._outbox import ship_outbox_table
from ship_sqla._schema_check import check_schema
from ship_sqla._sql import TABLELESS
from ship_sqla._sql.schema_apply import APPLY_LOCK, CREATE_SCHEMA, TABLE_OPTIONS
from ship_sqla._storage_options import storage_options, storage_options_ddl
from ship_sqla._webhooks import (
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
    ship_webhook_events_table,
)
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy import Table
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from ship_sqla._schema_check import SchemaReport

__all__ = [
    "COMPONENTS",
    "ApplyReport",
    "ShipTableNames",
    "apply_ship_schema",
    "ship_tables_metadata",
]

COMPONENTS: Final = (
    "jobs",
    "workflows",
    "outbox",
    "idempotency",
    "webhooks",
    "locks",
    "audit",
    "backfills",
    "webhooks_out",
)
"""What ``--only`` selects: jobs (runs, state, workers, history, stats, the job definitions with
the SQL enqueue functions, E6), workflows (steps, events;
needs jobs), outbox, idempotency, webhooks (events), locks (fences), audit (the operator audit
log, S1), backfills (the backfill ledger, C4), webhooks_out (the outbound webhooks' endpoints and
deliveries, §16)."""


_ONE_TABLE_COMPONENTS: Final = (
    ("outbox", ship_outbox_table, "outbox"),
    ("idempotency", ship_idempotency_table, "idempotency"),
    ("webhooks", ship_webhook_events_table, "webhook_events"),
    ("locks", ship_lock_fences_table, "lock_fences"),
    ("audit", ship_audit_table, "audit"),
    ("backfills", ship_backfills_table, "backfills"),
)
"""The components of one table each: component, its factory, its ShipTableNames field."""


@attrs.frozen
class ShipTableNames:
    """The ship tables' names: the factories' defaults unless given."""

    runs: str = "ship_job_runs"
    history: str = "ship_job_history"
    state: str = "ship_job_state"
    workers: str = "ship_job_workers"
    stats: str = "ship_job_stats"
    steps: str = "ship_job_steps"
    events: str = "ship_job_events"
    outbox: str = "ship_outbox"
    idempotency: str = "ship_idempotency"
    webhook_events: str = "ship_webhook_events"
    lock_fences: str = "ship_lock_fences"
    audit: str = "ship_audit"
    backfills: str = "ship_backfills"
    webhook_endpoints: str = "ship_webhook_endpoints"
    webhook_deliveries: str = "ship_webhook_deliveries"
    definitions: str = "ship_job_definitions"


def ship_tables_metadata(
    names: ShipTableNames | None = None,
    *,
    schema: str | None = None,
    components: Iterable[str] = COMPONENTS,
    fair_claims: bool = False,
    partitioned_claims: bool = False,
    partition_keys: bool = False,
) -> MetaData:
    """A new MetaData with the ship tables of ``components``, named by ``names``, in ``schema``
    (None: the search_path decides); ``fair_claims``: the runs table with the fair claims' index
    (``ship_job_runs_table(..., fair_claims=True)``, F2); ``partitioned_claims`` and
    ``partition_keys``: with the partitioned claims' indexes, per tenant and per key (F8, F9).
    A name the factories refuse (too long for their index names) raises
    :class:`ConfigurationError`."""
    names = names or ShipTableNames()
    wanted = set(components)
    unknown = wanted - set(COMPONENTS)
    if unknown:
        raise ConfigurationError(
            f"unknown ship table components {sorted(unknown)}.",
            fix=f"choose among {', '.join(COMPONENTS)}.",
        )
    if "workflows" in wanted and "jobs" not in wanted:
        raise ConfigurationError(
            "the workflow tables need the job tables (their steps reference the runs).",
            fix="select jobs too (--only jobs --only workflows), or leave --only out.",
        )
    metadata = MetaData()
    if "jobs" in wanted:
        runs = ship_job_runs_table(
            metadata,
            name=names.runs,
            schema=schema,
            fair_claims=fair_claims,
            partitioned_claims=partitioned_claims,
            partition_keys=partition_keys,
        )
        state = ship_job_state_table(metadata, name=names.state, schema=schema)
        ship_job_workers_table(metadata, name=names.workers, schema=schema)
        history = ship_job_history_table(metadata, name=names.history, schema=schema)
        ship_job_stats_table(metadata, name=names.stats, schema=schema)
        ship_job_definitions_table(
            metadata, names.definitions, schema, runs=runs, state=state, history=history
        )
    if "workflows" in wanted:
        ship_job_steps_table(metadata, name=names.steps, schema=schema, runs_table=names.runs)
        ship_job_events_table(metadata, name=names.events, schema=schema)
    for component, factory, field in _ONE_TABLE_COMPONENTS:
        if component in wanted:
            factory(metadata, name=getattr(names, field), schema=schema)
    if "webhooks_out" in wanted:
        ship_webhook_endpoints_table(metadata, name=names.webhook_endpoints, schema=schema)
        ship_webhook_deliveries_table(metadata, name=names.webhook_deliveries, schema=schema)
    return metadata


@attrs.frozen
class ApplyReport:
    """What :func:`apply_ship_schema` did: the tables it created, those that existed already,
    and the schema check of all of them afterwards (``ok``: they all match)."""

    created: tuple[str, ...]
    existing: tuple[str, ...]
    created_schemas: tuple[str, ...]
    check: SchemaReport
    options_set: tuple[str, ...] = ()
    """Existing tables whose missing storage options were set (J21)."""
    functions_installed: tuple[str, ...] = ()
    """The SQL enqueue functions (``<runs>_enqueue_v1``) installed or replaced, being missing or
    another build (E6)."""

    @property
    def ok(self) -> bool:
        return self.check.ok


def _missing(connection: Connection, tables: list[Table]) -> list[Table]:
    inspector = inspect(connection)
    return [t for t in tables if not inspector.has_table(t.name, schema=t.schema)]


def _schema_exists(connection: Connection, schema: str) -> bool:
    return schema in inspect(connection).get_schema_names()


async def apply_ship_schema(engine: AsyncEngine, metadata: MetaData) -> ApplyReport:
    """Create ``metadata``'s missing tables (and missing schemas) in one transaction, then check
    every table of it (T3) without looking for extra tables."""
    tables = list(metadata.sorted_tables)
    schemas = sorted({t.schema for t in tables if t.schema is not None})
    async with engine.begin() as connection:
        await connection.execute(TABLELESS[APPLY_LOCK])
        created_schemas: list[str] = []
        for schema in schemas:
            if not await connection.run_sync(_schema_exists, schema):
                quoted = connection.dialect.identifier_preparer.quote_schema(schema)
                await connection.exec_driver_sql(fill(CREATE_SCHEMA.sql, {"{schema}": quoted}))
                created_schemas.append(schema)
        missing = await connection.run_sync(_missing, tables)
        if missing:
            await connection.run_sync(_create, metadata, missing)
        options_set = await _set_missing_options(
            connection, [t for t in tables if t not in missing]
        )
        installed = await connection.run_sync(_install_functions, metadata)
    report = await check_schema(engine, metadata, extra_tables=False)
    created = {t.key for t in missing}
    return ApplyReport(
        created=tuple(t.key for t in tables if t.key in created),
        existing=tuple(t.key for t in tables if t.key not in created),
        created_schemas=tuple(created_schemas),
        check=report,
        options_set=tuple(options_set),
        functions_installed=tuple(installed),
    )


def _create(connection: Connection, metadata: MetaData, tables: list[Table]) -> None:
    """``create_all`` of ``tables``, leaving the SQL enqueue functions to
    :func:`_install_functions` (the option changes the connection in place: it is unset
    after)."""
    connection.execution_options(**{SKIP_INSTALL_OPTION: True})
    try:
        metadata.create_all(connection, tables=tables, checkfirst=False)
    finally:
        connection.execution_options(**{SKIP_INSTALL_OPTION: False})


def _install_functions(connection: Connection, metadata: MetaData) -> list[str]:
    """E6: the SQL enqueue functions ``metadata`` declares, installed where missing or another
    build (E5: their statements are CREATE OR REPLACE only); the functions installed."""
    installed: list[str] = []
    for install in sql_enqueue_installs(metadata):
        if status_of(connection, install) == "current":
            continue
        for statement in install.ddl():
            connection.exec_driver_sql(statement)
        installed.append(install.function)
    return installed


async def _set_missing_options(connection: AsyncConnection, tables: list[Table]) -> list[str]:
    """J21: each existing table's declared storage options it lacks, set; the tables changed."""
    changed: list[str] = []
    for table in tables:
        declared = storage_options(table)
        if not declared:
            continue
        live = (
            await connection.execute(TABLELESS[TABLE_OPTIONS], {"name": quoted_table(table)})
        ).scalar_one_or_none() or ()
        present = {option.split("=", 1)[0] for option in live}
        lacking = {name: value for name, value in declared.items() if name not in present}
        if lacking:
            await connection.exec_driver_sql(storage_options_ddl(table, lacking))
            changed.append(table.key)
    return changed
