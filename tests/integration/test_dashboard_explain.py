"""S2: the dashboard's page queries at 1,000,000 runs: each state's page of runs reads the index
of its order (waiting: ``<runs>_due_idx``, running: ``<runs>_lease_idx``, dead: the partial
``<runs>_browse_idx``, completed (J18, newest finished first): ``<runs>_finished_idx``), never
a sequential scan of the runs table, at most a bounded number of index entries, and a buffer
count that does not grow with the table (within 2x of the same statement at 1,000 runs, plus a
heap buffer per entry read), as custom plans and as a prepared statement's generic plan."""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import buffers, check_plan, explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, browse
from ship_sqla.kernel._priority import MAX_PRIORITY, MIN_PRIORITY

BIG = 1_000_000
SMALL = 1_000
LIMIT = 51
LEVELS = MAX_PRIORITY - MIN_PRIORITY + 1
JOBS = 10
TENANTS = 7

metadata = MetaData()
big_runs = ship_job_runs_table(metadata)
small_runs = ship_job_runs_table(metadata, name="small_job_runs")
ship_job_state_table(metadata)


def _load(table: str, total: int) -> list[str]:
    """``total`` runs over ten jobs, each with runs in every state: most completed (finished
    over the last two hours), a tenth waiting (priorities -1, 0 and 1, due over the last two
    hours, ten of each job tying on run_at), a tenth running (leases lapsing over the next two
    hours), a hundredth dead, tenants t0..t6: a busy table's shape."""
    columns = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
    return [
        (
            f"INSERT INTO {table} ({columns}, finished_at, tenant_id, priority,"
            " lease_expires_at, lease_token, claimed_by)"
            " SELECT 'r' || lpad(g::text, 9, '0'), 'job' || ((g / 10) % 10),"
            "  CASE WHEN g % 100 = 0 THEN 'dead' WHEN g % 10 = 1 THEN 'waiting'"
            "   WHEN g % 10 = 2 THEN 'running' ELSE 'completed' END,"
            "  '{}'::jsonb, 5, now() - ((g / 1000) * interval '7 seconds'),"
            "  now() - (g * interval '7 milliseconds'), now(),"
            "  CASE WHEN g % 10 IN (1, 2) THEN NULL ELSE now() - (g * interval '7 milliseconds')"
            "   END,"
            "  't' || (g % 7), CASE WHEN g % 10 = 1 THEN (g / 100) % 3 - 1 ELSE 0 END,"
            "  CASE WHEN g % 10 = 2 THEN now() + (g * interval '7 milliseconds') END,"
            "  CASE WHEN g % 10 = 2 THEN g END, CASE WHEN g % 10 = 2 THEN 'w' END"
            f" FROM generate_series(1, {total}) g"
        ),
        (
            "INSERT INTO ship_job_state (job_id, next_at, trigger)"
            f" SELECT 'sched' || g || '{table}', now(), 'cron:* * * * *'"
            " FROM generate_series(1, 20) g"
        ),
    ]


SEED = SeedStep(
    name="dashboard_explain",
    # Indexes grown by the inserts, as a live table's are: freshly built ones are denser, and
    # the planner then reads other indexes (the tenant index for the queue depths; the
    # throughput's walk past its cap).
    defer_indexes=False,
    metadata=metadata,
    statements=[*_load("ship_job_runs", BIG), *_load("small_job_runs", SMALL)],
)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


def _page(**extra: Any) -> dict[str, Any]:
    return {"limit": LIMIT, "tenant": None, **extra}


def _waiting(**extra: Any) -> dict[str, Any]:
    return _page(**{"after_priority": None, "after_run_at": None, "after_seq": None, **extra})


def _running(**extra: Any) -> dict[str, Any]:
    return _page(**{"after_at": None, "after_id": None, **extra})


def _finished(state: str, **extra: Any) -> dict[str, Any]:
    unset = {"created_from": None, "created_to": None, "after_at": None, "after_id": None}
    return _page(state=state, **{**unset, **extra})


def _completed(**extra: Any) -> dict[str, Any]:
    unset = {"finished_from": None, "finished_to": None, "after_at": None, "after_id": None}
    return _page(**{**unset, **extra})


ONE_JOB = LEVELS * (LIMIT + 1)
"""Index entries one job's page may read: for waiting, a probe and a page per priority level
(at most 21 levels); for the other states one page (the same bound, comfortably)."""

