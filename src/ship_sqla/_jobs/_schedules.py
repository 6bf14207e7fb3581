"""Schedules on PostgreSQL (J9): install one state row per scheduled job, and tick.

``install`` upserts ``(job_id, trigger, next_at)``: a row whose stored trigger equals the
definition's keeps its ``next_at`` (a restart, or a second process, replaces, never
duplicates); a new or changed trigger starts at the first occurrence after now.

``tick`` is one short transaction: lock the due rows of this process's scheduled jobs with
``FOR UPDATE SKIP LOCKED`` (a row another ticker holds is being fired by it), fire ONE run per
row for the latest missed occurrence (:func:`due_occurrence`: a process that was down catches
up with one run, not a storm), with the durable id ``<job_id>/<occurrence>`` inserted with
``ON CONFLICT DO NOTHING`` (a duplicate occurrence is impossible whatever the interleaving), and
advance ``next_at`` to the first occurrence after now. The run's ``run_at`` is its occurrence.
The schedule arithmetic is pure Python (:mod:`ship_sqla.kernel._plans.schedule`); only the instant
"now" comes from SQL (the frozen clock's, else the database's), so every ticker agrees on it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ship_sqla._jobs import _schedule_sql as sql
from ship_sqla.kernel._plans.schedule import due_occurrence, next_occurrence, occurrence_id
from ship_sqla.kernel._plans.scheduled_runs import scheduled_only, scheduled_payload

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from contextlib import AbstractAsyncContextManager
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla.kernel._jobs import JobDefinition

__all__ = ["Schedules"]

_encode_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


class Schedules:
    """The schedule half of one :class:`PostgresJobBackend`; it lends its connections."""

    def __init__(
        self,
        *,
        state: str,
        runs: str,
        transaction: Callable[[], AbstractAsyncContextManager[AsyncConnection]],
        deadline: Callable[[str], AbstractAsyncContextManager[None]],
        now: Callable[[], datetime | None],
        wake: Callable[[], None],
    ) -> None:
        self._transaction = transaction
        self._deadline = deadline
        self._now = now
        self._wake = wake
        self._db_now = sql.render_schedule(sql.DB_NOW, state=state, runs=runs)
        self._upsert = sql.render_schedule(sql.UPSERT_SCHEDULE_STATES, state=state, runs=runs)
        self._lock_due = sql.render_schedule(
            sql.LOCK_DUE_STATES_SKIP_LOCKED, state=state, runs=runs
        )
        self._insert = sql.render_schedule(sql.INSERT_OCCURRENCE_RUNS, state=state, runs=runs)
        self._set_next = sql.render_schedule(sql.SET_NEXT_AT, state=state, runs=runs)

    async def _current_time(self, connection: AsyncConnection) -> datetime:
        now = self._now()
        if now is not None:
            return now
        value: datetime = (await connection.execute(self._db_now, {"now": None})).scalar_one()
        return value

    async def install(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """Upsert one state row per scheduled job (unscheduled definitions are ignored)."""
        scheduled = scheduled_only(definitions)
        if not scheduled:
            return
        for job, _ in scheduled:
            scheduled_payload(job)  # refuse an unusable payload type now, not at the first tick
        async with self._deadline("schedule"), self._transaction() as connection:
            now = await self._current_time(connection)
            params = {
                "job_ids": [job.id for job, _ in scheduled],
                "next_ats": [next_occurrence(schedule, now) for _, schedule in scheduled],
                "triggers": [schedule.trigger for _, schedule in scheduled],
                "now": self._now(),
            }
            await connection.execute(self._upsert, params)

    async def tick(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire every due occurrence of the scheduled ``definitions``; the runs created."""
        scheduled = {job.id: (job, schedule) for job, schedule in scheduled_only(definitions)}
        if not scheduled:
            return 0
        ids = list(scheduled)
        async with self._deadline("schedule tick"), self._transaction() as connection:
            now = await self._current_time(connection)
            params = {
                "job_ids": ids,
                "triggers": [scheduled[job_id][1].trigger for job_id in ids],
                "now": now,
            }
            due = (await connection.execute(self._lock_due, params)).all()
            if not due:
                return 0
            runs: list[dict[str, Any]] = []
            advanced: dict[str, datetime] = {}
            for job_id, next_at in due:
                job, schedule = scheduled[job_id]
                fire, new_next_at = due_occurrence(schedule, next_at, now)
                advanced[job_id] = new_next_at
                if fire is None:  # pragma: no cover - the lock selected next_at <= now only
                    continue
                payload = scheduled_payload(job)
                runs.append(
                    {
                        "id": occurrence_id(job_id, fire),
                        "job_id": job_id,
                        "payload": _encode_json(job.encode(payload)),
                        "key": job.key_of(payload),
                        "dedupe_key": (
                            job.idempotency.key(payload) if job.idempotency is not None else None
                        ),
                        "max_attempts": job.retry.attempts,
                        "run_at": fire,
                    }
                )
            created = 0
            if runs:
                inserted = await connection.execute(
                    self._insert,
                    {
                        "ids": [run["id"] for run in runs],
                        "job_ids": [run["job_id"] for run in runs],
                        "payloads": [run["payload"] for run in runs],
                        "keys": [run["key"] for run in runs],
                        "dedupe_keys": [run["dedupe_key"] for run in runs],
                        "max_attempts": [run["max_attempts"] for run in runs],
                        "run_ats": [run["run_at"] for run in runs],
                        "now": self._now(),
                    },
                )
                created = len(inserted.all())
            await connection.execute(
                self._set_next,
                {
                    "job_ids": list(advanced),
                    "next_ats": list(advanced.values()),
                    "now": self._now(),
                },
            )
        if created:
            self._wake()
        return created
