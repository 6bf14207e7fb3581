"""The durable PostgreSQL job backend: tables, statements and the storage ports of the kernel."""

from ship_sqla._jobs._admin import PostgresRunAdmin as PostgresRunAdmin
from ship_sqla._jobs._backend import JobBackendTimeoutError as JobBackendTimeoutError
from ship_sqla._jobs._backend import PostgresJobBackend as PostgresJobBackend
from ship_sqla._jobs._backend import create_job_backend as create_job_backend
from ship_sqla._jobs._stats import PostgresJobStats as PostgresJobStats
from ship_sqla._jobs._stats import create_job_stats as create_job_stats
from ship_sqla._jobs._stats import ship_job_stats_table as ship_job_stats_table
from ship_sqla._jobs._tables import ship_job_events_table as ship_job_events_table
from ship_sqla._jobs._tables import ship_job_history_table as ship_job_history_table
from ship_sqla._jobs._tables import ship_job_runs_table as ship_job_runs_table
from ship_sqla._jobs._tables import ship_job_state_table as ship_job_state_table
from ship_sqla._jobs._tables import ship_job_steps_table as ship_job_steps_table
from ship_sqla._jobs._tables import ship_job_workers_table as ship_job_workers_table
from ship_sqla._jobs._workers import PostgresWorkerRegistry as PostgresWorkerRegistry

__all__ = (
    "JobBackendTimeoutError",
    "PostgresJobBackend",
    "PostgresJobStats",
    "PostgresRunAdmin",
    "PostgresWorkerRegistry",
    "create_job_backend",
    "create_job_stats",
    "ship_job_events_table",
    "ship_job_history_table",
    "ship_job_runs_table",
    "ship_job_state_table",
    "ship_job_stats_table",
    "ship_job_steps_table",
    "ship_job_workers_table",
)
