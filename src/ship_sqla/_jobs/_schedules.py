"""Schedules on PostgreSQL (J9): the :class:`~ship_sqla.kernel.ScheduleStore` of the backend.

The rules are the kernel's (:mod:`ship_sqla.kernel._plans.scheduled_runs`); this module stores
them. ``install`` upserts ``(job_id, trigger, next_at)`` (``UPSERT_SCHEDULE_STATES``: an
unchanged trigger keeps its ``next_at``). ``tick`` is one short transaction of the backend's
own: lock the due rows of this process's scheduled jobs with ``FOR UPDATE SKIP LOCKED`` (a row
another ticker holds is being fired by it), insert each fired occurrence through the backend's
one insert path (:class:`~ship_sqla._jobs._insert.RunInserter`, as ``enqueue`` does: its durable
id makes a repeated tick a duplicate whatever the interleaving), uncapped and without the J2
gate (so an open unit of work that enqueued the job never holds up its schedule), and advance
``next_at``. Only the instant "now" comes from SQL (the frozen clock's, else the database's), so
every ticker agrees on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ship_sqla._jobs._sql.schedules import (
    DB_NOW,
    LOCK_DUE_STATES_SKIP_LOCKED,
    SET_NEXT_AT,
    UPSERT_SCHEDULE_STATES,
)
from ship_sqla._scope import OWN
from ship_sqla.kernel._plans.scheduled_runs import (
    fire_due,
    installable,
    schedule_states,
    scheduled_only,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla._jobs._insert import RunInserter
    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections
    from ship_sqla.kernel._jobs import JobDefinition

__all__ = ["PostgresSchedules"]


class PostgresSchedules:
    """The schedule store of one PostgreSQL job backend; it borrows the backend's statements,
    connections and insert path."""

    __slots__ = ("_connections", "_inserter", "_now", "_s", "_wake")

    def __init__(
        self,
        statements: JobStatements,
        connections: StoreConnections,
        inserter: RunInserter,
        *,
        now: Callable[[], datetime | None],
        wake: Callable[[], None],
    ) -> None:
        self._s = statements
        self._connections = connections
        self._inserter = inserter
        self._now = now
        self._wake = wake

    async def _current_time(self, connection: AsyncConnection) -> datetime:
        now = self._now()
        if now is not None:
            return now
        value: datetime = (await connection.execute(self._s[DB_NOW], {"now": None})).scalar_one()
        return value

    async def install(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """Upsert one state row per scheduled job (unscheduled definitions are ignored)."""
        scheduled = installable(definitions)  # an unusable payload is refused before any SQL
        if not scheduled:
            return
        async with self._connections.transaction("schedule", scope=OWN) as tx:
            connection = tx.connection
            states = schedule_states(scheduled, await self._current_time(connection))
            params = {
                "job_ids": [job_id for job_id, _, _ in states],
                "triggers": [trigger for _, trigger, _ in states],
                "next_ats": [next_at for _, _, next_at in states],
                "now": self._now(),
            }
            await connection.execute(self._s[UPSERT_SCHEDULE_STATES], params)

    async def tick(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire every due occurrence of the scheduled ``definitions``; the runs created."""
        scheduled = {job.id: (job, schedule) for job, schedule in scheduled_only(definitions)}
        if not scheduled:
            return 0
        ids = list(scheduled)
        created = 0
        async with self._connections.transaction("schedule tick", scope=OWN) as tx:
            connection = tx.connection
            now = await self._current_time(connection)
            params = {
                "job_ids": ids,
                "triggers": [scheduled[job_id][1].trigger for job_id in ids],
                "now": now,
            }
            due = (await connection.execute(self._s[LOCK_DUE_STATES_SKIP_LOCKED], params)).all()
            if not due:
                return 0
            advanced: dict[str, datetime] = {}
            for job_id, next_at in due:
                job, schedule = scheduled[job_id]
                runs, advanced[job_id] = fire_due(job, schedule, next_at, now)
                if runs:
                    results, _, _ = await self._inserter.insert_on(tx, job_id, runs, capped=False)
                    created += sum(not result.deduplicated for result in results)
            await connection.execute(
                self._s[SET_NEXT_AT],
                {
                    "job_ids": list(advanced),
                    "next_ats": list(advanced.values()),
                    "now": self._now(),
                },
            )
        if created:
            self._wake()
        return created
