"""`ship-sqla worker` and `ship-sqla jobs ...` driven as an operator would, against a real
database: `python -m ship_sqla` in a subprocess for what imports the application's registry
(worker, cleanup --registry); the other `jobs` commands in this process by click's runner.
Exit codes: 0 ok, 1 failed/refused, 2 bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cli_runner import ship_sqla_in_process
from click.testing import CliRunner
from job_helpers import claim_request
from sqlalchemy import MetaData, text

from ship_sqla import define_job, ship_audit_table
from ship_sqla._cli import cli
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla.jobs import Concurrency, Retention, RetryPolicy
from ship_sqla.kernel import failed

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

REGISTRY_MODULE = textwrap.dedent(
    """
    from datetime import timedelta

    import anyio

    from ship_sqla import define_job
    from ship_sqla.jobs import Concurrency, JobRegistry, Retention, RetryPolicy

    registry = JobRegistry()


    @registry.job(
        "cli.mail",
        payload=dict,
        concurrency=Concurrency(max=10, lease=30),
        retry=RetryPolicy(attempts=1),
        retention=Retention(dead=timedelta(hours=2)),
    )
    async def mail(ctx, payload):
        return None


    @registry.job(
        "cli.slow",
        payload=dict,
        concurrency=Concurrency(max=10, lease=30),
        retry=RetryPolicy(attempts=3),
    )
    async def slow(ctx, payload):
        await anyio.sleep(3600)  # only a drain deadline ends it


    job_list = [mail]
    not_registry = 42
    """
)


async def _noop(ctx: Any, payload: Any) -> None:
    return None


# The same ids and policies as the registry module, for seeding runs from the test process.
MAIL = define_job(
    "cli.mail",
    _noop,
    payload=dict,
    concurrency=Concurrency(max=10, lease=30),
    retry=RetryPolicy(attempts=1),
    retention=Retention(dead=timedelta(hours=2)),
)
SLOW = define_job(
    "cli.slow",
    _noop,
    payload=dict,
    concurrency=Concurrency(max=10, lease=30),
    retry=RetryPolicy(attempts=3),
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_jobs_app.py").write_text(REGISTRY_MODULE)
    return tmp_path


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_history_table(metadata)  # J16: the default shape, as `schema apply` creates
    ship_job_state_table(metadata)
    ship_job_steps_table(metadata)  # after the history: no key to the runs (a settle asks it)
    ship_audit_table(metadata)  # S1: the verbs that change a run write their entry
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=ship_engine)


def _environment(app_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    environment = {
        k: v
        for k, v in os.environ.items()
        if k != "SHIP_SQLA_DATABASE_URL" and not k.startswith("SHIP_SQLA_JOB_")
    }
    environment.update(extra or {})
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(app_dir), *filter(None, [environment.get("PYTHONPATH")])]
    )
    return environment


async def ship_sqla(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``python -m ship_sqla ARGS`` as a user would."""
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args],
        cwd=cwd,
        env=_environment(cwd, env),
        check=False,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def dead_runs(backend: PostgresJobBackend, count: int) -> list[str]:
    """Enqueue ``count`` runs of MAIL and fail each on its only attempt: dead, history 1."""
    for i in range(count):
        await backend.enqueue(MAIL, {"i": i})
    claimed = await backend.claim(claim_request(MAIL, worker="test", limit=count))
    for run in claimed:
        assert await backend.settle([failed(run, f"boom {run.run_id}", retry_at=None)]) == ["dead"]
    return [run.run_id for run in claimed]


async def state_of(
    engine: AsyncEngine,
    run_id: str,
    runs: str = "ship_job_runs",
    history: str | None = "ship_job_history",
) -> tuple[str, int, int, Any]:
    """The run's state, attempt, max_attempts and history entries, wherever it is (J16: an
    ended run is in the history table when the database has one, ``history``)."""
    columns = "state, attempt, max_attempts, coalesce(history, '[]'::jsonb) AS history"
    sql = f"SELECT {columns} FROM {runs} WHERE id = :id"
    if history is not None:
        sql += f" UNION ALL SELECT {columns} FROM {history} WHERE id = :id"
    async with engine.connect() as connection:
        row = (await connection.execute(text(sql), {"id": run_id})).one()
    return row.state, row.attempt, row.max_attempts, row.history


