"""Optional second tenancy layer: PostgreSQL row-level security keyed on ``ship.tenant_id``.

The unit of work sets the setting transaction-locally (``set_config(..., true)``) at the start of
each run when built with ``row_level_security=True``; :func:`tenant_policy_ddl` emits the policy.
Repositories enforce tenancy on their own (R2); RLS is defence in depth for hand-written SQL.
"""

from __future__ import annotations

import re

from sqlalchemy import text

__all__ = ["SET_TENANT_SETTING", "tenant_policy_ddl"]

SET_TENANT_SETTING = text("select set_config('ship.tenant_id', :tenant, true)")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def _quote(name: str, what: str) -> str:
    if not _IDENTIFIER.match(name):
        msg = (
            f"{what} {name!r} is not a plain SQL identifier; rename it or write the policy by hand."
        )
        raise ValueError(msg)
    return f'"{name}"'


def tenant_policy_ddl(
    table: str, *, tenant_column: str = "tenant_id", schema: str | None = None
) -> list[str]:
    """DDL that restricts ``table`` to rows whose ``tenant_column`` equals ``ship.tenant_id``.

    Returns statements to put in a migration. ``FORCE`` makes the policy apply to the table's
    owner too; a superuser still bypasses RLS, so run the application as an ordinary role.
    """
    qualified = _quote(table, "table")
    if schema is not None:
        qualified = f"{_quote(schema, 'schema')}.{qualified}"
    column = _quote(tenant_column, "tenant_column")
    policy = _quote(f"{table}_tenant_isolation"[:63], "policy")
    return [
        f"ALTER TABLE {qualified} ENABLE ROW LEVEL SECURITY",
        f"ALTER TABLE {qualified} FORCE ROW LEVEL SECURITY",
        (
            f"CREATE POLICY {policy} ON {qualified}"
            f" USING ({column}::text = current_setting('ship.tenant_id', true))"
            f" WITH CHECK ({column}::text = current_setting('ship.tenant_id', true))"
        ),
    ]
