"""The schema check (T3) against real PostgreSQL: live database versus the tables' metadata,
partial-index predicates included (which Alembic does not compare, alembic issue #750)."""

from __future__ import annotations

import pytest
from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ENUM, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._schema_check import SchemaCheckError, SchemaReport, check_schema
from ship_sqla._schema_sql import schema_sql
from ship_sqla.errors import ConfigurationError


def build_metadata() -> MetaData:
    metadata = MetaData()
    Table(
        "chk_runs",
        metadata,
        Column("id", BigInteger, Identity(), nullable=False),
        Column("queue", Text, nullable=False),
        Column("state", Text, nullable=False, server_default="pending"),
        Column("priority", ENUM("low", "high", name="chk_priority"), nullable=True),
        Column("run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("note", String(200)),
        PrimaryKeyConstraint("id", name="chk_runs_pkey"),
        UniqueConstraint("queue", "id", name="chk_runs_queue_id_key"),
        CheckConstraint("state IN ('pending', 'running', 'done')", name="chk_runs_state_check"),
        Index(
            "chk_runs_pending_idx", "queue", "run_at", postgresql_where=text("state = 'pending'")
        ),
        Index("chk_runs_running_idx", "queue", postgresql_where=text("state = 'running'")),
        Index("chk_runs_payload_idx", "payload", postgresql_using="gin"),
    )
    Table(
        "chk_events",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("run_id", BigInteger, ForeignKey("chk_runs.id", name="chk_events_run_fkey")),
        Column("kind", String(50), nullable=False),
    )
    return metadata


@pytest.fixture
async def metadata(ship_engine: AsyncEngine) -> MetaData:
    metadata = build_metadata()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return metadata


async def alter(engine: AsyncEngine, *statements: str) -> None:
    async with engine.begin() as connection:
        for statement in statements:
            await connection.exec_driver_sql(statement)


def kinds(report: SchemaReport) -> list[tuple[str, str, str | None]]:
    return [(d.kind, d.table, d.name) for d in report.differences]


async def test_a_database_created_from_the_metadata_is_clean(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: a database created from the metadata matches it: no difference, report.ok."""
    report = await check_schema(ship_engine, metadata)
    assert report.differences == ()
    assert report.ok
    assert set(report.tables) == {"chk_runs", "chk_events"}
    assert "OK" in report.format_text()


async def test_a_changed_partial_index_predicate_is_reported_exactly(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: an index recreated with another WHERE (which alembic check misses, #750) is reported,
    and nothing else is."""
    await alter(
        ship_engine,
        "DROP INDEX chk_runs_pending_idx",
        "CREATE INDEX chk_runs_pending_idx ON chk_runs (queue, run_at) WHERE state = 'running'",
    )
    report = await check_schema(ship_engine, metadata)
    assert not report.ok
    assert kinds(report) == [("index_predicate", "chk_runs", "chk_runs_pending_idx")]
    [difference] = report.differences
    assert difference.database == "state = 'running'::text"
    assert difference.metadata == "state = 'pending'::text"
    assert "WHERE state = 'running'::text in the database" in difference.description
    assert "WHERE state = 'pending'::text in the metadata" in difference.description


async def test_an_equivalent_predicate_written_differently_is_not_a_difference(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: predicates are compared as PostgreSQL prints them, so parentheses, casts, quoting and
    spacing do not raise false alarms."""
    await alter(
        ship_engine,
        "DROP INDEX chk_runs_pending_idx",
        'CREATE INDEX chk_runs_pending_idx ON public.chk_runs ("queue", run_at)'
        " WHERE ((\"state\")::text   =   ('pending'::text))",
        "ALTER TABLE chk_runs DROP CONSTRAINT chk_runs_state_check",
        "ALTER TABLE chk_runs ADD CONSTRAINT chk_runs_state_check"
        " CHECK (state = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text]))",
    )
    report = await check_schema(ship_engine, metadata)
    assert report.ok, report.format_text()


async def test_a_partial_index_made_full_is_reported(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: an index that lost its predicate is reported as a predicate difference."""
    await alter(
        ship_engine,
        "DROP INDEX chk_runs_running_idx",
        "CREATE INDEX chk_runs_running_idx ON chk_runs (queue)",
    )
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [("index_predicate", "chk_runs", "chk_runs_running_idx")]
    assert report.differences[0].database is None
    assert "(none: a full index) in the database" in report.differences[0].description


async def test_a_missing_index_is_reported(ship_engine: AsyncEngine, metadata: MetaData) -> None:
    """T3: an index of the metadata that the database lacks is reported with its definition."""
    await alter(ship_engine, "DROP INDEX chk_runs_pending_idx")
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [("index_missing", "chk_runs", "chk_runs_pending_idx")]
    assert "WHERE state = 'pending'::text" in report.differences[0].description


async def test_a_missing_column_is_reported(ship_engine: AsyncEngine, metadata: MetaData) -> None:
    """T3: a column of the metadata that the database lacks is reported."""
    await alter(ship_engine, "ALTER TABLE chk_runs DROP COLUMN note")
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [("column_missing", "chk_runs", "note")]
    assert report.differences[0].description == (
        "column chk_runs.note (character varying(200)) is in the metadata but not in the database."
    )


async def test_a_nullability_change_is_reported(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: a column made NOT NULL (or nullable) in the database is reported."""
    await alter(
        ship_engine,
        "ALTER TABLE chk_runs ALTER COLUMN note SET NOT NULL",
        "ALTER TABLE chk_events ALTER COLUMN kind DROP NOT NULL",
    )
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [
        ("column_nullable", "chk_events", "kind"),
        ("column_nullable", "chk_runs", "note"),
    ]
    by_name = {d.name: d for d in report.differences}
    assert by_name["note"].database == "NOT NULL"
    assert by_name["note"].metadata == "nullable"
    assert by_name["kind"].description == (
        "column chk_events.kind is nullable in the database but NOT NULL in the metadata."
    )


async def test_every_other_kind_of_drift_is_reported(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: types, server defaults, primary keys, unique/check/foreign-key constraints, index
    columns, uniqueness and method, extra columns, indexes and tables are all compared."""
    await alter(
        ship_engine,
        "ALTER TABLE chk_runs ALTER COLUMN note TYPE varchar(100)",
        "ALTER TABLE chk_runs ALTER COLUMN state SET DEFAULT 'running'",
        "ALTER TABLE chk_runs ALTER COLUMN run_at DROP DEFAULT",
        "ALTER TABLE chk_runs ADD COLUMN legacy int",
        "ALTER TABLE chk_runs DROP CONSTRAINT chk_runs_state_check",
        "ALTER TABLE chk_runs ADD CONSTRAINT chk_runs_state_check CHECK (state <> '')",
        "ALTER TABLE chk_runs DROP CONSTRAINT chk_runs_queue_id_key",
        "ALTER TABLE chk_runs ADD CONSTRAINT chk_runs_extra_key UNIQUE (queue, state, id)",
        "DROP INDEX chk_runs_running_idx",
        "CREATE UNIQUE INDEX chk_runs_running_idx ON chk_runs (queue, id) WHERE state = 'running'",
        "DROP INDEX chk_runs_payload_idx",
        "CREATE INDEX chk_runs_payload_idx ON chk_runs USING btree (payload)",
        "CREATE INDEX chk_runs_stray_idx ON chk_runs (run_at)",
        "ALTER TABLE chk_events DROP CONSTRAINT chk_events_pkey",
        "ALTER TABLE chk_events ADD CONSTRAINT chk_events_pkey PRIMARY KEY (id, kind)",
        "ALTER TABLE chk_events DROP CONSTRAINT chk_events_run_fkey",
        "CREATE TABLE chk_stray (id int)",
        "CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)",
    )
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [
        ("primary_key", "chk_events", "chk_events_pkey"),
        ("constraint_missing", "chk_events", "chk_events_run_fkey"),
        ("column_type", "chk_runs", "note"),
        ("column_default", "chk_runs", "run_at"),
        ("column_default", "chk_runs", "state"),
        ("column_extra", "chk_runs", "legacy"),
        ("constraint_missing", "chk_runs", "chk_runs_queue_id_key"),
        ("constraint_definition", "chk_runs", "chk_runs_state_check"),
        ("constraint_extra", "chk_runs", "chk_runs_extra_key"),
        ("index_columns", "chk_runs", "chk_runs_running_idx"),
        ("index_unique", "chk_runs", "chk_runs_running_idx"),
        ("index_definition", "chk_runs", "chk_runs_payload_idx"),
        ("index_extra", "chk_runs", "chk_runs_stray_idx"),
        ("table_extra", "chk_stray", None),
    ]
    by_kind = {(d.kind, d.name): d for d in report.differences}
    assert by_kind["column_type", "note"].database == "character varying(100)"
    assert by_kind["column_type", "note"].metadata == "character varying(200)"
    assert by_kind["column_default", "run_at"].database is None
    assert by_kind["column_default", "run_at"].metadata == "now()"
    assert by_kind["index_definition", "chk_runs_payload_idx"].database == "btree (payload)"
    assert by_kind["index_definition", "chk_runs_payload_idx"].metadata == "gin (payload)"
    text_report = report.format_text()
    assert text_report.splitlines()[0].split() == ["TABLE", "KIND", "OBJECT", "DIFFERENCE"]
    assert text_report.splitlines()[-1] == (
        "schema check: 14 difference(s) in 3 table(s) of 2 compared."
    )

    only_events = await check_schema(ship_engine, metadata, tables=["chk_events"])
    assert {d.table for d in only_events.differences} == {"chk_events"}
    assert only_events.tables == ("chk_events",)
    no_extras = await check_schema(ship_engine, metadata, extra_tables=False)
    assert "table_extra" not in {d.kind for d in no_extras.differences}


async def test_a_missing_table_is_reported(ship_engine: AsyncEngine, metadata: MetaData) -> None:
    """T3: a table of the metadata that the database lacks is reported once, as a table."""
    await alter(ship_engine, "DROP TABLE chk_events")
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [("table_missing", "chk_events", None)]


async def test_schema_qualified_tables_and_concurrent_indexes(ship_engine: AsyncEngine) -> None:
    """T3: tables in a named schema (same table name as in public) are compared with their own
    schema; an index declared CONCURRENTLY is compared too and the metadata is left as given."""
    metadata = MetaData()
    for schema in (None, "app"):
        Table(
            "things",
            metadata,
            Column("id", Integer, primary_key=True),
            Column("state", Text, nullable=False),
            Index(
                "things_live_idx",
                "id",
                postgresql_where=text("state = 'live'"),
                postgresql_concurrently=schema == "app",
            ),
            schema=schema,
        )
    [app_index] = metadata.tables["app.things"].indexes
    # CONCURRENTLY cannot run in create_all's transaction: build without it, then declare it.
    app_index.dialect_options["postgresql"]["concurrently"] = False
    async with ship_engine.begin() as connection:
        await connection.exec_driver_sql("CREATE SCHEMA app")
        await connection.run_sync(metadata.create_all)
    app_index.dialect_options["postgresql"]["concurrently"] = True
    assert (await check_schema(ship_engine, metadata)).ok
    await alter(
        ship_engine,
        "DROP INDEX app.things_live_idx",
        "CREATE INDEX things_live_idx ON app.things (id) WHERE state = 'dead'",
    )
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [("index_predicate", "app.things", "things_live_idx")]
    assert app_index.dialect_options["postgresql"]["concurrently"] is True


async def test_foreign_keys_across_schemas_are_compared(ship_engine: AsyncEngine) -> None:
    """T3: a foreign key from a table in one schema to a table in another is compared (both
    tables are copied into the one scratch schema)."""
    metadata = MetaData()
    Table("owners", metadata, Column("id", Integer, primary_key=True))
    Table(
        "pets",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("owner_id", Integer, ForeignKey("owners.id", name="pets_owner_fkey")),
        schema="app",
    )
    async with ship_engine.begin() as connection:
        await connection.exec_driver_sql("CREATE SCHEMA app")
        await connection.run_sync(metadata.create_all)
    assert (await check_schema(ship_engine, metadata)).ok
    await alter(ship_engine, "ALTER TABLE app.pets DROP CONSTRAINT pets_owner_fkey")
    report = await check_schema(ship_engine, metadata)
    assert kinds(report) == [("constraint_missing", "app.pets", "pets_owner_fkey")]
    assert "REFERENCES owners(id)" in report.differences[0].description


async def test_check_inside_a_transaction_changes_nothing(ship_connection: AsyncConnection):
    """T3: on a connection in a transaction the check runs in a savepoint it rolls back: no
    temporary table is left, the connection stays usable and its options are untouched."""
    metadata = build_metadata()
    await ship_connection.run_sync(metadata.create_all)
    before = ship_connection.sync_connection.get_execution_options()  # type: ignore[union-attr]
    report = await check_schema(ship_connection, metadata)
    assert report.ok, report.format_text()
    leftovers = await ship_connection.scalar(
        text(
            "SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()"
            " AND relname LIKE 'chk_%'"
        )
    )
    assert leftovers == 0
    after = ship_connection.sync_connection.get_execution_options()  # type: ignore[union-attr]
    assert after.get("schema_translate_map") is None
    assert before.get("schema_translate_map") is None
    assert await ship_connection.scalar(text("SELECT count(*) FROM chk_runs")) == 0


async def test_unknown_table_and_broken_metadata_are_clear_errors(
    ship_engine: AsyncEngine, metadata: MetaData
) -> None:
    """T3: naming a table the metadata lacks is a ConfigurationError; a metadata whose own DDL
    cannot run is a SchemaCheckError saying so (nothing is compared)."""
    with pytest.raises(ConfigurationError, match="table 'nope' is not in the metadata"):
        await check_schema(ship_engine, metadata, tables=["nope"])
    broken = MetaData()
    Table("broken", broken, Column("id", Integer, server_default=text("no_such_function()")))
    with pytest.raises(SchemaCheckError, match="the metadata's own DDL failed") as caught:
        await check_schema(ship_engine, broken)
    assert caught.value.code == "SHIP_SQLA_SCHEMA_CHECK"


async def test_schema_sql_creates_what_the_check_accepts(ship_engine: AsyncEngine) -> None:
    """T3: the DDL from schema_sql (for projects without Alembic), partial predicates included,
    builds a database the schema check finds identical to the metadata."""
    metadata = build_metadata()
    ddl = schema_sql(metadata)
    assert "CREATE TYPE chk_priority AS ENUM ('low', 'high');" in ddl
    assert "CREATE INDEX chk_runs_pending_idx ON chk_runs (queue, run_at)" in ddl
    assert "WHERE state = 'pending';" in ddl
    async with ship_engine.begin() as connection:
        for statement in ddl.split(";\n"):
            if statement.strip():
                await connection.exec_driver_sql(statement)
    assert (await check_schema(ship_engine, metadata)).ok
