"""Every statement of the operator operations (J8): named, each beside the index that serves it.

Templates are rendered per runs table with :func:`ship_sqla._jobs._sql.render` (``{runs}``,
``{now}``, ``{cols}``), so each is one stable SQL text. Partial-index predicates are written as
``_tables.py`` declares them, as literals: ``state = 'dead'`` alone does not imply
``state IN ('completed', 'dead', 'discarded')`` for a generic plan's benefit, so both appear.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "OPS_DELETE_FINISHED_BATCH",
    "OPS_DISCARD_WAITING_OR_DEAD",
    "OPS_GET_RUN",
    "OPS_LIST_DEAD_ALL_JOBS",
    "OPS_LIST_DEAD_OF_JOB",
    "OPS_RETRY_DEAD",
]

OPS_GET_RUN: Final = "SELECT {cols} FROM {runs} r WHERE r.id = :id"
"""One run with its history. Served by ``<runs>_pkey``."""

_DEAD_PAGE_AFTER_CURSOR: Final = """
  -- The sargable bound starts the index scan at the cursor (a generic plan cannot use the row
  -- comparison below as an index condition); the row comparison breaks finished_at ties by id.
  AND r.finished_at <= coalesce(CAST(:after_at AS timestamptz), CAST('infinity' AS timestamptz))
  AND (CAST(:after_at AS timestamptz) IS NULL
       OR (r.finished_at, r.id) < (CAST(:after_at AS timestamptz), CAST(:after_id AS text)))
ORDER BY r.finished_at DESC, r.id DESC
LIMIT CAST(:limit AS integer)
"""
"""The keyset tail both dead-run pages share: past the cursor, newest first, one page."""

OPS_LIST_DEAD_OF_JOB: Final = (
    """
SELECT {cols} FROM {runs} r
-- <runs>_finished_idx (job_id, finished_at) read backwards: newest dead runs first, keyset on
-- (finished_at, id), at most :limit rows past the cursor.
WHERE r.job_id = :job_id AND r.state IN ('completed', 'dead', 'discarded') AND r.state = 'dead'
"""
    + _DEAD_PAGE_AFTER_CURSOR
)
"""A page of one job's dead runs (``list_failed(job_id=...)``)."""

OPS_LIST_DEAD_ALL_JOBS: Final = (
    """
SELECT {cols} FROM {runs} r
-- <runs>_finished_idx: its predicate limits the read to terminal runs, but job_id leads the
-- index, so across jobs the rows are filtered to 'dead' and top-N sorted (bounded by :limit, not
-- by the number of completed runs kept; run cleanup to keep that number small).
WHERE r.state IN ('completed', 'dead', 'discarded') AND r.state = 'dead'
"""
    + _DEAD_PAGE_AFTER_CURSOR
)
"""A page of every job's dead runs (``list_failed()``)."""

OPS_RETRY_DEAD: Final = """
UPDATE {runs} r
SET state = 'waiting', max_attempts = r.attempt + 1, run_at = {now}, finished_at = NULL,
    lease_expires_at = NULL, claimed_by = NULL, updated_at = {now}
-- <runs>_pkey. Not while a newer live run holds the dedupe key (<runs>_dedupe_idx, probed with
-- its predicate word for word): reviving this run would break J1. A concurrent enqueue that
-- wins the race anyway trips that unique index (23505).
WHERE r.id = :id AND r.state = 'dead'
  AND NOT EXISTS (
    SELECT 1 FROM {runs} o
    WHERE o.job_id = r.job_id AND o.dedupe_key = r.dedupe_key
      AND o.dedupe_key IS NOT NULL AND o.state IN ('waiting', 'running'))
RETURNING {cols}
"""
"""Operator retry (J8): a dead run waits again, due now, with exactly one more attempt."""

OPS_DISCARD_WAITING_OR_DEAD: Final = """
UPDATE {runs} r
SET state = 'discarded', finished_at = {now}, updated_at = {now}, lease_expires_at = NULL,
    claimed_by = NULL
-- <runs>_pkey. A running run is never discarded under its holder (it settles first).
WHERE r.id = :id AND r.state IN ('waiting', 'dead')
RETURNING {cols}
"""
"""Operator discard (J8): a waiting or dead run becomes terminal."""

OPS_DELETE_FINISHED_BATCH: Final = """
DELETE FROM {runs} d
WHERE d.id = ANY(ARRAY(
    -- <runs>_finished_idx (job_id, finished_at), predicate word for word: one job's runs in one
    -- terminal state finished at least :retention seconds ago, oldest first, one bounded batch.
    SELECT r.id FROM {runs} r
    WHERE r.job_id = :job_id AND r.state IN ('completed', 'dead', 'discarded')
      AND r.state = CAST(:state AS text)
      AND r.finished_at <= {now} - CAST(:retention AS double precision) * interval '1 second'
    ORDER BY r.finished_at
    LIMIT CAST(:batch AS integer)
))
"""
"""Cleanup (J8 retention): delete one bounded batch; each batch is its own short transaction."""
