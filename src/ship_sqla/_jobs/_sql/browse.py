"""The dashboard's reads (S2, :class:`~ship_sqla.kernel._browse.RunBrowser`): runs by state and
filter, throughput over time, the schedules' state rows. Rules: see :mod:`ship_sqla._jobs._sql`.

A page of runs is read in its state's order, through the index that order already has, so no
index is kept for browsing alone on the hot path (each state's predicate is written word for
word, as a literal, so a generic plan can use the partial index):

- ``waiting`` (LIST_WAITING_*): claim order, the order a claim takes them (K6): highest
  priority first, then ``run_at``, then ``seq``, through ``<runs>_due_idx`` (job_id,
  priority, run_at, seq): a loose scan over the job's priority levels from the cursor's down
  (one entry each; priorities are bounded, MIN_PRIORITY..MAX_PRIORITY: at most 21 levels),
  then at most ``:limit`` entries of each level from the cursor: at most ``21 * :limit``
  entries, of which only the index's columns are merged; the merged page's ``:limit`` full rows
  are then read by one probe each (a merge of every level's full rows took 2.5 times as long at
  1,000,000 runs, 245 rows a level: 20 ms against 8);
- ``running`` (LIST_RUNNING_*): soonest lease to lapse first, ``(lease_expires_at, id)``,
  through ``<runs>_lease_idx`` (job_id, lease_expires_at): one range from the cursor's lease,
  at most ``:limit`` entries plus the runs whose lease ties the cursor's (the index holds no
  id: runs claimed or heartbeated in one statement tie, a batch at most);
- dead, cancelled, discarded (LIST_FINISHED_*): newest first, ``(created_at, id)``
  descending, through ``<runs>_browse_idx`` (state, job_id, created_at, id), partial on the
  finished states (so a run enters it once, when it finishes): one backward range from the
  cursor, at most ``:limit`` entries, stopped at ``created_from``;
- completed (LIST_COMPLETED_*, J18): newest finished first, ``(finished_at, id)`` descending,
  the order history's ``<history>_job_idx`` keeps (no browse index pays for completed runs
  there). In a runs table that keeps its finished runs (no history table) through
  ``<runs>_finished_idx`` (job_id, finished_at), partial on the finished states: one backward
  range from the cursor, stopped at ``finished_from``, that reads past the job's dead,
  cancelled and discarded runs finished in it (the index holds no state) and sorts each
  ``finished_at`` tie (a settle batch) by id.

A tenant filter reads past the job's other tenants' runs in the range (no index holds the
tenant in these orders). A time range on the order's own time (creation; finish for
completed runs) bounds only the finished states' read; the
operator surface refuses one on a live state (it could only be filtered there, reading past
every other waiting or running run of the job), so the live statements take none.

A page across jobs finds the jobs with runs in the state by a loose scan of the same index (one
probe per job, at most ``:max_jobs``), reads each job's page and merges them: at most
``:max_jobs`` times the one-job bound. Throughput finds the jobs with finished runs by a loose
scan of ``<runs>_finished_idx`` and counts at most ``:cap`` entries of each job per bucket.
The Consumers page (C3, CONSUMER_PROGRESS) finds the (consumer, key) pairs with progress by a
loose scan of ``<runs>_progress_idx`` (at most ``:limit`` pairs) and reads each pair's latest
run with progress there and its live run through ``<runs>_dedupe_idx``.

Every statement is bounded whatever the table size and index-served
(``tests/integration/test_dashboard_explain.py`` proves the plans at 1,000,000 runs).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._jobs._sql._levels import levels
from ship_sqla._sql import Template

__all__ = [
    "CONSUMER_PROGRESS",
    "DEAD_ERRORS",
    "LIST_COMPLETED_ALL_JOBS",
    "LIST_COMPLETED_OF_JOB",
    "LIST_FINISHED_ALL_JOBS",
    "LIST_FINISHED_OF_JOB",
    "LIST_RUNNING_ALL_JOBS",
    "LIST_RUNNING_OF_JOB",
    "LIST_WAITING_ALL_JOBS",
    "LIST_WAITING_OF_JOB",
    "SCHEDULE_STATES",
    "THROUGHPUT",
    "loose_jobs",
]

WAITING: Final = "r.state = 'waiting'"
"""``<runs>_due_idx``'s predicate (``DUE_PREDICATE``), word for word."""
RUNNING: Final = "r.state = 'running'"
"""``<runs>_lease_idx``'s predicate (``LEASE_PREDICATE``), word for word."""
FINISHED: Final = (
    "r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = CAST(:state AS text)"
)
"""``<runs>_browse_idx``'s predicate (``FINISHED_PREDICATE``) word for word, then the state
asked: the literal lets a generic plan use the partial index, the parameter picks the state."""

