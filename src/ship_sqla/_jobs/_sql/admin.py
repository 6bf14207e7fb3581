"""The administration statements (J8) and the stats (J10's queue gauges, ``jobs stats``): what
the :class:`~ship_sqla.kernel.RunAdmin` port of the PostgreSQL backend runs. Rules: see
:mod:`ship_sqla._jobs._sql`. Partial-index predicates are written as ``_tables.py`` declares
them, as literals: ``state = 'dead'`` alone does not imply ``state IN ('completed', 'dead',
'discarded', 'cancelled')`` for a generic plan's benefit, so both appear.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._jobs._sql._levels import levels
from ship_sqla._sql import Template

__all__ = [
    "CANCEL_LIVE_RUN",
    "DEAD_BY_JOB",
    "DEAD_BY_JOB_EITHER",
    "DELETE_FINISHED_BATCH",
    "DEMAND",
    "DISCARD_WAITING_OR_DEAD",
    "GET_RUN",
    "JOB_KNOWN",
    "LIST_DEAD_ALL_JOBS",
    "LIST_DEAD_OF_JOB",
    "LIST_PAUSED",
    "PARTITION_WAITS",
    "PARTITION_WAITS_BY_KEY",
    "PAUSE_JOB",
    "QUEUE_DEPTHS",
    "RESUME_JOB",
    "RETRY_DEAD",
    "STATE_COUNTS",
    "TELL_FENCED_HOLDER",
]

GET_RUN: Final = Template("SELECT {cols} FROM {runs} r WHERE r.id = :id")
"""One run with its history. Served by ``<runs>_pkey``."""

_DEAD_PAGE_AFTER_CURSOR: Final = """
  -- The sargable bound starts the index scan at the cursor (a generic plan cannot use the row
  -- comparison below as an index condition); the row comparison breaks finished_at ties by id.
  AND r.finished_at <= coalesce(CAST(:after_at AS timestamptz), CAST('infinity' AS timestamptz))
  AND (CAST(:after_at AS timestamptz) IS NULL
       OR (r.finished_at, r.id) < (CAST(:after_at AS timestamptz), CAST(:after_id AS text)))
  -- F2: one tenant's runs only, filtered (the index does not lead with the tenant).
  AND (CAST(:tenant AS text) IS NULL OR r.tenant_id = CAST(:tenant AS text))
ORDER BY r.finished_at DESC, r.id DESC
LIMIT CAST(:limit AS integer)
"""
"""The keyset tail both dead-run pages share: past the cursor, newest first, one page."""

LIST_DEAD_OF_JOB: Final = Template(
    """
SELECT {cols} FROM {runs} r
-- <runs>_finished_idx (job_id, finished_at) read backwards: newest dead runs first, keyset on
-- (finished_at, id), at most :limit rows past the cursor.
WHERE r.job_id = :job_id AND r.state IN ('completed', 'dead', 'discarded', 'cancelled')
  AND r.state = 'dead'
"""
    + _DEAD_PAGE_AFTER_CURSOR
)
"""A page of one job's dead runs (``list_dead`` of a job)."""

LIST_DEAD_ALL_JOBS: Final = Template(
    """
SELECT {cols} FROM {runs} r
-- <runs>_finished_idx: its predicate limits the read to terminal runs, but job_id leads the
-- index, so across jobs the rows are filtered to 'dead' and top-N sorted (bounded by :limit, not
-- by the number of completed runs kept; run cleanup to keep that number small).
WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'
"""
    + _DEAD_PAGE_AFTER_CURSOR
)
"""A page of every job's dead runs (``list_dead`` of every job)."""