CASES = [
    # name, template, params, the index of the state's order, most entries of it read
    ("of_job_waiting", browse.LIST_WAITING_OF_JOB, _waiting(job_id="job1"), "due_idx", ONE_JOB),
    (
        "of_job_waiting_after_cursor",
        browse.LIST_WAITING_OF_JOB,
        _waiting(
            job_id="job1", after_priority=0, after_run_at="2000-01-01T00:00:00+00:00", after_seq=1
        ),
        "due_idx",
        ONE_JOB,
    ),
    (
        "of_job_waiting_tenant",
        browse.LIST_WAITING_OF_JOB,
        _waiting(job_id="job1", tenant="t3"),
        "due_idx",
        TENANTS * ONE_JOB,
    ),
    (
        "all_jobs_waiting",
        browse.LIST_WAITING_ALL_JOBS,
        _waiting(max_jobs=200),
        "due_idx",
        JOBS * ONE_JOB,
    ),
    ("of_job_running", browse.LIST_RUNNING_OF_JOB, _running(job_id="job2"), "lease_idx", ONE_JOB),
    (
        "of_job_running_after_cursor",
        browse.LIST_RUNNING_OF_JOB,
        _running(job_id="job2", after_at="2000-01-01T00:00:00+00:00", after_id="r"),
        "lease_idx",
        ONE_JOB,
    ),
    (
        "all_jobs_running",
        browse.LIST_RUNNING_ALL_JOBS,
        _running(max_jobs=200),
        "lease_idx",
        JOBS * ONE_JOB,
    ),
    (
        "of_job_dead",
        browse.LIST_FINISHED_OF_JOB,
        _finished("dead", job_id="job0"),
        "browse_idx",
        ONE_JOB,
    ),
    (
        "of_job_completed_tenant",
        browse.LIST_COMPLETED_OF_JOB,
        _completed(job_id="job3", tenant="t3"),
        "finished_idx",
        TENANTS * ONE_JOB,
    ),
    (
        "of_job_completed_after_cursor",
        browse.LIST_COMPLETED_OF_JOB,
        _completed(job_id="job3", after_at="2100-01-01T00:00:00+00:00", after_id="r"),
        "finished_idx",
        ONE_JOB,
    ),
    (
        "all_jobs_dead",
        browse.LIST_FINISHED_ALL_JOBS,
        _finished("dead", max_jobs=200),
        "browse_idx",
        JOBS * ONE_JOB,
    ),
    (
        "all_jobs_completed",
        browse.LIST_COMPLETED_ALL_JOBS,
        _completed(max_jobs=200),
        "finished_idx",
        JOBS * ONE_JOB,
    ),
]

THROUGHPUT_PARAMS = {"bucket": 300, "buckets": 24, "cap": 500, "max_jobs": 200, "now": None}


async def test_s2_dashboard_page_queries_are_index_served_and_bounded_at_1m_runs(loaded):
    """S2, J18: each state's page of runs reads the index of its order (waiting
    ``<runs>_due_idx``, running ``<runs>_lease_idx``, dead the partial ``<runs>_browse_idx``,
    completed ``<runs>_finished_idx`` in finish order), never a
    sequential scan, at most a bounded number of that index's entries (a page per priority
    level, per job across jobs; a tenant filter reads past the other tenants), with buffers at
    1,000,000 runs within 2x of 1,000 runs plus a small constant and one heap buffer per entry
    read, as custom and generic plans;
    the browse index holds finished runs only; throughput reads ``<runs>_finished_idx`` and at
    most ``cap`` entries per job and bucket (about 3,600 runs finish per job and 5-minute bucket
    here); the schedules page reads the state table only (one load of the table for all of it:
    it takes ~20 s)."""
    for generic in (False, True):
        await _pages_are_flat(loaded, generic=generic)
    await _browse_index_holds_finished_runs_only(loaded)
    await _throughput_is_capped(loaded)
    await _schedule_states_read_the_state_table(loaded)


async def _pages_are_flat(loaded: AsyncEngine, *, generic: bool) -> None:
    for name, template, params, index, most in CASES:
        async with loaded.connect() as connection:
            big = await explain(
                connection,
                JobStatements(runs="ship_job_runs", state="ship_job_state")[template],
                params,
                generic=generic,
            )
            small = await explain(
                connection,
                JobStatements(runs="small_job_runs", state="ship_job_state")[template],
                params,
                generic=generic,
            )
            await connection.rollback()
        check_plan(big, big_runs, uses={index})
        read = sum(
            int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
            + int(n.get("Rows Removed by Filter", 0)) * int(n.get("Actual Loops", 1))
            for n in nodes(big)
            if str(n.get("Index Name", "")).startswith("ship_job_runs_")
        )
        assert 0 < read <= most, (name, generic, read, most)
        # A page's entries lie on about as many heap pages in the big table as they are (its
        # runs are spread over it), on a few in the small one: one heap buffer per entry read
        # is allowed over the small table's count, and the entries are bounded above.
        allowed = 2 * buffers(small) + 200 + read
        assert buffers(big) <= allowed, (name, generic, buffers(big), buffers(small), read)


async def _browse_index_holds_finished_runs_only(loaded: AsyncEngine) -> None:
    async with loaded.connect() as connection:
        definition = (
            await connection.execute(
                text("SELECT pg_get_indexdef(CAST('ship_job_runs_browse_idx' AS regclass))")
            )
        ).scalar_one()
        await connection.rollback()
    assert definition.endswith(
        "WHERE (state = ANY (ARRAY['completed'::text, 'dead'::text, 'discarded'::text,"
        " 'cancelled'::text]))"
    ), definition


async def _throughput_is_capped(loaded: AsyncEngine) -> None:
    async with loaded.connect() as connection:
        plan = await explain(
            connection,
            JobStatements(runs="ship_job_runs", state="ship_job_state")[browse.THROUGHPUT],
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
            JobStatements(runs="ship_job_runs", state="ship_job_state")[browse.SCHEDULE_STATES],
            {"limit": 1000},
            generic=True,
        )
        await connection.rollback()
    assert "ship_job_runs" not in str(plan)
