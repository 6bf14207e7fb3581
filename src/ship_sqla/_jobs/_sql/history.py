"""The run history's maintenance reads (J17): what :mod:`ship_sqla._jobs._maintenance` runs
besides the partition DDL (:mod:`ship_sqla._jobs._history_ddl`, rendered per partition).

Neither is hot: one maintenance pass every ``MAINTENANCE_INTERVAL`` in the fleet's sampler-lease
holder, or ``ship-sqla jobs maintain``. The history table's name comes as a bound parameter
(its quoted, qualified name), so one text serves every table set. Sent as written.
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["HISTORY_EXISTS", "HISTORY_PARTITIONS", "LOCK_TIMEOUT_LOCAL"]

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