RETRY_DEAD: Final = Template("""
UPDATE {runs} r
SET state = 'waiting', max_attempts = r.attempt + 1, run_at = {now}, finished_at = NULL,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now},
    -- J15: a retried run starts a new streak (its crash loop's cause is taken to be fixed).
    consecutive_lapses = 0
-- <runs>_pkey. Not while a newer live run holds the dedupe key (<runs>_dedupe_idx, probed with
-- its predicate word for word): reviving this run would break J1. A concurrent enqueue that
-- wins the race anyway trips that unique index (23505).
WHERE r.id = :id AND r.state = 'dead'
  AND NOT EXISTS (
    SELECT 1 FROM {runs} o
    WHERE o.job_id = r.job_id AND o.dedupe_key = r.dedupe_key
      AND o.dedupe_key IS NOT NULL AND o.state IN ('waiting', 'running'))
RETURNING {cols}
""")
"""Operator retry (J8): a dead run waits again, due now, with exactly one more attempt."""

DISCARD_WAITING_OR_DEAD: Final = Template("""
UPDATE {runs} r
SET state = 'discarded', finished_at = {now}, updated_at = {now}, lease_expires_at = NULL,
    claimed_by = NULL
-- <runs>_pkey. A running run is never discarded under its holder (it settles first).
WHERE r.id = :id AND r.state IN ('waiting', 'dead')
RETURNING {cols}
""")
"""Operator discard (J8): a waiting or dead run becomes terminal."""

CANCEL_LIVE_RUN: Final = Template("""
WITH changed AS (
    UPDATE {runs} r
    SET state = CASE WHEN r.state = 'waiting' THEN 'cancelled' ELSE r.state END,
        finished_at = CASE WHEN r.state = 'waiting' THEN {now} ELSE r.finished_at END,
        -- A repeated request changes nothing (the first one's time is kept).
        cancel_requested_at = CASE WHEN r.state = 'running'
            THEN coalesce(r.cancel_requested_at, {now}) END,
        -- J18: a running run's updated_at stays its attempt's start (ship_sqla._sql.BEGAN).
        updated_at = CASE WHEN r.state = 'waiting' THEN {now} ELSE r.updated_at END
    -- <runs>_pkey. Fenced on the live states (SPEC §10: a cancel that matched "not completed"
    -- once rewrote a dead letter): a finished run is never touched. The row lock orders this
    -- with a racing settle or claim: whichever comes second reads the other's row.
    WHERE r.id = :id AND r.state IN ('waiting', 'running')
    RETURNING {cols}
)
-- The holder is told in this transaction, so on its commit (K2; payload: the run id).
SELECT c.*, CASE WHEN c.state = 'running'
    THEN CAST(pg_notify(CAST(:channel AS text), c.id) AS text) END IS NOT NULL AS told
FROM changed c
""")
"""Operator cancel (K2): a waiting run becomes cancelled at once; a running run's request is
recorded (the first request's time is kept) and announced on the backend's cancel channel,
whose listeners (the runtimes of every process) cancel the handler; the holder's heartbeat
answers it too. One row (the run as it is after) or none: the run is finished or unknown."""

TELL_FENCED_HOLDER: Final = Template("""
SELECT CAST(pg_notify(CAST(:channel AS text), r.id) AS text) IS NOT NULL AS told
FROM {runs} r
-- <runs>_pkey, one probe. FOR KEY SHARE conflicts with FOR UPDATE alone: the row is skipped
-- while a transactional handler's fence holds it (J13), not while a settle or a heartbeat
-- updates it.
WHERE r.id = :id AND r.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM {runs} l WHERE l.id = :id FOR KEY SHARE SKIP LOCKED)
""")
"""K2 with J13: a running run whose row a transactional handler's transaction holds takes no
cancel request until that transaction ends (CANCEL_LIVE_RUN would wait for the handler, which
would then commit). Its holder is told first, in a statement of its own (delivered on its
commit, at once outside a unit of work), so its handler is cancelled and its transaction rolls
back; the request is then recorded. One row (``told``) or none: no fence holds the run."""

