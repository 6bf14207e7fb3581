"""Row-level security's statements (:mod:`ship_sqla._rls`): the unit of work's tenant setting,
and the policy DDL :func:`~ship_sqla.tenant_policy_ddl` hands to the application for its
migrations (filled with quoted names by :func:`~ship_sqla._naming.fill`, never run here). Sent
as written (``compacted=False``).
"""

from __future__ import annotations

from typing import Final

from ship_sqla._sql import Template

__all__ = ["CREATE_TENANT_POLICY", "ENABLE_RLS", "FORCE_RLS", "SET_TENANT_SETTING"]

SET_TENANT_SETTING: Final = Template(
    "select set_config('ship.tenant_id', :tenant, true)", compacted=False
)
"""The ambient tenant for the rest of the transaction (``is_local``): set at the start of each
unit of work run built with ``row_level_security=True``; names no table
(:data:`~ship_sqla._sql.TABLELESS`)."""

ENABLE_RLS: Final = Template("ALTER TABLE {table} ENABLE ROW LEVEL SECURITY", compacted=False)
"""The DDL that turns row-level security on for ``{table}`` (quoted, schema-qualified)."""

FORCE_RLS: Final = Template("ALTER TABLE {table} FORCE ROW LEVEL SECURITY", compacted=False)
"""The DDL that applies ``{table}``'s policies to its owner too (a superuser still bypasses
them)."""

CREATE_TENANT_POLICY: Final = Template(
    "CREATE POLICY {policy} ON {table}"
    " USING ({column}::text = current_setting('ship.tenant_id', true))"
    " WITH CHECK ({column}::text = current_setting('ship.tenant_id', true))",
    compacted=False,
)
"""The DDL of ``{table}``'s policy ``{policy}``: rows whose ``{column}`` equals the ambient
tenant (``ship.tenant_id``), for reads and writes alike."""
