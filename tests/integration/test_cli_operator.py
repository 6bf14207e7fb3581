"""Issue 15's operator CLI, driven as a user would (``python -m ship_sqla`` in a subprocess;
the schema commands, which need no process of their own, run in this one by click's runner):
`schema apply` then `schema check`, `enqueue`, the README's worker example logging a failing
run (S3), `worker --burst`, Ctrl-C (130), and the input slips the issue lists (exit 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from cli_runner import ship_sqla, ship_sqla_in_process
from click.testing import CliRunner
from sqlalchemy import text

from ship_sqla._cli import cli

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

REPOSITORY = Path(__file__).resolve().parents[2]
URL = ("--database-url", "postgresql://u@127.0.0.1:1/nothing")


async def _apply(url: str, *extra: str) -> tuple[int, str, str]:
    return await ship_sqla_in_process("schema", "apply", "--database-url", url, *extra)


async def test_schema_apply_then_check_passes_on_an_empty_database(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """T3, issue 15, E6: `schema apply` creates every ship table (the job definitions too, with
    the SQL enqueue functions) on an empty database and checks them; a second apply creates
    nothing (idempotent); `schema check` (default: the ship tables) then exits 0; a table that
    differs is reported by both (exit 1), never altered."""
    code, out, err = await _apply(ship_engine_url)
    assert (code, err) == (0, ""), err
    assert "created 16 table(s): " in out
    assert "SQL enqueue functions installed (E6): ship_job_runs_enqueue_v1." in out
    assert "schema check: OK, 16 table(s) match the metadata." in out

    code, out, err = await _apply(ship_engine_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["ok"], report["created"]) == (True, [])
    assert "ship_job_runs" in report["existing"]

    code, out, err = await ship_sqla_in_process(
        "schema", "check", "--database-url", ship_engine_url
    )
    assert (code, err) == (0, ""), err
    assert out.strip() == "schema check: OK, 16 table(s) match the metadata."

    async with ship_engine.begin() as connection:
        await connection.execute(text("DROP INDEX ship_outbox_pending_idx"))
    code, out, err = await _apply(ship_engine_url)
    assert code == 1, out
    assert "index_missing" in out
    assert "apply never alters a table" in err
    code, _, _ = await ship_sqla_in_process(
        "schema", "check", "--database-url", ship_engine_url, "--only", "outbox"
    )
    assert code == 1


async def test_schema_apply_with_a_schema_and_names(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """`schema apply --schema ops --only jobs --runs-table ...` creates the schema and the named
    tables; the job commands then find them with the same options."""
    names = ("--schema", "ops", "--only", "jobs", "--runs-table", "billing_runs")
    code, out, err = await _apply(ship_engine_url, *names)
    assert (code, err) == (0, ""), err
    assert "created schema ops." in out
    assert "ops.billing_runs" in out
    code, out, err = await ship_sqla_in_process(
        "schema", "check", "--database-url", ship_engine_url, *names
    )
    assert (code, err) == (0, ""), err
    code, out, err = await ship_sqla_in_process(
        "jobs", "stats", "--database-url", ship_engine_url,
        "--schema", "ops", "--runs-table", "billing_runs",
    )  # fmt: skip
    assert (code, out.strip()) == (0, "no runs."), err


async def test_schema_apply_fair_claims_adds_the_tenant_index(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """F2: `schema apply --fair-claims` creates the runs table with ``<runs>_tenant_idx`` (the
    index fair claims read; `schema sql` prints it only with the flag); `schema check` then
    passes with --fair-claims and, without it, reports the index as extra (exit 1)."""
    code, out, err = await ship_sqla_in_process("schema", "sql", "--only", "jobs", "--fair-claims")
    assert code == 0, err
    assert "CREATE INDEX ship_job_runs_tenant_idx ON ship_job_runs" in out
    code, out, err = await ship_sqla_in_process("schema", "sql", "--only", "jobs")
    assert code == 0, err
    assert "ship_job_runs_tenant_idx" not in out

    code, out, err = await _apply(ship_engine_url, "--only", "jobs", "--fair-claims")
    assert (code, err) == (0, ""), err
    async with ship_engine.connect() as connection:
        found = await connection.scalar(
            text("SELECT count(*) FROM pg_indexes WHERE indexname = 'ship_job_runs_tenant_idx'")
        )
    assert found == 1
    check = ("schema", "check", "--database-url", ship_engine_url, "--only", "jobs")
    code, out, err = await ship_sqla_in_process(*check, "--fair-claims")
    assert (code, err) == (0, ""), err
    code, out, _ = await ship_sqla_in_process(*check)
    assert code == 1, out
    assert "index_extra" in out
    assert "ship_job_runs_tenant_idx" in out


def test_ship_table_options_with_metadata_are_bad_input(tmp_path: Path) -> None:
    (tmp_path / "app_meta.py").write_text(
        "from sqlalchemy import MetaData\nmetadata = MetaData()\n"
    )
    result = CliRunner().invoke(
        cli, ["schema", "sql", "--metadata", "app_meta:metadata", "--only", "jobs"],
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert result.exit_code == 2, result.output


async def test_enqueue_by_job_id_then_worker_burst_on_the_readme_example(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """S3, issue 15: the README path. `enqueue` by job id (the job need not be importable)
    stores the stand-in's attempts; `ship-sqla worker examples.worker:registry --burst` runs
    the due runs, logs the failing run's retry with job id, run id, attempt and error (never
    the payload), and exits 0 once nothing is due."""
    url = ("--database-url", ship_engine_url)
    assert (await _apply(ship_engine_url, "--only", "jobs"))[0] == 0
    code, out, err = await ship_sqla(
        "enqueue", "examples.greet", "--payload", '{"name": "Ada"}', *url, "--json",
        cwd=REPOSITORY,
    )  # fmt: skip
    # Issue 27 item 1: nothing on stderr (the connection's return once printed a traceback).
    assert (code, err) == (0, ""), err
    good = json.loads(out)["run_id"]
    code, out, err = await ship_sqla(
        "enqueue", "examples.greet", "--payload", '{"name": ""}', "--max-attempts", "3", *url,
        cwd=REPOSITORY,
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert "3 attempt(s)" in out
    bad = out.split()[2]

    with anyio.fail_after(60):
        code, out, err = await ship_sqla(
            "worker", "examples.worker:registry", *url, "--burst", "--poll-interval", "0.2",
            cwd=REPOSITORY,
        )  # fmt: skip
    assert code == 0, err
    assert f"hello, Ada (run {good}, attempt 1)" in out
    retry = next(line for line in err.splitlines() if "run failed, will retry" in line)
    assert "WARNING ship_sqla.jobs:" in retry
    assert f"job_id=examples.greet run_id={bad} attempt=1/3" in retry
    assert 'error="ValueError: nobody to greet: the payload\'s name is empty"' in retry
    assert "nothing due and nothing in flight (--burst)." in err
    assert "summary runs_per_s=" in err
    async with ship_engine.connect() as connection:
        # J16: the database schema apply built has the history: ended runs moved there.
        rows = (
            await connection.execute(
                text(
                    "SELECT id, state FROM ship_job_runs"
                    " UNION ALL SELECT id, state FROM ship_job_history"
                )
            )
        ).all()
    states = {row.id: row.state for row in rows}
    assert states[good] == "completed"
    # The example's retry has full jitter (0 to 1 s, then 0 to 2 s): usually the retry is due
    # after the burst stopped (waiting), but a short draw can make it due while the burst still
    # checks, and then its attempts run out within it (dead).
    assert states[bad] in {"waiting", "dead"}
    assert set(states) == {good, bad}


async def test_worker_log_format_json(ship_engine: AsyncEngine, ship_engine_url: str) -> None:
    """S3: --log-format json prints one JSON object per line, the run's facts as keys."""
    url = ("--database-url", ship_engine_url)
    assert (await _apply(ship_engine_url, "--only", "jobs"))[0] == 0
    code, _, err = await ship_sqla(
        "enqueue", "examples.greet", "--payload", '{"name": " "}', "--max-attempts", "1", *url,
        cwd=REPOSITORY,
    )  # fmt: skip
    assert code == 0, err
    with anyio.fail_after(60):
        code, _, err = await ship_sqla(
            "worker", "examples.worker:registry", *url, "--burst", "--log-format", "json",
            cwd=REPOSITORY,
        )  # fmt: skip
    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines()]
    [dead] = [line for line in lines if line.get("event") == "dead"]
    assert (dead["level"], dead["logger"], dead["job_id"]) == (
        "error",
        "ship_sqla.jobs",
        "examples.greet",
    )
    assert (dead["attempt"], dead["max_attempts"]) == (1, 1)
    assert dead["error"].startswith("ValueError: nobody to greet")
    assert "traceback" not in dead  # only at -v (debug)