PAUSE_JOB: Final = Template("""
INSERT INTO {state} AS p (job_id, updated_at)
VALUES (CAST(:pause_row AS text), {now})
ON CONFLICT (job_id) DO NOTHING
RETURNING p.job_id
""")
"""Operator pause (K3): the job's ``<job_id>#paused`` row in the state table, which every claim
reads in its own statement (the claim's paused CTE); a row back: this call paused the job. Index:
``<state>_pkey`` (the ON CONFLICT arbiter)."""

RESUME_JOB: Final = Template("""
WITH resumed AS (
    DELETE FROM {state} p WHERE p.job_id = CAST(:pause_row AS text) RETURNING p.job_id
)
-- K3: the job's waiting runs are claimable at once; wake the listeners (K1's announcement of
-- the job, as an enqueue sends it).
SELECT CAST(pg_notify(CAST(:channel AS text), CAST(:payload AS text)) AS text) IS NOT NULL
    AS told
FROM resumed
""")
"""Operator resume (K3): deletes the pause row and announces the job on the backend's wake
channel in the same transaction; a row back: the job was paused. Index: ``<state>_pkey``."""

LIST_PAUSED: Final = Template("""
SELECT left(p.job_id, -length('#paused')) AS job_id, p.updated_at AS paused_at
FROM {state} p
WHERE p.job_id LIKE '%#paused'
ORDER BY left(p.job_id, -length('#paused')) COLLATE "C"
LIMIT CAST(:limit AS integer)
""")
"""The paused jobs, by job id (byte order, as the in-memory backend sorts them). Operator-only:
it reads the state table (one row per scheduled, capped or paused job), not the runs."""

DELETE_FINISHED_BATCH: Final = Template("""
DELETE FROM {runs} d
WHERE d.id = ANY(ARRAY(
    -- <runs>_finished_idx (job_id, finished_at), predicate word for word: one job's runs in one
    -- terminal state finished at least :retention seconds ago, oldest first, one bounded batch.
    SELECT r.id FROM {runs} r
    WHERE r.job_id = :job_id AND r.state IN ('completed', 'dead', 'discarded', 'cancelled')
      AND r.state = CAST(:state AS text)
      AND r.finished_at <= {now} - CAST(:retention AS double precision) * interval '1 second'
    ORDER BY r.finished_at
    LIMIT CAST(:batch AS integer)
))
""")
"""Cleanup (J8 retention): delete one bounded batch; each batch is its own short transaction."""

QUEUE_DEPTHS: Final = Template("""
SELECT j.job_id, q.depth,
    coalesce(extract(epoch FROM {now} - q.oldest_due), 0) AS oldest_due_age
FROM unnest(CAST(:job_ids AS text[])) AS j(job_id)
CROSS JOIN LATERAL (
    -- <runs>_due_idx: an index-only scan of one job's waiting runs (due or delayed).
    SELECT count(*) AS depth, min(r.run_at) FILTER (WHERE r.run_at <= {now}) AS oldest_due
    FROM {runs} r
    WHERE r.job_id = j.job_id AND r.state = 'waiting'
) q
""")
"""J10's queue gauges for the given jobs (every one answered, 0 when empty). Costs one entry
read per waiting run, so the runtime samples it every ``DEPTH_SAMPLE_INTERVAL`` seconds, not
per claim."""

