"""Live runs only (J16) and slim history rows (J18): the statements of a backend given a
history table (``create_job_backend(history_table=...)``). Rules: see :mod:`ship_sqla._jobs._sql`.

The statement that ends a run moves it: ``DELETE ... RETURNING`` from the runs table feeds an
``INSERT`` into ``{history}`` in the SAME statement, fenced on the claim token exactly as the
in-place settle (J5), so a run is in exactly one of the two tables in every snapshot. What
stays live (a handler's retry, release or snooze) is still an UPDATE of the live row. An
operator's retry of a dead run moves it back the same way (J8). Every read of finished runs
reads both tables: history, and the runs table for finished rows an older release left there
(or a claim's buried runs before MOVE_FINISHED moves them: the claim itself is unchanged).

A history row is slim (J18): no lease, no wait, no cancel request; ``payload`` and
``trace_context`` are kept for dead, cancelled and discarded runs (retry needs them) and for a
completed run only when its job asks (``Retention(completed_payload=True)``) or it is a
workflow run with stored steps (D11's export reads it); ``history`` NULL for no entries.
``Retention(completed=timedelta(0))`` writes no history row at all for a completed run.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._jobs._sql import admin, browse, enqueue
from ship_sqla._jobs._sql._moves import HISTORY_COLUMNS, INSERT_BACK, insert_ended
from ship_sqla._jobs._sql.settle import SETTLE_INPUTS, settle_batch
from ship_sqla._sql import Template

__all__ = [  # noqa: RUF022
    "CANCEL_MOVING",
    "CHILDREN_EITHER",
    "CLAIM_STATE_EITHER",
    "CONSUMER_PROGRESS_EITHER",
    "DEAD_ERRORS_EITHER",
    "DISCARD_DEAD_IN_HISTORY",
    "DISCARD_WAITING_MOVING",
    "ENQUEUE_MANY_EITHER",
    "JOB_KNOWN_EITHER",
    "LIST_FINISHED_ALL_JOBS_EITHER",
    "LIST_FINISHED_OF_JOB_EITHER",
    "LIST_COMPLETED_ALL_JOBS_EITHER",
    "LIST_COMPLETED_OF_JOB_EITHER",
    "STATE_COUNTS_EITHER",
    "THROUGHPUT_EITHER",
    "GET_RUN_EITHER",
    "HISTORY_AS_RUN",
    "HISTORY_COLUMNS",
    "LIST_DEAD_ALL_JOBS_EITHER",
    "LIST_DEAD_OF_JOB_EITHER",
    "MOVE_FINISHED",
    "RERUN_FROM_STEP_BACK",
    "RETRY_DEAD_BACK",
    "SETTLE_MOVING",
]

HISTORY_AS_RUN: Final = (
    "h.id, h.job_id, h.state, h.payload, h.key, h.dedupe_key, h.attempt, h.max_attempts,"
    " h.run_at, h.created_at, h.finished_at AS updated_at, h.finished_at,"
    " CAST(NULL AS timestamptz) AS lease_expires_at, CAST(NULL AS bigint) AS lease_token,"
    " h.claimed_by, h.last_error, coalesce(h.history, CAST('[]' AS jsonb)) AS history,"
    " h.snoozes, h.priority, CAST(NULL AS timestamptz) AS cancel_requested_at, h.tenant_id,"
    " h.parent_id, CAST(NULL AS text) AS wait_for, h.lapses,"
    " coalesce(h.consecutive_lapses, 0) AS consecutive_lapses,"
    " h.progress, h.handler_version, h.started_at, h.claimed_by AS worker"
)
"""A history row (aliased ``h``) as a run record's columns (``{cols}``, ``started_at`` and
``worker``: the last attempt's start and worker, J18)."""

_LIVE_AS_RUN: Final = (
    "{cols}, CAST(NULL AS timestamptz) AS started_at, CAST(NULL AS text) AS worker"
)
"""A runs-table row as the same columns as HISTORY_AS_RUN (a live run has no finished attempt)."""


