"""D9's version gauge statement and D10's parked statements at 1,000,000 runs (VERSION_COUNTS;
LIST_PARKED, UNPARK_RUN, UNPARK_BATCH).

The gauges (``ship.workflow.runs``, ``ship.workflow.runs.stranded``) and ``ship-sqla workflows
versions`` count live runs per (job, handler version, state) with one statement: an index-only
scan of ``<runs>_version_idx``, which holds only live runs of versioned jobs. A backlog of
unversioned runs and the finished runs of versioned jobs are never read, as a custom and as a
generic plan. The parked runs' listing, an unpark and a new build's unpark batch read
``<runs>_parked_idx``, which holds only the parked runs, within a few dozen buffers.
"""

from __future__ import annotations

import pytest
from explain_helpers import buffers, check_plan, explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql.parked import (
    LIST_PARKED_ALL,
    LIST_PARKED_OF_JOB,
    PARKED_COUNTS,
    UNPARK_BATCH,
    UNPARK_RUN,
)
from ship_sqla._jobs._sql.versions import VERSION_COUNTS

BIG = 1_000_000
LIVE_VERSIONED = 100_000
PARKED = 10_000
MAX_PARKED_BUFFERS = 200
"""A page of 50 parked runs, one unpark, a batch of 500: a few index pages and the rows."""
MAX_BUFFERS = 1_500
"""About one index page per 250 live versioned runs, and nothing of the other 900,000 runs."""

metadata = MetaData()
runs = ship_job_runs_table(metadata)
ship_job_state_table(metadata)
S = JobStatements.for_tables(runs, metadata.tables["ship_job_state"])

_COLUMNS = "id, job_id, state, payload, max_attempts, run_at, created_at, updated_at"
LOAD = [
    # An unversioned job's backlog: not in <runs>_version_idx.
    (
        f"INSERT INTO ship_job_runs ({_COLUMNS})"
        " SELECT 'u' || g, 'bulk', 'waiting', '{}'::jsonb, 5, now(), now(), now()"
        f" FROM generate_series(1, {BIG - LIVE_VERSIONED - 300_000 - PARKED}) g"
    ),
    # Runs parked on a divergence (D10), over two jobs.
    (
        f"INSERT INTO ship_job_runs ({_COLUMNS}, wait_for)"
        " SELECT 'p' || lpad(g::text, 6, '0'), 'wf' || (g % 2), 'waiting', '{}'::jsonb, 5,"
        f" '9999-12-31T00:00:00+00', now(), now(), '#diverged' FROM generate_series(1, {PARKED}) g"
    ),
    # Finished runs of the versioned job: not in it either.
    (
        f"INSERT INTO ship_job_runs ({_COLUMNS}, handler_version, finished_at)"
        " SELECT 'f' || g, 'wf', 'completed', '{}'::jsonb, 5, now(), now(), now(), 1, now()"
        " FROM generate_series(1, 300000) g"
    ),
    # Its live runs over three versions, a tenth of them running.
    (
        f"INSERT INTO ship_job_runs ({_COLUMNS}, handler_version)"
        " SELECT 'v' || g, 'wf', CASE WHEN g % 10 = 0 THEN 'running' ELSE 'waiting' END,"
        " '{}'::jsonb, 5, now(), now(), now(), 1 + g % 3"
        f" FROM generate_series(1, {LIVE_VERSIONED}) g"
    ),
]


SEED = SeedStep(name="job_versions_explain", metadata=metadata, statements=LOAD)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


async def test_d9_version_counts_read_only_the_version_index_at_a_million_runs(
    loaded: AsyncEngine,
) -> None:
    """D9, F5: VERSION_COUNTS, for one job and for every job, is an index-only scan of
    <runs>_version_idx (no sequential scan of the runs table, no sort), reads only the live
    versioned runs' entries (not the 900,000 others), and answers six groups."""
    async with loaded.connect() as connection:
        for job_ids in (["wf"], None):
            for generic in (False, True):
                params = {"job_ids": job_ids, "limit": 10_000}
                async with connection.begin():
                    plan = await explain(connection, S[VERSION_COUNTS], params, generic=generic)
                check_plan(plan, runs, uses={"version_idx"})
                kinds = {n["Node Type"] for n in nodes(plan)}
                assert "Index Only Scan" in kinds, kinds
                assert "Sort" not in kinds, kinds
                assert buffers(plan) < MAX_BUFFERS, (job_ids, generic, buffers(plan))
        rows = (await connection.execute(S[VERSION_COUNTS], {"job_ids": None, "limit": 100})).all()
    assert [(r.handler_version, r.state) for r in rows] == [
        (v, s) for v in (1, 2, 3) for s in ("running", "waiting")
    ]
    assert sum(r.runs for r in rows) == LIVE_VERSIONED


async def test_d10_parked_statements_read_only_the_parked_index_at_a_million_runs(
    loaded: AsyncEngine,
) -> None:
    """D10, S1: LIST_PARKED_* (one job's page, every job's page, from a cursor), UNPARK_RUN,
    PARKED_COUNTS (the gauge) and UNPARK_BATCH read <runs>_parked_idx (or the primary key for
    the one run), never a sequential scan of the runs table, within a bounded number of
    buffers, custom and generic."""
    page = {"limit": 50, "after_id": None}
    cases = [
        (S[LIST_PARKED_OF_JOB], {**page, "job_id": "wf1"}, {"parked_idx"}, MAX_PARKED_BUFFERS),
        (S[LIST_PARKED_ALL], {**page, "after_job": None}, {"parked_idx"}, MAX_PARKED_BUFFERS),
        (
            S[LIST_PARKED_OF_JOB],
            {**page, "job_id": "wf0", "after_id": "p005000"},
            {"parked_idx"},
            MAX_PARKED_BUFFERS,
        ),
        (
            S[LIST_PARKED_ALL],
            {**page, "after_job": "wf0", "after_id": "p009000"},
            {"parked_idx"},
            MAX_PARKED_BUFFERS,
        ),
        (S[UNPARK_RUN], {"id": "p000002", "now": None}, {"pkey"}, MAX_PARKED_BUFFERS),
        # The parked gauge: an index-only count of the parked runs alone.
        (S[PARKED_COUNTS], {"job_ids": ["wf0", "wf1"]}, {"parked_idx"}, MAX_PARKED_BUFFERS),
        # 500 rows rewritten, each with its index entries: bounded by the batch, not the table.
        (S[UNPARK_BATCH], {"job_id": "wf0", "limit": 500, "now": None}, {"parked_idx"}, 20_000),
    ]
    async with loaded.connect() as connection:
        for statement, params, uses, most in cases:
            for generic in (False, True):
                async with connection.begin() as transaction:
                    plan = await explain(connection, statement, params, generic=generic)
                    await transaction.rollback()
                check_plan(plan, runs, uses=uses)
                assert "Sort" not in {n["Node Type"] for n in nodes(plan)}, statement.text[:60]
                assert buffers(plan) < most, (
                    statement.text[:40],
                    generic,
                    buffers(plan),
                )
