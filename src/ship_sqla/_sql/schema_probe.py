"""The start-time probe's statement (:func:`~ship_sqla._schema_probe.require_tables`): which
of the relations a surface needs do not exist. Names no table (:data:`~ship_sqla._sql.TABLELESS`).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["MISSING_RELATIONS"]

MISSING_RELATIONS: Final = Template("""
-- pg_class through to_regclass, one lookup per name: NULL for a relation that does not exist
-- (a missing schema too; no error, no lock). Run once, at a surface's start.
SELECT r.name
FROM unnest(CAST(:names AS text[])) WITH ORDINALITY AS r(name, n)
WHERE to_regclass(r.name) IS NULL
ORDER BY r.n
""")
"""The names of ``:names`` (schema-qualified, quoted as PostgreSQL reads them: tables, or an
index in its table's schema) that name no relation, in the order given."""