_MOVING_COLUMNS: Final = (
    *SETTLE_INPUTS[:-1],
    ("starts", "timestamptz", "started"),
    ("keeps", "smallint", "keep"),
    SETTLE_INPUTS[-1],
)
"""The in-place settle's input arrays, and each attempt's start and what history keeps."""

_SETTLE_INPUT: Final = (
    """
WITH settle AS (
    SELECT t.ord, t.id, t.token, coalesce(t.state, 'completed') AS state, t.at,
        coalesce(t.refund, false) AS refund, coalesce(t.snoozes_added, 0) AS snoozes_added,
        t.error, t.entry_kind, coalesce(t.keeps_lapses, false) AS keeps_lapses, t.started,
        coalesce(t.keep, 1) AS keep, t.wait_for
    -- J20: padded to 32 rows for the planner, as SETTLE_IF_TOKEN_CURRENT's (settle_batch).
    """  # noqa: S608 - constant text
    + settle_batch(_MOVING_COLUMNS)
    + """
), kept AS (
    -- What stays live: a retry, release or snooze of a run no operator asked to cancel (K2).
    -- <runs>_pkey, one probe per settlement; the token fences out stale holders (J5).
    UPDATE {runs} r
    SET state = 'waiting', run_at = s.at, finished_at = NULL,
        attempt = CASE WHEN s.refund THEN r.attempt - 1 ELSE r.attempt END,
        snoozes = r.snoozes + s.snoozes_added,
        -- D10: a parked run waits for '#diverged' (the settlement's wait_for); else no wait.
        lease_expires_at = NULL, claimed_by = NULL, updated_at = {now}, wait_for = s.wait_for,
        consecutive_lapses = CASE WHEN s.keeps_lapses THEN r.consecutive_lapses ELSE 0 END,
        last_error = coalesce(s.error, r.last_error),
        history = CASE WHEN s.error IS NULL THEN r.history
            ELSE r.history || jsonb_build_array(jsonb_build_object(
                'attempt', r.attempt, 'at', {at}, 'error', s.error, 'kind', s.entry_kind,
                'started', {began}, 'worker', r.claimed_by)) END
    FROM settle s
    -- J20: the one-path probe (settle.py's docstring).
    WHERE r.id = ANY(ARRAY[s.id]) AND s.state = 'waiting'
      AND (r.lease_token = s.token AND r.state = 'running'
           AND r.cancel_requested_at IS NULL) IS TRUE
    RETURNING s.ord, r.state, r.parent_id
), gone AS (
    -- J16: what ends leaves the runs table in this statement. <runs>_pkey, one probe per
    -- settlement (J20's one-path probe, as the UPDATE), fenced as the UPDATE (J5). K2: once a
    -- cancel was requested, anything but a completion ends the run cancelled, its attempt
    -- counted.
    DELETE FROM {runs} r USING settle s
    WHERE r.id = ANY(ARRAY[s.id])
      AND (r.lease_token = s.token AND r.state = 'running'
           AND (s.state <> 'waiting' OR r.cancel_requested_at IS NOT NULL)) IS TRUE
    RETURNING s.ord, s.keep, s.started, r.id, r.seq, r.job_id, r.payload, r.key, r.dedupe_key,
        r.max_attempts, r.priority, r.run_at, r.created_at, r.claimed_by, r.trace_context,
        r.snoozes, r.tenant_id, r.parent_id, r.lapses, r.progress, r.handler_version,
        r.partition_key,
        CASE WHEN s.state <> 'completed' AND r.cancel_requested_at IS NOT NULL
            THEN 'cancelled' ELSE s.state END AS state,
        CASE WHEN s.refund AND r.cancel_requested_at IS NULL
            THEN r.attempt - 1 ELSE r.attempt END AS attempt,
        coalesce(s.error, r.last_error) AS last_error,
        -- J15: an end the handler reached ends the run's streak of lapses.
        CASE WHEN s.keeps_lapses THEN r.consecutive_lapses ELSE 0 END AS consecutive_lapses,
        CASE WHEN s.error IS NULL THEN r.history
            ELSE r.history || jsonb_build_array(jsonb_build_object(
                'attempt', r.attempt, 'at', {at}, 'error', s.error, 'kind', s.entry_kind,
                'started', {began}, 'worker', r.claimed_by)) END
            AS history
), moved AS (
    -- J18: keep 0 is a completion its job keeps no row of (Retention(completed=0)); keep 2
    -- keeps a completed run's payload (Retention(completed_payload=True)).
    """
)