def test_help_lists_every_command(app_dir: Path) -> None:
    """Every worker and job command is in the tree; the help says the operator is trusted."""
    top = subprocess.run(
        [sys.executable, "-m", "ship_sqla", "--help"],
        cwd=app_dir, env=_environment(app_dir), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert top.returncode == 0
    for command in ("demo", "jobs", "schema", "worker"):
        assert f"  {command} " in top.stdout
    jobs = subprocess.run(
        [sys.executable, "-m", "ship_sqla", "jobs", "--help"],
        cwd=app_dir, env=_environment(app_dir), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert jobs.returncode == 0
    for command in ("dead", "show", "retry", "discard", "stats", "cleanup"):
        assert f"  {command} " in jobs.stdout
    assert "operator at the shell is trusted" in jobs.stdout
    assert "ship.jobs:manage" in jobs.stdout


async def test_dead_show_retry_discard(
    backend: PostgresJobBackend, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """J8 from the shell: `jobs dead` lists dead runs (table, --json, keyset pages, --tenant:
    F2), `show`
    prints the history, `retry` makes a dead run wait with one more attempt, `discard` ends a
    dead run; refusals and unknown runs exit 1, a foreign cursor exits 2."""
    first, second = await dead_runs(backend, 2)
    url = ("--database-url", ship_engine_url)

    code, out, err = await ship_sqla_in_process("jobs", "dead", *url)
    assert (code, err) == (0, ""), err
    assert out.splitlines()[0].split() == ["RUN_ID", "JOB", "ATTEMPTS", "FINISHED_AT", "LAST_ERROR"]
    assert first in out
    assert second in out
    assert "2 dead run(s)." in out

    code, out, _ = await ship_sqla_in_process("jobs", "dead", *url, "--job", "cli.mail", "--json")
    assert code == 0
    listed = json.loads(out)
    assert {r["run_id"] for r in listed["runs"]} == {first, second}
    assert listed["next_cursor"] is None
    assert all(r["state"] == "dead" for r in listed["runs"])

    # F2: --tenant lists only that tenant's dead runs (these have none); a blank one is bad input.
    code, out, _ = await ship_sqla_in_process("jobs", "dead", *url, "--tenant", "acme", "--json")
    assert (code, json.loads(out)["runs"]) == (0, [])
    code, _, err = await ship_sqla_in_process("jobs", "dead", *url, "--tenant", " ")
    assert code == 2, err
    assert "--tenant" in err

    code, out, _ = await ship_sqla_in_process("jobs", "dead", *url, "--limit", "1", "--json")
    page = json.loads(out)
    assert len(page["runs"]) == 1
    assert page["next_cursor"] is not None
    code, out, _ = await ship_sqla_in_process(
        "jobs", "dead", *url, "--limit", "1", "--cursor", page["next_cursor"], "--json",
    )  # fmt: skip
    rest = json.loads(out)
    assert {page["runs"][0]["run_id"], rest["runs"][0]["run_id"]} == {first, second}

    code, _, err = await ship_sqla_in_process(
        "jobs", "dead", *url, "--job", "other", "--cursor", page["next_cursor"]
    )
    assert code == 2
    assert "belongs to another query" in err

    code, out, err = await ship_sqla_in_process("jobs", "show", first, *url)
    assert (code, err) == (0, ""), err
    assert "state:            dead" in out
    assert "history (1):" in out
    assert f"boom {first}" in out
    assert " on test): " in out  # J18: the attempt's start and worker
    code, out, _ = await ship_sqla_in_process("jobs", "show", first, *url, "--json")
    shown = json.loads(out)
    assert shown["run_id"] == first
    assert [h["error"] for h in shown["history"]] == [f"boom {first}"]

    code, out, err = await ship_sqla_in_process("jobs", "retry", first, *url)
    assert (code, err) == (0, ""), err
    assert "is waiting again, due now: attempts 1 of 2 used." in out
    assert (await state_of(ship_engine, first))[:3] == ("waiting", 1, 2)
    # retry and show say the attempts the same way (issue 15).
    code, out, _ = await ship_sqla_in_process("jobs", "show", first, *url)
    assert "attempts:         1 of 2 used" in out

    code, out, err = await ship_sqla_in_process("jobs", "retry", first, *url)
    assert code == 1
    assert "SHIP_SQLA_JOB_OPERATION_REFUSED" in err
    assert "it is 'waiting'; retry takes only dead runs" in err
    # Messages use the CLI's verbs, not the Python API's (issue 15).
    assert "`ship-sqla jobs dead`" in err
    assert "list_dead" not in err
    assert "Traceback" not in err

    code, out, err = await ship_sqla_in_process("jobs", "discard", second, *url)
    assert (code, err) == (0, ""), err
    assert f"run {second} (cli.mail) is discarded." in out
    assert (await state_of(ship_engine, second))[0] == "discarded"

    for command in ("show", "retry", "discard", "cancel"):
        code, _, err = await ship_sqla_in_process("jobs", command, "no-such-run", *url)
        assert code == 1, command
        # A missing run is "no such run", not a refused operation (issue 15).
        assert "SHIP_SQLA_RUN_NOT_FOUND: no such run 'no-such-run' in ship_job_runs." in err
        assert "OPERATION_REFUSED" not in err
        assert "list_dead" not in err
        assert "Traceback" not in err


async def test_stats_counts_runs_by_state(
    backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """`jobs stats` counts each job's runs by state (bounded GROUP BY), with the age of the
    oldest due waiting run."""
    await dead_runs(backend, 2)
    await backend.enqueue(MAIL, {"waiting": True})
    await backend.enqueue(SLOW, {"waiting": True})
    url = ("--database-url", ship_engine_url)

    code, out, err = await ship_sqla_in_process("jobs", "stats", *url, "--json")
    assert (code, err) == (0, ""), err
    stats = json.loads(out)
    assert stats["truncated"] is False
    by_job = {j["job_id"]: j for j in stats["jobs"]}
    assert set(by_job) == {"cli.mail", "cli.slow"}
    mail = by_job["cli.mail"]
    assert (mail["waiting"], mail["dead"], mail["running"], mail["completed"]) == (1, 2, 0, 0)
    assert mail["oldest_due_seconds"] >= 0
    assert by_job["cli.slow"]["waiting"] == 1

    code, out, _ = await ship_sqla_in_process("jobs", "stats", *url)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["JOB", "WAITING", "RUNNING"]
    assert rows[0].split()[:5] == ["cli.mail", "1", "0", "0", "2"]


@pytest.fixture
async def inplace_backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    """J16's legacy in-place shape: a database without the history table (built before it),
    a backend given its runs table with no history declared; the commands follow it."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    state = ship_job_state_table(metadata)
    ship_audit_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    assert not backend.history
    return backend


async def test_cleanup_applies_the_registry_retention(
    app_dir: Path,
    inplace_backend: PostgresJobBackend,
    ship_engine: AsyncEngine,
    ship_engine_url: str,
) -> None:
    """J8, J16: `jobs cleanup --registry` deletes dead runs past the registered job's retention
    (2 hours here) and keeps the younger ones; on the in-place shape (a database without the
    history: the finished runs are in the runs table; with one, history leaves by its
    partitions, J17, and cleanup applies to the live tables only)."""
    old, young = await dead_runs(inplace_backend, 2)
    async with ship_engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE ship_job_runs SET finished_at = now() - interval '3 hours' WHERE id = :id"
            ),
            {"id": old},
        )
    code, out, err = await ship_sqla(
        "jobs", "cleanup", "--database-url", ship_engine_url, "--registry",
        "cli_jobs_app:registry", "--json", cwd=app_dir,
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {"deleted": {"cli.mail": 1, "cli.slow": 0}, "more_to_delete": []}
    async with ship_engine.connect() as connection:
        left = (await connection.execute(text("SELECT id FROM ship_job_runs"))).scalars().all()
    assert left == [young]


async def _wait_for_state(
    engine: AsyncEngine,
    run_id: str,
    state: str,
    runs: str = "ship_job_runs",
    history: str | None = "ship_job_history",
) -> None:
    """Poll the database (real processes: nothing to wait on in-process) until a deadline."""
    with anyio.fail_after(30):
        while True:
            if (await state_of(engine, run_id, runs, history))[0] == state:
                return
            await anyio.sleep(0.05)  # another process changes the row: nothing to wait on


async def test_worker_executes_runs_and_drains_on_sigterm(
    app_dir: Path, backend: PostgresJobBackend, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """J12: `ship-sqla worker` executes the registry's runs; on SIGTERM it stops claiming,
    cancels the run still executing at the drain deadline (back to waiting, the cancellation
    in its history, no attempt lost) and exits 0."""
    log = app_dir / "worker.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, waited on in a thread
            [
                sys.executable, "-m", "ship_sqla", "worker", "cli_jobs_app:registry",
                "--database-url", ship_engine_url, "--poll-interval", "0.2",
                "--drain-timeout", "0.5",
            ],
            cwd=app_dir, env=_environment(app_dir), stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        done = await backend.enqueue(MAIL, {"to": "a@example.com"})
        assert done.run_id is not None
        await _wait_for_state(ship_engine, done.run_id, "completed")
        slow = await backend.enqueue(SLOW, {})
        assert slow.run_id is not None
        await _wait_for_state(ship_engine, slow.run_id, "running")
        process.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 0, output
    assert "executing cli.mail, cli.slow" in output
    assert "stopped." in output
    state, attempt, max_attempts, history = await state_of(ship_engine, slow.run_id)
    assert (state, max_attempts) == ("waiting", 3)
    assert attempt == 0
    assert len(history) == 1
    assert "drain" in history[0]["error"]


# --- tables under other names, in another schema ---------------------------------------------

CUSTOM = {"runs": "billing_runs", "state": "billing_state", "schema": "ops"}
CUSTOM_OPTIONS = ("--runs-table", "billing_runs", "--schema", "ops")


@pytest.fixture
async def custom_backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    """A backend on tables created as an application with its own names would create them."""
    metadata = MetaData()
    runs = ship_job_runs_table(metadata, name=CUSTOM["runs"], schema=CUSTOM["schema"])
    state = ship_job_state_table(metadata, name=CUSTOM["state"], schema=CUSTOM["schema"])
    ship_audit_table(metadata, schema=CUSTOM["schema"])  # S1: beside the runs, as the CLI looks
    async with ship_engine.begin() as connection:
        await connection.execute(text(f"CREATE SCHEMA {CUSTOM['schema']}"))
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=ship_engine, table=runs, state_table=state)


async def test_job_commands_on_tables_with_other_names(
    custom_backend: PostgresJobBackend,
    ship_engine: AsyncEngine,
    ship_engine_url: str,
) -> None:
    """J8 on a backend created with custom table names in a custom schema: --runs-table and
    --schema (or SHIP_SQLA_JOB_RUNS_TABLE / SHIP_SQLA_JOB_SCHEMA) reach its runs; without
    them the default table is missing, which fails with exit 1 and says which options fix it."""
    first, second = await dead_runs(custom_backend, 2)
    url = ("--database-url", ship_engine_url)
    runs = "ops.billing_runs"

    code, out, err = await ship_sqla_in_process("jobs", "dead", *url, *CUSTOM_OPTIONS, "--json")
    assert (code, err) == (0, ""), err
    assert {r["run_id"] for r in json.loads(out)["runs"]} == {first, second}

    code, out, err = await ship_sqla_in_process("jobs", "show", first, *url, *CUSTOM_OPTIONS)
    assert (code, err) == (0, ""), err
    assert "state:            dead" in out

    code, out, err = await ship_sqla_in_process("jobs", "retry", first, *url, *CUSTOM_OPTIONS)
    assert (code, err) == (0, ""), err
    assert (await state_of(ship_engine, first, runs, None))[:3] == ("waiting", 1, 2)

    code, _, err = await ship_sqla_in_process("jobs", "show", "no-such-run", *url, *CUSTOM_OPTIONS)
    assert code == 1
    assert "no such run 'no-such-run' in ops.billing_runs." in err

    # The same through the environment, as a deployment would set it once.
    environment = {"SHIP_SQLA_JOB_RUNS_TABLE": "billing_runs", "SHIP_SQLA_JOB_SCHEMA": "ops"}
    code, out, err = await ship_sqla_in_process("jobs", "stats", *url, "--json", env=environment)
    assert (code, err) == (0, ""), err
    [mail] = json.loads(out)["jobs"]
    assert (mail["job_id"], mail["waiting"], mail["dead"]) == ("cli.mail", 1, 1)

    code, out, err = await ship_sqla_in_process("jobs", "discard", second, *url, env=environment)
    assert (code, err) == (0, ""), err
    assert (await state_of(ship_engine, second, runs, None))[0] == "discarded"

    # Without the options the default table is looked for, and is not there.
    code, _, err = await ship_sqla_in_process("jobs", "stats", *url)
    assert code == 1
    assert 'relation "ship_job_runs" does not exist' in err
    assert "here: ship_job_runs;" in err
    assert "--runs-table and --schema" in err
    assert "Traceback" not in err


async def test_worker_on_tables_with_other_names(
    app_dir: Path,
    custom_backend: PostgresJobBackend,
    ship_engine: AsyncEngine,
    ship_engine_url: str,
) -> None:
    """`ship-sqla worker --runs-table --state-table --schema` executes the runs of a backend
    created with custom names, and stops on SIGTERM with exit 0."""
    log = app_dir / "worker.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, waited on in a thread
            [
                sys.executable, "-m", "ship_sqla", "worker", "cli_jobs_app:registry",
                "--database-url", ship_engine_url, "--poll-interval", "0.2",
                "--runs-table", CUSTOM["runs"], "--state-table", CUSTOM["state"],
                "--schema", CUSTOM["schema"],
            ],
            cwd=app_dir, env=_environment(app_dir), stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        done = await custom_backend.enqueue(MAIL, {"to": "a@example.com"})
        assert done.run_id is not None
        await _wait_for_state(ship_engine, done.run_id, "completed", "ops.billing_runs", None)
        process.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 0, output
    assert "stopped." in output


async def test_worker_without_the_state_table_fails_at_start(
    app_dir: Path, custom_backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """The worker checks its tables before it starts (the runtime's one probe, issue 27 item
    7): a state table that is not there (here: the default name, in the custom schema) exits 1
    at once, naming the missing table and the `schema apply` command that creates it."""
    code, _, err = await ship_sqla(
        "worker", "cli_jobs_app:registry", "--database-url", ship_engine_url, *CUSTOM_OPTIONS,
        cwd=app_dir,
    )  # fmt: skip
    assert code == 1, err
    assert "SHIP_SQLA_TABLES_MISSING: ship-sqla worker at" in err
    assert "the job worker needs ops.ship_job_state, which the database does not have" in err
    assert (
        "`ship-sqla schema apply --only jobs --schema ops --runs-table billing_runs"
        " --state-table ship_job_state`" in err
    )
    assert "Traceback" not in err


# --- bad input and failures, fast, through CliRunner ----------------------------------------


@pytest.fixture
def runner(app_dir: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(app_dir)
    monkeypatch.delenv("SHIP_SQLA_DATABASE_URL", raising=False)
    return CliRunner()


URL = ("--database-url", "postgresql://u@127.0.0.1:1/nothing")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("cli_jobs_app:not_registry", "is a int, not a job registry"),
        ("cli_jobs_app:missing", "has no attribute 'missing'"),
        ("no_such_module_xyz:registry", "module 'no_such_module_xyz' was not found"),
        ("cli_jobs_app", "is not MODULE:ATTR"),
    ],
)
@pytest.mark.parametrize("command", ["worker", "cleanup"])
def test_a_registry_that_cannot_load_is_bad_input(
    runner: CliRunner, reference: str, message: str, command: str
) -> None:
    """APP:REGISTRY that is not a JobRegistry or list of jobs: exit 2 before any database."""
    args = (
        ["worker", reference, *URL]
        if command == "worker"
        else ["jobs", "cleanup", *URL, "--registry", reference]
    )
    result = runner.invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_list_of_job_definitions_is_a_registry(runner: CliRunner) -> None:
    """A list of definitions loads (it reaches the database, which is down here: exit 1)."""
    result = runner.invoke(cli, ["jobs", "cleanup", *URL, "--registry", "cli_jobs_app:job_list"])
    assert result.exit_code == 1, result.output
    assert (
        "could not use the database at postgresql+asyncpg://u@127.0.0.1:1/nothing" in result.output
    )


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "cli_jobs_app:registry", *URL],
        ["jobs", "dead", *URL],
        ["jobs", "show", "run-1", *URL],
        ["jobs", "retry", "run-1", *URL],
        ["jobs", "discard", "run-1", *URL],
        ["jobs", "stats", *URL],
    ],
)
def test_an_unreachable_database_fails_with_exit_1(runner: CliRunner, args: list[str]) -> None:
    """A refused connection is exit 1 printed as the one outage error: its code, the command,
    the database (no password), the driver's error and the fix; never a traceback."""
    result = runner.invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "Error: SHIP_SQLA_DATABASE_UNAVAILABLE: " in result.output
    command = " ".join(a for a in args[:2] if not a.startswith(("cli_", "run-")))
    assert f"{command} could not use the database at postgresql+asyncpg://u@" in result.output
    assert "ConnectionRefusedError" in result.output
    assert "Fix: check that PostgreSQL is running" in result.output
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "cli_jobs_app:registry", *URL, "--max-in-flight", "0"],
        ["worker", "cli_jobs_app:registry", *URL, "--poll-interval", "0"],
        ["jobs", "dead", *URL, "--limit", "0"],
        ["jobs", "dead", *URL, "--cursor", "not-a-cursor"],
        ["jobs", "show", *URL],
    ],
)
def test_malformed_options_are_bad_input(runner: CliRunner, args: list[str]) -> None:
    result = runner.invoke(cli, args)
    assert result.exit_code == 2, result.output


LONG = "r" * 60  # fits PostgreSQL's 63 bytes, but not with the factories' index suffixes


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["jobs", "stats", *URL, "--runs-table", ""], {}, "the table name is empty"),
        (
            ["jobs", "stats", *URL, "--runs-table", "ops.runs"],
            {},
            "'ops.runs' is a dotted name; give the bare table name (pass the schema with --schema)",
        ),
        (["jobs", "dead", *URL, "--schema", "a.b"], {}, "give the bare schema name."),
        (["jobs", "stats", *URL, "--schema", "s" * 64], {}, "is 64 bytes, over PostgreSQL's 63"),
        (["jobs", "stats", *URL, "--runs-table", LONG], {}, "job runs table name 'rrrr"),
        (
            ["worker", "cli_jobs_app:registry", *URL, "--state-table", LONG],
            {},
            "job state table name 'rrrr",
        ),
        (["jobs", "stats", *URL], {"SHIP_SQLA_JOB_RUNS_TABLE": "a.b"}, "'a.b' is a dotted name"),
        (["jobs", "stats", *URL, "--state-table", "x"], {}, "No such option '--state-table'"),
    ],
)
def test_malformed_table_options_are_bad_input(
    runner: CliRunner, args: list[str], env: dict[str, str], message: str
) -> None:
    """A table or schema name that cannot name the tables exits 2 before any database, naming
    the option; the operator commands, which never read the state table, do not take it."""
    result = runner.invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_an_overlong_table_name_names_its_option(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["worker", "cli_jobs_app:registry", *URL, "--runs-table", LONG])
    assert result.exit_code == 2, result.output
    assert "Invalid value for --runs-table" in result.output
    assert "too long" in result.output
    result = runner.invoke(cli, ["worker", "cli_jobs_app:registry", *URL, "--state-table", LONG])
    assert "Invalid value for --state-table" in result.output


@pytest.mark.parametrize("option", ["--poll-interval", "--drain-timeout"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nan", "is not a duration"),
        ("inf", "is not a duration"),
        ("1e12", "is not a duration"),
        ("-1", "is not a duration"),
        ("1000000000000", "must be at most"),
        ("99999999999d", "must be at most"),
    ],
)
def test_duration_options_must_be_finite_and_bounded(
    runner: CliRunner, option: str, value: str, message: str
) -> None:
    """Every duration option is finite, positive and within its bound (the library's): nan,
    inf, 1e12 and 99999999999d are bad input (exit 2) naming the option, never a traceback."""
    result = runner.invoke(cli, ["worker", "cli_jobs_app:registry", *URL, option, value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert message in result.output


def test_duration_options_take_units(runner: CliRunner) -> None:
    """--poll-interval 250ms and --drain-timeout 0 (cancel at once, as the runtime allows) are
    valid; the worker then reaches the database, which is down here (exit 1)."""
    args = ["worker", "cli_jobs_app:registry", *URL, "--poll-interval", "250ms"]
    result = runner.invoke(cli, [*args, "--drain-timeout", "0"])
    assert result.exit_code == 1, result.output
    assert "SHIP_SQLA_DATABASE_UNAVAILABLE" in result.output
