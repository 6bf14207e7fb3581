"""The tables a command works on: the job tables and the audit table, under their default names
unless the operator named others (``--runs-table``, ``--schema``, ``--audit-table`` ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import MetaData

from ship_sqla._audit import create_audit_log, ship_audit_table
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla._naming import quoted_table

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla._audit import PostgresAuditLog
    from ship_sqla._jobs import PostgresJobBackend
    from ship_sqla.kernel._on_error import ErrorHandler

__all__ = [
    "DEFAULT_AUDIT_TABLE",
    "DEFAULT_RUNS_TABLE",
    "DEFAULT_STATE_TABLE",
    "DEFAULT_TABLES",
    "DEFAULT_WORKERS_TABLE",
    "JobTables",
    "job_tables",
]

DEFAULT_RUNS_TABLE: Final = "ship_job_runs"
DEFAULT_STATE_TABLE: Final = "ship_job_state"
DEFAULT_WORKERS_TABLE: Final = "ship_job_workers"
DEFAULT_AUDIT_TABLE: Final = "ship_audit"


@attrs.frozen
class JobTables:
    """The job tables the commands work on: the defaults, or what the operator named."""

    runs: Table
    state: Table
    workers: Table

    @property
    def runs_name(self) -> str:
        """The runs table's quoted, schema-qualified name, for messages."""
        return quoted_table(self.runs)

    @property
    def workers_name(self) -> str:
        """The workers table's quoted, schema-qualified name, for messages."""
        return quoted_table(self.workers)

    @property
    def names(self) -> str:
        """Both tables' quoted, schema-qualified names, for messages."""
        return f"{self.runs_name} and {quoted_table(self.state)}"

    def backend(
        self,
        engine: AsyncEngine,
        *,
        on_error: ErrorHandler | None = None,
        synchronous_claims: bool = False,
    ) -> PostgresJobBackend:
        """The job backend on these three tables (the defaults are ``create_job_backend``'s)."""
        return create_job_backend(
            database=engine,
            table=self.runs,
            state_table=self.state,
            on_error=on_error,
            workers_table=self.workers,
            synchronous_claims=synchronous_claims,
        )

    def audit_log(self, engine: AsyncEngine, name: str = DEFAULT_AUDIT_TABLE) -> PostgresAuditLog:
        """The operator audit log (S1) in the runs table's schema."""
        return create_audit_log(
            database=engine, table=ship_audit_table(MetaData(), name=name, schema=self.runs.schema)
        )


def job_tables(
    *,
    runs: str = DEFAULT_RUNS_TABLE,
    state: str = DEFAULT_STATE_TABLE,
    schema: str | None = None,
    workers: str = DEFAULT_WORKERS_TABLE,
) -> JobTables:
    """The tables ``create_job_backend`` gets, built by the same factories as the application's
    (so their index names match); a name too long for them raises ``ConfigurationError``."""
    metadata = MetaData()
    return JobTables(
        runs=ship_job_runs_table(metadata, name=runs, schema=schema),
        state=ship_job_state_table(metadata, name=state, schema=schema),
        workers=ship_job_workers_table(metadata, name=workers, schema=schema),
    )


DEFAULT_TABLES: Final = job_tables()
