"""Workflow statements (SPEC §13, D1-D6) on the steps, events and runs tables.

Rules beyond the package's (:mod:`ship_sqla._jobs._sql`):

- Every step write is fenced on the claim: it reads the run by ``id`` AND ``lease_token`` AND
  ``state = 'running'`` (D1). A transactional step's write also takes ``FOR KEY SHARE`` on the
  run (held to its unit of work's end): a claim (``FOR UPDATE SKIP LOCKED``) cannot retake the
  run meanwhile, while the holder's heartbeats (no key change) still land.
- An event wait and a publish of the same (name, key) share a transaction-level advisory lock
  (the wait exclusive and tried, never waited for; the publish shared, both to their
  transaction's end): once a wait has taken it no publish of its event is in flight, so every
  later publish sees the run waiting (PUBLISH_EVENT wakes it), and every earlier one is visible
  to the wait's statement. A wait that finds the lock held begins again a moment later. An event
  belongs to a wait when its transaction is not visible in the snapshot the wait began in
  (``pg_visible_in_snapshot``): commit order, not timestamps (D4, SPEC §10).
- A child's end wakes its parent after the child's settle committed (WAKE_PARENTS, its own
  statement), so the last of several children settled at once in different processes always
  sees the others ended; a parent still running then is marked (``wait_for =
  '#children-done'``) and its own suspend makes it due at once.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "ADOPT_CHILDREN",
    "BEGIN_WAIT",
    "CHILDREN",
    "DELETE_OLD_EVENTS",
    "LOAD_STEPS",
    "MATCH_EVENT",
    "PATCH_HOLDING",
    "PATCH_IDS",
    "PATCH_LACKING",
    "PATCH_LACKING_EITHER",
    "PUBLISH_EVENT",
    "RERUN_FROM_STEP",
    "SAVE_STEP",
    "SUSPEND_RUN",
    "WAIT_LOCK",
    "WAIT_LOCK_SHARED",
    "WAKE_PARENTS",
]

_STEP_COLUMNS: Final = (
    "s.run_id, s.name, s.seq, s.kind, s.state, CAST(s.result AS text) AS result_json, s.wake_at,"
    " s.created_at, s.finished_at, s.event_name, s.event_key,"
    " coalesce(s.wake_at <= {now}, false) AS due"
)

LOAD_STEPS: Final = Template(
    f"""
-- <steps>_pkey (run_id prefix)
SELECT {_STEP_COLUMNS}
FROM {{steps}} s
WHERE s.run_id = :run_id
ORDER BY s.seq
""",  # noqa: S608 - a template of constant text
    compacted=False,
)
"""A run's steps in handler order, ``due`` by the database's clock (D3, D4)."""

SAVE_STEP: Final = Template(
    """
INSERT INTO {steps} AS s (run_id, name, seq, kind, state, result, created_at, finished_at)
SELECT r.id, :name, :seq, :kind, 'done', CAST(:result AS jsonb), {now}, {now}
FROM {runs} r
-- <runs>_pkey; the fence (D1)
WHERE r.id = :run_id AND r.lease_token = :token AND r.state = 'running'
FOR KEY SHARE OF r
ON CONFLICT (run_id, name) DO UPDATE
    SET state = 'done', result = EXCLUDED.result, finished_at = EXCLUDED.finished_at
    WHERE s.state = 'waiting'
RETURNING 1 AS stored
""",
    compacted=False,
)
"""Store a step done (a new one, or a waiting one ending), fenced on the claim; no row: the
token was not current, or the step was done already (D1, D2)."""

BEGIN_WAIT: Final = Template(
    f"""
