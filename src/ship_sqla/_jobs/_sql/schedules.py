"""The schedule statements (J9): the state table's upsert, its due-row lock and the advance of
``next_at``. A fired occurrence is inserted by the enqueue statements (:mod:`.enqueue`), in the
tick's transaction, like any run. Rules: see :mod:`ship_sqla._jobs._sql`.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["DB_NOW", "LOCK_DUE_STATES_SKIP_LOCKED", "SET_NEXT_AT", "UPSERT_SCHEDULE_STATES"]

DB_NOW: Final = Template("SELECT {now} AS now")
"""The instant schedule arithmetic starts from: the frozen clock's, else the database's, so
every ticker agrees on it."""

UPSERT_SCHEDULE_STATES: Final = Template("""
INSERT INTO {state} AS s (job_id, next_at, trigger, updated_at)
SELECT t.job_id, t.next_at, t.trigger, {now}
FROM unnest(
    CAST(:job_ids AS text[]), CAST(:next_ats AS timestamptz[]), CAST(:triggers AS text[])
) AS t(job_id, next_at, trigger)
ON CONFLICT (job_id) DO UPDATE
SET next_at = EXCLUDED.next_at, trigger = EXCLUDED.trigger, updated_at = EXCLUDED.updated_at
WHERE s.trigger IS DISTINCT FROM EXCLUDED.trigger OR s.next_at IS NULL
""")
"""``install_schedules``: one row per scheduled job; an unchanged trigger keeps its ``next_at``
(a restart replaces, never duplicates). Index: ``<state>_pkey`` (the ON CONFLICT arbiter)."""

LOCK_DUE_STATES_SKIP_LOCKED: Final = Template("""
SELECT s.job_id, s.next_at
FROM {state} AS s
JOIN unnest(CAST(:job_ids AS text[]), CAST(:triggers AS text[])) AS t(job_id, trigger)
    ON t.job_id = s.job_id AND t.trigger = s.trigger
WHERE s.next_at <= {now}
ORDER BY s.job_id
FOR UPDATE OF s SKIP LOCKED
""")
"""``tick_schedules``: lock this process's due state rows; rows another ticker holds are skipped
(it is firing them), rows whose stored trigger is another deployment's are left alone.
Index: ``<state>_pkey`` (``job_id`` equality per unnested id)."""

SET_NEXT_AT: Final = Template("""
UPDATE {state} AS s
SET next_at = t.next_at, updated_at = {now}
FROM unnest(CAST(:job_ids AS text[]), CAST(:next_ats AS timestamptz[])) AS t(job_id, next_at)
WHERE s.job_id = t.job_id
""")
"""``tick_schedules``: advance each locked row to its first occurrence after now.
Index: ``<state>_pkey``."""
