"""The PostgreSQL worker registry (F6) and queue-sampler lease (F5): ``backend.workers`` of
:func:`~ship_sqla.create_job_backend`, on the table of
:func:`~ship_sqla.ship_job_workers_table`.

It stores what the runtime reports and decides nothing (the rules are
:mod:`ship_sqla.kernel._runtime.registration`'s). Every statement is one of the backend's
:class:`~ship_sqla._jobs._sql.JobStatements` (:mod:`ship_sqla._jobs._sql.workers`) and runs
on the backend's own
connections (never a unit of work's), bounded by its ``operation_timeout``: a heartbeat, a
deregistration, a prune or a listing is one autocommitted statement; a lease take is one short
transaction of two (SAMPLER_LOCK, HOLD_SAMPLER_IF_FREE).

The table is optional: :meth:`PostgresWorkerRegistry.probe` tells a starting runtime whether it
exists, and the runtime runs unregistered when it does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sqlalchemy import MetaData
from sqlalchemy.exc import ProgrammingError

from ship_sqla._jobs._sql.workers import (
    DEREGISTER_WORKER,
    HEARTBEAT_WORKER,
    HOLD_SAMPLER_IF_FREE,
    LIST_WORKERS,
    PROBE_WORKERS_TABLE,
    PRUNE_STALE_WORKERS,
    RELEASE_SAMPLER,
    SAMPLER_LOCK,
)
from ship_sqla._jobs._tables import ship_job_workers_table
from ship_sqla._locks import advisory_lock_key
from ship_sqla._naming import quoted_table
from ship_sqla._scope import OWN
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._workers import WorkerRecord

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from sqlalchemy import Table

    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections
    from ship_sqla.kernel._workers import WorkerEntry

__all__ = ["SAMPLER_LOCK_NAMESPACE", "PostgresWorkerRegistry"]

SAMPLER_LOCK_NAMESPACE: Final = "ship_sqla.job_sampler"
"""The advisory-lock namespace of SAMPLER_LOCK (keyed by the workers table's name)."""

_UNDEFINED_TABLE: Final = "42P01"


class PostgresWorkerRegistry:
    """:class:`~ship_sqla.kernel.WorkerRegistry` over one workers table."""

    __slots__ = ("_connections", "_now", "_s", "_sampler_key", "table", "table_name")

    def __init__(
        self,
        table: Table,
        statements: JobStatements,
        connections: StoreConnections,
        *,
        now: Callable[[], datetime | None],
    ) -> None:
        """The registry on ``table``, the workers table of the backend's ``statements``."""
        self.table = table
        """The workers table (of :func:`~ship_sqla.ship_job_workers_table`)."""
        self.table_name: str = quoted_table(table)
        """The workers table's quoted, schema-qualified name."""
        self._s = statements
        self._connections = connections
        self._now = now
        self._sampler_key = advisory_lock_key(SAMPLER_LOCK_NAMESPACE, self.table_name)

    @staticmethod
    def table_or_default(table: Table | None) -> Table:
        """``table``; None: the default-named workers table on a fresh MetaData."""
        return ship_job_workers_table(MetaData()) if table is None else table

    async def probe(self) -> str | None:
        """None when the workers table is there; else what to do about it."""
        try:
            await self._connections.execute(
                "worker registry probe", self._s[PROBE_WORKERS_TABLE], scope=OWN
            )
        except ProgrammingError as exc:
            if sqlstate_of(exc) != _UNDEFINED_TABLE:
                raise
            return (
                f"the worker registry table {self.table_name} does not exist (F6). Fix: add"
                " ship_job_workers_table(metadata) to your migrations (or pass"
                " create_job_backend(workers_table=...) naming yours)."
            )
        return None

    async def heartbeat(self, entry: WorkerEntry) -> None:
        params = {
            "id": entry.worker_id,
            "host": entry.host,
            "pid": entry.pid,
            "started_at": entry.started_at,
            "job_ids": list(entry.job_ids),
            "in_flight": entry.in_flight,
            "draining": entry.draining,
            "job_versions": list(entry.job_versions),
            "now": self._now(),
        }
        await self._connections.execute(
            "worker heartbeat", self._s[HEARTBEAT_WORKER], params, scope=OWN
        )

    async def deregister(self, worker_id: str) -> bool:
        rows = await self._connections.rows(
            "worker deregistration", self._s[DEREGISTER_WORKER], {"id": worker_id}, scope=OWN
        )
        return bool(rows)

    async def prune(self, *, stale_after: float, limit: int) -> int:
        params = {"stale_after": stale_after, "limit": limit, "now": self._now()}
        return await self._connections.count(
            "worker prune", self._s[PRUNE_STALE_WORKERS], params, scope=OWN
        )

    async def hold_sampler(self, worker_id: str, *, lease: float) -> bool:
        params = {"id": worker_id, "lease": lease, "now": self._now()}
        async with self._connections.transaction("queue-sampler lease", scope=OWN) as tx:
            connection = tx.connection
            await connection.execute(self._s[SAMPLER_LOCK], {"sampler_key": self._sampler_key})
            row = (await connection.execute(self._s[HOLD_SAMPLER_IF_FREE], params)).one_or_none()
        return row is not None

    async def release_sampler(self, worker_id: str) -> None:
        await self._connections.execute(
            "queue-sampler release", self._s[RELEASE_SAMPLER], {"id": worker_id}, scope=OWN
        )

    async def list_workers(self, *, limit: int) -> list[WorkerRecord]:
        params = {"limit": limit, "now": self._now()}
        rows = await self._connections.rows(
            "worker listing", self._s[LIST_WORKERS], params, scope=OWN, by_name=True
        )
        return [
            WorkerRecord(
                worker_id=row.id,
                host=row.host,
                pid=row.pid,
                started_at=row.started_at,
                last_seen_at=row.last_seen_at,
                job_ids=tuple(row.job_ids),
                in_flight=row.in_flight,
                draining=row.draining,
                sampler=bool(row.sampler),
                job_versions=tuple(row.job_versions),
            )
            for row in rows
        ]
