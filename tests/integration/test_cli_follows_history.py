"""J16: the CLI follows the database's shape. On a database `ship-sqla schema apply` built (the
history table included, the steps table without a key to the runs), a CLI worker moves ended
runs into history and keeps a finished workflow's steps, and the commands' reads span both
tables; on a database without the history they keep the in-place shape.

Real processes and a real server: the worker is ``ship-sqla worker --burst``.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import anyio
from sqlalchemy import MetaData, text

from ship_sqla import create_job_backend, define_job, ship_job_runs_table, ship_job_state_table
from ship_sqla.jobs import RetryPolicy

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

APP = textwrap.dedent(
    """
    from ship_sqla.jobs import JobRegistry, RetryPolicy

    registry = JobRegistry()


    @registry.job("h16.done", payload=dict)
    async def done(ctx, payload):
        return None


    @registry.job("h16.fail", payload=dict, retry=RetryPolicy(attempts=1))
    async def fail(ctx, payload):
        raise RuntimeError("h16 boom")


    @registry.job("h16.flow", payload=dict)
    async def flow(ctx, payload):
        async def body():
            return "A"

        await ctx.step("a", body)
    """
)


async def _noop(ctx: Any, payload: Any) -> None:
    return None


DONE = define_job("h16.done", _noop, payload=dict)
FAIL = define_job("h16.fail", _noop, payload=dict, retry=RetryPolicy(attempts=1))
FLOW = define_job("h16.flow", _noop, payload=dict)


async def _ship(*args: str, cwd: Path, url: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    env["SHIP_SQLA_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), *filter(None, [env.get("PYTHONPATH")])])
    result = await anyio.run_process(
        [sys.executable, "-m", "ship_sqla", *args], cwd=cwd, env=env, check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def _count(engine: AsyncEngine, sql: str) -> int:
    async with engine.connect() as connection:
        return int((await connection.execute(text(sql))).scalar_one())


async def test_j16_a_cli_worker_on_a_schema_apply_database_moves_runs_and_reads_both(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J16, J5, D5: after `schema apply`, `create_job_backend(database=engine)` (no tables: the
    tables schema apply creates) enqueues, and `ship-sqla worker --burst` runs a completing
    run, a failing one (dead) and a one-step workflow: the runs table is left empty (each ended
    run moved, in its fenced settle, into history), the workflow's step is still stored (no
    cascade), and the reads that span both tables find them: `jobs show` (get-run, with the
    steps), `jobs dead` (the dead-letter page), `jobs stats` (counts). Each of those fails if
    it reads the runs table only (the runs are not there)."""
    (tmp_path / "h16_app.py").write_text(APP, encoding="utf-8")
    code, _, err = await _ship("schema", "apply", cwd=tmp_path, url=ship_engine_url)
    assert (code, err) == (0, ""), err
    backend = create_job_backend(database=ship_engine, listen=False)
    assert backend.history
    ids = {}
    for job in (DONE, FAIL, FLOW):
        result = await backend.enqueue(job, {})
        assert result.run_id is not None
        ids[job.id] = result.run_id

    code, _, err = await _ship(
        "worker", "h16_app:registry", "--burst", "--poll-interval", "0.2",
        cwd=tmp_path, url=ship_engine_url,
    )  # fmt: skip
    assert code == 0, err
    assert "keeps finished runs" not in err  # J16: no in-place warning on the default shape
    assert await _count(ship_engine, "SELECT count(*) FROM ship_job_runs") == 0
    assert await _count(ship_engine, "SELECT count(*) FROM ship_job_history") == 3
    flow_steps = f"SELECT count(*) FROM ship_job_steps WHERE run_id = '{ids['h16.flow']}'"
    assert await _count(ship_engine, flow_steps) == 1

    code, out, err = await _ship("jobs", "show", ids["h16.flow"], "--json", cwd=tmp_path,
                                 url=ship_engine_url)  # fmt: skip
    assert (code, err) == (0, ""), err
    shown = json.loads(out)
    assert shown["state"] == "completed"
    assert [(s["name"], s["result"]) for s in shown["steps"]] == [("a", "A")]
    code, out, err = await _ship("jobs", "show", ids["h16.done"], cwd=tmp_path,
                                 url=ship_engine_url)  # fmt: skip
    assert (code, err) == (0, ""), err
    assert "state:            completed" in out

    code, out, err = await _ship("jobs", "dead", "--json", cwd=tmp_path, url=ship_engine_url)
    assert (code, err) == (0, ""), err
    assert [r["run_id"] for r in json.loads(out)["runs"]] == [ids["h16.fail"]]

    code, out, err = await _ship("jobs", "stats", "--json", cwd=tmp_path, url=ship_engine_url)
    assert (code, err) == (0, ""), err
    by_job = {j["job_id"]: j for j in json.loads(out)["jobs"]}
    assert (by_job["h16.done"]["completed"], by_job["h16.fail"]["dead"]) == (1, 1)
    assert by_job["h16.flow"]["completed"] == 1


async def test_j16_a_cli_worker_without_the_history_ends_runs_in_place(
    ship_engine: AsyncEngine, ship_engine_url: str, tmp_path: Path
) -> None:
    """J16: on a database built before the history (runs and state tables only), the CLI's
    backend keeps the in-place shape: a CLI worker ends runs in the runs table (no history
    table is needed, none is asked for) and `jobs show` reads it there."""
    (tmp_path / "h16_app.py").write_text(APP, encoding="utf-8")
    metadata = MetaData()
    runs = ship_job_runs_table(metadata)
    state = ship_job_state_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(database=ship_engine, table=runs, state_table=state)
    assert not backend.history
    result = await backend.enqueue(DONE, {})
    assert result.run_id is not None

    code, _, err = await _ship(
        "worker", "h16_app:registry", "--burst", "--poll-interval", "0.2",
        cwd=tmp_path, url=ship_engine_url,
    )  # fmt: skip
    assert code == 0, err
    done = "SELECT count(*) FROM ship_job_runs WHERE state = 'completed'"
    assert await _count(ship_engine, done) == 1
    code, out, err = await _ship("jobs", "show", result.run_id, cwd=tmp_path, url=ship_engine_url)
    assert (code, err) == (0, ""), err
    assert "state:            completed" in out
