"""J21 on PostgreSQL: the table factories' storage options are created with the tables (schema
apply, create_all, Alembic's op.create_table, online and offline), compared by the schema check
(an option changed by hand is reported with its fix) and the missing ones set by schema apply."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from alembic.autogenerate import produce_migrations, render_python_code
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, text

from ship_sqla import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._history_ddl import HISTORY_PARTITION_OPTIONS
from ship_sqla._schema_apply import apply_ship_schema, ship_tables_metadata
from ship_sqla._storage_options import STORAGE_OPTIONS_INFO, OptionValue
from ship_sqla.schema import check_schema, storage_options

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

RELOPTIONS = text(
    "SELECT c.relname, c.reloptions FROM pg_class c"
    " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')"
)


async def _reloptions(engine: AsyncEngine) -> dict[str, dict[str, str]]:
    async with engine.connect() as connection:
        rows = (await connection.execute(RELOPTIONS)).all()
    return {name: dict(option.split("=", 1) for option in options or ()) for name, options in rows}


def _as_text(options: dict[str, OptionValue]) -> dict[str, str]:
    return {name: str(value) for name, value in options.items()}


async def test_j21_schema_apply_creates_every_declared_option(ship_engine: AsyncEngine) -> None:
    """J21: `schema apply` creates each ship table with the storage options its factory
    declares (the runs table's autovacuum thresholds, the state table's fillfactor too), and
    the schema check finds nothing to report."""
    metadata = ship_tables_metadata()
    report = await apply_ship_schema(ship_engine, metadata)
    assert report.ok, report.check
    live = await _reloptions(ship_engine)
    declared = {t.name: storage_options(t) for t in metadata.tables.values()}
    assert declared["ship_job_state"]["fillfactor"] == 50
    assert declared["ship_job_runs"]["vacuum_index_cleanup"] == "on"
    for name, options in declared.items():
        assert live[name] == _as_text(options), name
    # J17: the history parent is partitioned (it takes no options); its leaves take theirs.
    assert declared["ship_job_history"] == {}
    assert live["ship_job_history_completed_default"] == _as_text(HISTORY_PARTITION_OPTIONS)
    assert sum(1 for options in declared.values() if options) >= 6


async def test_j21_the_schema_check_reports_an_option_changed_by_hand(
    ship_engine: AsyncEngine,
) -> None:
    """J21: an option changed by hand and one removed are each a storage_option difference
    with its Fix (the ALTER TABLE); an option the operator added beyond the declared ones is
    theirs; schema apply sets the removed one again and leaves the changed one (reported)."""
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    await apply_ship_schema(ship_engine, metadata)
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "ALTER TABLE ship_job_runs SET (autovacuum_vacuum_threshold = 5000,"
                " autovacuum_analyze_threshold = 77)"
            )
        )
        await connection.execute(text("ALTER TABLE ship_job_state RESET (fillfactor)"))
    report = await check_schema(ship_engine, metadata, extra_tables=False)
    drift = {(d.table, d.name): d for d in report.differences}
    assert set(drift) == {
        ("ship_job_runs", "autovacuum_vacuum_threshold"),
        ("ship_job_state", "fillfactor"),
    }
    changed = drift["ship_job_runs", "autovacuum_vacuum_threshold"]
    assert changed.kind == "storage_option"
    assert (changed.database, changed.metadata) == (
        "autovacuum_vacuum_threshold=5000",
        "autovacuum_vacuum_threshold=1000",
    )
    assert (
        "Fix: ALTER TABLE ship_job_runs SET (autovacuum_vacuum_threshold = 1000)"
        in changed.description
    )
    assert "schema apply" in drift["ship_job_state", "fillfactor"].description
    applied = await apply_ship_schema(ship_engine, metadata)
    assert applied.options_set == ("ship_job_state",)
    assert [(d.table, d.name) for d in applied.check.differences] == [
        ("ship_job_runs", "autovacuum_vacuum_threshold")
    ]
    assert (await _reloptions(ship_engine))["ship_job_state"]["fillfactor"] == "50"


def _alembic_create(connection: Connection, info: dict[str, object]) -> None:
    Operations(MigrationContext.configure(connection)).create_table(
        "j21_alembic", Column("id", Integer, primary_key=True), info=info
    )


async def test_j21_alembic_creates_the_options_online_and_offline(
    ship_engine: AsyncEngine,
) -> None:
    """J21: autogenerate writes a ship table's options into op.create_table(info=...), and
    op.create_table sets them, on a database and in an offline (--sql) script."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    async with ship_engine.connect() as connection:
        migration = await connection.run_sync(
            lambda sync: produce_migrations(MigrationContext.configure(sync), metadata)
        )
    assert f"'{STORAGE_OPTIONS_INFO}'" in render_python_code(migration.upgrade_ops)
    info = {STORAGE_OPTIONS_INFO: storage_options(runs)}
    async with ship_engine.begin() as connection:
        await connection.run_sync(_alembic_create, info)
    assert (await _reloptions(ship_engine))["j21_alembic"] == _as_text(storage_options(runs))
    buffer = io.StringIO()
    offline = MigrationContext.configure(
        dialect_name="postgresql", opts={"as_sql": True, "output_buffer": buffer}
    )
    Operations(offline).create_table(
        "j21_offline", Column("id", Integer, primary_key=True), info=info
    )
    assert "ALTER TABLE j21_offline SET (autovacuum_vacuum_scale_factor = 0" in buffer.getvalue()