_TENANT: Final = """
      -- F2: one tenant's runs only, filtered (the index does not hold the tenant): reads past
      -- the other tenants' runs in the range.
      AND (CAST(:tenant AS text) IS NULL OR r.tenant_id = CAST(:tenant AS text))"""


def loose_jobs(predicate: str, order: str, index: str, *, name: str = "jobs") -> str:
    """The jobs CTE ``name(job_id, n)`` of a page across jobs: a loose scan of ``index`` over
    the job ids with runs matching ``predicate``, at most ``:max_jobs``, then a row with job_id
    NULL. Each probe is ordered by ``order``, the leading columns of ``index`` after its
    equalities, so the planner reads that index (the one the pages read) rather than another
    with the same predicate. A bulk preview's count (:mod:`.count`) reads the same jobs."""
    return f"""{name}(job_id, n) AS (
    -- {index}, a loose index scan: the next job id with runs in the state (one probe each).
    SELECT (SELECT r.job_id FROM {{runs}} r WHERE {predicate}
            ORDER BY {order} LIMIT 1), 1
    UNION ALL
    SELECT (SELECT r.job_id FROM {{runs}} r
            WHERE {predicate} AND r.job_id > j.job_id
            ORDER BY {order} LIMIT 1), j.n + 1
    FROM {name} j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
)"""  # noqa: S608 - a template of constant text


_WAITING_ROWS: Final = """
SELECT f.* FROM (
    SELECT p.* FROM levels l
    CROSS JOIN LATERAL (
        -- <runs>_due_idx: one level's runs in (run_at, seq) order, at most :limit: past the
        -- cursor on the cursor's level, from the level's start below it. The row comparison
        -- follows the equalities on job_id and priority in the index, so it is the scan's
        -- start (an index condition), never a filter: runs tying on run_at (enqueued in one
        -- transaction) are not read again. seq breaks the ties, as the claim does. Only the
        -- index's columns are carried to the merge (issue 36: the merge sorted every level's
        -- full rows, jobs x levels x :limit of them, for :limit kept).
        SELECT r.job_id, r.priority, r.run_at, r.seq FROM {runs} r
        WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.priority = l.priority
          AND (r.run_at, r.seq) > (
              CASE WHEN l.priority = CAST(:after_priority AS smallint)
                   THEN CAST(:after_run_at AS timestamptz)
                   ELSE CAST('-infinity' AS timestamptz) END,
              CASE WHEN l.priority = CAST(:after_priority AS smallint)
                   THEN CAST(:after_seq AS bigint)
                   ELSE CAST(0 AS bigint) END){tenant}
        ORDER BY r.run_at, r.seq
        LIMIT CAST(:limit AS integer)
    ) p
    WHERE l.priority IS NOT NULL
    ORDER BY p.priority DESC, p.run_at, p.seq
    LIMIT CAST(:limit AS integer)
) k
CROSS JOIN LATERAL (
    -- the merged page's full rows: one <runs>_due_idx probe each, on all four of its columns
    SELECT {cols}, r.seq FROM {runs} r
    WHERE r.job_id = k.job_id AND r.state = 'waiting' AND r.priority = k.priority
      AND r.run_at = k.run_at AND r.seq = k.seq
) f
ORDER BY f.priority DESC, f.run_at, f.seq
LIMIT CAST(:limit AS integer)
""".replace("{tenant}", _TENANT)

# The levels from the cursor's down (all of them on a first page).
_WAITING_PAGE: Final = (
    ", "
    + levels("jobs", start="coalesce(CAST(:after_priority AS smallint), CAST(32767 AS smallint))")
    + _WAITING_ROWS
)

