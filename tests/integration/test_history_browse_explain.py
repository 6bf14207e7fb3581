"""J16, J17, J18, S2: the dashboard's finished pages over the run history.

With a history table (J16, the default shape) the pages of dead, cancelled and discarded runs
(``LIST_FINISHED_OF_JOB_EITHER`` and ``LIST_FINISHED_ALL_JOBS_EITHER``: one state, one job or
all, newest created first, keyset on ``(created_at, id)``) read ``<history>_browse_idx``
``(job_id, state, created_at, id) WHERE state <> 'completed'``; the pages of completed runs
(``LIST_COMPLETED_*_EITHER``, J18: newest finished first, keyset on ``(finished_at, id)``) read
``<history>_job_idx`` ``(job_id, state, finished_at)``, so completed runs pay nothing for the
browse index. Either way: one backward scan of each of the class's day partitions (J17),
merged, never a sort of the job's runs in that state and never a sequential scan, at most a
bounded number of index entries per partition (a settle batch's finished_at tie sorted by id),
as custom plans and as a prepared statement's generic plan. Data: 440,000 ended runs of 20
jobs over the four day partitions (settled in batches of 100: a batch shares its finished_at),
and the runs table's live runs with a few finished leftovers (a database not migrated yet).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from explain_helpers import explain, nodes
from seeded_template import SeedStep
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs import ship_job_history_table, ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql import JobStatements, live

TOTAL = 440_000
JOBS = 20
LIMIT = 51
DAYS = 4
"""Today's partition and three days ahead: the ones ``create_all`` makes (J17)."""

metadata = MetaData()
runs = ship_job_runs_table(metadata)
ship_job_state_table(metadata)
history = ship_job_history_table(metadata)

_HISTORY = f"""
INSERT INTO ship_job_history (id, seq, job_id, state, attempt, max_attempts, run_at, created_at,
    started_at, finished_at, claimed_by, tenant_id)
SELECT 'h' || lpad(g::text, 9, '0'), g, 'job' || (g % {JOBS}),
    CASE WHEN g % 11 = 0 THEN 'dead' ELSE 'completed' END, 1, 5,
    now() - (g * interval '7 milliseconds'), now() - (g * interval '7 milliseconds'),
    now() - (g * interval '7 milliseconds'),
    -- spread over the day partitions: every one holds runs of every age; a batch of 100
    -- consecutive runs shares its finished_at (one settle statement)
    date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
        + ((g % {DAYS}) * interval '1 day') + interval '1 hour'
        + ((g / 100) * interval '10 milliseconds'),
    'w', 't' || (g % 7)
FROM generate_series(1, {TOTAL}) g
"""

_RUNS = f"""
INSERT INTO ship_job_runs (id, job_id, state, payload, max_attempts, run_at, created_at,
    updated_at, finished_at)
SELECT 'r' || lpad(g::text, 9, '0'), 'job' || (g % {JOBS}),
    CASE WHEN g % 50 = 0 THEN 'completed' ELSE 'waiting' END, '{{}}'::jsonb, 5,
    now(), now() - (g * interval '1 second'), now(),
    CASE WHEN g % 50 = 0 THEN now() END
FROM generate_series(1, 20000) g
"""

SEED = SeedStep(name="history_browse_explain", metadata=metadata, statements=[_HISTORY, _RUNS])
"""The module's data set in the session's seeded template (tests/support/seeded_template.py)."""


@pytest.fixture
def loaded(seeded_engine: AsyncEngine) -> AsyncEngine:
    return seeded_engine


def _statements() -> JobStatements:
    return JobStatements(
        runs="ship_job_runs", state="ship_job_state", history="ship_job_history", live_only=True
    )


async def _browse_indexes(connection: Any) -> set[str]:
    """``<history>_browse_idx`` and the indexes of every partition attached to it (two levels:
    the class partitions' and their days')."""
    rows = await connection.execute(
        text(
            "WITH RECURSIVE tree(oid) AS ("
            " SELECT to_regclass('ship_job_history_browse_idx')::oid"
            " UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)"
            " SELECT c.relname FROM tree t JOIN pg_class c ON c.oid = t.oid"
        )
    )
    return {row[0] for row in rows}


