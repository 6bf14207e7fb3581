"""Issue 27, item 4, at the shell: ``ship-sqla worker APP:REGISTRY --lifespan APP:LIFESPAN``
gives the handlers the application's resources (``ctx.resources``), entered before the first
claim and exited after the drain; a lifespan that raises refuses the start."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import define_job
from ship_sqla._cli._tables import job_tables
from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._backend import PostgresJobBackend

APP = textwrap.dedent(
    """
    import contextlib
    import os

    from ship_sqla import JobContext
    from ship_sqla.jobs import JobRegistry

    LOG = os.environ["LIFESPAN_LOG"]


    def note(line):
        with open(LOG, "a") as log:
            log.write(line + "\\n")


    @contextlib.asynccontextmanager
    async def lifespan():
        note("enter")
        try:
            yield {"greeting": "hello from the lifespan"}
        finally:
            note("exit")


    @contextlib.asynccontextmanager
    async def broken():
        raise OSError("the cache is down")
        yield


    not_callable = 42

    registry = JobRegistry()


    @registry.job("life.echo", payload=dict)
    async def echo(ctx: JobContext[dict[str, str]], payload):
        note(f"run {payload['n']}: {ctx.resources['greeting']}")
    """
)


async def _noop(ctx: Any, payload: Any) -> None:
    return None


ECHO = define_job("life.echo", _noop, payload=dict)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "life_app.py").write_text(APP)
    return tmp_path


@pytest.fixture
async def backend(ship_engine: AsyncEngine) -> PostgresJobBackend:
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_backend(database=ship_engine, listen=False)


async def _worker(app_dir: Path, url: str, *options: str) -> tuple[int, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(app_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    environment["LIFESPAN_LOG"] = str(app_dir / "lifespan.log")
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [
                sys.executable, "-m", "ship_sqla", "worker", "life_app:registry",
                "--database-url", url, "--burst", "--poll-interval", "0.2", *options,
            ],
            cwd=app_dir, env=environment, check=False,
        )  # fmt: skip
    return result.returncode, result.stderr.decode()


async def test_friction_4_the_cli_worker_enters_the_lifespan_around_its_runs(
    app_dir: Path, backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """Issue 27 item 4: `ship-sqla worker --lifespan` enters the lifespan once, before the
    first run, hands its value to the handlers and exits it after the drain."""
    for n in (1, 2):
        await backend.enqueue(ECHO, {"n": n})
    code, err = await _worker(app_dir, ship_engine_url, "--lifespan", "life_app:lifespan")
    assert code == 0, err
    lines = (app_dir / "lifespan.log").read_text().splitlines()
    assert lines[0] == "enter"
    assert lines[-1] == "exit"
    assert sorted(lines[1:-1]) == [
        "run 1: hello from the lifespan",
        "run 2: hello from the lifespan",
    ]


async def test_friction_4_a_failing_or_wrong_lifespan_refuses_the_cli_worker(
    app_dir: Path, backend: PostgresJobBackend, ship_engine_url: str
) -> None:
    """Issue 27 item 4: a lifespan that raises refuses the start (SHIP_SQLA_LIFESPAN_FAILED,
    nothing run); a --lifespan that is not callable is bad input; both exit 2 with no
    traceback."""
    await backend.enqueue(ECHO, {"n": 1})
    code, err = await _worker(app_dir, ship_engine_url, "--lifespan", "life_app:broken")
    assert code == 2, err
    assert "SHIP_SQLA_LIFESPAN_FAILED" in err
    assert "OSError: the cache is down" in err
    assert "Traceback" not in err
    assert not (app_dir / "lifespan.log").exists()

    code, err = await _worker(app_dir, ship_engine_url, "--lifespan", "life_app:not_callable")
    assert code == 2, err
    assert "not a lifespan" in err


async def test_j24_the_cli_worker_takes_synchronous_claims(
    app_dir: Path, backend: PostgresJobBackend, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """J24: `ship-sqla worker --synchronous-claims` builds its backend with synchronous claims
    (committed with the server's synchronous_commit, so no acknowledged claim is lost in a
    failover under synchronous replication) and executes the runs as without it."""
    assert (await job_tables().backend(ship_engine, synchronous_claims=True)).synchronous_claims
    assert not (await job_tables().backend(ship_engine)).synchronous_claims
    for n in (1, 2):
        await backend.enqueue(ECHO, {"n": n})
    code, err = await _worker(
        app_dir, ship_engine_url, "--lifespan", "life_app:lifespan", "--synchronous-claims"
    )
    assert code == 0, err
    lines = (app_dir / "lifespan.log").read_text().splitlines()
    assert sorted(lines[1:-1]) == [
        "run 1: hello from the lifespan",
        "run 2: hello from the lifespan",
    ]
