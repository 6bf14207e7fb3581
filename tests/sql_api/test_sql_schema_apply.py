"""The SQL enqueue functions installed with the tables (SPEC §18, E5, E6): `schema apply`
installs them (and replaces another build, CREATE OR REPLACE only), the schema check reports a
missing or outdated one by the build hash in its COMMENT with the fix, an Alembic migration and
`schema sql` carry their statements; the committed v1 corpus, a user's wrappers and the trigger
keep working across an upgrade by `schema apply`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from cli_runner import ship_sqla, ship_sqla_in_process
from sqlalchemy import text
from test_sql_enqueue import CAPPED, PLAIN, SMALL
from test_sql_enqueue_tx import GOLDEN, TRIGGER, _dsn, run_corpus

from ship_sqla._jobs._sql_api import (
    SKIP_INSTALL_OPTION,
    install_sql_enqueue,
    sql_enqueue_installs,
    status_of,
    sync_job_definitions,
)
from ship_sqla._schema_apply import apply_ship_schema, ship_tables_metadata
from ship_sqla._schema_check import check_schema
from ship_sqla._schema_sql import schema_sql

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = ship_tables_metadata(components=["jobs"])
[INSTALL] = sql_enqueue_installs(metadata)
FUNCTION = "ship_job_runs_enqueue_v1"
SIGNATURE = f"{FUNCTION}(text, jsonb, timestamptz, integer, text, text, text, text, jsonb, jsonb)"
# A SQL-standard body records its dependency on the function: PostgreSQL then refuses a DROP
# (graphile#388's trap); CREATE OR REPLACE keeps it working.
ATOMIC_WRAPPER = (
    "CREATE FUNCTION app_enqueue_atomic(n integer) RETURNS text LANGUAGE sql BEGIN ATOMIC"
    f" SELECT outcome FROM {FUNCTION}('sql.plain', jsonb_build_object('n', n),"
    " dedupe_key => 'atomic-' || n); END"
)


async def _definitions(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await sync_job_definitions(connection, INSTALL.definitions, [PLAIN, SMALL])
        await sync_job_definitions(connection, INSTALL.definitions, [CAPPED], queue_depth_limit=3)


async def test_after_schema_apply_the_v1_corpus_wrappers_and_trigger_keep_working(
    ship_engine: AsyncEngine,
) -> None:
    """E5, E6, E1, E4: `schema apply` creates the job tables with the definitions table and
    installs the functions (again: nothing, they are current); the frozen v1 corpus then gives
    its golden output. Its wrapper, the committed trigger and a BEGIN ATOMIC wrapper (which
    makes a DROP of the function fail) outlive an upgrade: an older build installed (the
    functions before J16's history probe) is reported outdated by the check with the fix, and
    `schema apply` replaces it in place; every caller then still enqueues."""
    first = await apply_ship_schema(ship_engine, metadata)
    assert first.ok, first.check
    assert "ship_job_definitions" in first.created
    assert first.functions_installed == (FUNCTION,)
    assert (await apply_ship_schema(ship_engine, metadata)).functions_installed == ()
    await _definitions(ship_engine)
    assert await run_corpus(_dsn(ship_engine)) == (GOLDEN / "v1_corpus.out").read_text()

    caller = await asyncpg.connect(_dsn(ship_engine))
    try:
        await caller.execute(TRIGGER)
        await caller.execute(ATOMIC_WRAPPER)
        with pytest.raises(asyncpg.DependentObjectsStillExistError):
            await caller.execute(f"DROP FUNCTION {SIGNATURE}")
        async with ship_engine.begin() as connection:  # the release before: another build
            await install_sql_enqueue(connection, INSTALL.runs, INSTALL.state, INSTALL.definitions)
        report = await check_schema(ship_engine, metadata, extra_tables=False)  # not orders
        [difference] = report.differences
        assert (difference.kind, difference.table, difference.name) == (
            "function_outdated",
            "ship_job_definitions",
            FUNCTION,
        )
        assert "ship-sqla schema apply" in difference.description
        upgrade = await apply_ship_schema(ship_engine, metadata)
        assert upgrade.ok, upgrade.check
        assert upgrade.functions_installed == (FUNCTION,)

        await caller.execute("INSERT INTO orders (item) VALUES ('after the upgrade')")
        assert await caller.fetchval("SELECT app_enqueue_order(2)") == "inserted"
        assert await caller.fetchval("SELECT app_enqueue_atomic(7)") == "inserted"
        order = await caller.fetchval("SELECT max(id)::text FROM orders")
        found = await caller.fetch(
            "SELECT dedupe_key FROM ship_job_runs WHERE dedupe_key = ANY($1::text[])",
            [f"order-{order}", "order-2", "atomic-7"],
        )
        assert sorted(row[0] for row in found) == sorted([f"order-{order}", "order-2", "atomic-7"])
    finally:
        await caller.close()


async def test_the_check_reports_a_missing_function_with_the_fix_and_apply_installs_it(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """E6 through the commands: `ship-sqla schema apply --only jobs` says it installed the
    functions; with them dropped, `ship-sqla schema check` fails naming the missing function
    and the fix; `schema apply` installs them and its check passes; `ship-sqla jobs
    sync-definitions` then leaves apply's install as it is (it installs only a missing one).
    The schema commands run in this process; sync-definitions, which imports the application's
    module from its directory, in a `python -m ship_sqla` subprocess."""
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla_in_process("schema", "apply", "--only", "jobs", *url)
    assert (code, err) == (0, ""), out + err
    assert f"SQL enqueue functions installed (E6): {FUNCTION}." in out
    async with ship_engine.begin() as connection:
        await connection.exec_driver_sql(f"DROP FUNCTION {SIGNATURE}")
    code, out, _ = await ship_sqla_in_process("schema", "check", "--only", "jobs", *url)
    assert code != 0
    assert "function_missing" in out
    assert f"{FUNCTION} is not installed" in out
    assert "ship-sqla schema apply" in out
    code, out, err = await ship_sqla_in_process("schema", "apply", "--only", "jobs", *url)
    assert (code, err) == (0, ""), out + err
    assert f"SQL enqueue functions installed (E6): {FUNCTION}." in out
    assert "schema check: OK" in out  # apply's own check, the functions included
    (tmp_path / "sync_app.py").write_text(
        "from ship_sqla import define_job\n\n"
        "async def noop(ctx, payload):\n    return None\n\n"
        "jobs = [define_job('cli.sync', noop, payload=dict)]\n"
    )
    sync = ("jobs", "sync-definitions", *url, "--registry", "sync_app:jobs")
    code, out, err = await ship_sqla(*sync, cwd=tmp_path)
    assert (code, err) == (0, ""), out + err
    async with ship_engine.connect() as connection:  # left as apply installed it
        assert await connection.run_sync(status_of, INSTALL) == "current"


def _migrate(connection: Connection) -> None:
    """An Alembic migration's upgrade(): Alembic does not compare functions, so it runs the
    install's statements (what docs/sql-enqueue.md shows)."""
    op = Operations(MigrationContext.configure(connection))
    for statement in INSTALL.ddl():
        op.execute(statement)


async def test_an_alembic_migration_and_schema_sql_carry_the_functions(
    ship_engine: AsyncEngine,
) -> None:
    """E6: tables created without the functions are reported (function_missing); an Alembic
    migration running sql_enqueue_ddl's statements through op.execute installs them (the check
    passes, a call enqueues); `schema sql` prints them after the tables."""
    async with ship_engine.begin() as connection:
        await connection.execution_options(**{SKIP_INSTALL_OPTION: True})
        await connection.run_sync(metadata.create_all)
    report = await check_schema(ship_engine, metadata)
    assert [d.kind for d in report.differences] == ["function_missing"]
    async with ship_engine.begin() as connection:
        await connection.run_sync(_migrate)
    assert (await check_schema(ship_engine, metadata)).ok
    await _definitions(ship_engine)
    async with ship_engine.begin() as connection:
        outcome = await connection.scalar(
            text(f"SELECT outcome FROM {FUNCTION}('sql.plain', '{{}}')")
        )
    assert outcome == "inserted"
    ddl = schema_sql(metadata)
    assert ddl.index("CREATE TABLE ship_job_definitions") < ddl.index(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}("
    )