LIST_WAITING_OF_JOB: Final = Template(
    "WITH RECURSIVE jobs(job_id) AS (SELECT CAST(:job_id AS text))" + _WAITING_PAGE
)
"""A page of one job's waiting runs in claim order (``JobOperations.list_runs``)."""

LIST_WAITING_ALL_JOBS: Final = Template(
    "WITH RECURSIVE "
    + loose_jobs(WAITING, "r.job_id, r.priority", "<runs>_due_idx")
    + _WAITING_PAGE
)
"""A page of every job's waiting runs in claim order (priority, run_at, seq): each job's page,
merged."""

_RUNNING_IN_RANGE: Final = (
    """
    -- <runs>_lease_idx (job_id, lease_expires_at): the sargable bound starts the scan at the
    -- cursor's lease. The index holds no id, so the runs whose lease ties the cursor's (claimed,
    -- or heartbeated, in one statement: they share now() + lease) are read again and filtered
    -- by the row comparison after the index range, and ties are sorted by id over the index's
    -- order (an incremental sort): a batch of entries at most past :limit.
    WHERE r.job_id = {job} AND r.state = 'running'
      AND r.lease_expires_at >= coalesce(CAST(:after_at AS timestamptz),
                                         CAST('-infinity' AS timestamptz))
      AND (CAST(:after_at AS timestamptz) IS NULL
           OR (r.lease_expires_at, r.id)
              > (CAST(:after_at AS timestamptz), CAST(:after_id AS text)))"""
    + _TENANT
    + """
    ORDER BY r.lease_expires_at, r.id
    LIMIT CAST(:limit AS integer)
"""
)


def _pages(
    state: str, in_range: str, index_order: str, index: str, order: str
) -> tuple[Template, Template]:
    """(a page of one job's runs, a page of every job's runs, each job's page merged) for a
    state whose page of one job is ``in_range`` (its ``{job}`` the job) in ``order``; the loose
    scan over the jobs reads ``index`` in ``index_order``."""
    select = "SELECT {cols}, r.seq FROM {runs} r"
    of_job = select + in_range.replace("{job}", "CAST(:job_id AS text)")
    all_jobs = (
        "WITH RECURSIVE "
        + loose_jobs(state, index_order, index)
        + "\nSELECT p.* FROM jobs j\nCROSS JOIN LATERAL (\n    "
        + select
        + in_range.replace("{job}", "j.job_id")
        + f""") p
WHERE j.job_id IS NOT NULL
ORDER BY {order}
LIMIT CAST(:limit AS integer)
"""
    )
    return Template(of_job), Template(all_jobs)


LIST_RUNNING_OF_JOB, LIST_RUNNING_ALL_JOBS = _pages(
    RUNNING,
    _RUNNING_IN_RANGE,
    "r.job_id, r.lease_expires_at",
    "<runs>_lease_idx",
    "p.lease_expires_at, p.id",
)
"""A page of one job's running runs, soonest lease to lapse first (lapsed leases first); and
of every job's running runs, each job's page merged."""


def _keyset_range(alias: str, column: str, *, index_bound: bool = False) -> str:
    """A newest-first page's range on ``<column>_at`` for the table aliased ``alias``:
    ``[:<column>_from, :<column>_to)`` and strictly before the cursor ``(:after_at,
    :after_id)``, the bound the earlier of the cursor and ``:<column>_to``; one tenant's runs
    only when ``:tenant`` is given; with ``index_bound``, the bound also as a plain comparison
    on the column (an index condition where the index holds no id, see :func:`finish_range`)."""
    at, upper = f"{column}_at", f"CAST(:{column}_to AS timestamptz)"
    bound = (
        f"""
      AND ?.{at} <= least(
          coalesce(CAST(:after_at AS timestamptz), CAST('infinity' AS timestamptz)),
          coalesce({upper}, CAST('infinity' AS timestamptz)))"""
        if index_bound
        else ""
    )
    return (
        f"""
      AND ?.{at} >= coalesce(CAST(:{column}_from AS timestamptz),
                             CAST('-infinity' AS timestamptz))
      AND ?.{at} < coalesce({upper}, CAST('infinity' AS timestamptz)){bound}
      AND (?.{at}, ?.id) < (
          least(coalesce(CAST(:after_at AS timestamptz), CAST('infinity' AS timestamptz)),
                coalesce({upper}, CAST('infinity' AS timestamptz))),
          CASE WHEN coalesce(CAST(:after_at AS timestamptz), CAST('infinity' AS timestamptz))
                    < coalesce({upper}, CAST('infinity' AS timestamptz))
               THEN coalesce(CAST(:after_id AS text), '') ELSE '' END)
      AND (CAST(:tenant AS text) IS NULL OR ?.tenant_id = CAST(:tenant AS text))
    ORDER BY ?.{at} DESC, ?.id DESC
    LIMIT CAST(:limit AS integer)"""
    ).replace("?", alias)