_DEMAND_JOBS: Final = """
WITH RECURSIVE waiting_jobs(job_id, n) AS (
    -- <runs>_due_idx, a loose index scan: the next job id with waiting runs, one probe each.
    SELECT (SELECT min(r.job_id) FROM {runs} r WHERE r.state = 'waiting'), 1
    UNION ALL
    SELECT (SELECT min(r.job_id) FROM {runs} r WHERE r.state = 'waiting' AND r.job_id > w.job_id),
        w.n + 1
    FROM waiting_jobs w
    WHERE w.job_id IS NOT NULL AND w.n < CAST(:max_jobs AS integer) AND CAST(:all_jobs AS boolean)
), running_jobs(job_id, n) AS (
    -- <runs>_lease_idx, the same walk over the running runs.
    SELECT (SELECT min(r.job_id) FROM {runs} r WHERE r.state = 'running'), 1
    UNION ALL
    SELECT (SELECT min(r.job_id) FROM {runs} r WHERE r.state = 'running' AND r.job_id > w.job_id),
        w.n + 1
    FROM running_jobs w
    WHERE w.job_id IS NOT NULL AND w.n < CAST(:max_jobs AS integer) AND CAST(:all_jobs AS boolean)
), jobs(job_id) AS (
    SELECT j.job_id FROM unnest(CAST(:job_ids AS text[])) AS j(job_id)
    UNION
    SELECT w.job_id FROM waiting_jobs w WHERE w.job_id IS NOT NULL AND CAST(:all_jobs AS boolean)
    UNION
    SELECT w.job_id FROM running_jobs w WHERE w.job_id IS NOT NULL AND CAST(:all_jobs AS boolean)
), chosen AS (
    SELECT job_id FROM jobs ORDER BY job_id COLLATE "C" LIMIT CAST(:max_jobs AS integer)
), """

_DEMAND_COUNTS: Final = """, per_level AS (
    -- <runs>_due_idx, index-only: per level at most :cap due and :cap delayed entries, and the
    -- level's oldest due run (its first entry).
    SELECT l.job_id,
        (SELECT count(*) FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.priority = l.priority
              AND r.run_at <= {now}
            LIMIT CAST(:cap AS integer)) d) AS due,
        (SELECT count(*) FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.priority = l.priority
              AND r.run_at > {now}
            LIMIT CAST(:cap AS integer)) d) AS delayed,
        (SELECT min(r.run_at) FROM {runs} r
         WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.priority = l.priority
           AND r.run_at <= {now}) AS oldest_due
    FROM levels l
    WHERE l.priority IS NOT NULL
)
SELECT c.job_id,
    least(coalesce(sum(p.due), 0), CAST(:cap AS integer)) AS due,
    least(coalesce(sum(p.delayed), 0), CAST(:cap AS integer)) AS delayed,
    -- <runs>_lease_idx: at most :cap entries.
    (SELECT count(*) FROM (
        SELECT 1 FROM {runs} r WHERE r.job_id = c.job_id AND r.state = 'running'
        LIMIT CAST(:cap AS integer)) x) AS running,
    extract(epoch FROM {now} - min(p.oldest_due)) AS oldest_due_age
FROM chosen c
LEFT JOIN per_level p ON p.job_id = c.job_id
GROUP BY c.job_id
ORDER BY c.job_id COLLATE "C"
"""

# <runs>_due_idx: each job's priority levels in use, so every count is a range of one level's
# entries.
DEMAND: Final = Template(_DEMAND_JOBS + levels("chosen") + _DEMAND_COUNTS)
"""F5 demand (``JobOperations.demand``, ``ship-sqla jobs demand``): per job the due, delayed and
running runs, each counted up to ``:cap``, and the oldest due run's age, for the jobs of
``:job_ids``, and with ``:all_jobs`` also every job with waiting or running runs (found by a loose
index scan, at most ``:max_jobs``). Bounded at any backlog: at most about ``:cap`` index entries
per kind and priority level of each job, plus one probe per level and per job found."""

STATE_COUNTS: Final = Template("""
SELECT r.job_id, r.state, count(*) AS runs,
       extract(epoch FROM {now}
               - min(r.run_at) FILTER (WHERE r.state = 'waiting' AND r.run_at <= {now}))
           AS oldest_due_age
FROM {runs} r
GROUP BY r.job_id, r.state
ORDER BY r.job_id COLLATE "C", r.state COLLATE "C"
LIMIT CAST(:limit AS integer)
""")
"""Runs per (job, state) and the age of each job's oldest due waiting run (``state_counts``,
``ship-sqla jobs stats``). Operator-invoked, never on a hot path: it aggregates the whole runs
table (a sequential scan; cleanup keeps the table bounded by each job's retention). At most
``:limit`` groups, in byte order of the job id then the state (as the in-memory backend sorts
them, whatever the database's collation)."""