async def test_ctrl_c_drains_and_exits_130(ship_engine: AsyncEngine, ship_engine_url: str) -> None:
    """Issue 15: Ctrl-C (SIGINT) makes the worker drain and exit 130, not 1."""
    assert (await _apply(ship_engine_url, "--only", "jobs"))[0] == 0
    environment = {k: v for k, v in os.environ.items() if k != "SHIP_SQLA_DATABASE_URL"}
    process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, waited on in a thread
        [
            sys.executable, "-m", "ship_sqla", "worker", "examples.worker:registry",
            "--database-url", ship_engine_url,
        ],
        cwd=REPOSITORY, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        # The signal handlers are installed before this line is printed.
        line = await anyio.to_thread.run_sync(process.stderr.readline)
        assert "executing examples.greet" in line, line
        process.send_signal(signal.SIGINT)
        code = await anyio.to_thread.run_sync(process.wait, 30)
        rest = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert code == 130, rest
    assert "stopped." in rest


def test_ctrl_c_in_any_command_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: a KeyboardInterrupt anywhere is exit 130 with one line, not click's 1."""

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("ship_sqla._cli.demo.clean_embedded", interrupted)
    result = CliRunner().invoke(cli, ["demo", "--clean"])
    assert result.exit_code == 130
    assert "interrupted (Ctrl-C)" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["outbox", "purge", *URL, "--outbox-id", "o", "--older-than", "99999999999d"],
         "--older-than must be at most"),
        (["jobs", "events-purge", *URL, "--older-than", "99999999999d"],
         "--older-than must be at most"),
        (["worker", "examples.worker:registry", *URL, "--drain-timeout", "nan"],
         "is not a duration"),
        (["worker", "examples.worker:registry", *URL, "--poll-interval", "inf"],
         "is not a duration"),
        (["worker", "examples.worker:registry", *URL, "--summary-interval", "inf"],
         "is not a duration"),
        (["outbox", "purge", *URL, "--outbox-id", "", "--older-than", "7d"],
         "outbox_id must not be empty"),
        (["jobs", "show", "r1", "--database-url", "mysql://u@h/db"], "needs PostgreSQL"),
        (["jobs", "show", "r1", "--database-url", "foo://x"], "needs PostgreSQL"),
        (["enqueue", "bad id!", *URL], "job id 'bad id!' is not valid"),
        (["enqueue", "a.job", *URL, "--payload", "{nope"], "is not JSON"),
        (["enqueue", "a.job", *URL, "--run-at", "2030-01-01T09:00"], "has no UTC offset"),
        (["enqueue", "a.job", *URL, "--run-at", "soon"], "is not a time"),
        (["enqueue", "a.job", *URL, "--priority", "11"], "not in the range"),
        (["enqueue", "a.job", *URL, "--registry", "examples.worker:registry"],
         "'a.job' is not in that registry"),
        (["enqueue", "examples.greet", *URL, "--registry", "examples.worker:registry",
          "--max-attempts", "2"], "with --registry the job's definition decides"),
        (["worker", "examples.worker", *URL], "like examples.worker:registry"),
        (["worker", "examples.worker:registry", *URL, "--log-level", "loud"],
         "Invalid value for '--log-level'"),
    ],
)  # fmt: skip
def test_input_slips_are_exit_2(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: every input slip it lists (and the new commands' own) is exit 2 with a
    message, before any database work; never a traceback."""
    monkeypatch.chdir(REPOSITORY)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


async def test_enqueue_payload_the_job_refuses_is_exit_2(ship_engine_url: str) -> None:
    """With --registry the job's codec decodes the JSON payload: a refused one is exit 2."""
    assert (await _apply(ship_engine_url, "--only", "jobs"))[0] == 0
    code, _, err = await ship_sqla(
        "enqueue", "examples.greet", "--payload", '{"nom": 1}', "--database-url",
        ship_engine_url, "--registry", "examples.worker:registry", cwd=REPOSITORY,
    )  # fmt: skip
    assert code == 2, err
    assert "Invalid value for --payload: job examples.greet refuses the payload:" in err
    assert "SHIP_SQLA_JOB_PAYLOAD_INVALID: payload does not fit Greeting" in err
    # A payload that fits the job's type is decoded into it and enqueued.
    code, out, err = await ship_sqla(
        "enqueue", "examples.greet", "--payload", '{"name": "Ada"}', "--database-url",
        ship_engine_url, "--registry", "examples.worker:registry", cwd=REPOSITORY,
    )  # fmt: skip
    assert code == 0, err
    assert "5 attempt(s)" in out


def test_demo_help_is_true_to_the_code() -> None:
    """Issue 15: `demo --help` names the order the demo follows (no local probe) and --clean."""
    result = CliRunner().invoke(cli, ["demo", "--help"])
    assert result.exit_code == 0
    output = " ".join(result.output.split())
    assert "SHIP_SQLA_DATABASE_URL when set, else the embedded one" in output
    assert "a local server is not probed" in output
    assert "--clean" in output
    assert "A generic DATABASE_URL is not read." in output


def test_demo_clean_removes_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: `demo --clean` removes the embedded server's data directory (a directory
    without a server in it here) and says so; run again, it says there is nothing."""
    cache = tmp_path / "embedded"
    (cache / "base").mkdir(parents=True)
    (cache / "base" / "file").write_bytes(b"x" * 1000)
    monkeypatch.setattr("ship_sqla._server.DEFAULT_EMBEDDED_DIR", cache)
    monkeypatch.setattr("ship_sqla._server.ROOT_EMBEDDED_DIR", cache)
    monkeypatch.setattr("ship_sqla._server._runtime_dir", lambda: tmp_path / "runtime")
    result = CliRunner().invoke(cli, ["demo", "--clean"])
    assert result.exit_code == 0, result.output
    assert f"removed the embedded server's data {cache}" in result.output
    assert not cache.exists()
    result = CliRunner().invoke(cli, ["demo", "--clean"])
    assert result.exit_code == 0
    assert f"nothing to remove: {cache} does not exist." in result.output


def test_as_root_the_embedded_server_says_what_it_changes(tmp_path: Path) -> None:
    """Issue 15: as root, pgserver's changes outside its own directory (a system user, wider
    permissions of parent directories) are listed before they happen, each with its undo."""
    from ship_sqla._server import _root_notice  # noqa: PLC0415 - the unit under test

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    data = private / "data"
    data.mkdir()
    notice = _root_notice(data, tmp_path)
    assert notice is not None
    assert f"add g+rx,o+rx to {private} (now drwx------); undo: chmod go-rx {private}" in notice
    assert "undo: ship-sqla demo --clean" in notice


def test_a_generic_database_url_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: DATABASE_URL is not picked up silently (only SHIP_SQLA_DATABASE_URL is)."""
    monkeypatch.delenv("SHIP_SQLA_DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://app@127.0.0.1:1/production")
    result = CliRunner().invoke(cli, ["jobs", "stats"])
    assert result.exit_code == 2
    assert "Missing option '--database-url'" in result.output


