"""The storage-health reads (J22): what the PostgreSQL
:class:`~ship_sqla.kernel._health.StorageHealthSource` (``backend.storage_health()``,
``ship-sqla jobs health``, the dashboard's banner, the fleet's sampler) runs.

Both read statistics and catalog views only, never a ship table: their cost is bounded by the
number of ship tables (five at most, looked up by ``to_regclass`` through ``pg_class``'s oid
index) and of sessions (``max_connections``), whatever the backlog. Table names come as bound
parameters (the quoted, qualified names the backend renders its statements with), so one text
serves every table set. Sent as written (``compacted=False``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["HORIZON_OLDEST", "TABLE_HEALTH"]

TABLE_HEALTH: Final = Template(
    """
SELECT t.role, t.name,
       coalesce(s.n_live_tup, 0) AS live_tuples,
       coalesce(s.n_dead_tup, 0) AS dead_tuples,
       pg_total_relation_size(c.oid) AS size_bytes,
       extract(epoch FROM clock_timestamp() - greatest(s.last_vacuum, s.last_autovacuum))
           AS vacuum_age,
       -- pg_index by table (pg_index_indrelid_index): a stat of each index's file.
       (SELECT max(pg_relation_size(x.indexrelid)) FROM pg_catalog.pg_index x
         WHERE x.indrelid = c.oid) AS largest_index_bytes
  FROM unnest(CAST(:roles AS text[]), CAST(:names AS text[])) AS t(role, name)
  -- pg_class by oid (pg_class_oid_index); a table that does not exist is left out.
  JOIN pg_catalog.pg_class c ON c.oid = to_regclass(t.name)
  LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = c.oid
""",
    compacted=False,
)
"""Per ship table (``:roles`` and ``:names`` side by side): live and dead tuples (statistics
estimates), total size (heap, indexes, TOAST: a ``stat`` of each file, no page read),
seconds since its last vacuum or autovacuum (NULL: never) and the size of its largest index
(NULL: none; the early index rebuild's input, J17)."""

HORIZON_OLDEST: Final = Template(
    """
SELECT h.pid, h.application_name, h.age, h.kind,
       (pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
        OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user))
           AS sees_all
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (
    -- Sessions of this database holding a snapshot (backend_xmin): the horizon of its tables
    -- is theirs. The sampler's own session is left out; its read holds one while it runs.
    SELECT a.pid, coalesce(a.application_name, '') AS application_name,
           extract(epoch FROM clock_timestamp() - a.xact_start) AS age, 'session' AS kind
      FROM pg_catalog.pg_stat_activity a
     WHERE a.backend_xmin IS NOT NULL AND a.xact_start IS NOT NULL
       AND a.pid <> pg_backend_pid()
       AND a.datname = current_database()
    UNION ALL
    -- A prepared transaction holds its snapshot until COMMIT / ROLLBACK PREPARED.
    SELECT NULL, p.gid, extract(epoch FROM clock_timestamp() - p.prepared), 'prepared'
      FROM pg_catalog.pg_prepared_xacts p
     WHERE p.database = current_database()
     ORDER BY 3 DESC
     LIMIT 1
  ) AS h ON true
""",
    compacted=False,
)
"""The oldest held snapshot of this database (one row; its columns NULL when none is held):
who (pid and application_name, or a prepared transaction's gid; never the query), its age in
seconds on the database's clock, and whether the role sees every session
(``pg_read_all_stats`` or superuser: without it other roles' sessions show no
``backend_xmin``, and the answer covers the role's own sessions only)."""