JOB_KNOWN: Final = Template("""
-- Whether the job tables hold any trace of one job (issue 25: what pause reports as known).
-- Four index probes, whatever the number of runs: a waiting run through <runs>_due_idx, a
-- running one through <runs>_lease_idx, a finished one through <runs>_finished_idx (each
-- predicate word for word the index's), and the job's state rows (its schedule, pause, claim
-- gate, enqueue gate) through <state>_pkey.
SELECT EXISTS (
           SELECT 1 FROM {runs} r
           WHERE r.job_id = CAST(:job_id AS text) AND r.state = 'waiting')
    OR EXISTS (
           SELECT 1 FROM {runs} r
           WHERE r.job_id = CAST(:job_id AS text) AND r.state = 'running')
    OR EXISTS (
           SELECT 1 FROM {runs} r
           WHERE r.job_id = CAST(:job_id AS text)
             AND r.state IN ('completed', 'dead', 'discarded', 'cancelled'))
    OR EXISTS (
           SELECT 1 FROM {state} s WHERE s.job_id = ANY(CAST(:state_rows AS text[])))
    AS known
""")
"""The admin port's ``job_known`` (:class:`~ship_sqla.kernel.RunAdmin`). Operator-only, never
hot."""


_PARTITION_WAITS: Final = """
WITH RECURSIVE limits AS (
    SELECT l.i, l.job_id, l.gate, l.max_running, l.rate_limit, l.rate_period
    FROM unnest(CAST(:job_ids AS text[]), CAST(:gates AS text[]),
                CAST(:max_runnings AS integer[]), CAST(:rate_limits AS integer[]),
                CAST(:rate_periods AS double precision[]))
        WITH ORDINALITY AS l(job_id, gate, max_running, rate_limit, rate_period, i)
), walk (i, tenant, k) AS (
    -- <runs>_tenant_idx, a loose index scan per job: its next tenant with waiting runs, one
    -- entry each, at most :max_partitions.
    SELECT l.i, CAST(NULL AS text), 0 FROM limits l
    UNION ALL
    SELECT w.i, nxt.tenant, w.k + 1
    FROM walk w
    JOIN limits l ON l.i = w.i
    CROSS JOIN LATERAL (
        SELECT r.tenant_id AS tenant FROM {runs} r
        WHERE r.job_id = l.job_id AND r.state = 'waiting'
          AND r.tenant_id > coalesce(w.tenant, '')
        ORDER BY r.tenant_id
        LIMIT 1
    ) nxt
    WHERE w.k < CAST(:max_partitions AS integer)
), parts AS (
    SELECT w.i, w.tenant, w.k FROM walk w WHERE w.k > 0
    UNION ALL
    -- The untenanted runs, one partition more when any is due (one probe).
    SELECT l.i, CAST(NULL AS text), 2147483647 FROM limits l
    WHERE (SELECT r.run_at FROM {runs} r
           WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.tenant_id IS NULL
             AND r.run_at <= {now}
           ORDER BY r.tenant_id, r.run_at
           LIMIT 1) IS NOT NULL
)
SELECT l.job_id, p.tenant,
    -- <runs>_tenant_idx, index-only: the partition's due runs, up to :cap.
    CASE WHEN p.tenant IS NULL THEN (SELECT count(*) FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.tenant_id IS NULL
              AND r.run_at <= {now}
            ORDER BY r.tenant_id, r.run_at
            LIMIT CAST(:cap AS integer)) d)
        ELSE (SELECT count(*) FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = l.job_id AND r.state = 'waiting' AND r.tenant_id = p.tenant
              AND r.run_at <= {now}
            ORDER BY r.tenant_id, r.run_at
            LIMIT CAST(:cap AS integer)) d) END AS due,
    -- <runs>_running_idx: its running runs, up to concurrency.max (none read without a cap).
    CASE WHEN l.max_running IS NULL THEN 0
        WHEN p.tenant IS NULL THEN (SELECT count(*) FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = l.job_id AND r.state = 'running' AND r.tenant_id IS NULL
            ORDER BY r.tenant_id
            LIMIT l.max_running) h)
        ELSE (SELECT count(*) FROM (
            SELECT 1 FROM {runs} r
            WHERE r.job_id = l.job_id AND r.state = 'running' AND r.tenant_id = p.tenant
            ORDER BY r.tenant_id
            LIMIT l.max_running) h) END AS running,
    -- <state>_pkey: the partition's gate (F8): its starts in the window ending at the gate's
    -- time (never before its last recorded start), and the oldest of them.
    CASE WHEN l.rate_limit IS NULL THEN 0 ELSE coalesce((
        SELECT sum(u.n) FROM unnest(g.rate_at, g.rate_n) AS u(at, n)
        WHERE u.n > 0 AND u.at > greatest({now}, g.rate_at[cardinality(g.rate_at)])
            - l.rate_period * interval '1 second'), 0) END AS started,
    CASE WHEN l.rate_limit IS NOT NULL THEN (
        SELECT min(u.at) FROM unnest(g.rate_at, g.rate_n) AS u(at, n)
        WHERE u.n > 0 AND u.at > greatest({now}, g.rate_at[cardinality(g.rate_at)])
            - l.rate_period * interval '1 second') END AS oldest_start
FROM parts p
JOIN limits l ON l.i = p.i
LEFT JOIN {state} g ON g.job_id = l.gate || '/' || coalesce(p.tenant, '')
ORDER BY p.i, p.k
"""

