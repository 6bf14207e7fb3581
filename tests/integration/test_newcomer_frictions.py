"""Issue 27, the newcomer's frictions 1, 2, 3, 6, 8, 9, 10 and 11: each test is named after its
item and failed before its fix. The command line is driven as a user would (``python -m ship_sqla``
in a subprocess); a command that succeeds writes nothing to stderr."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from job_helpers import claim_request
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

import ship_sqla
from ship_sqla import create_engine, create_job_backend, create_unit_of_work, define_job
from ship_sqla._demo import _describe
from ship_sqla._server import (
    DEFAULT_EMBEDDED_DIR,
    ROOT_EMBEDDED_DIR,
    ResolvedServer,
    embedded_dir,
    resolve_server,
)
from ship_sqla.errors import ConfigurationError, TerminalError
from ship_sqla.jobs import Fairness, JobRegistry, RateLimit, RetryPolicy
from ship_sqla.kernel import WorkerEntry, failed
from ship_sqla.kernel._runtime.state import describe_failure


def _plain(url: str) -> str:
    """The URL as the CLI and the README write it: ``postgresql://`` (no driver)."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


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


async def ship(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m ship_sqla ARGS`` in ``cwd`` (importable), as a user would run it."""
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args],
        cwd=cwd,
        env=_environment(cwd, env),
        check=False,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def _count(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as connection:
        return await connection.scalar(text(sql))


# --- 2: one URL -----------------------------------------------------------------------------------

HANDLER_WITH_ITS_OWN_ENGINE = textwrap.dedent(
    """
    import os

    from sqlalchemy import text

    import ship_sqla
    from ship_sqla.jobs import JobRegistry

    registry = JobRegistry()
    # The handler's engine, from the variable the worker itself reads: no converter.
    engine = ship_sqla.create_engine(os.environ["SHIP_SQLA_DATABASE_URL"])


    @registry.job("friction.record", payload=dict)
    async def record(ctx, payload):
        async with engine.begin() as connection:
            await connection.execute(
                text("INSERT INTO handled (note) VALUES (:note)"), {"note": payload["note"]}
            )
    """
)


async def test_friction_2_one_url_for_every_entry_point(
    tmp_path: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """Issue 27 item 2: ``postgresql://`` and ``postgresql+asyncpg://`` mean the same database
    at every entry point: ``create_engine``, ``create_unit_of_work`` (given the URL), the
    testing plugin's server, the dashboard's backend, and ``ship-sqla worker`` whose handler
    builds its engine from the worker's own ``SHIP_SQLA_DATABASE_URL``."""
    plain, driven = _plain(ship_engine_url), ship_engine_url
    assert plain.startswith("postgresql://")
    for url in (plain, driven, plain.replace("postgresql://", "postgres://", 1)):
        engine = create_engine(url)
        try:
            assert await _count(engine, "SELECT 1") == 1
            assert engine.url.drivername == "postgresql+asyncpg"
        finally:
            await engine.dispose()

    for url in (plain, driven):
        uow = create_unit_of_work(url, repositories=lambda scope: scope)
        try:
            assert await uow.run(lambda scope: scope.connection.scalar(text("SELECT 2"))) == 2
        finally:
            assert isinstance(uow.bind, AsyncEngine)
            await uow.bind.dispose()

    with pytest.raises(ConfigurationError, match="needs PostgreSQL"):
        create_engine("mysql://u@h/d")
    with pytest.raises(ConfigurationError, match="is not a database URL"):
        create_engine("::nonsense::")

    for url in (plain, driven):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SHIP_SQLA_DATABASE_URL", url)
            assert resolve_server().url.drivername == "postgresql+asyncpg"

    pytest.importorskip("starlette")
    engine = create_engine(plain)
    try:
        dashboard = ship_sqla.create_dashboard(
            create_job_backend(database=engine), authorizer=lambda *_: True, audit=None
        )
        assert dashboard is not None
    finally:
        await engine.dispose()

    async with ship_engine.begin() as connection:
        await connection.execute(text("CREATE TABLE handled (note text NOT NULL)"))
    (tmp_path / "friction_app.py").write_text(HANDLER_WITH_ITS_OWN_ENGINE)
    env = {"SHIP_SQLA_DATABASE_URL": plain}
    code, _, err = await ship("schema", "apply", "--only", "jobs", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    code, _, err = await ship(
        "enqueue", "friction.record", "--payload", '{"note": "hi"}', cwd=tmp_path, env=env
    )
    assert (code, err) == (0, ""), err
    with anyio.fail_after(60):
        code, _, err = await ship(
            "worker", "friction_app:registry", "--burst", "--poll-interval", "0.2",
            "--log-level", "error", cwd=tmp_path, env=env,
        )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert await _count(ship_engine, "SELECT note FROM handled") == "hi"


# --- 6: a second Ctrl-C during the drain ----------------------------------------------------------

SLOW_APP = textwrap.dedent(
    """
    import anyio

    from ship_sqla.jobs import Concurrency, JobRegistry, RetryPolicy

    registry = JobRegistry()


    @registry.job(
        "friction.slow",
        payload=dict,
        concurrency=Concurrency(max=2, lease=30),
        retry=RetryPolicy(attempts=3),
    )
    async def slow(ctx, payload):
        await anyio.sleep(3600)  # only a cancellation ends it
    """
)


async def _wait_until(predicate: Any) -> None:
    """Poll another process's effect (a row, a log line): there is no event to wait on."""
    with anyio.fail_after(30):
        while True:
            if await predicate():
                return
            await anyio.sleep(0.05)  # another process changes it: nothing to wait on


async def test_friction_6_a_second_ctrl_c_cancels_the_drain_at_once(
    tmp_path: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """Issue 27 item 6, J12: the first Ctrl-C starts the drain (here a day long); a second one
    cancels the run in flight at once, as uvicorn, Celery and Sidekiq read it: the worker exits
    130 within seconds, the run waits again with no attempt lost and says it was cancelled."""
    (tmp_path / "friction_slow.py").write_text(SLOW_APP)
    env = {"SHIP_SQLA_DATABASE_URL": _plain(ship_engine_url)}
    code, _, err = await ship("schema", "apply", "--only", "jobs", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    code, out, err = await ship("enqueue", "friction.slow", "--json", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    run_id = json.loads(out)["run_id"]
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, waited on in a thread
            [
                sys.executable, "-m", "ship_sqla", "worker", "friction_slow:registry",
                "--poll-interval", "0.2", "--drain-timeout", "1d",
            ],
            cwd=tmp_path, env=_environment(tmp_path, env), stdout=subprocess.DEVNULL,
            stderr=stderr,
        )  # fmt: skip
    try:

        async def running() -> bool:
            sql = f"SELECT state = 'running' FROM ship_job_runs WHERE id = '{run_id}'"
            return bool(await _count(ship_engine, sql))

        async def draining() -> bool:
            return "stopping: draining for up to 86400s" in log.read_text()

        await _wait_until(running)
        process.send_signal(signal.SIGINT)
        await _wait_until(draining)
        process.send_signal(signal.SIGINT)
        code = await anyio.to_thread.run_sync(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 130, output
    assert "second signal: cancelling the 1 run(s) in flight now" in output
    async with ship_engine.connect() as connection:
        row = (
            await connection.execute(
                text("SELECT state, attempt, history FROM ship_job_runs WHERE id = :id"),
                {"id": run_id},
            )
        ).one()
    assert (row.state, row.attempt) == ("waiting", 0)
    assert "drain" in row.history[0]["error"]


# --- 9: schema apply, then schema check --metadata ------------------------------------------------

APP_METADATA = textwrap.dedent(
    """
    from sqlalchemy import Column, Integer, MetaData, Table

    from ship_sqla import (
        ship_idempotency_table,
        ship_job_runs_table,
        ship_job_state_table,
        ship_job_workers_table,
        ship_outbox_table,
    )

    metadata = MetaData()
    orders = Table("orders", metadata, Column("id", Integer, primary_key=True))
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    ship_job_workers_table(metadata)
    ship_outbox_table(metadata)
    ship_idempotency_table(metadata)
    """
)


async def test_friction_9_schema_check_after_apply_leaves_out_undeclared_ship_tables(
    tmp_path: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """Issue 27 item 9, T3: the README's order, `schema apply` (every ship table, the job
    definitions of E6 included) then `schema check --metadata app:metadata` (five of them and
    one of the app's), passes: the eleven ship tables the metadata does not declare are left out
    and named; a table that is
    neither the app's nor a ship table is still extra; --extra-ship-tables reports them all."""
    (tmp_path / "friction_meta.py").write_text(APP_METADATA)
    env = {"SHIP_SQLA_DATABASE_URL": _plain(ship_engine_url)}
    code, _, err = await ship("schema", "apply", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    async with ship_engine.begin() as connection:
        await connection.execute(text("CREATE TABLE orders (id serial PRIMARY KEY)"))
    check = ("schema", "check", "--metadata", "friction_meta:metadata")
    code, out, err = await ship(*check, cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), out + err
    lines = out.splitlines()
    assert lines[0] == "schema check: OK, 6 table(s) match the metadata."
    assert lines[1].startswith("left out: 11 ship table(s) in the database that the metadata")
    for name in (
        "ship_job_stats",
        "ship_job_steps",
        "ship_job_events",
        "ship_webhook_events",
        "ship_audit",
        "ship_webhook_endpoints",
        "ship_webhook_deliveries",
        "ship_job_definitions",
    ):
        assert name in lines[1]

    code, out, err = await ship(*check, "--json", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    assert len(json.loads(out)["ship_tables_left_out"]) == 11

    async with ship_engine.begin() as connection:
        await connection.execute(text("CREATE TABLE stray (id integer)"))
    code, out, _ = await ship(*check, cwd=tmp_path, env=env)
    assert code == 1, out
    assert [line.split()[0] for line in out.splitlines() if "table_extra" in line] == ["stray"]
    code, out, _ = await ship(*check, "--extra-ship-tables", cwd=tmp_path, env=env)
    assert code == 1, out
    assert sum("table_extra" in line for line in out.splitlines()) == 12


# --- 8: a job no live worker serves ---------------------------------------------------------------


async def test_friction_8_a_job_no_live_worker_serves_is_named(
    tmp_path: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """Issue 27 item 8, F6: with a worker live for friction.record, `enqueue friction.recrod`
    (a typo, no --registry) still enqueues (exit 0) but warns on stderr that no live worker
    serves it and suggests the served id; the right id enqueues silently; `jobs stats` and the
    dashboard's overview count each job's live workers (0 / 'none' for the typo). Without the
    workers table nothing can be told and nothing is said."""
    env = {"SHIP_SQLA_DATABASE_URL": _plain(ship_engine_url)}
    code, _, err = await ship("schema", "apply", "--only", "jobs", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    backend = create_job_backend(database=ship_engine)
    now = datetime.now(UTC)
    live = WorkerEntry("w-live", "host", 1, now, ("friction.record",), 0, draining=False)
    leaving = WorkerEntry("w-drain", "host", 2, now, ("friction.recrod",), 0, draining=True)
    for entry in (live, leaving):
        await backend.workers.heartbeat(entry)

    code, out, err = await ship("enqueue", "friction.recrod", "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    assert json.loads(out)["run_id"] is not None
    assert json.loads(out)["live_workers_serving"] == 0
    assert err.startswith("warning: no live worker serves job 'friction.recrod': the 1 live")
    assert "worker(s) serve friction.record." in err
    assert "Did you mean 'friction.record'?" in err
    code, out, err = await ship("enqueue", "friction.record", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err

    code, out, err = await ship("jobs", "stats", "--json", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    served = {j["job_id"]: j["live_workers"] for j in json.loads(out)["jobs"]}
    assert served == {"friction.recrod": 0, "friction.record": 1}
    code, out, err = await ship("jobs", "stats", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    header, *rows = out.splitlines()
    assert header.split()[-1] == "WORKERS"
    assert {row.split()[0]: row.split()[-1] for row in rows} == {
        "friction.recrod": "0",
        "friction.record": "1",
    }

    httpx = pytest.importorskip("httpx")
    dashboard = ship_sqla.create_dashboard(backend, authorizer=lambda *_: True, audit=None)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        page = (await client.get("/")).text
    recrod = page[page.index(">friction.recrod<") :].split("</tr>")[0]
    assert 'title="no live worker serves this job">none</span>' in recrod
    record = page[page.index(">friction.record<") :].split("</tr>")[0]
    assert "<td>1</td>" in record

    async with ship_engine.begin() as connection:
        await connection.execute(text("DROP TABLE ship_job_workers"))
    code, out, err = await ship("enqueue", "friction.recrod", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    code, out, err = await ship("jobs", "stats", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    assert all(row.split()[-1] == "-" for row in out.splitlines()[1:])


# --- 10: registry.job's options, error texts ------------------------------------------------------


async def _noop(ctx: Any, payload: Any) -> None:
    return None


def test_friction_10_registry_job_takes_every_define_job_option() -> None:
    """Issue 27 item 10: ``@registry.job`` takes every keyword ``define_job`` takes (timeout,
    priority, rate_limit, fairness, max_payload_bytes...), with the same defaults, and passes
    them on."""
    wrapper = inspect.signature(JobRegistry.job).parameters
    defined = inspect.signature(define_job).parameters
    for name, parameter in defined.items():
        if name in {"id", "handler"}:
            continue
        assert name in wrapper, f"registry.job lacks {name}="
        assert wrapper[name].default == parameter.default, name
    registry = JobRegistry()
    options: dict[str, Any] = {
        "timeout": 5,
        "priority": 3,
        "rate_limit": RateLimit(limit=10, period=60),
        "fairness": Fairness(),
        "max_payload_bytes": 100,
    }
    decorated = registry.job("friction.options", payload=dict, **options)(_noop)
    direct = define_job("friction.options", _noop, payload=dict, **options)
    for name in ("timeout", "priority", "rate_limit", "fairness", "max_payload_bytes"):
        assert getattr(decorated, name) == getattr(direct, name), name
    assert registry.get("friction.options") is decorated


async def test_friction_10_error_texts_name_public_paths_and_keep_tracebacks_readable(
    tmp_path: Path, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """Issue 27 item 10: a run a handler ended with TerminalError records the error under its
    public path (``ship_sqla.errors.TerminalError``); the dashboard's dead-letter list shows
    its first line only (no cut-off 'Traceback (most recent call'); `ship-sqla jobs show`
    indents the traceback under its field and history entry."""
    env = {"SHIP_SQLA_DATABASE_URL": _plain(ship_engine_url)}
    code, _, err = await ship("schema", "apply", "--only", "jobs", cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    job = define_job("friction.card", _noop, payload=dict, retry=RetryPolicy(attempts=3))
    backend = create_job_backend(database=ship_engine)
    await backend.enqueue(job, {"card": "4242"})
    [run] = await backend.claim(claim_request(job, worker="test", limit=1))
    try:
        raise TerminalError("card declined")  # noqa: TRY301 - a real traceback to record
    except TerminalError as exc:
        error = describe_failure(exc)
    assert error.startswith("ship_sqla.errors.TerminalError: SHIP_SQLA_JOB_TERMINAL: card")
    assert "ship_sqla.kernel._outcomes" not in error
    assert "Traceback (most recent call last):" in error
    assert await backend.settle([failed(run, error, retry_at=None)]) == ["dead"]

    httpx = pytest.importorskip("httpx")
    dashboard = ship_sqla.create_dashboard(backend, authorizer=lambda *_: True, audit=None)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        page = (await client.get("/dead")).text
    row = page[page.index(run.run_id) :].split("</tr>")[0]
    assert "SHIP_SQLA_JOB_TERMINAL: card declined</span>" in row
    assert "Traceback" not in row

    code, out, err = await ship("jobs", "show", run.run_id, cwd=tmp_path, env=env)
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    field = lines.index(next(line for line in lines if line.startswith("last_error:")))
    assert lines[field + 1] == " " * 18 + "Traceback (most recent call last):"
    history = lines.index("history (1):")
    assert lines[history + 1].startswith("  attempt 1 [failure] at ")
    assert lines[history + 2] == "    Traceback (most recent call last):"
    fields = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    assert fields[-2:] == ["payload", "history (1)"]
    assert "File" not in "".join(fields)


# --- 11: the README's first steps -----------------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(title)
    return text[start : text.index("\n#", start + len(title))]


async def test_friction_11_the_readme_quickstart_runs_twice(
    tmp_path: Path, ship_engine_url: str
) -> None:
    """Issue 27 item 11: the README's quickstart, run as written with the one
    ``postgresql://`` variable, succeeds at a second run too (no IntegrityError on
    orders_pkey), one order more each time."""
    section = _readme_section("## Quickstart")
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "quickstart.py").write_text(code)
    environment = _environment(tmp_path, {"SHIP_SQLA_DATABASE_URL": _plain(ship_engine_url)})
    outputs = []
    for _ in range(2):
        result = await anyio.run_process(
            [sys.executable, "quickstart.py"], cwd=tmp_path, env=environment, check=False
        )
        assert (result.returncode, result.stderr.decode()) == (0, ""), result.stderr.decode()
        outputs.append(result.stdout.decode().strip())
    assert outputs[0] == "(OrderSummary(id=1, total=Decimal('12.50')),)"
    assert outputs[1].count("OrderSummary(") == 2


def test_friction_11_the_readme_worker_section_and_embedded_server_are_true() -> None:
    """Issue 27 item 11: the worker section activates the virtualenv before its first bare
    `ship-sqla`, and points the URL at a database of its own, not the `postgres` maintenance
    database; the README names the embedded server's two real locations, and the demo says
    which one it uses and its size."""
    section = _readme_section("### A worker, from the shell")
    commands = section.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    first_ship = next(i for i, line in enumerate(commands) if line.startswith("ship-sqla "))
    assert any(". .venv/bin/activate" in line for line in commands[:first_ship])
    [url_line] = [line for line in commands if "SHIP_SQLA_DATABASE_URL=" in line]
    assert not url_line.rstrip().endswith("/postgres")
    database = url_line.rstrip().rsplit("/", 1)[1]
    assert any(line.startswith("createdb ") and database in line for line in commands)

    text = " ".join(README.read_text().split())
    assert Path.home() / ".cache" / "ship_sqla" / "embedded" == DEFAULT_EMBEDDED_DIR
    assert "`~/.cache/ship_sqla/embedded`" in text
    assert f"`{ROOT_EMBEDDED_DIR.name}` under the temporary directory" in text
    assert ROOT_EMBEDDED_DIR.parent == Path(tempfile.gettempdir())
    said = _describe(
        ResolvedServer(url=make_url("postgresql+asyncpg://p@h/postgres"), source="embedded")
    )
    assert f"its data in {embedded_dir()} (" in said
    assert " MB, kept for the next run; `ship-sqla demo --clean` removes it)" in said


# --- 1: no traceback after a plain enqueue; 3: sync handlers --------------------------------------


async def test_friction_1_enqueue_prints_no_traceback(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """Issue 27 item 1 (and issue 33 part 1): `ship-sqla enqueue` stored its run and exited 0,
    but printed `Exception closing connection ... MissingGreenlet` on stderr: its engine's
    NullPool closed the direct path's connection outside SQLAlchemy's greenlet. Now stderr is
    empty, and the same enqueue from Python on a NullPool engine, then `dispose()`, logs
    nothing (every pool shape: tests/integration/test_pool_return.py)."""
    url = _plain(ship_engine_url)
    code, _, err = await ship(
        "schema", "apply", "--only", "jobs", "--database-url", url, cwd=tmp_path
    )
    assert code == 0, err
    for _ in range(2):
        code, out, err = await ship(
            "enqueue", "friction.one", "--payload", "{}", "--database-url", url, cwd=tmp_path
        )
        assert (code, err) == (0, ""), err
        assert "enqueued" in out
    assert await _count(ship_engine, "SELECT count(*) FROM ship_job_runs") == 2


def test_friction_3_a_sync_handler_is_refused_at_definition() -> None:
    """Issue 27 item 3: a sync handler was accepted, ran its body at every attempt and then failed
    each with `TypeError: object NoneType can't be used in 'await' expression`. It is refused
    when the job is defined (by `define_job` and by `@registry.job`), the fix naming `async def`
    (tests/unit/test_sync_handler_refused.py holds the details)."""

    def handler(ctx: Any, payload: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match="async def"):
        define_job("friction.three", handler, payload=dict)
    registry = JobRegistry()
    with pytest.raises(ConfigurationError, match="async def"):
        registry.job("friction.three.registry", payload=dict)(handler)


async def test_friction_11_the_readme_worker_section_runs_as_written(tmp_path: Path) -> None:
    """Issue 27 (must show): the README's worker section, pasted into a shell as written from
    the repository root, works with nothing else set up and prints no traceback. Two changes
    only, so a test can run it: its database gets a name of this test's own (dropped after),
    and the worker gets `--burst` (it exits once nothing is due, where a user presses Ctrl-C)."""
    repository = README.parent
    if not (repository / ".venv" / "bin" / "activate").exists():
        pytest.skip("the README's section activates .venv at the repository root; none here")
    section = _readme_section("### A worker, from the shell")
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    database = f"ship_worker_readme_{os.getpid()}"
    script = script.replace("ship_worker_demo", database).replace(
        "ship-sqla worker examples.worker:registry",
        "ship-sqla worker examples.worker:registry --burst",
    )
    assert "--burst" in script
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    try:
        result = await anyio.run_process(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=repository,
            env=environment,
            check=False,
        )
    finally:
        await anyio.run_process(
            ["dropdb", "--if-exists", "--force", "-h", "127.0.0.1", "-U", "postgres", database],
            check=False,
        )
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, err
    assert "Traceback" not in out + err
    assert "hello, Ada" in out
