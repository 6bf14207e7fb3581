"""The SQL enqueue API in the caller's transaction (E3, K1, K8), across languages (J2), its
install and versions (E5, E6), the session's tenant (F2) and its privileges (E7)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cli_runner import ship_sqla
from pgbouncer import PgBouncer
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from test_sql_enqueue import CAPPED, PLAIN, SMALL, defs, metadata, runs, state

from ship_sqla._jobs import create_job_backend
from ship_sqla._jobs._sql_api import install_sql_enqueue, sql_enqueue_status, sync_job_definitions
from ship_sqla.schema import tenant_policy_ddl

CHANNEL = "ship_sqla.jobs:ship_job_runs"
TRIGGER = (Path(__file__).parent / "trigger_v1.sql").read_text()


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await sync_job_definitions(connection, defs, [PLAIN, SMALL])
        await sync_job_definitions(connection, defs, [CAPPED], queue_depth_limit=100)
    return ship_engine


def _dsn(engine: AsyncEngine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


async def test_a_trigger_enqueues_only_for_committed_rows_and_announces_them(
    engine: AsyncEngine,
) -> None:
    """E3, K1: an AFTER INSERT trigger's enqueue joins the inserting transaction: runs exist
    only for committed rows, and a due run is announced on the wake channel when it commits,
    nothing for a rollback."""
    listener = await asyncpg.connect(_dsn(engine))
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(CHANNEL, lambda *args: heard.put_nowait(args[3]))
    try:
        await listener.execute(TRIGGER)
        for item, commit in (("kept", True), ("lost", False), ("kept too", True)):
            connection = await asyncpg.connect(_dsn(engine))
            try:
                tx = connection.transaction()
                await tx.start()
                await connection.execute("INSERT INTO orders (item) VALUES ($1)", item)
                await (tx.commit() if commit else tx.rollback())
            finally:
                await connection.close()
            if commit:
                assert await asyncio.wait_for(heard.get(), 5) == "sql/sql.plain"
            else:
                assert heard.empty()
        async with engine.connect() as connection:
            found = await connection.execute(
                text("SELECT payload ->> 'order' FROM ship_job_runs ORDER BY seq")
            )
            orders = await connection.execute(text("SELECT id::text FROM orders ORDER BY id"))
            assert [row[0] for row in found] == [row[0] for row in orders]
    finally:
        await listener.close()


async def test_python_and_sql_enqueuers_share_one_hard_cap(
    engine: AsyncEngine, ship_engine_url: str
) -> None:
    """J2, E2: three Python engines and three SQL sessions enqueue a job capped at 100 at the
    same time: exactly 100 runs are inserted, never more."""
    engines = [create_async_engine(ship_engine_url) for _ in range(3)]
    backends = [
        create_job_backend(database=e, table=runs, state_table=state, queue_depth_limit=100)
        for e in engines
    ]

    async def python_side(backend: Any) -> int:
        inserted = 0
        for i in range(40):
            result = await backend.enqueue(CAPPED, {"py": i})
            inserted += result.rejected is None and not result.deduplicated
        return inserted

    async def sql_side() -> int:
        connection = await asyncpg.connect(_dsn(engine))
        try:
            inserted = 0
            for i in range(40):
                outcome = await connection.fetchval(
                    "SELECT outcome FROM ship_job_runs_enqueue_v1('sql.capped', $1::jsonb)",
                    json.dumps({"sql": i}),
                )
                inserted += outcome == "inserted"
            return inserted
        finally:
            await connection.close()

    try:
        counts = await asyncio.gather(
            *[python_side(b) for b in backends], *[sql_side() for _ in range(3)]
        )
    finally:
        for e in engines:
            await e.dispose()
    async with engine.connect() as connection:
        total = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
    assert sum(counts) == total == 100


async def test_the_session_tenant_is_the_runs_tenant(engine: AsyncEngine) -> None:
    """F2, E2: without a tenant argument the run records the session's ship.tenant_id (a
    trigger inside a tenanted unit of work); the argument wins."""
    async with engine.begin() as connection:
        await connection.execute(text("SELECT set_config('ship.tenant_id', 'acme', true)"))
        await connection.execute(text("SELECT ship_job_runs_enqueue_v1('sql.plain', '{}')"))
        await connection.execute(
            text("SELECT ship_job_runs_enqueue_v1('sql.plain', '{}', tenant => 'other')")
        )
    async with engine.connect() as connection:
        found = await connection.execute(text("SELECT tenant_id FROM ship_job_runs ORDER BY seq"))
        assert [row[0] for row in found] == ["acme", "other"]


async def test_the_schema_check_sees_a_missing_or_outdated_function(engine: AsyncEngine) -> None:
    """E6, E5: create_all installs the functions with a build hash in their COMMENT; the check
    reports a dropped one as missing, another build as outdated; install_sql_enqueue (what
    schema apply and a migration run) makes it current again, and the versions function lists
    v1."""
    async with engine.begin() as connection:
        assert await sql_enqueue_status(connection, runs, state, defs) == "current"
        versions = await connection.execute(
            text("SELECT version FROM ship_job_runs_enqueue_versions()")
        )
        assert {row[0] for row in versions} == {"v1"}
        await connection.exec_driver_sql(
            "COMMENT ON FUNCTION ship_job_runs_enqueue_v1(text, jsonb, timestamptz, integer,"
            " text, text, text, text, jsonb, jsonb) IS 'ship_sqla sql enqueue build 0'"
        )
        assert await sql_enqueue_status(connection, runs, state, defs) == "outdated"
        await connection.exec_driver_sql("DROP FUNCTION ship_job_runs_enqueue_many_v1(jsonb)")
        await connection.exec_driver_sql(
            "DROP FUNCTION ship_job_runs_enqueue_v1(text, jsonb, timestamptz, integer,"
            " text, text, text, text, jsonb, jsonb)"
        )
        assert await sql_enqueue_status(connection, runs, state, defs) == "missing"
        await install_sql_enqueue(connection, runs, state, defs)
        assert await sql_enqueue_status(connection, runs, state, defs) == "current"


async def test_the_definer_variant_runs_only_for_the_granted_role(engine: AsyncEngine) -> None:
    """E7: the hardened SECURITY DEFINER variant has a fixed search_path and EXECUTE only for
    the named role: that role enqueues without any grant on the tables, another role is
    refused."""
    async with engine.begin() as connection:
        for role in ("ship_sql_caller", "ship_sql_other"):
            await connection.exec_driver_sql(
                f"DO $$ BEGIN CREATE ROLE {role}; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
        await install_sql_enqueue(connection, runs, state, defs, definer_role="ship_sql_caller")
        await connection.exec_driver_sql(
            "GRANT USAGE ON SCHEMA public TO ship_sql_caller, ship_sql_other"
        )
        await connection.exec_driver_sql("SET LOCAL ROLE ship_sql_caller")
        [(_run_id, outcome)] = await connection.execute(
            text("SELECT * FROM public.ship_job_runs_enqueue_v1('sql.plain', '{}')")
        )
        assert outcome == "inserted"
    async with engine.connect() as connection:
        await connection.exec_driver_sql("SET ROLE ship_sql_other")
        call = text("SELECT * FROM public.ship_job_runs_enqueue_v1('sql.plain', '{}')")
        with pytest.raises(DBAPIError, match="permission denied"):
            await connection.execute(call)
        await connection.rollback()
        await connection.exec_driver_sql("RESET ROLE")


GOLDEN = Path(__file__).parent / "golden"


async def run_corpus(dsn: str) -> str:
    """psql's output for the frozen v1 corpus (tests/sql_api/golden/v1_corpus.sql) on ``dsn``."""
    psql = shutil.which("psql")
    assert psql is not None, "psql is needed for the golden files (postgresql-client)"
    done = await asyncio.to_thread(
        subprocess.run,
        [psql, "-X", "-q", "-d", dsn, "-f", "-"],
        input=(GOLDEN / "v1_corpus.sql").read_text(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        env={**os.environ, "PGTZ": "UTC", "PGOPTIONS": "-c lc_messages=C"},
    )
    if os.environ.get("SHIP_SQLA_WRITE_GOLDEN"):  # only when a NEW call joins the corpus
        (GOLDEN / "v1_corpus.out").write_text(done.stdout)
    return done.stdout


async def test_the_frozen_v1_corpus_gives_its_golden_output(engine: AsyncEngine) -> None:
    """E5, E6, E1, E4: the committed corpus of v1 calls (every outcome, every error code, a
    user's wrapper function) run by psql after the install gives exactly its golden output;
    an upgrade that breaks a v1 caller fails here (after `schema apply`:
    test_sql_schema_apply.py)."""
    async with engine.begin() as connection:
        await install_sql_enqueue(connection, runs, state, defs)
        await sync_job_definitions(connection, defs, [CAPPED], queue_depth_limit=3)
    assert await run_corpus(_dsn(engine)) == (GOLDEN / "v1_corpus.out").read_text()


async def test_single_and_bulk_calls_through_pgbouncer(
    engine: AsyncEngine, pgbouncer: PgBouncer
) -> None:
    """F7, E1: through PgBouncer in transaction mode the single and the bulk call give the
    same outcomes as on a direct connection."""
    bounced = pgbouncer.engine(str(engine.url.database))
    try:
        answers = []
        for target in (bounced, engine):
            async with target.begin() as connection:
                await connection.execute(text("DELETE FROM ship_job_runs"))
            for _ in range(2):
                async with target.begin() as connection:
                    one = await connection.execute(
                        text(
                            "SELECT outcome FROM ship_job_runs_enqueue_v1('sql.plain', '{}',"
                            " dedupe_key => 'b')"
                        )
                    )
                    many = await connection.execute(
                        text(
                            "SELECT outcome FROM ship_job_runs_enqueue_many_v1("
                            '\'[{"job_id": "sql.plain", "payload": {}, "run_id": "m"},'
                            ' {"job_id": "sql.plain", "payload": {}, "dedupe_key": "b"}]\')'
                        )
                    )
                    answers.append((target is bounced, one.scalar(), [r[0] for r in many]))
    finally:
        await bounced.dispose()
    assert [a[1:] for a in answers[:2]] == [a[1:] for a in answers[2:]]
    assert answers[0][1:] == ("inserted", ["inserted", "deduplicated"])
    assert answers[1][1:] == ("deduplicated", ["deduplicated", "deduplicated"])


async def test_a_worker_start_upserts_its_definitions(engine: AsyncEngine) -> None:
    """E8, J2: a worker started on a backend that serves SQL enqueuers upserts its jobs' rows
    with the backend's cap, so SQL and Python callers cap against one number."""
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, queue_depth_limit=7
    )
    backend.serve_sql_enqueue(defs)
    await backend.require_support([PLAIN, CAPPED])
    async with engine.connect() as connection:
        found = await connection.execute(
            text(
                "SELECT job_id, queue_depth_limit, max_attempts, priority, handler_version"
                " FROM ship_job_definitions ORDER BY job_id"
            )
        )
        rows = [tuple(row) for row in found]
    assert rows == [
        ("sql.capped", 7, 5, 0, None),
        ("sql.plain", 7, 5, 2, 3),
        ("sql.small", None, 5, 0, None),
    ]


