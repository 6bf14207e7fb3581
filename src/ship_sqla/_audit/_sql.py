"""The audit log's statements (S1). ``{audit}`` is the table's quoted, qualified name; each
is a :class:`~ship_sqla._sql.Template` rendered once per audit log by its
:class:`~ship_sqla._sql.Statements`, sent as written (``compacted=False``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["LIST_AUDIT", "PROBE_AUDIT", "RECORD_AUDIT"]

RECORD_AUDIT: Final = Template(
    """
INSERT INTO {audit} (at, actor, operation, target, count, details)
VALUES ({now}, :actor, :operation, :target, :count,
        CAST(:details AS jsonb))
""",
    compacted=False,
)
"""One entry; joins the caller's unit of work when there is one (the entry commits with the
change it describes)."""

LIST_AUDIT: Final = Template(
    """
SELECT a.id, a.at, a.actor, a.operation, a.target, a.count, a.details
FROM {audit} a
-- <audit>_pkey read backwards from :before: at most :limit entries.
WHERE a.id < coalesce(CAST(:before AS bigint), 9223372036854775807)
ORDER BY a.id DESC
LIMIT CAST(:limit AS integer)
""",
    compacted=False,
)
"""A page of entries, newest first."""

PROBE_AUDIT: Final = Template("SELECT 1 FROM {audit} LIMIT 0", compacted=False)
"""Reads nothing; fails (42P01) when the audit table is absent."""
