"""The statements of schedules (J9): the state table's upsert, its due-row lock, and the insert
of one run per fired occurrence. Templates rendered once per backend with the quoted table names
(``{state}``, ``{runs}``); time is ``{now}`` as in :mod:`ship_sqla._jobs._sql`.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import TextClause, text

from ship_sqla._jobs._sql import NOW

__all__ = [
    "DB_NOW",
    "INSERT_OCCURRENCE_RUNS",
    "LOCK_DUE_STATES_SKIP_LOCKED",
    "SET_NEXT_AT",
    "UPSERT_SCHEDULE_STATES",
    "render_schedule",
]


def render_schedule(template: str, *, state: str, runs: str) -> TextClause:
    """The statement for one (state, runs) table pair (quoted, schema-qualified names)."""
    return text(template.replace("{state}", state).replace("{runs}", runs).replace("{now}", NOW))


DB_NOW: Final = "SELECT {now} AS now"
"""The instant schedule arithmetic starts from: the frozen clock's, else the database's."""

UPSERT_SCHEDULE_STATES: Final = """
INSERT INTO {state} AS s (job_id, next_at, trigger, updated_at)
SELECT t.job_id, t.next_at, t.trigger, {now}
FROM unnest(
    CAST(:job_ids AS text[]), CAST(:next_ats AS timestamptz[]), CAST(:triggers AS text[])
) AS t(job_id, next_at, trigger)
ON CONFLICT (job_id) DO UPDATE
SET next_at = EXCLUDED.next_at, trigger = EXCLUDED.trigger, updated_at = EXCLUDED.updated_at
WHERE s.trigger IS DISTINCT FROM EXCLUDED.trigger OR s.next_at IS NULL
"""
"""``schedule``: one row per scheduled job; an unchanged trigger keeps its ``next_at`` (a restart
replaces, never duplicates). Index: ``<state>_pkey`` (the ON CONFLICT arbiter)."""

LOCK_DUE_STATES_SKIP_LOCKED: Final = """
SELECT s.job_id, s.next_at
FROM {state} AS s
JOIN unnest(CAST(:job_ids AS text[]), CAST(:triggers AS text[])) AS t(job_id, trigger)
    ON t.job_id = s.job_id AND t.trigger = s.trigger
WHERE s.next_at <= {now}
ORDER BY s.job_id
FOR UPDATE OF s SKIP LOCKED
"""
"""``tick``: lock this process's due state rows; rows another ticker holds are skipped (it is
firing them), rows whose stored trigger is another deployment's are left alone.
Index: ``<state>_pkey`` (``job_id`` equality per unnested id)."""

INSERT_OCCURRENCE_RUNS: Final = """
INSERT INTO {runs} (
    id, job_id, state, payload, key, dedupe_key, attempt, max_attempts,
    run_at, created_at, updated_at, history
)
SELECT t.id, t.job_id, 'waiting', CAST(t.payload AS jsonb), t.key, t.dedupe_key, 0,
    t.max_attempts, t.run_at, {now}, {now}, CAST('[]' AS jsonb)
FROM unnest(
    CAST(:ids AS text[]), CAST(:job_ids AS text[]), CAST(:payloads AS text[]),
    CAST(:keys AS text[]), CAST(:dedupe_keys AS text[]), CAST(:max_attempts AS integer[]),
    CAST(:run_ats AS timestamptz[])
) AS t(id, job_id, payload, key, dedupe_key, max_attempts, run_at)
ON CONFLICT DO NOTHING
RETURNING id
"""
"""``tick``: one run per fired occurrence, id ``<job_id>/<occurrence>``. An id that exists is a
duplicate tick and inserts nothing. Index: ``<runs>_pkey`` (arbiter; also
``<runs>_dedupe_idx`` when the job's idempotency policy gives the run a dedupe key)."""

SET_NEXT_AT: Final = """
UPDATE {state} AS s
SET next_at = t.next_at, updated_at = {now}
FROM unnest(CAST(:job_ids AS text[]), CAST(:next_ats AS timestamptz[])) AS t(job_id, next_at)
WHERE s.job_id = t.job_id
"""
"""``tick``: advance each locked row to its first occurrence after now. Index: ``<state>_pkey``."""