def creation_range(alias: str) -> str:
    """A page's range in creation order (the finished states but completed) for the table
    aliased ``alias``: ``[:created_from, :created_to)`` and strictly before the cursor
    ``(:after_at, :after_id)``, the bound the earlier of the cursor and ``:created_to``; one
    tenant's runs only when ``:tenant`` is given (F2: filtered, the index does not hold the
    tenant, so the scan reads past the other tenants' runs in the range); newest first."""
    return _keyset_range(alias, "created")


_FINISHED_IN_RANGE: Final = (
    """
    -- <runs>_browse_idx (state, job_id, created_at, id), partial on the finished states, read
    -- backwards from the cursor to created_from. The row comparison follows the equalities on
    -- state and job_id in the index, so it is the scan's start (an index condition, written
    -- without an OR so a generic plan can use it: no cursor is ('infinity', '')), never a
    -- filter: runs tying on created_at (enqueued in one transaction) are not read again. Its
    -- bound is the cursor or created_to, whichever is earlier: the scan starts there (with
    -- ('infinity', '') and created_to beside it, PostgreSQL started at the job's newest run
    -- and read every run newer than created_to, 15 ms a job at 1M runs, issue 36).
    WHERE """
    + FINISHED
    + " AND r.job_id = {job}"
    + creation_range("r")
    + "\n"
)

LIST_FINISHED_OF_JOB, LIST_FINISHED_ALL_JOBS = _pages(
    FINISHED,
    _FINISHED_IN_RANGE,
    "r.job_id, r.created_at",
    "<runs>_browse_idx",
    "p.created_at DESC, p.id DESC",
)
"""A page of one job's runs in one finished state, newest first; and of every job's, each
job's page merged."""

COMPLETED: Final = (
    "r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'completed'"
)
"""``<runs>_finished_idx``'s and ``<runs>_browse_idx``'s predicate word for word, then the
completed state (J18's finish order)."""


def finish_range(alias: str) -> str:
    """A page's range in finish order (J18, completed runs) for the table aliased ``alias``:
    ``[:finished_from, :finished_to)`` and strictly before the cursor ``(:after_at,
    :after_id)``, newest finished first. An index on ``finished_at`` without the id (history's
    ``<history>_job_idx``, ``<runs>_finished_idx``) starts its backward scan at the bound's
    ``finished_at`` (an index condition) and the row comparison filters the cursor's ties;
    the order's ties (one settle batch's runs) are sorted by id over the index's order (an
    incremental sort: one batch's group at most past ``:limit``)."""
    return _keyset_range(alias, "finished", index_bound=True)


_COMPLETED_IN_RANGE: Final = (
    """
    -- <runs>_finished_idx (job_id, finished_at), partial on the finished states, read
    -- backwards from the cursor to finished_from (J18's finish order); the state is filtered.
    WHERE """
    + COMPLETED
    + " AND r.job_id = {job}"
    + finish_range("r")
    + "\n"
)

LIST_COMPLETED_OF_JOB, LIST_COMPLETED_ALL_JOBS = _pages(
    COMPLETED,
    _COMPLETED_IN_RANGE,
    "r.job_id, r.created_at",
    "<runs>_browse_idx",
    "p.finished_at DESC, p.id DESC",
)
"""A page of one job's completed runs, newest finished first (J18); and of every job's, each
job's page merged."""

DEAD_ERRORS: Final = Template("""
SELECT r.id, r.job_id, r.last_error, r.finished_at FROM {runs} r
-- <runs>_browse_idx (state, job_id, created_at, id) read backwards: one job's newest dead runs
WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'
  AND r.job_id = CAST(:job_id AS text)
ORDER BY r.created_at DESC, r.id DESC
LIMIT CAST(:limit AS integer)
""")
"""The error groups' read of one job (issue 36 items 1 and 6): its newest ``:limit`` dead runs,
newest created first, as LIST_FINISHED_OF_JOB reads them, but only the four columns the
grouping needs (id, job, error, finish time): one statement, not pages of full rows."""

