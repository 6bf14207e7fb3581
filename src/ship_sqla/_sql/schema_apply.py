"""The schema apply's own statements (:func:`~ship_sqla.apply_ship_schema`); the tables' DDL is
SQLAlchemy's. Sent as written (``compacted=False``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["APPLY_LOCK", "CREATE_SCHEMA", "TABLE_OPTIONS"]

APPLY_LOCK: Final = Template(
    "SELECT pg_advisory_xact_lock(hashtextextended('ship_sqla.schema_apply', 0))",
    compacted=False,
)
"""Serialises concurrent applies on one database (transaction level: safe behind PgBouncer;
the key is hashed from a namespace, SPEC §10). Names no table
(:data:`~ship_sqla._sql.TABLELESS`)."""

CREATE_SCHEMA: Final = Template("CREATE SCHEMA IF NOT EXISTS {schema}", compacted=False)
"""A missing schema of the metadata's tables; ``{schema}`` is quoted by the dialect and filled
by :func:`~ship_sqla._naming.fill` (run as driver SQL: it has no bind parameters)."""

TABLE_OPTIONS: Final = Template(
    "SELECT c.reloptions FROM pg_catalog.pg_class c WHERE c.oid = to_regclass(:name)",
    compacted=False,
)
"""An existing table's storage options (J21), by its quoted, qualified name (``:name``):
``pg_class`` by oid (``pg_class_oid_index``). Names no table in its text
(:data:`~ship_sqla._sql.TABLELESS`)."""
