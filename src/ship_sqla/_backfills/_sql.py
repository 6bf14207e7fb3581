"""The backfill ledger's statements (C4). ``{backfills}`` is the table's quoted, qualified name;
each is a :class:`~ship_sqla._sql.Template` rendered once per ledger by its
:class:`~ship_sqla._sql.Statements`, sent as written (``compacted=False``). Every one reads
one row by ``<backfills>_pkey`` (the list: the whole small table in id order).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "BEGIN_BACKFILL",
    "CANCEL_BACKFILL_IF_LIVE",
    "CHECKPOINT_IF_HOLDER_CURRENT",
    "FINISH_IF_HOLDER_CURRENT",
    "GET_BACKFILL",
    "LIST_BACKFILLS",
    "REQUEST_BACKFILL",
]

REQUEST_BACKFILL: Final = Template(
    """
INSERT INTO {backfills} AS b
    (id, state, pages, rows, pace, stall_after, required_by, created_at, updated_at)
VALUES (:id, 'pending', 0, 0, CAST(:pace AS double precision),
        CAST(:stall_after AS double precision), CAST(:required_by AS text), {now}, {now})
ON CONFLICT (id) DO UPDATE SET
    state = CASE WHEN b.state IN ('failed', 'cancelled') THEN 'pending' ELSE b.state END,
    finished_at = CASE WHEN b.state IN ('failed', 'cancelled') THEN NULL ELSE b.finished_at END,
    error = CASE WHEN b.state IN ('failed', 'cancelled') THEN NULL ELSE b.error END,
    run_id = CASE WHEN b.state IN ('failed', 'cancelled') THEN NULL ELSE b.run_id END,
    token = CASE WHEN b.state IN ('failed', 'cancelled') THEN NULL ELSE b.token END,
    updated_at = CASE WHEN b.state IN ('failed', 'cancelled') THEN EXCLUDED.updated_at
                      ELSE b.updated_at END,
    pace = coalesce(EXCLUDED.pace, b.pace),
    stall_after = coalesce(EXCLUDED.stall_after, b.stall_after),
    required_by = coalesce(EXCLUDED.required_by, b.required_by)
RETURNING id, state, pages, rows, last_key, pace, stall_after, required_by, run_id, token,
        created_at, started_at, finished_at, updated_at, error
""",
    compacted=False,
)
"""A start: inserted pending, a failed or cancelled one pending again, the declared fields
given stored (None keeps them)."""

BEGIN_BACKFILL: Final = Template(
    """
INSERT INTO {backfills} AS b
    (id, state, pages, rows, pace, stall_after, required_by, run_id, token,
     created_at, started_at, updated_at)
VALUES (:id, 'running', 0, 0, CAST(:pace AS double precision),
        CAST(:stall_after AS double precision), CAST(:required_by AS text),
        CAST(:run_id AS text), CAST(:token AS bigint), {now}, {now}, {now})
ON CONFLICT (id) DO UPDATE SET
    state = 'running',
    run_id = EXCLUDED.run_id,
    token = EXCLUDED.token,
    pace = EXCLUDED.pace,
    stall_after = EXCLUDED.stall_after,
    required_by = EXCLUDED.required_by,
    started_at = coalesce(b.started_at, EXCLUDED.started_at),
    finished_at = NULL,
    error = NULL,
    -- A resumed pass keeps its last checkpoint's time: the pacer's next slot is read from it.
    updated_at = CASE WHEN b.state <> 'running' AND b.pages = 0
                      THEN EXCLUDED.updated_at ELSE b.updated_at END
WHERE b.state NOT IN ('completed', 'cancelled')
RETURNING id, state, pages, rows, last_key, pace, stall_after, required_by, run_id, token,
        created_at, started_at, finished_at, updated_at, error
""",
    compacted=False,
)
"""A run takes the backfill (no row: a completed or cancelled one, nothing to do)."""

CHECKPOINT_IF_HOLDER_CURRENT: Final = Template(
    """
UPDATE {backfills}
SET pages = pages + 1,
    rows = rows + CAST(:rows AS bigint),
    last_key = CAST(:last_key AS jsonb),
    updated_at = {now}
WHERE id = :id
  AND state = 'running'
  AND run_id = CAST(:run_id AS text)
  AND token = CAST(:token AS bigint)
  AND pages = CAST(:pages_before AS bigint)
RETURNING id, state, pages, rows, last_key, pace, stall_after, required_by, run_id, token,
        created_at, started_at, finished_at, updated_at, error
""",
    compacted=False,
)
"""C4: one page's checkpoint, a compare-and-set on the holder and the page count; joins the
page's unit of work (the row lock it takes is held to that commit)."""

FINISH_IF_HOLDER_CURRENT: Final = Template(
    """
UPDATE {backfills}
SET state = CAST(:state AS text), finished_at = {now}, updated_at = {now},
    error = CAST(:error AS text)
WHERE id = :id
  AND state = 'running'
  AND run_id = CAST(:run_id AS text)
  AND token = CAST(:token AS bigint)
""",
    compacted=False,
)
"""The pass ended (completed, or failed on its last attempt), fenced on the holder."""

CANCEL_BACKFILL_IF_LIVE: Final = Template(
    """
UPDATE {backfills}
SET state = 'cancelled', finished_at = {now}, updated_at = {now}
WHERE id = :id AND state IN ('pending', 'running')
RETURNING id, state, pages, rows, last_key, pace, stall_after, required_by, run_id, token,
        created_at, started_at, finished_at, updated_at, error
""",
    compacted=False,
)
"""An operator's cancel of a live backfill."""

GET_BACKFILL: Final = Template(
    """
SELECT id, state, pages, rows, last_key, pace, stall_after, required_by, run_id, token,
       created_at, started_at, finished_at, updated_at, error
FROM {backfills}
WHERE id = :id
""",
    compacted=False,
)
"""One ledger row."""

LIST_BACKFILLS: Final = Template(
    """
SELECT id, state, pages, rows, last_key, pace, stall_after, required_by, run_id, token,
       created_at, started_at, finished_at, updated_at, error
FROM {backfills}
ORDER BY id
LIMIT CAST(:limit AS integer)
""",
    compacted=False,
)
"""The ledger, by id, bounded."""
