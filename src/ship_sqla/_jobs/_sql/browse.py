"""The dashboard's reads (S2, :class:`~ship_sqla.kernel._browse.RunBrowser`): runs by state and
filter, throughput over time, the schedules' state rows. Rules: see :mod:`ship_sqla._jobs._sql`.

Every statement is bounded whatever the table size and index-served
(``tests/integration/test_dashboard_explain.py`` proves the plans at 1,000,000 runs):

- a page of one job's runs is one backward range of ``<runs>_browse_idx`` (state, job_id,
  created_at, id) from the cursor, at most ``:limit`` entries (a tenant filter reads past the
  job's other tenants' runs in that range);
- a page across jobs finds the jobs with runs in the state by a loose scan of the same index
  (one probe per job, at most ``:max_jobs``), reads at most ``:limit`` entries of each and
  merges them: at most ``:max_jobs * :limit`` entries;
- throughput finds the jobs with finished runs by a loose scan of ``<runs>_finished_idx`` and
  counts at most ``:cap`` entries of each job per bucket.
"""

from __future__ import annotations

from typing import Final

__all__ = ["LIST_RUNS_ALL_JOBS", "LIST_RUNS_OF_JOB", "SCHEDULE_STATES", "THROUGHPUT"]

_RUNS_IN_RANGE: Final = """
    -- <runs>_browse_idx (state, job_id, created_at, id) read backwards: the sargable bounds
    -- start the scan at the cursor and stop it at created_from (a generic plan cannot use the
    -- row comparison as an index condition; it breaks created_at ties by id).
    WHERE r.state = CAST(:state AS text) AND r.job_id = {job}
      AND r.created_at >= coalesce(CAST(:created_from AS timestamptz),
                                   CAST('-infinity' AS timestamptz))
      AND r.created_at < coalesce(CAST(:created_to AS timestamptz),
                                  CAST('infinity' AS timestamptz))
      AND r.created_at <= coalesce(CAST(:after_at AS timestamptz),
                                   CAST('infinity' AS timestamptz))
      AND (CAST(:after_at AS timestamptz) IS NULL
           OR (r.created_at, r.id) < (CAST(:after_at AS timestamptz), CAST(:after_id AS text)))
      -- F2: one tenant's runs only, filtered (the index does not hold the tenant).
      AND (CAST(:tenant AS text) IS NULL OR r.tenant_id = CAST(:tenant AS text))
    ORDER BY r.created_at DESC, r.id DESC
    LIMIT CAST(:limit AS integer)
"""

LIST_RUNS_OF_JOB: Final = f"""
SELECT {{cols}} FROM {{runs}} r
{_RUNS_IN_RANGE.replace("{job}", "CAST(:job_id AS text)")}
"""  # noqa: S608 - a template of constant text
"""A page of one job's runs in one state, newest first (``JobOperations.list_runs``)."""

LIST_RUNS_ALL_JOBS: Final = f"""
WITH RECURSIVE jobs(job_id, n) AS (
    -- <runs>_browse_idx, a loose index scan: the next job id with runs in the state.
    SELECT (SELECT min(r.job_id) FROM {{runs}} r WHERE r.state = CAST(:state AS text)), 1
    UNION ALL
    SELECT (SELECT min(r.job_id) FROM {{runs}} r
            WHERE r.state = CAST(:state AS text) AND r.job_id > j.job_id), j.n + 1
    FROM jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
)
SELECT p.* FROM jobs j
CROSS JOIN LATERAL (
    SELECT {{cols}} FROM {{runs}} r
    {_RUNS_IN_RANGE.replace("{job}", "j.job_id")}
) p
WHERE j.job_id IS NOT NULL
ORDER BY p.created_at DESC, p.id DESC
LIMIT CAST(:limit AS integer)
"""  # noqa: S608 - a template of constant text
"""A page of every job's runs in one state, newest first: each job's page, merged."""

THROUGHPUT: Final = """
WITH RECURSIVE jobs(job_id, n) AS (
    -- <runs>_finished_idx (job_id, finished_at), a loose index scan over the jobs with finished
    -- runs (its predicate word for word).
    SELECT (SELECT min(r.job_id) FROM {runs} r
            WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled')), 1
    UNION ALL
    SELECT (SELECT min(r.job_id) FROM {runs} r
            WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled')
              AND r.job_id > j.job_id), j.n + 1
    FROM jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), edges AS (
    SELECT {now} - (CAST(:buckets AS integer) - b.i) * CAST(:bucket AS integer)
               * interval '1 second' AS start,
           {now} - (CAST(:buckets AS integer) - b.i - 1) * CAST(:bucket AS integer)
               * interval '1 second' AS stop
    FROM generate_series(0, CAST(:buckets AS integer) - 1) AS b(i)
)
SELECT e.start, coalesce(t.completed, 0) AS completed, coalesce(t.dead, 0) AS dead,
       coalesce(t.capped, false) AS capped
FROM edges e
CROSS JOIN LATERAL (
    SELECT sum(c.completed) AS completed, sum(c.dead) AS dead,
           bool_or(c.seen >= CAST(:cap AS integer)) AS capped
    FROM jobs j
    CROSS JOIN LATERAL (
        SELECT count(*) AS seen,
               count(*) FILTER (WHERE x.state = 'completed') AS completed,
               count(*) FILTER (WHERE x.state = 'dead') AS dead
        FROM (
            -- <runs>_finished_idx: one job's runs finished in the bucket, at most :cap.
            SELECT r.state FROM {runs} r
            WHERE r.job_id = j.job_id
              AND r.state IN ('completed', 'dead', 'discarded', 'cancelled')
              AND r.finished_at >= e.start AND r.finished_at < e.stop
            LIMIT CAST(:cap AS integer)
        ) x
    ) c
    WHERE j.job_id IS NOT NULL
) t
ORDER BY e.start
"""
"""Runs completed and dead per bucket, over every job (at most ``:max_jobs``), oldest bucket
first; ``capped`` where a job's bucket reached ``:cap`` finished runs."""

SCHEDULE_STATES: Final = """
SELECT s.job_id, s.trigger, s.next_at, s.updated_at
FROM {state} s
-- <state>_pkey in job id order; the state table holds a few rows per job (schedule, pause,
-- gates), never one per run.
WHERE s.trigger IS NOT NULL
ORDER BY s.job_id
LIMIT CAST(:limit AS integer)
"""
"""The scheduled jobs' state rows (J9): trigger, next occurrence, last change."""