WITH inserted AS (
    INSERT INTO {{steps}} AS s (run_id, name, seq, kind, state, wake_at, event_name, event_key,
                               snapshot, created_at)
    SELECT r.id, :name, :seq, 'event', 'waiting',
        coalesce(CAST(:wake_at AS timestamptz),
                 {{now}} + CAST(:wake_after AS double precision) * interval '1 second'),
        :event_name, :event_key, CAST(pg_current_snapshot() AS text), {{now}}
    FROM {{runs}} r
    -- <runs>_pkey; the fence (D1)
    WHERE r.id = :run_id AND r.lease_token = :token AND r.state = 'running'
    ON CONFLICT (run_id, name) DO NOTHING
    RETURNING s.*
)
SELECT {_STEP_COLUMNS} FROM inserted s
UNION ALL
SELECT {_STEP_COLUMNS} FROM {{steps}} s
WHERE s.run_id = :run_id AND s.name = :name
  AND EXISTS (SELECT 1 FROM {{runs}} r
              WHERE r.id = :run_id AND r.lease_token = :token AND r.state = 'running')
LIMIT 1
""",  # noqa: S608 - a template of constant text
    compacted=False,
)
"""D4 (``expect_event``): store an event wait as waiting, beginning in this statement's snapshot,
without suspending the run; the stored step (the one already stored, on a replay). No row: the
token was stale."""

WAIT_LOCK: Final = Template(
    "SELECT pg_try_advisory_xact_lock(CAST(:lock_key AS bigint))", compacted=False
)
"""An event wait's lock (exclusive), tried: a wait never queues behind a publisher's open
transaction (the backend hands the run back for a moment instead)."""
WAIT_LOCK_SHARED: Final = Template(
    "SELECT pg_advisory_xact_lock_shared(CAST(:lock_key AS bigint))", compacted=False
)

_MATCHING_EVENT: Final = """
    SELECT 1 FROM {events} e
    -- <events>_match_idx: this (name, key) from the wait snapshot's xmin on
    WHERE e.name = st.event_name AND e.key = st.event_key
      AND e.xid >= CAST(CAST(pg_snapshot_xmin(CAST(st.snapshot AS pg_snapshot)) AS text)
                        AS bigint)
      AND NOT pg_visible_in_snapshot(CAST(CAST(e.xid AS text) AS xid8),
                                     CAST(st.snapshot AS pg_snapshot))
"""

SUSPEND_RUN: Final = Template(
    f"""
