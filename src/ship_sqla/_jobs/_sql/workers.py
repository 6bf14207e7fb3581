"""The worker registry's statements (F6) and the queue-sampler lease (F5): what the PostgreSQL
:class:`~ship_sqla.kernel.WorkerRegistry` (``backend.workers``) runs, on the table of
``ship_job_workers_table``. Rules: see :mod:`ship_sqla._jobs._sql` (time is ``{now}``, arrays
instead of IN lists, partial-index predicates word for word). The table holds one row per live
worker (stale rows are pruned), so no statement here ever reads more than a few rows; each still
names the index that serves it.

The templates are rendered once per backend into :class:`WorkerStatements`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import TextClause, text

from ship_sqla._jobs._sql import NOW
from ship_sqla._naming import fill, quoted_table, text_name

if TYPE_CHECKING:
    from sqlalchemy import Table

__all__ = [
    "DEREGISTER_WORKER",
    "HEARTBEAT_WORKER",
    "HOLD_SAMPLER_IF_FREE",
    "LIST_WORKERS",
    "PROBE_WORKERS_TABLE",
    "PRUNE_STALE_WORKERS",
    "RELEASE_SAMPLER",
    "SAMPLER_LOCK",
    "WorkerStatements",
]

PROBE_WORKERS_TABLE: Final = "SELECT 1 FROM {workers} LIMIT 0"
"""Reads nothing; fails (42P01) when the workers table is absent: a runtime probes it once at
start and runs unregistered without it."""

HEARTBEAT_WORKER: Final = """
INSERT INTO {workers} AS w
    (id, host, pid, started_at, last_seen_at, job_ids, in_flight, draining)
VALUES (CAST(:id AS text), CAST(:host AS text), CAST(:pid AS integer),
    CAST(:started_at AS timestamptz), {now}, CAST(:job_ids AS text[]),
    CAST(:in_flight AS integer), CAST(:draining AS boolean))
-- <workers>_pkey (the ON CONFLICT arbiter). The sampler lease (sampler_until) is kept.
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
    last_seen_at = EXCLUDED.last_seen_at, job_ids = EXCLUDED.job_ids,
    in_flight = EXCLUDED.in_flight, draining = EXCLUDED.draining
"""
"""A worker's heartbeat (F6): registers it on the first call (and after a prune), refreshes its
entry and ``last_seen_at`` on every other."""

DEREGISTER_WORKER: Final = """
DELETE FROM {workers} w
-- <workers>_pkey.
WHERE w.id = CAST(:id AS text)
RETURNING w.id
"""
"""A stopped worker's entry goes, with the sampler lease it held (F6, F5)."""

PRUNE_STALE_WORKERS: Final = """
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
"""
"""F6: entries of workers that died (or lost the database for ``:stale_after`` seconds) go; a
live one that was pruned registers again at its next heartbeat."""

SAMPLER_LOCK: Final = "SELECT pg_advisory_xact_lock(CAST(:sampler_key AS bigint))"
"""F5: the first statement of HOLD_SAMPLER's transaction. Takers of the lease take turns on this
transaction-level lock (keyed by the workers table), so the next statement's snapshot, taken
after the lock, sees the lease an earlier taker committed: never two holders."""

HOLD_SAMPLER_IF_FREE: Final = """
UPDATE {workers} w
SET sampler_until = {now} + CAST(:lease AS double precision) * interval '1 second'
-- <workers>_pkey for the asker's row; <workers>_sampler_idx (predicate word for word) for the
-- one or two rows that hold or held the lease.
WHERE w.id = CAST(:id AS text)
  AND NOT EXISTS (
    SELECT 1 FROM {workers} o
    WHERE o.sampler_until IS NOT NULL AND o.sampler_until > {now} AND o.id <> w.id)
RETURNING w.id
"""
"""F5: take the queue-sampler lease, or renew it, unless another entry holds a lease that has
not lapsed; a row back: the asker holds it until ``:lease`` seconds from now. Runs after
SAMPLER_LOCK in the same short transaction."""

RELEASE_SAMPLER: Final = """
UPDATE {workers} w SET sampler_until = NULL
-- <workers>_pkey, or <workers>_sampler_idx (its predicate, word for word: a row or two).
WHERE w.id = CAST(:id AS text) AND w.sampler_until IS NOT NULL
"""
"""F5: a draining worker hands the lease back, so the next asker takes it at once."""

LIST_WORKERS: Final = """
SELECT w.id, w.host, w.pid, w.started_at, w.last_seen_at, w.job_ids, w.in_flight, w.draining,
    coalesce(w.sampler_until > {now}, false) AS sampler
FROM {workers} w
-- A read of the whole registry (one row per live worker; stale ones are pruned) and a top-N
-- sort in byte order, as the in-memory registry sorts: at most :limit rows back.
ORDER BY w.id COLLATE "C"
LIMIT CAST(:limit AS integer)
"""
"""The registry's entries by worker id (``JobOperations.workers``, ``ship-sqla workers``, and
the sampler's view of the jobs its fleet runs)."""


def _render(template: str, workers: str) -> TextClause:
    """``template`` for the workers table ``workers`` (quoted): filled in one pass, the name
    escaped for ``text()``, so it reaches PostgreSQL as quoted whatever it holds."""
    return text(fill(template, {"{workers}": text_name(workers), "{now}": NOW}))


@attrs.frozen
class WorkerStatements:
    """Every statement of one backend's workers table, rendered once."""

    workers_name: str
    """The workers table's quoted, schema-qualified name (for messages and the lock key)."""
    probe: TextClause
    heartbeat: TextClause
    deregister: TextClause
    prune: TextClause
    sampler_lock: TextClause
    hold_sampler: TextClause
    release_sampler: TextClause
    list_workers: TextClause

    @classmethod
    def for_table(cls, workers: Table) -> WorkerStatements:
        name = quoted_table(workers)
        return cls(
            workers_name=name,
            probe=_render(PROBE_WORKERS_TABLE, name),
            heartbeat=_render(HEARTBEAT_WORKER, name),
            deregister=_render(DEREGISTER_WORKER, name),
            prune=_render(PRUNE_STALE_WORKERS, name),
            sampler_lock=_render(SAMPLER_LOCK, name),
            hold_sampler=_render(HOLD_SAMPLER_IF_FREE, name),
            release_sampler=_render(RELEASE_SAMPLER, name),
            list_workers=_render(LIST_WORKERS, name),
        )
