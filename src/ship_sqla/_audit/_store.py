"""The PostgreSQL :class:`~ship_sqla.operators.AuditLog` (S1)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import Table
from sqlalchemy.exc import DBAPIError

from ship_sqla._audit._sql import LIST_AUDIT, PROBE_AUDIT, RECORD_AUDIT
from ship_sqla._audit._tables import ship_audit_table
from ship_sqla._naming import quoted_table
from ship_sqla._scope import OWN, StoreConnections
from ship_sqla._sql import Statements
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel._audit import AuditEntry, AuditUnavailableError
from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from ship_sqla._scope import Database
    from ship_sqla.kernel._clock import Clock

__all__ = ["PostgresAuditLog", "create_audit_log"]


class PostgresAuditLog:
    """An :class:`~ship_sqla.operators.AuditLog` on one audit table. Build with
    :func:`create_audit_log`."""

    __slots__ = ("_clock", "_connections", "_s", "table")

    def __init__(self, *, database: Database, table: Table, clock: Clock) -> None:
        self.table = table
        self._clock = clock
        self._connections = StoreConnections(database, name="audit log")
        self._s = Statements({"{audit}": quoted_table(table)})

    async def require_writable(self) -> None:
        """S1's one audit rule: raise :class:`~ship_sqla.errors.AuditUnavailableError`, naming
        the table and how to create it, when the audit table does not exist. The operator
        surfaces call it before an action's first change, so a missing table changes nothing.
        One statement that reads no row."""
        try:
            await self._connections.execute("check", self._s[PROBE_AUDIT], scope=OWN)
        except DBAPIError as exc:
            if sqlstate_of(exc) != "42P01":  # undefined_table
                raise
            name = quoted_table(self.table)
            raise AuditUnavailableError(
                f"the audit table {name} does not exist, so this operator action could not be"
                " audited (S1); nothing was changed.",
                fix="create it: `ship-sqla schema apply --only audit` (add --schema when the"
                " tables live in one), or ship_audit_table(metadata, name=...) in your"
                " migrations; at the shell, --audit-table names a table created under another"
                " name, and --no-audit acts unaudited on purpose.",
            ) from exc

    async def record(self, entry: AuditEntry) -> None:
        """Insert ``entry``, in the ambient unit of work when there is one."""
        params = {
            "now": now_bound(self._clock),
            "actor": entry.actor,
            "operation": entry.operation,
            "target": entry.target,
            "count": entry.count,
            "details": json.dumps(dict(entry.details), default=str),
        }
        await self._connections.execute("record", self._s[RECORD_AUDIT], params, scope=None)

    async def list_entries(self, *, limit: int, before: int | None = None) -> list[AuditEntry]:
        """At most ``limit`` entries, newest first, with ids below ``before``."""
        rows = await self._connections.rows(
            "list", self._s[LIST_AUDIT], {"limit": limit, "before": before}, scope=OWN, by_name=True
        )
        return [
            AuditEntry(
                actor=row.actor,
                operation=row.operation,
                target=row.target,
                count=row._mapping["count"],  # noqa: SLF001 - Row.count is tuple.count
                details=row.details,
                at=row.at,
                entry_id=row.id,
            )
            for row in rows
        ]


def create_audit_log(
    *, database: Database, table: Table | None = None, clock: Clock | None = None
) -> PostgresAuditLog:
    """The operator audit log on ``table`` (default ``ship_audit_table`` named ship_audit):
    pass it as ``audit=`` to :func:`~ship_sqla.create_job_operations`,
    :func:`~ship_sqla.create_outbox_operations` and :func:`~ship_sqla.create_dashboard`.
    ``database``: an ``AsyncEngine``, or an ``AsyncConnection`` in a transaction (tests)."""
    if table is None:
        from sqlalchemy import MetaData  # noqa: PLC0415 - only for the default table

        table = ship_audit_table(MetaData())
    given: object = table
    if not isinstance(given, Table) or not {"actor", "operation", "count"} <= set(table.c.keys()):
        raise ConfigurationError(
            f"table must be an audit table, got {table!r}.",
            fix="pass ship_audit_table(metadata, name=...).",
        )
    return PostgresAuditLog(database=database, table=table, clock=clock or SystemClock())