SETTLE_MOVING: Final = Template(
    _SETTLE_INPUT  # noqa: S608 - constant text
    + insert_ended(
        "gone",
        "e.state",
        "(e.state <> 'completed' OR e.keep = 2 OR {stepped})",
        "e.started",
    )
    + """
    WHERE e.state <> 'completed' OR e.keep > 0
    RETURNING 1
)
SELECT k.ord, k.state, k.parent_id FROM kept k
UNION ALL
SELECT g.ord, g.state, g.parent_id FROM gone g
WHERE (SELECT count(*) FROM moved) >= 0
"""
)
"""SETTLE_IF_TOKEN_CURRENT for a backend with a history table (J16, J18): the same arrays, and
the answer by position (:data:`~ship_sqla._jobs._sql.settle.SETTLE_COLUMNS`), plus
``:starts`` (each settled attempt's start: its claim's time, for run time and queue wait) and
``:keeps`` (smallint per settlement; NULL: 1; 0: a completion leaves no history row; 2: a
completion keeps its payload). A settlement that stays live updates the live row; one that
ends deletes it and inserts its history row. A cancel request that lands between the
statement's snapshot and its row lock makes a retry or release stale (neither CTE takes the
row); the run then ends cancelled at its lease's lapse (K2, the claim's buried path)."""

GET_RUN_EITHER: Final = Template(
    f"""
-- <runs>_pkey, then the history's id index (a run is in exactly one, J16).
SELECT {_LIVE_AS_RUN} FROM {{runs}} r WHERE r.id = :id
UNION ALL
SELECT {HISTORY_AS_RUN} FROM {{history}} h WHERE h.id = :id
LIMIT 1
"""  # noqa: S608 - constant text
)
"""GET_RUN over both tables (J16): one run with its history, live or finished."""

_DEAD_TAIL: Final = """
  AND x.finished_at <= coalesce(CAST(:after_at AS timestamptz), CAST('infinity' AS timestamptz))
  AND (CAST(:after_at AS timestamptz) IS NULL
       OR (x.finished_at, x.id) < (CAST(:after_at AS timestamptz), CAST(:after_id AS text)))
  AND (CAST(:tenant AS text) IS NULL OR x.tenant_id = CAST(:tenant AS text))
ORDER BY x.finished_at DESC, x.id DESC
LIMIT CAST(:limit AS integer)"""


def _dead_pages(job_filter: str) -> Template:
    """A page of dead runs from history and from the runs table's leftovers, merged."""
    return Template(
        f"""
SELECT x.* FROM (
    (SELECT {HISTORY_AS_RUN} FROM {{history}} h
     -- the history's (job_id, state, finished_at) index, newest first
     WHERE h.state = 'dead'{job_filter.replace("?", "h")}
     ORDER BY h.finished_at DESC, h.id DESC)
    UNION ALL
    (SELECT {_LIVE_AS_RUN} FROM {{runs}} r
     -- <runs>_finished_idx: finished rows left in the runs table (an older release's)
     WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'
       {job_filter.replace("?", "r")})
) x
WHERE true"""  # noqa: S608 - constant text
        + _DEAD_TAIL
        + "\n"
    )


LIST_DEAD_OF_JOB_EITHER: Final = _dead_pages(" AND ?.job_id = :job_id")
"""LIST_DEAD_OF_JOB over both tables (J16)."""

LIST_DEAD_ALL_JOBS_EITHER: Final = _dead_pages("")
"""LIST_DEAD_ALL_JOBS over both tables (J16)."""

