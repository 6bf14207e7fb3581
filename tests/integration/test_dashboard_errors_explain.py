"""S2, issue 36 item 6: the error groups' read at 1,000,000 runs (the seeded template's
``dashboard_explain`` step, shared with test_dashboard_explain.py). Every statement of
:func:`ship_sqla.kernel._error_groups.error_groups` besides the overview's ``dead_by_job`` is
one read of one job's newest dead runs, newest created first, of the four columns the grouping
needs (``DEAD_ERRORS``; until 2026-12-07 pages of 500 full rows of ``LIST_FINISHED_OF_JOB``):
read from the end of ``<runs>_browse_idx``, never a sequential scan, and stopping at its limit.
Here ``job0`` has 10,000 dead runs (the seed puts every dead run in it): a read of 2,001 (the
one-job read) and of 101 (a job of the cross-job read) reads at most its limit and one more,
custom and generic plans. (``LIST_DEAD_OF_JOB``, in finish order, read
all 10,000 through the same index and sorted them: the groups do not use it.)"""

from __future__ import annotations

from typing import Any

import pytest
from explain_helpers import check_plan, explain, nodes
from sqlalchemy.ext.asyncio import AsyncEngine
from test_dashboard_explain import SEED, big_runs

from ship_sqla._jobs._sql import JobStatements, browse
from ship_sqla.kernel._error_groups import ERROR_GROUP_PER_JOB, ERROR_GROUP_SCAN

__all__ = ["SEED"]

BIG = JobStatements(runs="ship_job_runs", state="ship_job_state")
DEAD_OF_JOB = 10_000
"""The seed's dead runs of job0: a page reads its limit of them, not all."""


def _entries(plan: dict[str, Any]) -> int:
    return sum(
        (int(n.get("Actual Rows", 0)) + int(n.get("Rows Removed by Filter", 0)))
        * int(n.get("Actual Loops", 1))
        for n in nodes(plan)
        if str(n.get("Index Name", "")).startswith("ship_job_runs_")
    )


@pytest.mark.parametrize("limit", [ERROR_GROUP_PER_JOB + 1, ERROR_GROUP_SCAN + 1])
async def test_s2_error_groups_read_one_jobs_newest_dead_runs_through_an_index(
    seeded_engine: AsyncEngine, limit: int
) -> None:
    """S2: one read of one job's newest dead runs (the groups' only statement besides the
    overview's ``dead_by_job``) is index-served and bounded: no sequential scan of the runs
    table, and at most ``PAGE_ENTRIES`` index entries, custom and generic."""
    params = {"job_id": "job0", "limit": limit}
    for generic in (False, True):
        async with seeded_engine.connect() as connection:
            plan = await explain(connection, BIG[browse.DEAD_ERRORS], params, generic=generic)
            await connection.rollback()
        check_plan(plan, big_runs, uses={"browse_idx"})
        read = _entries(plan)
        assert 0 < read <= limit + 2, (generic, read)