async def test_enqueue_partition_key_stores_the_runs_key(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """F8/F9: `enqueue --partition-key KEY` stores the run's partition key (the stand-in is a
    job whose limits are per key, so the enqueue accepts it); a blank key is exit 2; through
    --registry a job whose limits are not per key refuses it."""
    assert (await _apply(ship_engine_url, "--only", "jobs", "--partition-keys"))[0] == 0
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla(
        "enqueue", "reports.build", "--partition-key", "customer-7", *url, "--json",
        cwd=REPOSITORY,
    )  # fmt: skip
    assert code == 0, err
    run_id = json.loads(out)["run_id"]
    async with ship_engine.connect() as connection:
        key = await connection.scalar(
            text("SELECT partition_key FROM ship_job_runs WHERE id = :id"), {"id": run_id}
        )
    assert key == "customer-7"
    code, _, err = await ship_sqla(
        "enqueue", "reports.build", "--partition-key", "", *url, cwd=REPOSITORY
    )
    assert code == 2, err
    code, _, err = await ship_sqla(
        "enqueue", "examples.greet", "--payload", '{"name": "Ada"}', "--partition-key", "k",
        *url, "--registry", "examples.worker:registry", cwd=REPOSITORY,
    )  # fmt: skip
    assert code != 0
    assert "partition='key'" in err
