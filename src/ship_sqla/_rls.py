"""Optional second tenancy layer: PostgreSQL row-level security keyed on ``ship.tenant_id``.

The unit of work sets the setting transaction-locally (``set_config(..., true)``) at the start of
each run when built with ``row_level_security=True``; :func:`tenant_policy_ddl` emits the policy.
Repositories enforce tenancy on their own (R2); RLS is defence in depth for hand-written SQL.
"""

from __future__ import annotations

from ship_sqla._naming import MAX_IDENTIFIER_BYTES, check_identifier, fill, quoted_identifier
from ship_sqla._sql.rls import CREATE_TENANT_POLICY, ENABLE_RLS, FORCE_RLS

__all__ = ["tenant_policy_ddl"]


def _quote(name: str, what: str) -> str:
    """``name`` quoted by PostgreSQL's rules, whatever it holds (issue 25 D3: a table named
    ``jobs--v2`` gets its policy too); one PostgreSQL cannot hold (empty, NUL, not UTF-8, over
    63 bytes) is a :class:`~ship_sqla.errors.ConfigurationError` naming ``what``."""
    check_identifier(name, f"tenant_policy_ddl {what}")
    return quoted_identifier(name)


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
    # Cut to the identifier limit in bytes, at a character boundary, as PostgreSQL would.
    policy_name = f"{table}_tenant_isolation".encode()[:MAX_IDENTIFIER_BYTES]
    policy = _quote(policy_name.decode(errors="ignore"), "policy")
    names = {"{table}": qualified, "{policy}": policy, "{column}": column}
    return [fill(ddl.sql, names) for ddl in (ENABLE_RLS, FORCE_RLS, CREATE_TENANT_POLICY)]
