"""``ship-sqla jobs errors`` (issue 36, item 6) against real PostgreSQL: the dead runs grouped
by job, exception type and normalised message, as text with each group's ``retry-matching``
arguments, and as JSON with the read's bound (S2)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
from click.testing import CliRunner
from dashboard_support import MAIL, REPORT, dashboard_tables
from job_helpers import claim_request

from ship_sqla import create_job_backend
from ship_sqla._cli import cli
from ship_sqla.kernel import failed

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


async def _fail(backend: Any, job: Any, error: str, count: int) -> None:
    for i in range(count):
        await backend.enqueue(job, {"i": i})
    claimed = await backend.claim(claim_request(job, worker="w", limit=count))
    settled = await backend.settle(
        [failed(run, error.format(n=i + 40), retry_at=None) for i, run in enumerate(claimed)]
    )
    assert set(settled) == {"dead"}


async def test_s2_jobs_errors_groups_dead_runs_with_their_retry_filter(
    ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """S2: three ``ConnectionError: port N refused`` dead runs of dash.mail are one group,
    listed first with the ``retry-matching`` filter that takes them; dash.report's own group is
    apart; ``--job`` keeps one job's groups; ``--json`` says every dead run was read."""
    metadata, runs, state, workers, _ = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    await _fail(backend, MAIL, "ConnectionError: port {n} refused", 3)
    await _fail(backend, REPORT, "ValueError: row {n}", 1)

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["jobs", "errors", "--database-url", ship_engine_url, *args])

    text_out = await anyio.to_thread.run_sync(run)
    assert text_out.exit_code == 0, text_out.output
    lines = text_out.output.splitlines()
    assert lines[0].split()[:3] == ["3", "dash.mail", "ConnectionError:"]
    assert "port <n> refused" in lines[0]
    assert (
        "--filter job=dash.mail --filter state=dead --filter 'error=ConnectionError: port'"
        in (lines[2])
    )
    assert "dash.report" in text_out.output
    only = await anyio.to_thread.run_sync(run, "--job", "dash.report", "--json")
    assert only.exit_code == 0, only.output
    answer = json.loads(only.output)
    assert [(g["job_id"], g["count"]) for g in answer["groups"]] == [("dash.report", 1)]
    assert answer["complete"] is True
    assert answer["scanned"] == 1