def _check(plan: dict[str, Any], browse: set[str]) -> None:
    every = nodes(plan)
    scans = [n for n in every if n["Node Type"] == "Seq Scan"]
    assert not scans, f"sequential scans: {[n.get('Relation Name') for n in scans]}"
    history_reads = [
        n for n in every if str(n.get("Relation Name", "")).startswith("ship_job_history")
    ]
    assert history_reads
    # The page's rows come through <history>_browse_idx; another index may serve only the
    # loose scan over the jobs (one min(job_id) probe per loop).
    paging = {str(n.get("Index Name")) for n in history_reads if n["Actual Rows"] > 1}
    assert paging, "no page read from history"
    assert paging <= browse, f"history paged through {paging - browse}, not <history>_browse_idx"
    # No sort of the job's runs: a sort, if any, is of one page's rows at most per job.
    for node in every:
        if node["Node Type"] in ("Sort", "Incremental Sort"):
            assert node["Actual Rows"] <= LIMIT * JOBS, node
    # Bounded: at most a page's entries from each day partition (each class's default too).
    read = sum(round(n["Actual Rows"] * n["Actual Loops"]) for n in history_reads)
    assert read <= LIMIT * (DAYS + 1) * JOBS


@pytest.mark.parametrize("state", ["dead"])
async def test_j16_finished_page_of_one_job_reads_the_history_browse_index(
    loaded: AsyncEngine, state: str
) -> None:
    """J16, J17, J18, S2: one job's page of dead runs, first page and after a cursor, reads
    ``<history>_browse_idx`` (partial on ``state <> 'completed'``: the statement repeats the
    predicate, so the generic plan proves it; each day partition's, merged in creation order),
    never a sort of the job's 2,000 dead runs, custom and generic."""
    statement = _statements()[live.LIST_FINISHED_OF_JOB_EITHER]
    async with loaded.connect() as connection:
        browse = await _browse_indexes(connection)
        assert "ship_job_history_browse_idx" in browse
        first: list[Any] = []
        for generic in (False, True):
            for after in ((None, None), ("cursor", None)):
                after_at = after_id = None
                if after[0] is not None and first:
                    after_at, after_id = first[-1].created_at, first[-1].id
                params = {
                    "limit": LIMIT,
                    "tenant": None,
                    "state": state,
                    "created_from": None,
                    "created_to": None,
                    "after_at": after_at,
                    "after_id": after_id,
                    "job_id": "job3",
                }
                plan = await explain(connection, statement, params, generic=generic)
                _check(plan, browse)
                rows = (await connection.execute(statement, params)).all()
                assert len(rows) == LIMIT
                keys = [(row.created_at, row.id) for row in rows]
                assert keys == sorted(keys, reverse=True)
                if after_at is None:
                    first = rows
                else:
                    assert keys[0] < (after_at, after_id)
            await connection.rollback()


async def test_j16_finished_page_of_all_jobs_reads_the_history_browse_index(
    loaded: AsyncEngine,
) -> None:
    """J16, J17, J18, S2: the page of dead runs over every job (a loose scan over the jobs,
    then each job's page through ``<history>_browse_idx``, merged), custom and generic."""
    statement = _statements()[live.LIST_FINISHED_ALL_JOBS_EITHER]
    async with loaded.connect() as connection:
        browse = await _browse_indexes(connection)
        for generic in (False, True):
            params = {
                "limit": LIMIT,
                "tenant": None,
                "state": "dead",
                "created_from": None,
                "created_to": None,
                "after_at": None,
                "after_id": None,
                "max_jobs": 100,
            }
            plan = await explain(connection, statement, params, generic=generic)
            _check(plan, browse)
            rows = (await connection.execute(statement, params)).all()
            assert len(rows) == LIMIT
            await connection.rollback()


def _blocks(plan: dict[str, Any]) -> int:
    """Buffers the history's scans touched (hit or read)."""
    return sum(
        n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
        for n in nodes(plan)
        if str(n.get("Relation Name", "")).startswith("ship_job_history")
    )


