"""Bulk actions by filter (issue 36 item 5; J8, K2, J16, S1): ONE statement per batch of up to
1,000 runs the walk found (:func:`~ship_sqla.kernel._search.act_matching`), each fenced exactly
as the single-run statement it stands for (:mod:`.admin`, :mod:`.live`). Rules: see
:mod:`ship_sqla._jobs._sql`. Each takes ``:ids`` (``text[]``, the batch in walk order) and
answers one row per run it changed (``id``, ``state`` after, ``parent_id``; the cancels also
``told`` and the rows they ``skipped``). Every run is probed by ``<runs>_pkey`` (or the
history's id index); nothing else is read. The ids are matched as
``id = ANY(ARRAY(SELECT unnest(:ids)))``: an array the planner cannot see into, so it probes
the key for each (a custom plan given the 1,000 ids as a literal array, or a join on them,
planned sequential scans of the runs table and the history partitions at 80,000 / 400,000
rows, and ran 2-8 times as long under this machine's load;
``tests/integration/test_job_bulk_filter_explain.py``).

- retry (J8, J1, J16): a dead run in history moves back, one in the runs table (an older
  release's leftover) waits again in place; of several runs of the batch that share a dedupe
  key, only the first in walk order (a single-run retry of each in that order would revive
  only the first too), and none while a live run holds it. A concurrent enqueue that wins the
  race anyway trips the unique index (23505): the backend then retries the batch run by run.
- discard (J8, J16): a waiting run is moved into history, discarded; a dead one in history
  changes state class; a running run is never discarded under its holder.
- cancel (K2, J13, J16): locks the batch's live rows ``FOR UPDATE SKIP LOCKED``; a waiting run
  is cancelled at once (moved into history), a running run's request is recorded and its holder
  told in this transaction. A row that someone holds (a transactional handler's fence, J13, or
  a settle in flight) is answered as ``skipped`` and changed by nothing here: the backend
  cancels it with the single-run path (told first, then requested), one run at a time.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._jobs._sql._moves import INSERT_BACK, insert_ended
from ship_sqla._sql import Template

__all__ = [
    "CANCEL_BATCH",
    "CANCEL_BATCH_MOVING",
    "DISCARD_BATCH",
    "DISCARD_BATCH_MOVING",
    "RETRY_DEAD_BATCH",
    "RETRY_DEAD_BATCH_BACK",
]

_WANTED: Final = """wanted AS (
    SELECT t.id, t.ord FROM unnest(CAST(:ids AS text[])) WITH ORDINALITY AS t(id, ord)
)"""
"""The batch's ids with their place in the walk."""

_PICK_FIRST: Final = """picked AS (
    -- J1: of the batch's runs that share a dedupe key, the first in walk order only, and
    -- none while a live run holds it (<runs>_dedupe_idx, its predicate word for word).
    SELECT DISTINCT ON (f.job_id, coalesce(f.dedupe_key, f.id)) f.id
    FROM found f
    WHERE NOT EXISTS (
        SELECT 1 FROM {runs} o
        WHERE o.job_id = f.job_id AND o.dedupe_key = f.dedupe_key
          AND o.dedupe_key IS NOT NULL AND o.state IN ('waiting', 'running'))
    ORDER BY f.job_id, coalesce(f.dedupe_key, f.id), f.ord
)"""

_RETRY_SET: Final = """SET state = 'waiting', max_attempts = r.attempt + 1, run_at = {now},
    finished_at = NULL, lease_expires_at = NULL, claimed_by = NULL, updated_at = {now},
    -- J15: a retried run starts a new streak (its crash loop's cause is taken to be fixed).
    consecutive_lapses = 0"""

RETRY_DEAD_BATCH: Final = Template(
    "WITH "  # noqa: S608 - constant text
    + _WANTED
    + """, found AS (
    -- <runs>_pkey, one probe per id.
    SELECT r.id, r.job_id, r.dedupe_key, w.ord FROM {runs} r JOIN wanted w ON r.id = w.id
    WHERE r.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND r.state = 'dead'
), """
    + _PICK_FIRST
    + """
UPDATE {runs} r
"""
    + _RETRY_SET
    + """
WHERE r.id = ANY(ARRAY(SELECT p.id FROM picked p)) AND r.state = 'dead'
RETURNING r.id, r.state, r.parent_id
"""
)
"""Operator retry (J8) of a batch of dead runs, in place (a backend without history)."""

RETRY_DEAD_BATCH_BACK: Final = Template(
    "WITH "  # noqa: S608 - constant text
    + _WANTED
    + """, found AS (
    -- the history's id index (J16), then <runs>_pkey for an older release's leftovers.
    SELECT h.id, h.job_id, h.dedupe_key, w.ord FROM {history} h JOIN wanted w ON h.id = w.id
    WHERE h.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND h.state = 'dead'
    UNION ALL
    SELECT r.id, r.job_id, r.dedupe_key, w.ord FROM {runs} r JOIN wanted w ON r.id = w.id
    WHERE r.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[]))))
      AND r.state IN ('completed', 'dead', 'discarded', 'cancelled') AND r.state = 'dead'
), """
    + _PICK_FIRST
    + """, back AS (
    -- J16, J8: the dead runs leave history ...
    DELETE FROM {history} h
    WHERE h.id = ANY(ARRAY(SELECT p.id FROM picked p)) AND h.state = 'dead'
    RETURNING h.*
), moved AS (
    -- ... and wait again in the runs table, due now, with exactly one more attempt.
    """
    + INSERT_BACK
    + """    RETURNING r.id, r.state, r.parent_id
), kept AS (
    UPDATE {runs} r
"""
    + _RETRY_SET
    + """
    WHERE r.id = ANY(ARRAY(SELECT p.id FROM picked p)) AND r.state = 'dead'
    RETURNING r.id, r.state, r.parent_id
)
SELECT m.id, m.state, m.parent_id FROM moved m
UNION ALL
SELECT k.id, k.state, k.parent_id FROM kept k
"""
)
"""RETRY_DEAD_BATCH for a backend with a history table (J16): moved back in one statement."""