PARTITION_WAITS: Final = Template(_PARTITION_WAITS)
"""F8/F9 seen (``JobOperations.partition_waits``, the dashboard, the demand endpoint): per job of
``:job_ids`` (with its partitioned limits and gate row prefix), each partition with waiting runs
(tenant order, at most ``:max_partitions``; the untenanted runs one more), its due runs (up to
``:cap``), running runs (up to ``concurrency.max``) and its rate window's starts and oldest
start; the kernel judges which wait on a limit (:mod:`ship_sqla.kernel._partition_waits`).
Bounded at any backlog: per job about ``:max_partitions`` x (one walk entry, ``:cap`` due
entries, ``max`` running entries, one gate row)."""

PARTITION_WAITS_BY_KEY: Final = Template(
    _PARTITION_WAITS.replace("r.tenant_id", "r.partition_key")
    .replace("_tenant_idx", "_part_idx")
    .replace("_running_idx", "_part_run_idx")
)
""":data:`PARTITION_WAITS` for limits per partition key (``partition="key"``): the partitions
are the runs' ``partition_key``, read off ``<runs>_part_idx`` and ``<runs>_part_run_idx``."""


_DEAD_IN_RUNS: Final = (
    "r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'"
)
"""``<runs>_browse_idx``'s predicate word for word, then the dead state (its leading column)."""

_DEAD_JOBS_WALK: Final = f"""
    -- <runs>_browse_idx (state, job_id, created_at, id), a loose index scan: the next job id
    -- with dead runs, one entry each, at most :max_jobs.
    SELECT (SELECT r.job_id FROM {{runs}} r WHERE {_DEAD_IN_RUNS}
            ORDER BY r.state, r.job_id LIMIT 1), 1
    UNION ALL
    SELECT (SELECT r.job_id FROM {{runs}} r WHERE {_DEAD_IN_RUNS} AND r.job_id > d.job_id
            ORDER BY r.state, r.job_id LIMIT 1), d.n + 1
    FROM dead_jobs d
    WHERE d.job_id IS NOT NULL AND d.n < CAST(:max_jobs AS integer)"""  # noqa: S608 - constant