THROUGHPUT: Final = Template("""
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
            -- <runs>_finished_idx: one job's runs finished in the bucket, at most :cap, in
            -- the index's order: a plain index scan that stops at :cap (unordered, the planner
            -- chose a bitmap scan that first read every entry of the bucket: 770,000 entries
            -- per chart at 1,000,000 runs).
            SELECT r.state FROM {runs} r
            WHERE r.job_id = j.job_id
              AND r.state IN ('completed', 'dead', 'discarded', 'cancelled')
              AND r.finished_at >= e.start AND r.finished_at < e.stop
            ORDER BY r.finished_at
            LIMIT CAST(:cap AS integer)
        ) x
    ) c
    WHERE j.job_id IS NOT NULL
) t
ORDER BY e.start
""")
"""Runs completed and dead per bucket, over every job (at most ``:max_jobs``), oldest bucket
first; ``capped`` where a job's bucket reached ``:cap`` finished runs."""

SCHEDULE_STATES: Final = Template("""
SELECT s.job_id, s.trigger, s.next_at, s.updated_at
FROM {state} s
-- <state>_pkey in job id order; the state table holds a few rows per job (schedule, pause,
-- gates), never one per run. A schedule's row is the job's id itself: a job's other rows
-- (<job_id>#<kind>) may carry a trigger too (the last build to unpark it, D10), and a job id
-- never holds '#'.
WHERE s.trigger IS NOT NULL AND strpos(s.job_id, '#') = 0
ORDER BY s.job_id
LIMIT CAST(:limit AS integer)
""")
"""The scheduled jobs' state rows (J9): trigger, next occurrence, last change."""

CONSUMER_PROGRESS: Final = Template("""
WITH RECURSIVE pairs(job_id, key, n) AS (
    -- <runs>_progress_idx (job_id, key, seq), a loose index scan over the (consumer, key) pairs
    -- with recorded progress (its predicate word for word), from the page's start: one probe
    -- each, at most :limit.
    (SELECT r.job_id, r.key, 1 FROM {runs} r
     WHERE r.progress IS NOT NULL
       AND (r.job_id, r.key) > (coalesce(CAST(:after_job AS text), ''),
                                coalesce(CAST(:after_key AS text), ''))
     ORDER BY r.job_id, r.key LIMIT 1)
    UNION ALL
    SELECT x.job_id, x.key, p.n + 1 FROM pairs p
    CROSS JOIN LATERAL (
        SELECT r.job_id, r.key FROM {runs} r
        WHERE r.progress IS NOT NULL AND (r.job_id, r.key) > (p.job_id, p.key)
        ORDER BY r.job_id, r.key LIMIT 1
    ) x
    WHERE p.n < CAST(:limit AS integer)
)
SELECT p.job_id, p.key, latest.id AS run_id, latest.state, latest.progress,
       live.id AS live_run_id, live.state AS live_state
FROM pairs p
CROSS JOIN LATERAL (
    -- <runs>_progress_idx: the key's newest run with progress (the last batch committed).
    SELECT r.id, r.state, r.progress FROM {runs} r
    WHERE r.progress IS NOT NULL AND r.job_id = p.job_id AND r.key = p.key
    ORDER BY r.seq DESC LIMIT 1
) latest
LEFT JOIN LATERAL (
    -- <runs>_dedupe_idx: the key's live run (C2: a consumer's runs are deduplicated by key).
    SELECT r.id, r.state FROM {runs} r
    WHERE r.dedupe_key IS NOT NULL AND r.state IN ('waiting', 'running')
      AND r.job_id = p.job_id AND r.dedupe_key = p.key
    LIMIT 1
) live ON true
ORDER BY p.job_id, p.key
""")
"""C3: at most ``:limit`` consumer keys with recorded progress, by (consumer id, key) after
(``:after_job``, ``:after_key``) (NULL: from the first): each key's newest run with progress
(its id, state and progress) and its live (waiting or running) run, if any."""
