"""D10's statements: runs parked on a divergence (``wait_for = '#diverged'``, due never): the
operators' listing, an unpark, and a new build's bounded batches of unparks. Rules: see
:mod:`ship_sqla._jobs._sql`. Each reads ``<runs>_parked_idx``, which holds only parked runs, so
nothing here reads the rest of the table however large it is.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "CLAIM_BUILD_UNPARK",
    "LIST_PARKED_ALL",
    "LIST_PARKED_OF_JOB",
    "MOVE_VERSION",
    "PARKED_COUNTS",
    "UNPARK_BATCH",
    "UNPARK_RUN",
]

LIST_PARKED_OF_JOB: Final = Template("""
SELECT {cols} FROM {runs} r
-- <runs>_parked_idx (its predicate word for word): one job's parked runs in id order from the
-- cursor, one page.
WHERE r.wait_for = '#diverged' AND r.job_id = :job_id AND r.state = 'waiting'
  AND r.id > coalesce(CAST(:after_id AS text), '')
ORDER BY r.job_id, r.id
LIMIT CAST(:limit AS integer)
""")
"""D10: one keyset page of ``:job_id``'s parked runs, by id, after ``:after_id``."""

LIST_PARKED_ALL: Final = Template("""
SELECT {cols} FROM {runs} r
-- <runs>_parked_idx (its predicate word for word): every job's parked runs in (job_id, id)
-- order from the cursor, one page.
WHERE r.wait_for = '#diverged' AND r.state = 'waiting'
  AND (r.job_id, r.id)
      > (coalesce(CAST(:after_job AS text), ''), coalesce(CAST(:after_id AS text), ''))
ORDER BY r.job_id, r.id
LIMIT CAST(:limit AS integer)
""")
"""D10: one keyset page of every job's parked runs, by job then id, after (``:after_job``,
``:after_id``)."""

UNPARK_RUN: Final = Template("""
UPDATE {runs} r
SET run_at = {now}, wait_for = NULL, updated_at = {now}
-- <runs>_pkey; the run must still be parked.
WHERE r.id = :id AND r.wait_for = '#diverged' AND r.state = 'waiting'
RETURNING {cols}
""")
"""D10: an operator unparks one run: due now, so it replays on the deployed code (and parks
again if it still diverges)."""

UNPARK_BATCH: Final = Template("""
UPDATE {runs} u
SET run_at = {now}, wait_for = NULL, updated_at = {now}
WHERE u.id = ANY(ARRAY(
    -- <runs>_parked_idx (its predicate word for word): at most :limit parked runs of the job.
    SELECT r.id FROM {runs} r
    WHERE r.wait_for = '#diverged' AND r.job_id = :job_id
    ORDER BY r.job_id, r.id
    LIMIT CAST(:limit AS integer)
    FOR UPDATE SKIP LOCKED
))
  AND u.wait_for = '#diverged' AND u.state = 'waiting'
""")
"""D10: one bounded batch of a new build's unparks of one job (its count is the rowcount)."""

CLAIM_BUILD_UNPARK: Final = Template("""
INSERT INTO {state} AS g (job_id, trigger, updated_at)
VALUES (CAST(:row AS text), CAST(:build AS text), {now})
-- <state>_pkey (the ON CONFLICT arbiter): one row per job, <job_id>#unparked-by.
ON CONFLICT (job_id) DO UPDATE SET trigger = EXCLUDED.trigger, updated_at = EXCLUDED.updated_at
WHERE g.trigger IS DISTINCT FROM EXCLUDED.trigger
RETURNING g.job_id
""")
"""D10: the first worker of build ``:build`` to register for a job records that build on the
job's ``<job_id>#unparked-by`` state row and gets a row back: it, and only it, unparks the job's
parked runs; a later registration of the same build gets none."""

PARKED_COUNTS: Final = Template("""
SELECT r.job_id, count(*) AS runs
FROM {runs} r
-- <runs>_parked_idx (its predicate word for word): an index-only count of the given jobs'
-- parked runs (one entry read per parked run, and no other run).
WHERE r.wait_for = '#diverged' AND r.job_id = ANY(CAST(:job_ids AS text[]))
GROUP BY r.job_id
""")
"""D10: the ``ship.workflow.runs.parked`` gauge: parked runs per job of ``:job_ids`` (jobs with
none are absent)."""

MOVE_VERSION: Final = Template("""
UPDATE {runs} r
SET handler_version = CAST(:version AS integer), run_at = {now}, wait_for = NULL,
    updated_at = {now}
-- <runs>_pkey; the run must still be parked.
WHERE r.id = :id AND r.wait_for = '#diverged' AND r.state = 'waiting'
RETURNING {cols}
""")
"""D10: an operator moves a parked run to handler version ``:version`` (after its history
replayed cleanly on it) and unparks it: due now, executed by that version's handler."""
