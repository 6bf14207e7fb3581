"""S2: the dashboard's page queries at 1,000,000 runs: index scans on the named indexes, never a
sequential scan of the runs table, and a buffer count that does not grow with the table (within
2x of the same statement at 1,000 runs), as custom plans and as a prepared statement's generic
plan."""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import buffers, check_plan, explain, nodes
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import browse, render

BIG = 1_000_000
SMALL = 1_000

metadata = MetaData()
big_runs = ship_job_runs_table(metadata)
small_runs = ship_job_runs_table(metadata, name="small_job_runs")
ship_job_state_table(metadata)


def _load(table: str, total: int) -> list[str]:
    """``total`` runs over ten jobs: most completed (finished over the last two hours), a tenth
    waiting, a hundredth dead, tenants t0..t9: a busy table's shape."""
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
    return [
        (
            f"INSERT INTO {table} ({columns}, finished_at, tenant_id)"
            " SELECT 'r' || lpad(g::text, 9, '0'), 'job' || (g % 10),"
            "  CASE WHEN g % 100 = 0 THEN 'dead' WHEN g % 10 = 1 THEN 'waiting'"
            "   ELSE 'completed' END,"
            "  '{}'::jsonb, 5, now(), now() - (g * interval '7 milliseconds'), now(),"
            "  CASE WHEN g % 10 = 1 THEN NULL ELSE now() - (g * interval '7 milliseconds') END,"
            "  't' || (g % 7)"
            f" FROM generate_series(1, {total}) g"
        ),
        (
            "INSERT INTO ship_job_state (job_id, next_at, trigger)"
            f" SELECT 'sched' || g || '{table}', now(), 'cron:* * * * *'"
            " FROM generate_series(1, 20) g"
        ),
    ]


@pytest.fixture
async def loaded(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        for statement in _load("ship_job_runs", BIG) + _load("small_job_runs", SMALL):
            await connection.execute(text(statement))
    async with ship_engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("ship_job_runs", "small_job_runs", "ship_job_state"):
            await connection.execute(text(f"VACUUM (ANALYZE) {table}"))
    return ship_engine


def _page(state: str, **extra: Any) -> dict[str, Any]:
    return {
        "state": state,
        "limit": 51,
        "tenant": None,
        "created_from": None,
        "created_to": None,
        "after_at": None,
        "after_id": None,
        **extra,
    }


CASES = [
    ("of_job_dead", browse.LIST_RUNS_OF_JOB, _page("dead", job_id="job0"), {"browse_idx"}),
    (
        "of_job_completed_tenant",
        browse.LIST_RUNS_OF_JOB,
        _page("completed", job_id="job3", tenant="t3"),
        {"browse_idx"},
    ),
    (
        "of_job_after_cursor",
        browse.LIST_RUNS_OF_JOB,
        _page("waiting", job_id="job1", after_at="2000-01-01T00:00:00+00:00", after_id="r"),
        {"browse_idx"},
    ),
    ("all_jobs_dead", browse.LIST_RUNS_ALL_JOBS, _page("dead", max_jobs=200), {"browse_idx"}),
    (
        "all_jobs_completed",
        browse.LIST_RUNS_ALL_JOBS,
        _page("completed", max_jobs=200),
        {"browse_idx"},
    ),
]

THROUGHPUT_PARAMS = {"bucket": 300, "buckets": 24, "cap": 500, "max_jobs": 200, "now": None}


async def test_s2_dashboard_page_queries_are_index_served_and_bounded_at_1m_runs(loaded):
    """S2: every page of runs reads ``<runs>_browse_idx``, never a sequential scan, with buffers
    at 1,000,000 runs within 2x (+ a small constant) of 1,000 runs, as custom and generic
    plans; throughput reads ``<runs>_finished_idx`` and at most ``cap`` entries per job and
    bucket (about 3,600 runs finish per job and 5-minute bucket here); the schedules page reads
    the state table only (one load of the table for all of it: it takes ~20 s)."""
    for generic in (False, True):
        await _pages_are_flat(loaded, generic=generic)
    await _throughput_is_capped(loaded)
    await _schedule_states_read_the_state_table(loaded)


async def _pages_are_flat(loaded: AsyncEngine, *, generic: bool) -> None:
    for name, template, params, uses in CASES:
        async with loaded.connect() as connection:
            big = await explain(
                connection,
                render(template, runs="ship_job_runs", state="ship_job_state"),
                params,
                generic=generic,
            )
            small = await explain(
                connection,
                render(template, runs="small_job_runs", state="ship_job_state"),
                params,
                generic=generic,
            )
            await connection.rollback()
        check_plan(big, big_runs, uses=uses)
        assert buffers(big) <= 2 * buffers(small) + 200, (name, buffers(big), buffers(small))


async def _throughput_is_capped(loaded: AsyncEngine) -> None:
    async with loaded.connect() as connection:
        plan = await explain(
            connection,
            render(browse.THROUGHPUT, runs="ship_job_runs", state="ship_job_state"),
            THROUGHPUT_PARAMS,
            generic=True,
        )
        await connection.rollback()
    check_plan(plan, big_runs, uses={"finished_idx"})
    read = sum(
        int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
        for n in nodes(plan)
        if n.get("Index Name") == "ship_job_runs_finished_idx"
        and "finished_at" in str(n.get("Index Cond", ""))
    )
    assert 0 < read <= 10 * 24 * 500


async def _schedule_states_read_the_state_table(loaded: AsyncEngine) -> None:
    async with loaded.connect() as connection:
        plan = await explain(
            connection,
            render(browse.SCHEDULE_STATES, runs="ship_job_runs", state="ship_job_state"),
            {"limit": 1000},
            generic=True,
        )
        await connection.rollback()
    assert "ship_job_runs" not in str(plan)