RETRY_DEAD_BACK: Final = Template(
    """
WITH back AS (
    -- J16, J8: the dead run leaves history (its id index) ... Not while a newer live run holds
    -- the dedupe key (<runs>_dedupe_idx, its predicate word for word): J1.
    DELETE FROM {history} h
    WHERE h.id = :id AND h.state = 'dead'
      AND NOT EXISTS (
        SELECT 1 FROM {runs} o
        WHERE o.job_id = h.job_id AND o.dedupe_key = h.dedupe_key
          AND o.dedupe_key IS NOT NULL AND o.state IN ('waiting', 'running'))
    RETURNING h.*
)
-- ... and waits again in the runs table, due now, with exactly one more attempt.
"""  # noqa: S608 - constant text
    + INSERT_BACK
    + """RETURNING {cols}
"""
)
"""Operator retry (J8) of a dead run in history: moved back to the runs table in one
statement (J16). No row: no dead run of that id in history (the backend then tries the runs
table's leftovers, RETRY_DEAD)."""

DISCARD_WAITING_MOVING: Final = Template(
    """
WITH gone AS (
    -- <runs>_pkey. A running run is never discarded under its holder (it settles first).
    DELETE FROM {runs} r WHERE r.id = :id AND r.state = 'waiting'
    RETURNING r.*
)
"""  # noqa: S608 - constant text
    + insert_ended("gone", "'discarded'", "true", "NULL")
    + f"\nRETURNING {HISTORY_AS_RUN}\n"
)
"""Operator discard (J8) of a waiting run: moved into history, discarded (J16)."""

DISCARD_DEAD_IN_HISTORY: Final = Template(
    f"""
-- The history's id index. A dead run discarded stays in history (its state class changes).
UPDATE {{history}} h SET state = 'discarded', finished_at = {{now}}
WHERE h.id = :id AND h.state = 'dead'
RETURNING {HISTORY_AS_RUN}
"""  # noqa: S608 - constant text
)
"""Operator discard (J8) of a dead run in history."""

CANCEL_MOVING: Final = Template(
    """
WITH gone AS (
    -- <runs>_pkey: a waiting run is cancelled at once, out of the runs table (J16).
    DELETE FROM {runs} r WHERE r.id = :id AND r.state = 'waiting'
    RETURNING r.*
), moved AS (
    """  # noqa: S608 - constant text
    + insert_ended("gone", "'cancelled'", "true", "NULL")
    + f"""
    RETURNING {HISTORY_AS_RUN}
), requested AS ("""
    + """
    -- <runs>_pkey: a running run's request is recorded (the first request's time is kept).
    UPDATE {runs} r
    -- J18: updated_at stays the attempt's start (ship_sqla._sql.BEGAN).
    SET cancel_requested_at = coalesce(r.cancel_requested_at, {now})
    WHERE r.id = :id AND r.state = 'running'
    RETURNING {cols}
)
-- The holder is told in this transaction, so on its commit (K2; payload: the run id).
SELECT c.*, CAST(NULL AS timestamptz) AS started_at, CAST(NULL AS text) AS worker,
    CAST(pg_notify(CAST(:channel AS text), c.id) AS text) IS NOT NULL AS told
FROM requested c
UNION ALL
SELECT m.*, false FROM moved m
"""
)
"""CANCEL_LIVE_RUN for a backend with a history table (K2, J16): a waiting run is moved into
history, cancelled; a running run's request is recorded and its holder told."""

MOVE_FINISHED: Final = Template(
    """
WITH gone AS (
    DELETE FROM {runs} d
    WHERE d.id = ANY(ARRAY(
        -- <runs>_finished_idx (job_id, finished_at), predicate word for word: one bounded
        -- batch of one job's finished rows, oldest first.
        SELECT r.id FROM {runs} r
        WHERE r.job_id = :job_id AND r.state IN ('completed', 'dead', 'discarded', 'cancelled')
        ORDER BY r.finished_at
        LIMIT CAST(:batch AS integer)))
    RETURNING d.*
)
"""  # noqa: S608 - constant text
    + insert_ended("gone", "e.state", "e.state <> 'completed'", "NULL", "e.finished_at")
    + "\nRETURNING 1\n"
)
"""J16: move one bounded batch of one job's finished rows from the runs table into history, in
one statement (a claim's buried runs, J6, which the claim itself still ends in place; and the
finished rows an older release left). The row count says how many moved."""

