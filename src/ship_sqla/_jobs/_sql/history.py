"""The run history's maintenance reads (J17): what :mod:`ship_sqla._jobs._maintenance` runs
besides the partition DDL (:mod:`ship_sqla._jobs._history_ddl`, rendered per partition).

Neither is hot: one maintenance pass every ``MAINTENANCE_INTERVAL`` in the fleet's sampler-lease
holder, or ``ship-sqla jobs maintain``. The history table's name comes as a bound parameter
(its quoted, qualified name), so one text serves every table set. Sent as written.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = [
    "FINISHED_LEFT_IN_RUNS",
    "HISTORY_EXISTS",
    "HISTORY_PARTITIONS",
    "LOCK_TIMEOUT_LOCAL",
    "MIGRATE_FINISHED_BATCH",
    "RUNS_INDEXES",
    "RUNS_REFERENCED_BY",
    "SESSION_LOCK_TIMEOUT",
    "SESSION_LOCK_TIMEOUT_RESET",
]

HISTORY_EXISTS: Final = Template(
    "SELECT to_regclass(:history) IS NOT NULL AS present",
    compacted=False,
)
"""Whether the history table exists (a backend's default one may not: nothing to maintain)."""

HISTORY_PARTITIONS: Final = Template(
    """
SELECT k.relname AS class_name, c.relname AS name, c.relkind::text AS kind
  -- pg_inherits by parent (pg_inherits_parent_index), twice: classes, then their partitions.
  FROM pg_catalog.pg_inherits ki
  JOIN pg_catalog.pg_class k ON k.oid = ki.inhrelid
  JOIN pg_catalog.pg_inherits ci ON ci.inhparent = k.oid
  JOIN pg_catalog.pg_class c ON c.oid = ci.inhrelid
 WHERE ki.inhparent = to_regclass(:history)
""",
    compacted=False,
)
"""Every partition of every class partition of ``:history``: the class's name, the
partition's name and kind (``r``: a table)."""

LOCK_TIMEOUT_LOCAL: Final = Template(
    "SELECT set_config('lock_timeout', CAST(:timeout AS text), true)",
    compacted=False,
)
"""The maintenance transaction's ``lock_timeout`` (J17: 1 s), for this transaction only."""

RUNS_INDEXES: Final = Template(
    """
SELECT i.relname AS name, format('%I.%I', n.nspname, i.relname) AS qualified,
       x.indisvalid AS valid, pg_relation_size(i.oid) AS size_bytes,
       greatest(coalesce(s.n_live_tup, 0), t.reltuples::bigint, 0) AS live_entries,
       (SELECT extract(epoch FROM clock_timestamp() - min(a.xact_start))
          FROM pg_catalog.pg_stat_activity a
         WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
           AND a.datname = current_database() AND a.backend_type = 'client backend')
           AS snapshot_age
  -- pg_index by table (pg_index_indrelid_index): the runs table's indexes, valid or not.
  FROM pg_catalog.pg_index x
  JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = i.relnamespace
  JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
  LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = t.oid
 WHERE x.indrelid = to_regclass(:runs)
 ORDER BY i.relname
""",
    compacted=False,
)
"""Each index of the runs table ``:runs`` (J17's rebuild): its name (and quoted, qualified), whether
it is valid, its size (a ``stat`` of its file), the live runs it holds at most (the table's
live-tuple estimate or its ``reltuples``, whichever is larger: a stale estimate only delays a
rebuild), and the age in seconds of the oldest snapshot another client session of this database
holds (NULL: none; ``REINDEX CONCURRENTLY`` waits for every older snapshot to end, autovacuum's
excepted: its workers are left out)."""

SESSION_LOCK_TIMEOUT: Final = Template(
    "SELECT set_config('lock_timeout', CAST(:timeout AS text), false)",
    compacted=False,
)
"""``lock_timeout`` for the session (J17: 1 s, :data:`SESSION_LOCK_TIMEOUT_RESET` after):
``REINDEX`` and ``DROP INDEX CONCURRENTLY`` run outside any transaction, where a local setting
does not last."""

SESSION_LOCK_TIMEOUT_RESET: Final = Template("RESET lock_timeout", compacted=False)
"""The session's ``lock_timeout`` back to its default before the connection goes back to the
pool."""

MIGRATE_FINISHED_BATCH: Final = Template(
    """
WITH picked AS (
    -- Served by <runs>_finished_idx (its predicate, word for word): one bounded batch of the
    -- finished runs still in the runs table, locked so two migrations never take the same.
    SELECT r.id FROM {runs} r
     WHERE r.state IN ('completed', 'dead', 'discarded', 'cancelled')
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {runs} r USING picked p WHERE r.id = p.id
    RETURNING r.*
), kept AS (
    -- A run already past its class's retention leaves without a history row.
    INSERT INTO {history} (id, seq, job_id, state, payload, key, dedupe_key, attempt,
                           max_attempts, priority, run_at, created_at, started_at, finished_at,
                           claimed_by, last_error, history, trace_context, snoozes, lapses,
                           tenant_id, parent_id, progress, handler_version, partition_key)
    SELECT m.id, m.seq, m.job_id, m.state,
           CASE WHEN m.state = 'completed' THEN NULL ELSE m.payload END,
           m.key, m.dedupe_key, m.attempt, m.max_attempts, m.priority, m.run_at, m.created_at,
           NULL, coalesce(m.finished_at, m.updated_at), m.claimed_by, m.last_error, m.history,
           m.trace_context, m.snoozes, m.lapses, m.tenant_id, m.parent_id, m.progress,
           m.handler_version, m.partition_key
      FROM moved m
     WHERE coalesce(m.finished_at, m.updated_at) >= CASE m.state
               WHEN 'completed' THEN CAST(:completed_after AS timestamptz)
               WHEN 'dead' THEN CAST(:dead_after AS timestamptz)
               ELSE CAST(:ended_after AS timestamptz) END
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS taken, (SELECT count(*) FROM kept) AS kept
""",
    compacted=False,
)
"""Item 8 of issue 39 (``ship-sqla jobs maintain --migrate``): one batch of finished runs
moved from the runs table into history in one statement (so an interrupted migration resumes
where it stopped: every batch is all or nothing, and a run is in exactly one table in every
snapshot, J16); runs past their class's retention are deleted, not moved; a completed run's
payload is not kept (J18's default)."""

RUNS_REFERENCED_BY: Final = Template(
    """
SELECT c.conname, c.conrelid::regclass::text AS referencing
  FROM pg_catalog.pg_constraint c
 WHERE c.confrelid = to_regclass(:runs) AND c.contype = 'f'
""",
    compacted=False,
)
"""The foreign keys that reference the runs table (the steps' ON DELETE CASCADE would take a
finished workflow's steps with it when it moves)."""

FINISHED_LEFT_IN_RUNS: Final = Template(
    """
SELECT EXISTS (
    SELECT 1 FROM {runs} WHERE state IN ('completed', 'dead', 'cancelled', 'discarded')
) AS left_over
""",
    compacted=False,
)
"""J16: whether finished runs are still in the runs table (a database upgraded to live runs
only whose migration has not run: they stay readable, ``ship-sqla jobs maintain --migrate``
moves them)."""
