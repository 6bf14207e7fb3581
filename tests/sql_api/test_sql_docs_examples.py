"""docs/sql-enqueue.md's examples run as printed (SPEC §18, E1, E3): the psql call, the
TypeScript (pg) one under Node and the trigger, against tables `schema apply` made; the Go
(pgx) one is not run (no Go module registry is reachable), as the page says."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from test_node_enqueue import NODE_DIR, _node
from test_sql_enqueue_tx import _dsn

from ship_sqla import define_job
from ship_sqla._jobs._sql_api import sql_enqueue_installs, sync_job_definitions
from ship_sqla._schema_apply import apply_ship_schema, ship_tables_metadata

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

PAGE = (Path(__file__).parents[2] / "docs" / "sql-enqueue.md").read_text()
metadata = ship_tables_metadata(components=["jobs"])


async def noop(ctx: Any, payload: Any) -> None:
    return None


SEND_EMAIL = define_job("send-email", noop, payload=dict)


def example(heading: str, language: str) -> str:
    """The first ``language`` code block under ``## heading`` of the page."""
    section = PAGE.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"no {language} example under {heading!r}"
    return found.group(1)


async def test_the_pages_psql_typescript_and_trigger_examples_run_as_printed(
    ship_engine: AsyncEngine, tmp_path: Path
) -> None:
    """E1, E3, J1: after `schema apply` and a synced definition, the page's psql call inserts,
    its TypeScript call (Node, pg from npm) deduplicates against it (the same key), and its
    trigger enqueues a run for a committed order only; the Go example is there and said not
    to run."""
    assert (await apply_ship_schema(ship_engine, metadata)).ok
    [install] = sql_enqueue_installs(metadata)
    async with ship_engine.begin() as connection:
        await sync_job_definitions(connection, install.definitions, [SEND_EMAIL])
    dsn = _dsn(ship_engine)
    psql = shutil.which("psql")
    assert psql is not None, "psql is needed (postgresql-client)"
    done = await asyncio.to_thread(
        subprocess.run,
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", example("psql", "sql")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "| inserted" in done.stdout

    node = _node()
    script = tmp_path / "example.mjs"
    script.write_text(example("TypeScript (pg)", "typescript"))
    (tmp_path / "node_modules").symlink_to(NODE_DIR / "node_modules")
    done = await asyncio.to_thread(
        subprocess.run,
        [node, str(script)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DATABASE_URL": dsn},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deduplicated"

    assert "not run in CI" in PAGE.split("\n## Go (pgx)\n", 1)[1].split("\n## ", 1)[0]
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(example("A trigger", "sql"))
        await connection.execute("INSERT INTO orders (item) VALUES ('kept')")
        rolled_back = connection.transaction()
        await rolled_back.start()
        await connection.execute("INSERT INTO orders (item) VALUES ('rolled back')")
        await rolled_back.rollback()
        keys = await connection.fetch("SELECT dedupe_key FROM ship_job_runs ORDER BY seq")
    finally:
        await connection.close()
    assert [row[0] for row in keys] == ["welcome-42", "order-1"]