CHILDREN_EITHER: Final = Template(
    """
SELECT c.id, c.job_id, c.state, c.last_error FROM (
    -- <runs>_parent_idx
    SELECT r.id, r.job_id, r.state, r.last_error, r.seq FROM {runs} r
    WHERE r.parent_id = :run_id AND r.parent_id IS NOT NULL
    UNION ALL
    -- the history's parent index
    SELECT h.id, h.job_id, h.state, h.last_error, h.seq FROM {history} h
    WHERE h.parent_id = :run_id AND h.parent_id IS NOT NULL
) c
ORDER BY c.seq
""",
    compacted=False,
)
"""CHILDREN over both tables (D5, J16): a workflow run's children, live and finished, in
creation order."""

_DURABLE_PROBE: Final = "(SELECT r.id FROM {runs} r WHERE r.id = i.id),"

ENQUEUE_MANY_EITHER: Final = Template(
    enqueue.ENQUEUE_MANY.sql.replace(
        _DURABLE_PROBE,
        _DURABLE_PROBE  # noqa: S608 - constant text
        + "\n            -- J16: a durable id that ended is in history (its id index)."
        + "\n            (SELECT h.id FROM {history} h WHERE h.id = i.id),",
    )
)
"""ENQUEUE_MANY for a backend with a history table: a durable id dedupes against a run in
either table (J1, J16)."""

JOB_KNOWN_EITHER: Final = Template(
    admin.JOB_KNOWN.sql.replace(
        "    AS known",
        """    -- J16: a job whose runs all ended is known by its history (its (job_id, state,
    -- finished_at) index, one probe).
    OR EXISTS (SELECT 1 FROM {history} h WHERE h.job_id = CAST(:job_id AS text))
    AS known""",
    )
)
"""JOB_KNOWN over both tables (J16)."""

# --- the dashboard's reads of finished runs (S2) over both tables --------------------------------


def _finished_of(job: str) -> str:
    """One job's (``job``) page of runs in one ended state other than completed (dead,
    cancelled, discarded), newest created first: the runs table's leftovers
    (``<runs>_browse_idx``) and history (``<history>_browse_idx``, partial on ``state <>
    'completed'``, its predicate word for word so a generic plan proves it: a backward scan of
    each day partition, merged in creation order), merged."""
    return (
        f"""SELECT x.* FROM (
    (SELECT {_LIVE_AS_RUN}, r.seq FROM {{runs}} r
     WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled')
       AND r.state = CAST(:state AS text) AND r.job_id = {job}"""  # noqa: S608 - constant text
        + browse.creation_range("r")
        + f""")
    UNION ALL
    (SELECT {HISTORY_AS_RUN}, h.seq FROM {{history}} h
     WHERE h.state <> 'completed' AND h.state = CAST(:state AS text)
       AND h.job_id = {job}"""  # noqa: S608 - constant text
        + browse.creation_range("h")
        + """)
) x
ORDER BY x.created_at DESC, x.id DESC
LIMIT CAST(:limit AS integer)"""
    )


LIST_FINISHED_OF_JOB_EITHER: Final = Template(_finished_of("CAST(:job_id AS text)") + "\n")
"""LIST_FINISHED_OF_JOB over both tables (J16)."""


def _completed_of(job: str) -> str:
    """One job's (``job``) page of completed runs, newest finished first (J18, keyset on
    ``(finished_at, id)``): the runs table's leftovers (``<runs>_finished_idx``) and history
    (``<history>_job_idx`` (job_id, state, finished_at): a backward scan of each day partition
    of the completed class, merged in finish order; a settle batch's tie sorted by id over it,
    an incremental sort), merged."""
    return (
        f"""SELECT x.* FROM (
    (SELECT {_LIVE_AS_RUN}, r.seq FROM {{runs}} r
     WHERE {browse.COMPLETED} AND r.job_id = {job}"""  # noqa: S608 - constant text
        + browse.finish_range("r")
        + f""")
    UNION ALL
    (SELECT {HISTORY_AS_RUN}, h.seq FROM {{history}} h
     WHERE h.state = 'completed' AND h.job_id = {job}"""  # noqa: S608 - constant text
        + browse.finish_range("h")
        + """)
) x
ORDER BY x.finished_at DESC, x.id DESC
LIMIT CAST(:limit AS integer)"""
    )