async def test_row_level_security_applies_to_the_invoker(engine: AsyncEngine) -> None:
    """E7, F2: the default SECURITY INVOKER function runs with the caller's rights, so a
    tenant policy on the runs table applies: a caller of tenant acme cannot enqueue a run for
    another tenant, and enqueues its own."""
    async with engine.begin() as connection:
        await connection.exec_driver_sql(
            "DO $$ BEGIN CREATE ROLE ship_sql_tenant_app; EXCEPTION WHEN duplicate_object THEN"
            " NULL; END $$"
        )
        for statement in tenant_policy_ddl("ship_job_runs"):
            await connection.exec_driver_sql(statement)
        for grant in (
            "GRANT USAGE ON SCHEMA public TO ship_sql_tenant_app",
            "GRANT SELECT, INSERT, UPDATE ON ship_job_runs, ship_job_state TO ship_sql_tenant_app",
            "GRANT SELECT ON ship_job_definitions TO ship_sql_tenant_app",
        ):
            await connection.exec_driver_sql(grant)
    async with engine.connect() as connection:
        await connection.exec_driver_sql("SET ROLE ship_sql_tenant_app")
        await connection.execute(text("SELECT set_config('ship.tenant_id', 'acme', false)"))
        inserted = await connection.scalar(
            text("SELECT outcome FROM ship_job_runs_enqueue_v1('sql.plain', '{}')")
        )
        await connection.commit()
        assert inserted == "inserted"
        with pytest.raises(DBAPIError, match="row-level security"):
            await connection.execute(
                text("SELECT ship_job_runs_enqueue_v1('sql.plain', '{}', tenant => 'other')")
            )
        await connection.rollback()
        await connection.exec_driver_sql("RESET ROLE")


async def test_the_cli_syncs_definitions_and_installs_the_functions(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """E8, E6: `ship-sqla jobs sync-definitions --registry` creates the definitions table,
    installs the functions and upserts one row per registered job with the given cap; a SQL
    call then enqueues under it."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all, tables=[runs, state])
    (tmp_path / "sql_app.py").write_text(
        "from ship_sqla import define_job\n\n"
        "async def noop(ctx, payload):\n    return None\n\n"
        "jobs = [define_job('cli.sql', noop, payload=dict)]\n"
    )
    code, out, err = await ship_sqla(
        "jobs", "sync-definitions", "--database-url", ship_engine_url,
        "--registry", "sql_app:jobs", "--queue-depth-limit", "1", cwd=tmp_path,
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert "1 job definition(s) synced" in out
    async with ship_engine.begin() as connection:
        outcomes = [
            await connection.scalar(
                text("SELECT outcome FROM ship_job_runs_enqueue_v1('cli.sql', '{}')")
            )
            for _ in range(2)
        ]
    assert outcomes == ["inserted", "queue-full"]
