"""The operator audit log (S1) on PostgreSQL: its table and its store."""

from ship_sqla._audit._store import PostgresAuditLog as PostgresAuditLog
from ship_sqla._audit._store import create_audit_log as create_audit_log
from ship_sqla._audit._tables import ship_audit_table as ship_audit_table

__all__ = ["PostgresAuditLog", "create_audit_log", "ship_audit_table"]
