"""The ``ship-sqla`` command line, driven as a user would (``python -m ship_sqla`` in a
subprocess) and through click's CliRunner for the fast cases. Exit codes: 0 ok, 1 differences
or failed operation, 2 bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
from typing import TYPE_CHECKING

import anyio
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from ship_sqla._cli import cli

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from ship_sqla.testing import ResolvedServer

APP_MODULE = textwrap.dedent(
    """
    from sqlalchemy import Column, Index, Integer, MetaData, Table, Text, text

    metadata = MetaData()
    Table(
        "cli_jobs",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("state", Text, nullable=False),
        Index("cli_jobs_pending_idx", "id", postgresql_where=text("state = 'pending'")),
    )
    not_metadata = 42
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_app.py").write_text(APP_MODULE)
    (tmp_path / "cli_broken.py").write_text("import not_installed_anywhere_xyz\n")
    return tmp_path


def _command(*args: str, env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    environment = {k: v for k, v in os.environ.items() if k != "SHIP_SQLA_DATABASE_URL"}
    environment.update(env or {})
    return [sys.executable, "-m", "ship_sqla", *args], environment


async def ship_sqla(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``python -m ship_sqla ARGS`` from ``cwd``, as a user would (from async tests)."""
    command, environment = _command(*args, env=env)
    result = await anyio.run_process(command, cwd=cwd, env=environment, check=False)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def ship_sqla_sync(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``python -m ship_sqla ARGS`` from ``cwd``, as a user would."""
    command, environment = _command(*args, env=None)
    result = subprocess.run(
        command, cwd=cwd, env=environment, check=False, capture_output=True, text=True
    )
    return result.returncode, result.stdout, result.stderr


async def test_schema_check_from_the_command_line(
    app_dir: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """T3: `ship-sqla schema check` exits 0 on a matching database and 1 with the changed
    partial-index predicate named, as a table for people and as JSON for scripts."""
    # Create the tables as a project without Alembic would: from `ship-sqla schema sql`.
    code, ddl, err = await ship_sqla("schema", "sql", "--metadata", "cli_app:metadata", cwd=app_dir)
    assert (code, err) == (0, "")
    async with ship_engine.begin() as connection:
        for statement in ddl.split(";\n"):
            if statement.strip():
                await connection.exec_driver_sql(statement)

    code, out, err = await ship_sqla(
        "schema", "check", "--database-url", ship_engine_url, "--metadata", "cli_app:metadata",
        cwd=app_dir,
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.strip() == "schema check: OK, 1 table(s) match the metadata."

    async with ship_engine.begin() as connection:
        await connection.exec_driver_sql("DROP INDEX cli_jobs_pending_idx")
        await connection.exec_driver_sql(
            "CREATE INDEX cli_jobs_pending_idx ON cli_jobs (id) WHERE state = 'done'"
        )

    # The URL from the environment, JSON out.
    code, out, err = await ship_sqla(
        "schema", "check", "--metadata", "cli_app:metadata", "--json",
        cwd=app_dir, env={"SHIP_SQLA_DATABASE_URL": ship_engine_url},
    )  # fmt: skip
    assert code == 1, err
    report = json.loads(out)
    assert report["ok"] is False
    assert report["tables"] == ["cli_jobs"]
    [difference] = report["differences"]
    assert difference["kind"] == "index_predicate"
    assert difference["name"] == "cli_jobs_pending_idx"
    assert difference["database"] == "state = 'done'::text"
    assert difference["metadata"] == "state = 'pending'::text"

    code, out, _ = await ship_sqla(
        "schema", "check", "--metadata", "cli_app:metadata",
        cwd=app_dir, env={"SHIP_SQLA_DATABASE_URL": ship_engine_url},
    )  # fmt: skip
    assert code == 1
    assert "index_predicate" in out
    assert out.strip().endswith("schema check: 1 difference(s) in 1 table(s) of 1 compared.")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_such_module_xyz:metadata", "module 'no_such_module_xyz' was not found"),
        ("cli_app:missing", "module 'cli_app' has no attribute 'missing'"),
        ("cli_app:not_metadata", "cli_app:not_metadata is a int, not a SQLAlchemy MetaData"),
        ("cli_app", "'cli_app' is not MODULE:ATTR"),
        ("cli_broken:metadata", "it imports 'not_installed_anywhere_xyz', which is not installed"),
    ],
)
def test_a_metadata_reference_that_cannot_load_is_bad_input(
    app_dir: Path, reference: str, message: str
) -> None:
    """A MODULE:ATTR that cannot be loaded is a clear usage error: exit 2, no traceback."""
    code, out, err = ship_sqla_sync("schema", "sql", "--metadata", reference, cwd=app_dir)
    assert code == 2
    assert out == ""
    assert message in err
    assert "Traceback" not in err


def test_schema_sql_prints_the_ddl_with_partial_predicates(app_dir: Path) -> None:
    """`ship-sqla schema sql` prints CREATE TABLE and CREATE INDEX with its WHERE."""
    code, out, err = ship_sqla_sync("schema", "sql", "--metadata", "cli_app:metadata", cwd=app_dir)
    assert (code, err) == (0, "")
    assert "CREATE TABLE cli_jobs (" in out
    assert "CREATE INDEX cli_jobs_pending_idx ON cli_jobs (id) WHERE state = 'pending';" in out


def test_help_lists_the_command_tree(app_dir: Path) -> None:
    code, out, _ = ship_sqla_sync("--help", cwd=app_dir)
    assert code == 0
    for command in ("demo", "jobs", "outbox", "schema", "worker"):
        assert f"  {command} " in out
    assert "Exit codes: 0 success; 1" in out


# --- fast cases through CliRunner -----------------------------------------------------------


@pytest.fixture
def runner(app_dir: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(app_dir)
    monkeypatch.delenv("SHIP_SQLA_DATABASE_URL", raising=False)
    return CliRunner()


def test_missing_database_url_is_bad_input(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["schema", "check", "--metadata", "cli_app:metadata"])
    assert result.exit_code == 2
    assert "Missing option '--database-url'" in result.output


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://u@h/db", "needs PostgreSQL"),
    ],
)
def test_a_malformed_database_url_is_bad_input(runner: CliRunner, url: str, message: str) -> None:
    result = runner.invoke(
        cli, ["schema", "check", "--database-url", url, "--metadata", "cli_app:metadata"]
    )
    assert result.exit_code == 2
    assert message in result.output


def test_an_unknown_table_is_bad_input(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["schema", "sql", "--metadata", "cli_app:metadata", "--table", "x"])
    assert result.exit_code == 2
    assert "'x' not in the metadata; it has: cli_jobs." in result.output


def test_an_unreachable_database_fails_with_exit_1(runner: CliRunner) -> None:
    """A database that cannot be reached is a failed operation (exit 1) printed with the
    outage's code, what failed, the URL without its password, and the fix; no traceback."""
    url = "postgresql://someone:s3cret@127.0.0.1:1/nothing"
    result = runner.invoke(
        cli, ["schema", "check", "--database-url", url, "--metadata", "cli_app:metadata"]
    )
    assert result.exit_code == 1
    assert "Error: SHIP_SQLA_DATABASE_UNAVAILABLE: " in result.output
    assert (
        "schema check could not use the database at"
        " postgresql+asyncpg://someone:***@127.0.0.1:1/nothing: "
    ) in result.output
    assert "the database is unavailable" in result.output
    assert "ConnectionRefusedError" in result.output
    assert "Fix: check that PostgreSQL is running" in result.output
    assert "s3cret" not in result.output
    assert "Traceback" not in result.output

    as_json = runner.invoke(
        cli,
        ["schema", "check", "--database-url", url, "--metadata", "cli_app:metadata", "--json"],
    )
    assert as_json.exit_code == 1
    error = json.loads(as_json.stdout)
    assert error["ok"] is False
    assert error["error"].startswith("SHIP_SQLA_DATABASE_UNAVAILABLE: ")
    assert "someone:***@127.0.0.1:1" in error["error"]


def test_job_commands_are_built(runner: CliRunner) -> None:
    """The worker and job operator commands no longer answer SHIP_SQLA_NOT_YET (their
    behaviour is tested in test_cli_jobs.py): a non-registry is bad input (exit 2)."""
    result = runner.invoke(
        cli, ["worker", "cli_app:metadata", "--database-url", "postgresql://u@h/db"]
    )
    assert result.exit_code == 2
    assert "SHIP_SQLA_NOT_YET" not in result.output
    assert "not a job registry" in result.output


async def test_demo_runs_end_to_end(
    app_dir: Path, ship_server: ResolvedServer, ship_connection: AsyncConnection
) -> None:
    """`ship-sqla demo`, the README's first command, runs the whole story in a scratch database
    of the test server and exits 0: two tenants' rows through a unit of work, each with an
    outbox message relayed to the printing sink and a job run by the worker, then a rolled-back
    unit of work that leaves neither row, message nor job; the scratch database is dropped."""
    admin_url = ship_server.url.render_as_string(hide_password=False)
    with anyio.fail_after(60):
        code, out, err = await ship_sqla(
            "demo", cwd=app_dir, env={"SHIP_SQLA_DATABASE_URL": admin_url}
        )
    assert (code, err) == (0, ""), err
    steps = [line.split(".", 1)[0] for line in out.splitlines() if line[:1].isdigit()]
    assert steps == [str(n) for n in range(1, 9)], out
    for line in (
        'relay  -> sink: order.placed {"order_id": 1, "total": "12.50"} (tenant acme)',
        'relay  -> sink: order.placed {"order_id": 1, "total": "5.00"} (tenant globex)',
        "worker -> demo.send_receipt: receipt for order 1 (Ada, tenant acme), attempt 1",
        "worker -> demo.send_receipt: receipt for order 1 (Linus, tenant globex), attempt 1",
        "   acme: order 1 Ada 12.50\n",
        "   globex: order 1 Linus 5.00\n",
        "rolled back: order 2 absent, message absent, job run absent (2 rows in",
        "2 message(s) relayed, 2 job run(s) executed.",
    ):
        assert line in out, out
    assert out.count("relay  -> sink:") == 2
    assert out.count("worker -> ") == 2
    found = re.search(r"scratch database (ship_sqla_demo_[0-9a-f]+)\.", out)
    assert found is not None, out
    left = await ship_connection.execute(
        text("SELECT count(*) FROM pg_database WHERE datname = :name"), {"name": found[1]}
    )
    assert left.scalar_one() == 0


def test_demo_on_an_unreachable_server_fails_with_exit_1(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A demo that cannot reach its server is a failed operation: exit 1, the error's code,
    what happened and the fix, no traceback."""
    monkeypatch.setenv("SHIP_SQLA_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/postgres")
    result = runner.invoke(cli, ["demo"])
    assert result.exit_code == 1, result.output
    assert "SHIP_SQLA_DEMO_FAILED: the demo failed on postgresql+asyncpg://nobody@127.0.0.1:1/" in (
        result.output
    )
    assert "Fix: check that the server is up" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("returned", "code"), [(None, 0), (0, 0), (3, 3)])
@pytest.mark.parametrize("is_async", [False, True])
def test_demo_runs_the_demo_main(
    runner: CliRunner,
    monkeypatch: pytest.MonkeyPatch,
    returned: int | None,
    code: int,
    is_async: bool,
) -> None:
    """`ship-sqla demo` calls ship_sqla._demo.main() (sync or async); its int is the exit code."""
    calls: list[str] = []
    demo = types.ModuleType("ship_sqla._demo")

    def sync_main() -> int | None:
        calls.append("sync")
        return returned

    async def async_main() -> int | None:
        calls.append("async")
        return returned

    demo.main = async_main if is_async else sync_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ship_sqla._demo", demo)
    result = runner.invoke(cli, ["demo"])
    assert result.exit_code == code, result.output
    assert calls == ["async" if is_async else "sync"]
