"""The tables a command works on: the job tables and the audit table, under their default names
unless the operator named others (``--runs-table``, ``--schema``, ``--audit-table`` ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import MetaData, text
from sqlalchemy.exc import SQLAlchemyError

from ship_sqla._audit import create_audit_log, ship_audit_table
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla._jobs._sql.history import HISTORY_EXISTS
from ship_sqla._naming import quoted_table
from ship_sqla._sql_errors import outage_reason

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

_HISTORY_PRESENT: Final = text(HISTORY_EXISTS.sql)
"""J16: whether the history table exists (the commands' one probe of the database's shape)."""


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

    @property
    def history(self) -> Table:
        """The history table ``ship-sqla schema apply`` creates beside the runs table (J16: its
        default name, in the runs table's schema)."""
        return ship_job_history_table(MetaData(), schema=self.runs.schema)

    async def history_present(self, engine: AsyncEngine) -> bool:
        """Whether the database holds :attr:`history` (J16: the commands follow its shape)."""
        async with engine.connect() as connection:
            found = await connection.scalar(
                _HISTORY_PRESENT, {"history": quoted_table(self.history)}
            )
        return bool(found)

    async def operator_backend(self, engine: AsyncEngine) -> PostgresJobBackend:
        """:meth:`backend` for one operator command (J8): when the database cannot be reached
        to probe its shape, the in-place one, so the command's own checks (a malformed
        ``--cursor``: exit 2) come first and its first statement then meets the same outage
        (exit 1) as before the probe existed."""
        try:
            history = await self.history_present(engine)
        except (SQLAlchemyError, OSError) as exc:
            if outage_reason(exc, driver_only=True) is None:
                raise
            history = False
        return self.shaped_backend(engine, history=history)

    async def backend(
        self,
        engine: AsyncEngine,
        *,
        on_error: ErrorHandler | None = None,
        synchronous_claims: bool = False,
    ) -> PostgresJobBackend:
        """The job backend on these tables, following the database's shape (J16): when the
        history table ``schema apply`` creates exists (:attr:`history`), runs that end move
        into it and every read spans both tables (as the application's backend whose metadata
        declares it); otherwise (a database built before the history) runs end in place."""
        return self.shaped_backend(
            engine,
            history=await self.history_present(engine),
            on_error=on_error,
            synchronous_claims=synchronous_claims,
        )

    def shaped_backend(
        self,
        engine: AsyncEngine,
        *,
        history: bool,
        on_error: ErrorHandler | None = None,
        synchronous_claims: bool = False,
    ) -> PostgresJobBackend:
        """The job backend on these tables, live runs only (J16) when ``history`` (what
        :meth:`history_present` answered), else runs ending in place."""
        return create_job_backend(
            database=engine,
            table=self.runs,
            state_table=self.state,
            on_error=on_error,
            workers_table=self.workers,
            synchronous_claims=synchronous_claims,
            history_table=self.history if history else None,
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
