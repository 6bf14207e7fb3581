"""The worker registry's statements (F6) and the queue-sampler lease (F5): what the PostgreSQL
:class:`~ship_sqla.kernel.WorkerRegistry` (``backend.workers``) runs, on the table of
``ship_job_workers_table``. Rules: see :mod:`ship_sqla._jobs._sql` (time is ``{now}``, arrays
instead of IN lists, partial-index predicates word for word). The table holds one row per live
worker (stale rows are pruned), so no statement here ever reads more than a few rows; each still
names the index that serves it.

The templates are rendered by the backend's :class:`~ship_sqla._jobs._sql.JobStatements`,
sent as written (``compacted=False``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "DEREGISTER_WORKER",
    "HEARTBEAT_WORKER",
    "HOLD_SAMPLER_IF_FREE",
    "LIST_WORKERS",
    "PROBE_WORKERS_TABLE",
    "PRUNE_STALE_WORKERS",
    "RELEASE_SAMPLER",
    "SAMPLER_LOCK",
]

PROBE_WORKERS_TABLE: Final = Template("SELECT 1 FROM {workers} LIMIT 0", compacted=False)
"""Reads nothing; fails (42P01) when the workers table is absent: a runtime probes it once at
start and runs unregistered without it."""

HEARTBEAT_WORKER: Final = Template(
    """
INSERT INTO {workers} AS w
    (id, host, pid, started_at, last_seen_at, job_ids, in_flight, draining, job_versions)
VALUES (CAST(:id AS text), CAST(:host AS text), CAST(:pid AS integer),
    CAST(:started_at AS timestamptz), {now}, CAST(:job_ids AS text[]),
    CAST(:in_flight AS integer), CAST(:draining AS boolean), CAST(:job_versions AS text[]))
-- <workers>_pkey (the ON CONFLICT arbiter). The sampler lease (sampler_until) is kept.
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
    last_seen_at = EXCLUDED.last_seen_at, job_ids = EXCLUDED.job_ids,
    in_flight = EXCLUDED.in_flight, draining = EXCLUDED.draining,
    job_versions = EXCLUDED.job_versions
""",
    compacted=False,
)
"""A worker's heartbeat (F6): registers it on the first call (and after a prune), refreshes its
entry and ``last_seen_at`` on every other."""

DEREGISTER_WORKER: Final = Template(
    """
DELETE FROM {workers} w
-- <workers>_pkey.
WHERE w.id = CAST(:id AS text)
RETURNING w.id
""",
    compacted=False,
)
"""A stopped worker's entry goes, with the sampler lease it held (F6, F5)."""

PRUNE_STALE_WORKERS: Final = Template(
    """
DELETE FROM {workers} d
WHERE d.id = ANY(ARRAY(
    -- <workers>_seen_idx (last_seen_at): the entries not seen for :stale_after seconds, oldest
    -- first, one bounded batch.
    SELECT w.id FROM {workers} w
    WHERE w.last_seen_at <= {now} - CAST(:stale_after AS double precision) * interval '1 second'
    ORDER BY w.last_seen_at
    LIMIT CAST(:limit AS integer)
))
  -- Checked again on the row itself: a heartbeat that committed while this DELETE waited for
  -- the row keeps its entry (the re-check reads the row's newest version).
  AND d.last_seen_at <= {now} - CAST(:stale_after AS double precision) * interval '1 second'
""",
    compacted=False,
)
"""F6: entries of workers that died (or lost the database for ``:stale_after`` seconds) go; a
live one that was pruned registers again at its next heartbeat."""

SAMPLER_LOCK: Final = Template(
    "SELECT pg_advisory_xact_lock(CAST(:sampler_key AS bigint))", compacted=False
)
"""F5: the first statement of HOLD_SAMPLER's transaction. Takers of the lease take turns on this
transaction-level lock (keyed by the workers table), so the next statement's snapshot, taken
after the lock, sees the lease an earlier taker committed: never two holders."""

HOLD_SAMPLER_IF_FREE: Final = Template(
    """
UPDATE {workers} w
SET sampler_until = {now} + CAST(:lease AS double precision) * interval '1 second'
-- <workers>_pkey for the asker's row; <workers>_sampler_idx (predicate word for word) for the
-- one or two rows that hold or held the lease.
WHERE w.id = CAST(:id AS text)
  AND NOT EXISTS (
    SELECT 1 FROM {workers} o
    WHERE o.sampler_until IS NOT NULL AND o.sampler_until > {now} AND o.id <> w.id)
RETURNING w.id
""",
    compacted=False,
)
"""F5: take the queue-sampler lease, or renew it, unless another entry holds a lease that has
not lapsed; a row back: the asker holds it until ``:lease`` seconds from now. Runs after
SAMPLER_LOCK in the same short transaction."""

RELEASE_SAMPLER: Final = Template(
    """
UPDATE {workers} w SET sampler_until = NULL
-- <workers>_pkey, or <workers>_sampler_idx (its predicate, word for word: a row or two).
WHERE w.id = CAST(:id AS text) AND w.sampler_until IS NOT NULL
""",
    compacted=False,
)
"""F5: a draining worker hands the lease back, so the next asker takes it at once."""

LIST_WORKERS: Final = Template(
    """
SELECT w.id, w.host, w.pid, w.started_at, w.last_seen_at, w.job_ids, w.in_flight, w.draining,
    coalesce(w.sampler_until > {now}, false) AS sampler, w.job_versions
FROM {workers} w
-- A read of the whole registry (one row per live worker; stale ones are pruned) and a top-N
-- sort in byte order, as the in-memory registry sorts: at most :limit rows back.
ORDER BY w.id COLLATE "C"
LIMIT CAST(:limit AS integer)
""",
    compacted=False,
)
"""The registry's entries by worker id (``JobOperations.workers``, ``ship-sqla workers``, and
the sampler's view of the jobs its fleet runs)."""