_DEAD_OF_JOB_IN_RUNS: Final = f"""
        -- <runs>_browse_idx, index-only: at most :cap of the job's dead runs.
        SELECT 1 FROM {{runs}} r WHERE {_DEAD_IN_RUNS} AND r.job_id = d.job_id
        LIMIT CAST(:cap AS integer)"""  # noqa: S608 - constant text

_NEWEST_DEAD_IN_RUNS: Final = f"""
        -- <runs>_browse_idx backwards: the job's newest dead run (one entry, one heap row).
        SELECT r.finished_at FROM {{runs}} r WHERE {_DEAD_IN_RUNS} AND r.job_id = d.job_id
        ORDER BY r.state DESC, r.job_id DESC, r.created_at DESC, r.id DESC LIMIT 1"""  # noqa: S608

DEAD_BY_JOB: Final = Template(
    f"""
WITH RECURSIVE dead_jobs(job_id, n) AS ({_DEAD_JOBS_WALK}
)
SELECT d.job_id,
    (SELECT count(*) FROM ({_DEAD_OF_JOB_IN_RUNS}) x) AS dead,
    ({_NEWEST_DEAD_IN_RUNS}) AS last_dead_at
FROM dead_jobs d
WHERE d.job_id IS NOT NULL
ORDER BY d.job_id COLLATE "C"
"""  # noqa: S608 - constant text
)
"""The overview's failing jobs (issue 36, S2): every job with dead runs (a loose scan, at most
``:max_jobs``), each with its dead runs counted up to ``:cap`` and the finish time of its newest
(by creation) dead run. Bounded whatever the table size: one probe per job found, at most
``:cap`` index entries and one heap row per job. Nothing is added to the hot path: the index
is the finished-runs pages' own (a run enters it once, when it finishes)."""

DEAD_BY_JOB_EITHER: Final = Template(
    f"""
WITH RECURSIVE dead_jobs(job_id, n) AS ({_DEAD_JOBS_WALK}
), history_jobs(job_id, n) AS (
    -- the history's (job_id, state, finished_at) index over its dead partitions, a loose
    -- index scan: the next job id with dead runs in history, at most :max_jobs.
    SELECT (SELECT min(h.job_id) FROM {{history}} h WHERE h.state = 'dead'), 1
    UNION ALL
    SELECT (SELECT min(h.job_id) FROM {{history}} h
            WHERE h.state = 'dead' AND h.job_id > d.job_id), d.n + 1
    FROM history_jobs d
    WHERE d.job_id IS NOT NULL AND d.n < CAST(:max_jobs AS integer)
), jobs AS (
    SELECT job_id FROM dead_jobs WHERE job_id IS NOT NULL
    UNION
    SELECT job_id FROM history_jobs WHERE job_id IS NOT NULL
)
SELECT d.job_id,
    least(CAST(:cap AS integer), (SELECT count(*) FROM ({_DEAD_OF_JOB_IN_RUNS}) x)
        + (SELECT count(*) FROM (
            -- the history's index, each dead partition: at most :cap of the job's dead runs.
            SELECT 1 FROM {{history}} h WHERE h.state = 'dead' AND h.job_id = d.job_id
            LIMIT CAST(:cap AS integer)) y)) AS dead,
    greatest(({_NEWEST_DEAD_IN_RUNS}),
        (SELECT max(h.finished_at) FROM {{history}} h
         WHERE h.state = 'dead' AND h.job_id = d.job_id)) AS last_dead_at
FROM (SELECT job_id FROM jobs ORDER BY job_id COLLATE "C"
      LIMIT CAST(:max_jobs AS integer)) d
ORDER BY d.job_id COLLATE "C"
"""  # noqa: S608 - constant text
)
"""DEAD_BY_JOB over both tables (J16): the runs table's dead runs (an older release's, or a
table without history) and the history's."""