WITH inserted AS (
    INSERT INTO {{steps}} (run_id, name, seq, kind, state, wake_at, event_name, event_key,
                          snapshot, created_at)
    SELECT r.id, :name, :seq, :kind, 'waiting',
        coalesce(CAST(:wake_at AS timestamptz),
                 {{now}} + CAST(:wake_after AS double precision) * interval '1 second'),
        :event_name, :event_key, CAST(pg_current_snapshot() AS text), {{now}}
    FROM {{runs}} r
    WHERE r.id = :run_id AND r.lease_token = :token AND r.state = 'running'
    ON CONFLICT (run_id, name) DO NOTHING
    RETURNING wake_at, snapshot, event_name, event_key
), st AS (
    -- the new step, else the stored one (a replayed wait keeps when it began)
    SELECT i.wake_at, i.snapshot, i.event_name, i.event_key, true AS fresh FROM inserted i
    UNION ALL
    SELECT s.wake_at, s.snapshot, s.event_name, s.event_key, false FROM {{steps}} s
    WHERE s.run_id = :run_id AND s.name = :name
    LIMIT 1
)
UPDATE {{runs}} r
SET state = CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'waiting' END,
    finished_at = CASE WHEN r.cancel_requested_at IS NOT NULL THEN {{now}} END,
    -- D3: a sleep or a wait spends no attempt (a cancelled run's stays counted: it ran)
    attempt = CASE WHEN r.cancel_requested_at IS NOT NULL THEN r.attempt ELSE r.attempt - 1 END,
    run_at = CASE
        WHEN r.cancel_requested_at IS NOT NULL THEN r.run_at
        WHEN :wait = 'sleep' THEN st.wake_at
        WHEN :wait = 'event' THEN CASE
            WHEN st.wake_at <= {{now}} OR (NOT st.fresh AND EXISTS ({_MATCHING_EVENT}))
            THEN {{now}} ELSE st.wake_at END
        -- children: due now when none is live, or a child's wake marked the run meanwhile
        WHEN r.wait_for = '#children-done' OR NOT EXISTS (
            -- <runs>_parent_idx
            SELECT 1 FROM {{runs}} c
            WHERE c.parent_id = r.id AND c.parent_id IS NOT NULL
              AND c.state IN ('waiting', 'running'))
        THEN {{now}}
        ELSE {{now}} + CAST(:recheck AS double precision) * interval '1 second' END,
    wait_for = CASE
        WHEN r.cancel_requested_at IS NOT NULL OR :wait = 'sleep' THEN NULL
        WHEN :wait = 'event' THEN st.event_name || chr(31) || st.event_key
        ELSE '#children' END,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {{now}},
    -- J15: the handler reached a suspend: the run's streak of lapses ends.
    consecutive_lapses = 0
FROM st
-- <runs>_pkey; the fence (J5)
WHERE r.id = :run_id AND r.lease_token = :token AND r.state = 'running'
RETURNING r.state, r.job_id, r.run_at <= {{now}} AS due
""",  # noqa: S608 - a template of constant text
    compacted=False,
)
"""D3: store the waiting step (unless stored) and put the run back to waiting, its attempt
unspent, at the sleep's wake time; an event wait's timeout, or now when a matching event
committed since the wait began (a new wait: none can, it begins in this statement's snapshot,
under the wait lock); a children wait's recheck, or now when no child is live. A run whose
cancel was requested ends cancelled (K2). No row: the token was stale."""

MATCH_EVENT: Final = Template(
    """
SELECT e.id, e.name, e.key, CAST(e.payload AS text) AS payload_json
FROM {steps} st
JOIN {events} e
  -- <events>_match_idx
  ON e.name = st.event_name AND e.key = st.event_key
 AND e.xid >= CAST(CAST(pg_snapshot_xmin(CAST(st.snapshot AS pg_snapshot)) AS text) AS bigint)
 AND NOT pg_visible_in_snapshot(CAST(CAST(e.xid AS text) AS xid8),
                                CAST(st.snapshot AS pg_snapshot))
-- <steps>_pkey
WHERE st.run_id = :run_id AND st.name = :name
-- the index's order: the earliest publishing transaction first, then publication order in it
ORDER BY e.xid, e.id
LIMIT 1
""",
    compacted=False,
)
"""D4: the first event of a wait step's (name, key) whose transaction its snapshot did not see
(committed after the wait began), earliest transaction first, or no row."""

PUBLISH_EVENT: Final = Template(
    """
WITH event AS (
    INSERT INTO {events} (name, key, payload, xid, created_at)
    VALUES (:name, :key, CAST(:payload AS jsonb),
            CAST(CAST(pg_current_xact_id() AS text) AS bigint), {now})
    RETURNING id
), woken AS (
    UPDATE {runs} r SET wait_for = NULL, run_at = least(r.run_at, {now}), updated_at = {now}
    -- <runs>_wait_idx
    WHERE r.wait_for = :wait_key AND r.state = 'waiting'
    RETURNING r.job_id
)
SELECT (SELECT id FROM event) AS id, ARRAY(SELECT DISTINCT job_id FROM woken) AS job_ids
""",
    compacted=False,
)
"""D4: store an event in the publisher's transaction (after WAIT_LOCK_SHARED) and make its
waiting runs due; the event's id and the jobs of the runs it woke (to announce, K1)."""

ADOPT_CHILDREN: Final = Template(
    """
WITH adopted AS (
    UPDATE {runs} c SET parent_id = :parent_id
    -- <runs>_pkey
    WHERE c.id = ANY(CAST(:ids AS text[])) AND c.parent_id IS NULL AND c.id <> :parent_id
    RETURNING 1
)
UPDATE {runs} p SET wait_for = '#children'
WHERE p.id = :parent_id AND p.lease_token = :token AND p.state = 'running'
  AND (SELECT count(*) FROM adopted) >= 0
""",
    compacted=False,
)
"""D5: the spawned runs become the parent's children (once: a replay adopts nothing new), and
the parent is marked as having children (their end wakes it). With a history table (J16) the
backend then runs ADOPT_ENDED_CHILDREN (:mod:`.live`) for the children already there."""

CHILDREN: Final = Template(
    """
SELECT c.id, c.job_id, c.state, c.last_error
FROM {runs} c
-- <runs>_parent_idx
WHERE c.parent_id = :run_id AND c.parent_id IS NOT NULL
ORDER BY c.seq
""",
    compacted=False,
)

WAKE_PARENTS: Final = Template(
    """
UPDATE {runs} p
-- J18: a running parent's updated_at stays its attempt's start (ship_sqla._sql.BEGAN).
SET wait_for = '#children-done',
    updated_at = CASE WHEN p.state = 'waiting' THEN {now} ELSE p.updated_at END,
    run_at = CASE WHEN p.state = 'waiting' THEN least(p.run_at, {now}) ELSE p.run_at END
-- <runs>_pkey, then <runs>_parent_idx for the live-children check
WHERE p.id = ANY(CAST(:parents AS text[])) AND p.wait_for = '#children'
  AND NOT EXISTS (
    SELECT 1 FROM {runs} c
    WHERE c.parent_id = p.id AND c.parent_id IS NOT NULL AND c.state IN ('waiting', 'running'))
RETURNING p.job_id, p.state
""",
    compacted=False,
)
"""D5: after children's ends committed, wake each of their parents that has no live child
left: due now when it waits, marked when it still runs (its suspend then sees the mark)."""

RERUN_FROM_STEP: Final = Template(
    """
WITH run AS (
    SELECT r.id FROM {runs} r
    -- <runs>_pkey
    WHERE r.id = :run_id AND r.state IN ('dead', 'waiting')
      AND EXISTS (SELECT 1 FROM {steps} s WHERE s.run_id = r.id AND s.name = :step)
    FOR UPDATE
), dropped AS (
    DELETE FROM {steps} s
    USING run
    WHERE s.run_id = run.id
      AND s.seq >= (SELECT s2.seq FROM {steps} s2 WHERE s2.run_id = run.id AND s2.name = :step)
    RETURNING 1
)
UPDATE {runs} r
SET state = 'waiting', run_at = {now}, finished_at = NULL, updated_at = {now}, wait_for = NULL,
    max_attempts = CASE WHEN r.state = 'dead' THEN r.attempt + 1 ELSE r.max_attempts END,
    consecutive_lapses = 0
FROM run
WHERE r.id = run.id AND (SELECT count(*) FROM dropped) >= 0
RETURNING {cols}
""",
    compacted=False,
)
"""D6: drop the named step and every later one of a dead or waiting run, and make it due now
(a dead one with one more attempt, as an operator retry); no row when it is in another state
or has no such step."""

DELETE_OLD_EVENTS: Final = Template(
    """
DELETE FROM {events} e
WHERE e.id IN (
    SELECT o.id FROM {events} o
    -- <events>_created_idx
    WHERE o.created_at < {now} - CAST(:older_than AS double precision) * interval '1 second'
    ORDER BY o.created_at
    LIMIT :limit
)
""",
    compacted=False,
)
"""Events retention: at most ``:limit`` events published over ``:older_than`` seconds ago."""

# --- D8: the patch figures, each one bounded statement ------------------------------------------

_LIVE_RUNS: Final = """
    SELECT both_states.id, both_states.created_at FROM (
        (SELECT r.id, r.created_at FROM {runs} r
         -- <runs>_due_idx (job_id prefix): the job's waiting runs
         WHERE r.job_id = :job_id AND r.state = 'waiting' LIMIT :read)
        UNION ALL
        (SELECT r.id, r.created_at FROM {runs} r
         -- <runs>_lease_idx (job_id prefix): the job's running runs
         WHERE r.job_id = :job_id AND r.state = 'running' LIMIT :read)
    ) both_states
    LIMIT :read"""
"""At most ``:read`` live runs of job ``:job_id`` (waiting, then running), each through the
partial index its claims keep, so the read never leaves the job's live runs."""

_HOLDS: Final = """EXISTS (
        -- <steps>_pkey: the run's marker of the patch
        SELECT 1 FROM {steps} s
        WHERE s.run_id = live.id AND s.name = :name AND s.kind = 'patch'
    )"""

PATCH_IDS: Final = Template(
    """
WITH RECURSIVE ids(name) AS (
    (SELECT s.name FROM {steps} s
     -- <steps>_patch_idx: a loose scan, one probe per patch
     WHERE s.kind = 'patch' ORDER BY s.name LIMIT 1)
    UNION ALL
    SELECT (SELECT s.name FROM {steps} s
            WHERE s.kind = 'patch' AND s.name > ids.name ORDER BY s.name LIMIT 1)
    FROM ids WHERE ids.name IS NOT NULL
)
SELECT ids.name FROM ids WHERE ids.name IS NOT NULL LIMIT :limit
""",
    compacted=False,
)
"""D8: the names of the patch markers any run stored (``patch:<id>``), in name order, at most
``:limit``: one index probe each."""

PATCH_HOLDING: Final = Template(
    f"""
SELECT count(*) FILTER (WHERE {_HOLDS}) AS runs, count(*) AS read
FROM ({_LIVE_RUNS}
) live
""",  # noqa: S608 - a template of constant text
    compacted=False,
)
"""D8: live runs of the job holding the marker ``:name``, among at most ``:read`` of its live
runs (``read`` = ``:read``: a lower bound)."""

_LACKING_TAIL: Final = f"""
SELECT (SELECT first.created_at FROM first) AS first_marker_at,
    count(*) FILTER (
        WHERE live.created_at < (SELECT first.created_at FROM first) AND NOT {_HOLDS}
    ) AS runs,
    count(*) AS read
FROM ({_LIVE_RUNS}
) live
"""  # noqa: S608 - a template of constant text
"""D8: what PATCH_LACKING and PATCH_LACKING_EITHER read after their ``first`` marker: the live
runs created before it that do not hold it, among at most ``:read``."""

PATCH_LACKING: Final = Template(
    f"""
WITH first AS (
    SELECT s.created_at FROM {{steps}} s
    JOIN {{runs}} r ON r.id = s.run_id
    -- <steps>_patch_idx: the patch's markers, oldest first; <runs>_pkey: the job's
    WHERE s.kind = 'patch' AND s.name = :name AND r.job_id = :job_id
    ORDER BY s.created_at LIMIT 1
){_LACKING_TAIL}""",  # noqa: S608 - a template of constant text
    compacted=False,
)
"""D8: when the job's first marker ``:name`` was stored, and the live runs of the job created
before it that do not hold it (they may take the old path), among at most ``:read`` of its live
runs. Patch ids are best unique per application: the first marker's walk passes markers of
other jobs with the same id."""

PATCH_LACKING_EITHER: Final = Template(
    f"""
WITH first AS (
    SELECT s.created_at FROM {{steps}} s
    -- <steps>_patch_idx: the patch's markers, oldest first; the job's run in either table
    -- (J16: <runs>_pkey, else <history>_id_idx: a run that ended moved, its steps stayed)
    WHERE s.kind = 'patch' AND s.name = :name
      AND (EXISTS (SELECT 1 FROM {{runs}} r WHERE r.id = s.run_id AND r.job_id = :job_id)
           OR EXISTS (SELECT 1 FROM {{history}} h WHERE h.id = s.run_id AND h.job_id = :job_id))
    ORDER BY s.created_at LIMIT 1
){_LACKING_TAIL}""",  # noqa: S608 - a template of constant text
    compacted=False,
)
"""PATCH_LACKING with history (J16): the first marker's run may have ended and moved."""