LIST_COMPLETED_OF_JOB_EITHER: Final = Template(_completed_of("CAST(:job_id AS text)") + "\n")
"""LIST_COMPLETED_OF_JOB over both tables (J16, J18)."""

DEAD_ERRORS_EITHER: Final = Template("""
SELECT x.* FROM (
    (SELECT r.id, r.job_id, r.last_error, r.finished_at, r.created_at FROM {runs} r
     -- <runs>_browse_idx: the runs table's leftovers (an older release's)
     WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'
       AND r.job_id = CAST(:job_id AS text)
     ORDER BY r.created_at DESC, r.id DESC
     LIMIT CAST(:limit AS integer))
    UNION ALL
    (SELECT h.id, h.job_id, h.last_error, h.finished_at, h.created_at FROM {history} h
     -- <history>_browse_idx (job_id, state, created_at, id), each day partition backwards
     WHERE h.state = 'dead' AND h.job_id = CAST(:job_id AS text)
     ORDER BY h.created_at DESC, h.id DESC
     LIMIT CAST(:limit AS integer))
) x
ORDER BY x.created_at DESC, x.id DESC
LIMIT CAST(:limit AS integer)
""")
"""DEAD_ERRORS over both tables (J16)."""


def _jobs_either(state: str, leftovers: str) -> str:
    """The first ``:max_jobs`` jobs with runs in the finished state ``state`` (SQL: a literal,
    which a partial index's predicate can match in a generic plan, or ``CAST(:state AS text)``)
    in the runs table's leftovers (``leftovers`` names them in the comment) and in history, each
    by a loose index scan: the CTEs ``live_jobs``, ``ended_jobs`` and their union ``jobs``."""
    return f"""WITH RECURSIVE live_jobs(job_id, n) AS (
    -- <runs>_browse_idx, a loose index scan over the jobs with {leftovers}.
    SELECT (SELECT min(r.job_id) FROM {{runs}} r
            WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled')
              AND r.state = {state}), 1
    UNION ALL
    SELECT (SELECT min(r.job_id) FROM {{runs}} r
            WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled')
              AND r.state = {state} AND r.job_id > j.job_id), j.n + 1
    FROM live_jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), ended_jobs(job_id, n) AS (
    -- the history's (job_id, state, finished_at) index, a loose scan over its jobs.
    SELECT (SELECT min(h.job_id) FROM {{history}} h WHERE h.state = {state}), 1
    UNION ALL
    SELECT (SELECT min(h.job_id) FROM {{history}} h
            WHERE h.state = {state} AND h.job_id > j.job_id), j.n + 1
    FROM ended_jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), jobs AS (
    SELECT job_id FROM live_jobs WHERE job_id IS NOT NULL
    UNION
    SELECT job_id FROM ended_jobs WHERE job_id IS NOT NULL
)
"""  # noqa: S608 - constant text


def _all_jobs_either(state: str, leftovers: str, page: str, order: str) -> Template:
    """Every job's page merged, over both tables (J16): the jobs of :func:`_jobs_either`, each
    job's ``page`` (its SQL, ``j.job_id`` the job) in ``order``."""
    return Template(
        "\n"  # noqa: S608 - constant text
        + _jobs_either(state, leftovers)
        + "SELECT p.* FROM jobs j\nCROSS JOIN LATERAL (\n"
        + page
        + f"""
) p
ORDER BY {order}
LIMIT CAST(:limit AS integer)
"""
    )


LIST_FINISHED_ALL_JOBS_EITHER: Final = _all_jobs_either(
    "CAST(:state AS text)",
    "leftovers in the state",
    _finished_of("j.job_id"),
    "p.created_at DESC, p.id DESC",
)
"""LIST_FINISHED_ALL_JOBS over both tables (J16): each job's page merged."""

LIST_COMPLETED_ALL_JOBS_EITHER: Final = _all_jobs_either(
    "'completed'", "completed leftovers", _completed_of("j.job_id"), "p.finished_at DESC, p.id DESC"
)
"""LIST_COMPLETED_ALL_JOBS over both tables (J16, J18): each job's page merged, newest
finished first."""