async def test_issue_36_a_finished_page_in_a_time_range_starts_at_the_range_s_end(
    loaded: AsyncEngine,
) -> None:
    """S2, issue 36: a dead page with ``created_to`` (the runs page's ``until``, the search's
    ``to``) starts its backward scan at ``created_to``, not at the job's newest run: it
    touches about the buffers of a first page without a range, not those of every run newer
    than the range (half the job's runs here), custom and generic; its rows are the newest in
    the range, in order."""
    statement = _statements()[live.LIST_FINISHED_OF_JOB_EITHER]
    async with loaded.connect() as connection:
        newest = (
            await connection.execute(
                text(
                    "SELECT max(created_at) FROM ship_job_history"
                    " WHERE job_id = 'job3' AND state = 'dead'"
                )
            )
        ).scalar_one()
        # created_at spans TOTAL x 7 ms (about 51 minutes): the range is its older half.
        until = newest - (TOTAL * 7 // 2) * timedelta(milliseconds=1)
        since = until - timedelta(minutes=10)
        for generic in (False, True):
            base = {
                "limit": LIMIT,
                "tenant": None,
                "state": "dead",
                "created_from": None,
                "created_to": None,
                "after_at": None,
                "after_id": None,
                "job_id": "job3",
            }
            unranged = _blocks(await explain(connection, statement, base, generic=generic))
            ranged = {**base, "created_from": since, "created_to": until}
            plan = await explain(connection, statement, ranged, generic=generic)
            assert _blocks(plan) <= 2 * unranged + 20, (_blocks(plan), unranged)
            rows = (await connection.execute(statement, ranged)).all()
            keys = [(row.created_at, row.id) for row in rows]
            assert len(keys) == LIMIT
            assert keys == sorted(keys, reverse=True)
            assert all(since <= at < until for at, _ in keys)
            # The next page goes on after the cursor, inside the range.
            after = {**ranged, "after_at": keys[-1][0], "after_id": keys[-1][1]}
            more = [(r.created_at, r.id) for r in (await connection.execute(statement, after))]
            assert more
            assert more[0] < keys[-1]
            assert all(since <= at < until for at, _ in more)
            await connection.rollback()


async def _job_indexes(connection: Any) -> set[str]:
    """``<history>_job_idx`` and the indexes of every partition attached to it."""
    rows = await connection.execute(
        text(
            "WITH RECURSIVE tree(oid) AS ("
            " SELECT to_regclass('ship_job_history_job_idx')::oid"
            " UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)"
            " SELECT c.relname FROM tree t JOIN pg_class c ON c.oid = t.oid"
        )
    )
    return {row[0] for row in rows}


def _completed_params(**given: Any) -> dict[str, Any]:
    return {
        "limit": LIMIT,
        "tenant": None,
        "finished_from": None,
        "finished_to": None,
        "after_at": None,
        "after_id": None,
        **given,
    }


async def test_j18_completed_runs_pay_nothing_for_the_browse_index(loaded: AsyncEngine) -> None:
    """J18: ``<history>_browse_idx`` holds no completed run (partial on ``state <>
    'completed'``): the completed class's partitions' indexes of it are empty, its dead
    partitions' hold every dead run."""
    async with loaded.connect() as connection:
        completed = (
            await connection.execute(
                text(
                    "SELECT count(*) FROM ship_job_history"
                    " WHERE state <> 'completed' AND state = 'completed'"
                )
            )
        ).scalar_one()
        assert completed == 0
        predicate = (
            await connection.execute(
                text(
                    "SELECT pg_get_expr(indpred, indrelid) FROM pg_index"
                    " WHERE indexrelid = 'ship_job_history_browse_idx'::regclass"
                )
            )
        ).scalar_one()
        assert predicate == "(state <> 'completed'::text)"
        sizes = await connection.execute(
            text(
                "SELECT c.relname, (SELECT count(*) FROM pg_inherits) AS n,"
                " pg_relation_size(c.oid) AS bytes FROM pg_class c"
                " WHERE c.relname LIKE 'ship_job_history_completed%browse%'"
                " OR (c.relkind = 'i' AND c.oid IN (SELECT indexrelid FROM pg_index"
                "     WHERE indrelid IN (SELECT oid FROM pg_class"
                "         WHERE relname LIKE 'ship_job_history_completed_%'"
                "           AND relkind = 'r')"
                "     AND pg_get_expr(indpred, indrelid) IS NOT NULL"
                "     AND pg_get_indexdef(indexrelid) LIKE '%created_at, id%'))"
            )
        )
        leaves = [(row.relname, row.bytes) for row in sizes if row.bytes is not None]
        assert leaves, "no completed partition's browse index found"
        # An empty btree: its metapage (and at most a root page): nothing per run.
        assert all(size <= 2 * 8192 for _, size in leaves), leaves


def _check_completed(plan: dict[str, Any], job_idx: set[str], *, jobs: int = 1) -> None:
    every = nodes(plan)
    scans = [n for n in every if n["Node Type"] == "Seq Scan"]
    assert not scans, f"sequential scans: {[n.get('Relation Name') for n in scans]}"
    history_reads = [
        n for n in every if str(n.get("Relation Name", "")).startswith("ship_job_history")
    ]
    paging = {str(n.get("Index Name")) for n in history_reads if n["Actual Rows"] > 1}
    assert paging, "no page read from history"
    assert paging <= job_idx, f"completed runs paged through {paging - job_idx}"
    # A sort is over a page and one settle batch's tie at most per job, never the job's runs.
    for node in every:
        if node["Node Type"] in ("Sort", "Incremental Sort"):
            assert node["Actual Rows"] <= (LIMIT + 100) * jobs, node
    read = sum(round(n["Actual Rows"] * n["Actual Loops"]) for n in history_reads)
    assert read <= (LIMIT + 100) * (DAYS + 1) * jobs, read


async def test_j18_completed_page_of_one_job_reads_the_history_job_index(
    loaded: AsyncEngine,
) -> None:
    """J18, J16, J17, S2: one job's page of completed runs, newest finished first (keyset on
    ``(finished_at, id)``), first page and after a cursor, reads ``<history>_job_idx`` (each
    day partition's, merged in finish order; a settle batch's tie sorted by id over it, an
    incremental sort), never ``<history>_browse_idx``, never a sort of the job's 20,000
    completed runs, bounded, custom and generic; a finish-time range starts the scan at its
    end."""
    statement = _statements()[live.LIST_COMPLETED_OF_JOB_EITHER]
    async with loaded.connect() as connection:
        job_idx = await _job_indexes(connection)
        for generic in (False, True):
            params = _completed_params(job_id="job3")
            first_plan = await explain(connection, statement, params, generic=generic)
            _check_completed(first_plan, job_idx)
            rows = (await connection.execute(statement, params)).all()
            assert len(rows) == LIMIT
            keys = [(row.finished_at, row.id) for row in rows]
            assert keys == sorted(keys, reverse=True)
            after = _completed_params(job_id="job3", after_at=keys[-1][0], after_id=keys[-1][1])
            _check_completed(await explain(connection, statement, after, generic=generic), job_idx)
            more = [(r.finished_at, r.id) for r in (await connection.execute(statement, after))]
            assert len(more) == LIMIT
            assert more == sorted(more, reverse=True)
            assert more[0] < keys[-1]
            # A finish-time range (ten seconds, 20 s before the newest run): the scan starts
            # at its end; its rows are the newest in it, in order.
            until = keys[0][0] - timedelta(seconds=20)
            since = until - timedelta(seconds=10)
            ranged = _completed_params(job_id="job3", finished_from=since, finished_to=until)
            plan = await explain(connection, statement, ranged, generic=generic)
            _check_completed(plan, job_idx)
            assert _blocks(plan) <= 2 * _blocks(first_plan) + 20
            inside = [(r.finished_at, r.id) for r in (await connection.execute(statement, ranged))]
            assert len(inside) == LIMIT
            assert inside == sorted(inside, reverse=True)
            assert all(since <= at < until for at, _ in inside)
            await connection.rollback()


async def test_j18_completed_page_of_all_jobs_reads_the_history_job_index(
    loaded: AsyncEngine,
) -> None:
    """J18, J16, S2: the page of completed runs over every job (a loose scan over the jobs,
    then each job's page through ``<history>_job_idx``, merged newest finished first), custom
    and generic."""
    statement = _statements()[live.LIST_COMPLETED_ALL_JOBS_EITHER]
    async with loaded.connect() as connection:
        job_idx = await _job_indexes(connection)
        for generic in (False, True):
            params = _completed_params(max_jobs=100)
            plan = await explain(connection, statement, params, generic=generic)
            _check_completed(plan, job_idx, jobs=JOBS)
            rows = (await connection.execute(statement, params)).all()
            assert len(rows) == LIMIT
            keys = [(row.finished_at, row.id) for row in rows]
            assert keys == sorted(keys, reverse=True)
            await connection.rollback()


async def test_j18_the_error_groups_dead_read_still_uses_the_partial_browse_index(
    loaded: AsyncEngine,
) -> None:
    """J18, J16, S2: the error groups' read of one job's newest dead runs (DEAD_ERRORS_EITHER,
    ``state = 'dead'`` as a literal, which implies the partial index's ``state <> 'completed'``)
    reads ``<history>_browse_idx`` backwards, bounded, custom and generic."""
    statement = _statements()[live.DEAD_ERRORS_EITHER]
    async with loaded.connect() as connection:
        browse = await _browse_indexes(connection)
        for generic in (False, True):
            params = {"job_id": "job3", "limit": LIMIT}
            plan = await explain(connection, statement, params, generic=generic)
            _check(plan, browse)
            rows = (await connection.execute(statement, params)).all()
            assert len(rows) == LIMIT
            keys = [(row.created_at, row.id) for row in rows]
            assert keys == sorted(keys, reverse=True)
            await connection.rollback()
