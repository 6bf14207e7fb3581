"""The durable PostgreSQL job backend: tables, statements and the ``JobBackend`` itself."""

from ship_sqla._jobs._backend import JobBackendTimeoutError as JobBackendTimeoutError
from ship_sqla._jobs._backend import PostgresJobBackend as PostgresJobBackend
from ship_sqla._jobs._backend import create_job_backend as create_job_backend
from ship_sqla._jobs._operations import JobOperationRefusedError as JobOperationRefusedError
from ship_sqla._jobs._operations import JobOperations as JobOperations
from ship_sqla._jobs._operations import RunPage as RunPage
from ship_sqla._jobs._operations import create_job_operations as create_job_operations
from ship_sqla._jobs._tables import ship_job_runs_table as ship_job_runs_table
from ship_sqla._jobs._tables import ship_job_state_table as ship_job_state_table

__all__ = (
    "JobBackendTimeoutError",
    "JobOperationRefusedError",
    "JobOperations",
    "PostgresJobBackend",
    "RunPage",
    "create_job_backend",
    "create_job_operations",
    "ship_job_runs_table",
    "ship_job_state_table",
)