THROUGHPUT_EITHER: Final = Template(
    browse.THROUGHPUT.sql.replace(
        """            ORDER BY r.finished_at
            LIMIT CAST(:cap AS integer)
        ) x""",
        """            UNION ALL
            -- the history's (job_id, state, finished_at) index: its runs ended in the bucket.
            SELECT h.state FROM {history} h
            WHERE h.job_id = j.job_id AND h.state IN ('completed', 'dead')
              AND h.finished_at >= e.start AND h.finished_at < e.stop
            LIMIT CAST(:cap AS integer)
        ) x""",
    )
    .replace(
        """    FROM jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), edges""",
        """    FROM jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), ended_jobs(job_id, n) AS (
    -- the history's (job_id, state, finished_at) index, a loose scan over its jobs.
    SELECT (SELECT min(h.job_id) FROM {history} h), 1
    UNION ALL
    SELECT (SELECT min(h.job_id) FROM {history} h WHERE h.job_id > j.job_id), j.n + 1
    FROM ended_jobs j
    WHERE j.job_id IS NOT NULL AND j.n < CAST(:max_jobs AS integer)
), edges""",
    )
    .replace(
        """    FROM jobs j
    CROSS JOIN LATERAL (""",
        """    FROM (SELECT job_id FROM jobs UNION SELECT job_id FROM ended_jobs) j
    CROSS JOIN LATERAL (""",
    )
)
"""THROUGHPUT over both tables (J16): each bucket's runs ended there, in either."""

STATE_COUNTS_EITHER: Final = Template("""
SELECT x.job_id, x.state, sum(x.runs) AS runs, min(x.oldest_due_age) AS oldest_due_age
FROM (
    SELECT r.job_id, r.state, count(*) AS runs,
           extract(epoch FROM {now}
                   - min(r.run_at) FILTER (WHERE r.state = 'waiting' AND r.run_at <= {now}))
               AS oldest_due_age
    FROM {runs} r
    GROUP BY r.job_id, r.state
    UNION ALL
    -- J16: history, aggregated whole (operator-invoked, as STATE_COUNTS).
    SELECT h.job_id, h.state, count(*), NULL FROM {history} h GROUP BY h.job_id, h.state
) x
GROUP BY x.job_id, x.state
ORDER BY x.job_id COLLATE "C", x.state COLLATE "C"
LIMIT CAST(:limit AS integer)
""")
"""STATE_COUNTS over both tables (J16)."""

CLAIM_STATE_EITHER: Final = Template("""
-- <runs>_pkey, one probe: how an ambiguous COMMIT of a transactional handler, or a settle
-- retried after its answer was lost, is resolved (J13, J5).
SELECT r.state FROM {runs} r WHERE r.id = :id AND r.lease_token = :token
UNION ALL
-- J16: the run ended (its end committed): history's id index. History keeps no claim token:
-- the claim's attempt stands for it (a retake spends one more, so an end another holder
-- committed after this claim lapsed is at a later attempt and answers nothing).
SELECT h.state FROM {history} h WHERE h.id = :id AND h.attempt = :attempt
LIMIT 1
""")
"""CLAIM_STATE_IF_TOKEN over both tables (J13, J16): ``:attempt`` is the claim's."""

RERUN_FROM_STEP_BACK: Final = Template(
    """
WITH back AS (
    -- J16, D6: a dead workflow run in history (its id index) that has the step leaves it ...
    DELETE FROM {history} h
    WHERE h.id = :run_id AND h.state = 'dead'
      AND EXISTS (SELECT 1 FROM {steps} s WHERE s.run_id = h.id AND s.name = :step)
    RETURNING h.*
), dropped AS (
    -- ... drops the named step and every later one (<steps>_pkey) ...
    DELETE FROM {steps} s
    USING back
    WHERE s.run_id = back.id
      AND s.seq >= (SELECT s2.seq FROM {steps} s2 WHERE s2.run_id = back.id AND s2.name = :step)
    RETURNING 1
)
-- ... and waits again in the runs table, due now, with one more attempt.
"""  # noqa: S608 - constant text
    + INSERT_BACK
    + """WHERE (SELECT count(*) FROM dropped) >= 0
RETURNING {cols}
""",
    compacted=False,
)
"""RERUN_FROM_STEP of a dead run in history (D6, J16): moved back to the runs table in one
statement, its named step and every later one dropped. No row: none such in history."""


