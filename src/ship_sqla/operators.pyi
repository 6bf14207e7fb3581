from ship_sqla._audit import PostgresAuditLog as PostgresAuditLog
from ship_sqla._dashboard import DashboardAuthorizer as DashboardAuthorizer
from ship_sqla._jobs._stats import PostgresJobStats as PostgresJobStats
from ship_sqla.kernel._audit import AuditEntry as AuditEntry
from ship_sqla.kernel._audit import AuditFilter as AuditFilter
from ship_sqla.kernel._audit import AuditLog as AuditLog
from ship_sqla.kernel._audit import AuditPage as AuditPage
from ship_sqla.kernel._audit import AuditSink as AuditSink
from ship_sqla.kernel._audit import CheckedAuditSink as CheckedAuditSink
from ship_sqla.kernel._audit import InMemoryAuditLog as InMemoryAuditLog
from ship_sqla.kernel._authorize import Authorizer as Authorizer
from ship_sqla.kernel._memory.stats import InMemoryJobStats as InMemoryJobStats
from ship_sqla.kernel._stats import JobStatsStore as JobStatsStore
from ship_sqla.kernel._stats import StatsBucket as StatsBucket
from ship_sqla.kernel._stats import StatsSeries as StatsSeries

__all__ = (
    "AuditEntry",
    "AuditFilter",
    "AuditLog",
    "AuditPage",
    "AuditSink",
    "Authorizer",
    "CheckedAuditSink",
    "DashboardAuthorizer",
    "InMemoryAuditLog",
    "InMemoryJobStats",
    "JobStatsStore",
    "PostgresAuditLog",
    "PostgresJobStats",
    "StatsBucket",
    "StatsSeries",
)