DISCARD_BATCH: Final = Template("""
UPDATE {runs} r
SET state = 'discarded', finished_at = {now}, updated_at = {now}, lease_expires_at = NULL,
    claimed_by = NULL
-- <runs>_pkey, one probe per id. A running run is never discarded under its holder.
WHERE r.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND r.state IN ('waiting', 'dead')
RETURNING r.id, r.state, r.parent_id
""")
"""Operator discard (J8) of a batch of waiting or dead runs (a backend without history)."""

DISCARD_BATCH_MOVING: Final = Template(
    """
WITH gone AS (
    -- <runs>_pkey. A running run is never discarded under its holder (it settles first).
    DELETE FROM {runs} r
    WHERE r.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND r.state = 'waiting'
    RETURNING r.*
), moved AS (
    """  # noqa: S608 - constant text
    + insert_ended("gone", "'discarded'", "true", "NULL")
    + """
    RETURNING h.id, h.state, h.parent_id
), dead AS (
    -- The history's id index. A dead run discarded stays in history (its state class changes).
    UPDATE {history} h SET state = 'discarded', finished_at = {now}
    WHERE h.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND h.state = 'dead'
    RETURNING h.id, h.state, h.parent_id
), kept AS (
    -- <runs>_pkey: a dead run an older release left in the runs table.
    UPDATE {runs} r
    SET state = 'discarded', finished_at = {now}, updated_at = {now}, lease_expires_at = NULL,
        claimed_by = NULL
    WHERE r.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND r.state = 'dead'
    RETURNING r.id, r.state, r.parent_id
)
SELECT m.id, m.state, m.parent_id FROM moved m
UNION ALL
SELECT d.id, d.state, d.parent_id FROM dead d
UNION ALL
SELECT k.id, k.state, k.parent_id FROM kept k
"""
)
"""DISCARD_BATCH for a backend with a history table (J16)."""

_LOCKED: Final = """locked AS (
    -- <runs>_pkey, one probe per id. A row someone holds is skipped (K2 with J13: the
    -- single-run cancel takes it, its holder told first), never waited for here.
    SELECT r.id FROM {runs} r
    WHERE r.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[]))))
      AND r.state IN ('waiting', 'running')
    FOR UPDATE SKIP LOCKED
)"""

_SKIPPED: Final = """
UNION ALL
-- Live in this statement's snapshot, yet not locked above: held by someone (or ended since).
SELECT s.id, 'skipped', CAST(NULL AS text), false FROM {runs} s
WHERE s.id = ANY(ARRAY(SELECT unnest(CAST(:ids AS text[])))) AND s.state IN ('waiting', 'running')
  AND NOT EXISTS (SELECT 1 FROM locked l WHERE l.id = s.id)
"""

CANCEL_BATCH: Final = Template(
    "WITH "  # noqa: S608 - constant text
    + _LOCKED
    + """, changed AS (
    UPDATE {runs} r
    SET state = CASE WHEN r.state = 'waiting' THEN 'cancelled' ELSE r.state END,
        finished_at = CASE WHEN r.state = 'waiting' THEN {now} ELSE r.finished_at END,
        cancel_requested_at = CASE WHEN r.state = 'running'
            THEN coalesce(r.cancel_requested_at, {now}) END,
        -- J18: a running run's updated_at stays its attempt's start (ship_sqla._sql.BEGAN).
        updated_at = CASE WHEN r.state = 'waiting' THEN {now} ELSE r.updated_at END
    FROM locked l
    WHERE r.id = l.id AND r.state IN ('waiting', 'running')
    RETURNING r.id, r.state, r.parent_id
)
-- The holders are told in this transaction, so on its commit (K2; payload: the run id).
SELECT c.id, c.state, c.parent_id, CASE WHEN c.state = 'running'
    THEN CAST(pg_notify(CAST(:channel AS text), c.id) AS text) END IS NOT NULL AS told
FROM changed c"""
    + _SKIPPED
)
"""Operator cancel (K2) of a batch of live runs (a backend without history)."""

CANCEL_BATCH_MOVING: Final = Template(
    "WITH "  # noqa: S608 - constant text
    + _LOCKED
    + """, gone AS (
    -- a waiting run is cancelled at once, out of the runs table (J16).
    DELETE FROM {runs} r USING locked l WHERE r.id = l.id AND r.state = 'waiting'
    RETURNING r.*
), moved AS (
    """
    + insert_ended("gone", "'cancelled'", "true", "NULL")
    + """
    RETURNING h.id, h.state, h.parent_id
), requested AS (
    -- a running run's request is recorded (the first request's time is kept).
    UPDATE {runs} r
    -- J18: updated_at stays the attempt's start (ship_sqla._sql.BEGAN).
    SET cancel_requested_at = coalesce(r.cancel_requested_at, {now})
    FROM locked l
    WHERE r.id = l.id AND r.state = 'running'
    RETURNING r.id, r.state, r.parent_id
)
SELECT m.id, m.state, m.parent_id, false AS told FROM moved m
UNION ALL
-- The holders are told in this transaction, so on its commit (K2; payload: the run id).
SELECT q.id, q.state, q.parent_id,
    CAST(pg_notify(CAST(:channel AS text), q.id) AS text) IS NOT NULL
FROM requested q"""
    + _SKIPPED
)
"""CANCEL_BATCH for a backend with a history table (K2, J16)."""