def _next_pair(after: str) -> str:
    """The next (consumer, key) with progress after ``after`` in either table: each one's
    progress index, one probe each, the lower of the two."""
    return f"""SELECT y.job_id, y.key FROM (
        (SELECT r.job_id, r.key FROM {{runs}} r
         WHERE r.progress IS NOT NULL AND (r.job_id, r.key) > {after}
         ORDER BY r.job_id, r.key LIMIT 1)
        UNION ALL
        (SELECT h.job_id, h.key FROM {{history}} h
         WHERE h.progress IS NOT NULL AND (h.job_id, h.key) > {after}
         ORDER BY h.job_id, h.key LIMIT 1)
    ) y ORDER BY y.job_id, y.key LIMIT 1"""  # noqa: S608 - constant text


CONSUMER_PROGRESS_EITHER: Final = Template(
    """
WITH RECURSIVE pairs(job_id, key, n) AS (
    -- <runs>_progress_idx and the history's progress index, a loose scan over both.
    SELECT x.job_id, x.key, 1 FROM ("""  # noqa: S608 - constant text
    + _next_pair("(coalesce(CAST(:after_job AS text), ''), coalesce(CAST(:after_key AS text), ''))")
    + """) x
    UNION ALL
    SELECT x.job_id, x.key, p.n + 1 FROM pairs p
    CROSS JOIN LATERAL ("""
    + _next_pair("(p.job_id, p.key)")
    + """) x
    WHERE p.n < CAST(:limit AS integer)
)
SELECT p.job_id, p.key, latest.id AS run_id, latest.state, latest.progress,
       live.id AS live_run_id, live.state AS live_state
FROM pairs p
CROSS JOIN LATERAL (
    -- the key's newest run with progress, in either table (each its progress index).
    SELECT z.id, z.state, z.progress FROM (
        (SELECT r.id, r.state, r.progress, r.seq FROM {runs} r
         WHERE r.progress IS NOT NULL AND r.job_id = p.job_id AND r.key = p.key
         ORDER BY r.seq DESC LIMIT 1)
        UNION ALL
        (SELECT h.id, h.state, h.progress, h.seq FROM {history} h
         WHERE h.progress IS NOT NULL AND h.job_id = p.job_id AND h.key = p.key
         ORDER BY h.seq DESC LIMIT 1)
    ) z ORDER BY z.seq DESC LIMIT 1
) latest
LEFT JOIN LATERAL (
    -- <runs>_dedupe_idx: the key's live run (C2: a consumer's runs are deduplicated by key).
    SELECT r.id, r.state FROM {runs} r
    WHERE r.dedupe_key IS NOT NULL AND r.state IN ('waiting', 'running')
      AND r.job_id = p.job_id AND r.dedupe_key = p.key
    LIMIT 1
) live ON true
ORDER BY p.job_id, p.key
"""
)
"""CONSUMER_PROGRESS over both tables (C3, J16): a key's last batch is kept after its run
ended, in history."""

ADOPT_ENDED_CHILDREN: Final = Template(
    """
UPDATE {history} h SET parent_id = :parent_id
FROM unnest(CAST(:ids AS text[])) AS i(id)
-- the history's id index, one probe per child (a hash index takes no array, so a join)
WHERE h.id = i.id AND h.parent_id IS NULL AND h.id <> :parent_id
""",
    compacted=False,
)
"""D5, J16: the adoption's history half, run after ADOPT_CHILDREN (the runs table's) as a
statement of its own. A child that already ended (a fast worker) is in history, and so is one
whose settle moved it there while ADOPT_CHILDREN ran (that UPDATE found its row gone once the
settle committed). This statement's snapshot is taken after ADOPT_CHILDREN ended, so it sees
both; inside ADOPT_CHILDREN's own statement the second was invisible, the child kept no parent
and ``wait_for_children`` missed it (all 20 children of a fan-out once, under load)."""
