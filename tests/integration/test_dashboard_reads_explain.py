"""S2, issue 36: the overview's reads at 1,000,000 runs (the seeded template's
``dashboard_explain`` step, shared with test_dashboard_explain.py): the failing jobs
(DEAD_BY_JOB, a loose scan of ``<runs>_browse_idx``) and the per-job counts at the overview's
cap (DEMAND) read a bounded number of index entries, never the table; the throughput chart
reads at most its cap per job and bucket through ``<runs>_finished_idx``; operator reads run
with JIT off; ``dead_by_job`` counts an all-dead job (the overview's page: test_dashboard_http).
"""

from __future__ import annotations

from typing import Any

from explain_helpers import buffers, check_plan, explain, nodes
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine
from test_dashboard_explain import JOBS, LEVELS, SEED, big_runs

from ship_sqla._dashboard._reads import OVERVIEW_COUNT_CAP
from ship_sqla._jobs import create_job_backend, ship_job_runs_table
from ship_sqla._jobs._sql import JobStatements, admin, browse

__all__ = ["SEED"]

BIG = JobStatements(runs="ship_job_runs", state="ship_job_state")
SMALL = JobStatements(runs="small_job_runs", state="ship_job_state")
CAP = OVERVIEW_COUNT_CAP


def _entries(plan: dict[str, Any]) -> int:
    """Index entries the plan read from the big runs table's indexes."""
    return sum(
        (int(n.get("Actual Rows", 0)) + int(n.get("Rows Removed by Filter", 0)))
        * int(n.get("Actual Loops", 1))
        for n in nodes(plan)
        if str(n.get("Index Name", "")).startswith("ship_job_runs_")
    )


async def _plans(
    engine: AsyncEngine, template: Any, params: dict[str, Any], *, generic: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    async with engine.connect() as connection:
        big = await explain(connection, BIG[template], params, generic=generic)
        small = await explain(connection, SMALL[template], params, generic=generic)
        await connection.rollback()
    return big, small


async def test_s2_overview_failing_jobs_read_is_index_served_and_bounded(seeded_engine):
    """S2: DEAD_BY_JOB finds the jobs with dead runs by a loose scan of ``<runs>_browse_idx``
    (one probe per job) and counts each job's dead runs up to the cap there: no sequential scan,
    at most about ``cap`` entries per job whatever the table holds, and buffers within 2x of
    the same statement at 1,000 runs plus the entries read, custom and generic."""
    params = {"cap": CAP, "max_jobs": 1000}
    for generic in (False, True):
        big, small = await _plans(seeded_engine, admin.DEAD_BY_JOB, params, generic=generic)
        check_plan(big, big_runs, uses={"browse_idx"})
        read = _entries(big)
        assert 0 < read <= JOBS * (CAP + 4) + 4, (generic, read)
        assert buffers(big) <= 2 * buffers(small) + 200 + read, (generic, buffers(big))


async def test_s2_overview_counts_at_the_overview_cap_are_bounded(seeded_engine):
    """S2: the overview's per-job counts (DEMAND at the overview's cap) read at most the cap per
    kind and priority level of each job, through ``<runs>_due_idx`` and ``<runs>_lease_idx``
    (10,000 runs wait per job here: counted to 1,000, shown "1000+")."""
    params = {"job_ids": [], "all_jobs": True, "cap": CAP, "max_jobs": 1000, "now": None}
    for generic in (False, True):
        big, _small = await _plans(seeded_engine, admin.DEMAND, params, generic=generic)
        check_plan(big, big_runs, uses={"due_idx", "lease_idx"})
        read = _entries(big)
        assert 0 < read <= JOBS * (LEVELS * 3 * (CAP + 1) + CAP + 2 * LEVELS + 4), read


async def test_s2_throughput_reads_its_cap_per_job_and_bucket_in_index_order(seeded_engine):
    """S2: the throughput chart reads each job's bucket in ``<runs>_finished_idx`` order and
    stops at the cap (about 3,600 runs finish per job and bucket here): a plain index scan, not
    a bitmap scan that first reads every entry of the bucket."""
    params = {"bucket": 300, "buckets": 24, "cap": 100, "max_jobs": 200, "now": None}
    big, _small = await _plans(seeded_engine, browse.THROUGHPUT, params, generic=False)
    check_plan(big, big_runs, uses={"finished_idx"})
    bucket_reads = [
        n
        for n in nodes(big)
        if n.get("Index Name") == "ship_job_runs_finished_idx"
        and "finished_at" in str(n.get("Index Cond", ""))
    ]
    assert bucket_reads, "the buckets are not read through the finished index"
    assert not [n for n in nodes(big) if n["Node Type"].startswith("Bitmap")]
    assert _entries(big) <= JOBS * (24 * 100 + 4) + 4


async def test_s2_operator_reads_run_with_jit_off_and_count_dead_runs_per_job(seeded_engine):
    """S2, issue 36: the backend's operator reads run with JIT off (their recursive CTEs'
    estimates passed ``jit_above_cost``: compiling took seconds, executing milliseconds); and
    ``dead_by_job`` lists a job whose runs are all dead (nothing waiting or running) with its
    exact count, and a job past the cap with the cap, marked a floor."""
    async with seeded_engine.connect() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, attempt,"
                " run_at, created_at, updated_at, finished_at)"
                " SELECT 'fail' || g, 'job.failing', 'dead', '{}'::jsonb, 3, 3, now(), now(),"
                " now(), now() FROM generate_series(1, 3) g"
            )
        )
        # The in-place shape (a runs table given, no history declared): its reads are measured.
        in_place = ship_job_runs_table(MetaData())
        backend = create_job_backend(
            database=connection, table=in_place, listen=False, announce=False
        )
        admin_port = backend.admin
        setting = await admin_port._operator_rows(
            "jit", text("SELECT current_setting('jit') AS jit"), {}
        )
        assert setting[0].jit == "off"
        failures = {f.job_id: f for f in await admin_port.dead_by_job(cap=CAP, max_jobs=1000)}
        assert failures["job.failing"].dead == 3
        assert not failures["job.failing"].capped
        assert failures["job.failing"].last_dead_at is not None
        assert failures["job0"].dead == CAP
        assert failures["job0"].capped
        await connection.rollback()
