"""Operator operations on the PostgreSQL job backend (J8).

``list_failed``, ``get_run``, ``retry`` (one more attempt), ``discard`` and ``cleanup`` (each
job's retention, in bounded batches). Every operation first asks the application's
``authorizer("ship.jobs:manage", operation)``; anything but ``True`` raises
:class:`PermissionDeniedError` before a statement runs, so a refusal changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import attrs
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import IntegrityError

from ship_sqla._jobs import _operations_sql as _ops
from ship_sqla._jobs._backend import run_record
from ship_sqla._jobs._sql import render
from ship_sqla._scope import joined
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel import (
    BoundExceededError,
    ConfigurationError,
    InvalidCursorError,
    PermissionDeniedError,
    ShipError,
)

if TYPE_CHECKING:
    from sqlalchemy import Table, TextClause

    from ship_sqla._jobs._backend import PostgresJobBackend
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._ports import RunRecord

__all__ = [
    "MANAGE_PERMISSION",
    "MAX_LIST_LIMIT",
    "JobOperationRefusedError",
    "JobOperations",
    "RunPage",
    "create_job_operations",
]

MANAGE_PERMISSION: Final = "ship.jobs:manage"
MAX_LIST_LIMIT: Final = 500
"""Rows per ``list_failed`` page (R1)."""
MAX_CLEANUP_BATCH: Final = 10_000
"""Rows per cleanup DELETE: one short transaction each."""

Authorizer = Callable[[str, str], "bool | Awaitable[bool]"]

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


class JobOperationRefusedError(ShipError, RuntimeError):
    """An operator operation does not apply to the run in its current state; nothing changed."""

    code = "SHIP_SQLA_JOB_OPERATION_REFUSED"


@attrs.frozen
class RunPage:
    """One page of runs, newest first; ``next_cursor`` is None on the last page."""

    items: tuple[RunRecord, ...]
    next_cursor: str | None


@attrs.frozen
class _Statements:
    get_run: TextClause
    list_dead_of_job: TextClause
    list_dead_all_jobs: TextClause
    retry: TextClause
    discard: TextClause
    delete_batch: TextClause

    @classmethod
    def for_table(cls, table: Table) -> _Statements:
        runs = str(_PREPARER.format_table(table))
        return cls(
            get_run=render(_ops.OPS_GET_RUN, runs=runs),
            list_dead_of_job=render(_ops.OPS_LIST_DEAD_OF_JOB, runs=runs),
            list_dead_all_jobs=render(_ops.OPS_LIST_DEAD_ALL_JOBS, runs=runs),
            retry=render(_ops.OPS_RETRY_DEAD, runs=runs),
            discard=render(_ops.OPS_DISCARD_WAITING_OR_DEAD, runs=runs),
            delete_batch=render(_ops.OPS_DELETE_FINISHED_BATCH, runs=runs),
        )


def _encode_cursor(job_id: str | None, record: RunRecord) -> str:
    assert record.finished_at is not None  # noqa: S101 - dead runs always have finished_at
    raw = json.dumps([job_id, record.finished_at.isoformat(), record.run_id])
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_cursor(cursor: str, job_id: str | None) -> tuple[datetime, str]:
    fix = "pass the next_cursor of a list_failed page with the same job_id, unchanged."
    try:
        cursor_job, at, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        after_at = datetime.fromisoformat(at)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise InvalidCursorError(f"list_failed cursor {cursor!r} is malformed.", fix=fix) from exc
    if cursor_job != job_id or not isinstance(run_id, str) or after_at.tzinfo is None:
        raise InvalidCursorError(
            f"list_failed cursor {cursor!r} belongs to another query (job_id={cursor_job!r},"
            f" this call's job_id={job_id!r}).",
            fix=fix,
        )
    return after_at, run_id


class JobOperations:
    """J8 operator operations over one :class:`PostgresJobBackend`'s runs table.

    Build with :func:`create_job_operations`. Each operation runs in a short transaction of its
    own (or joins the ambient unit of work, like every store).
    """

    def __init__(self, backend: PostgresJobBackend, *, authorizer: Authorizer) -> None:
        if not callable(authorizer):
            raise ConfigurationError(
                f"authorizer must be callable, got {type(authorizer).__name__}.",
                fix="pass authorizer=lambda permission, operation: user.can(permission).",
            )
        self._backend = backend
        self._authorizer = authorizer
        self._s = _Statements.for_table(backend.table)

    def _now(self) -> datetime | None:
        clock = self._backend.clock
        return clock.now() if clock.frozen else None

    async def _authorize(self, operation: str) -> None:
        answer = self._authorizer(MANAGE_PERMISSION, operation)
        if inspect.isawaitable(answer):
            answer = await answer
        # Fail closed: only an explicit True allows (a truthy mistake must not grant access).
        if answer is not True:
            raise PermissionDeniedError(
                f"the authorizer refused permission {MANAGE_PERMISSION!r} for job operation"
                f" {operation!r}; nothing was changed.",
                fix=f"grant {MANAGE_PERMISSION!r} to this caller in the application's"
                " authorizer (it must return True).",
            )

    async def list_failed(
        self, *, job_id: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        """Dead runs (of ``job_id``, or of every job), newest first, keyset-paged by
        ``(finished_at, id)``: at most ``limit`` (1..500) per page."""
        await self._authorize("list_failed")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise BoundExceededError(
                f"list_failed limit must be 1..{MAX_LIST_LIMIT}, got {limit}.",
                fix=f"ask for at most {MAX_LIST_LIMIT} and follow next_cursor for the rest.",
            )
        after_at, after_id = (None, None) if cursor is None else _decode_cursor(cursor, job_id)
        params: dict[str, Any] = {"limit": limit + 1, "after_at": after_at, "after_id": after_id}
        statement = self._s.list_dead_all_jobs
        if job_id is not None:
            statement = self._s.list_dead_of_job
            params["job_id"] = job_id
        async with joined(self._backend.database, None) as tx:
            rows = (await tx.connection.execute(statement, params)).all()
        records = tuple(run_record(row) for row in rows[:limit])
        more = len(rows) > limit
        return RunPage(records, _encode_cursor(job_id, records[-1]) if more else None)

    async def get_run(self, run_id: str) -> RunRecord | None:
        """One run with its history, or None."""
        await self._authorize("get_run")
        async with joined(self._backend.database, None) as tx:
            row = (await tx.connection.execute(self._s.get_run, {"id": run_id})).one_or_none()
        return None if row is None else run_record(row)

    async def _state_of(self, run_id: str) -> RunRecord | None:
        async with joined(self._backend.database, None) as tx:
            row = (await tx.connection.execute(self._s.get_run, {"id": run_id})).one_or_none()
        return None if row is None else run_record(row)

    async def _refuse(self, operation: str, run_id: str, allowed: str) -> JobOperationRefusedError:
        record = await self._state_of(run_id)
        if record is None:
            return JobOperationRefusedError(
                f"{operation} of run {run_id!r}: no such run.",
                fix="pass the id of an existing run (list_failed lists dead ones).",
            )
        if operation == "retry" and record.state == "dead":
            return JobOperationRefusedError(
                f"retry of run {run_id!r}: a newer waiting or running run of job"
                f" {record.job_id!r} holds its dedupe key {record.dedupe_key!r} (J1).",
                fix="let that run finish, or discard this one.",
            )
        return JobOperationRefusedError(
            f"{operation} of run {run_id!r}: it is {record.state!r}; {operation} takes only"
            f" {allowed} runs.",
            fix="list dead runs with list_failed; a running run must settle first.",
        )

    async def retry(self, run_id: str) -> RunRecord:
        """A dead run waits again, due now, with exactly one more attempt
        (``max_attempts = attempt + 1``). Refused unless the run is dead."""
        await self._authorize("retry")
        params = {"id": run_id, "now": self._now()}
        try:
            async with joined(self._backend.database, None) as tx:
                row = (await tx.connection.execute(self._s.retry, params)).one_or_none()
                if row is not None:
                    tx.after_commit(self._backend.wake)  # J3: a retry wakes the local loop
        except IntegrityError as exc:
            if sqlstate_of(exc) != "23505":
                raise
            row = None  # a concurrent enqueue took the dedupe key (J1)
        if row is None:
            raise await self._refuse("retry", run_id, "dead")
        return run_record(row)

    async def discard(self, run_id: str) -> RunRecord:
        """A waiting or dead run becomes discarded. Refused for running (and finished) runs."""
        await self._authorize("discard")
        params = {"id": run_id, "now": self._now()}
        async with joined(self._backend.database, None) as tx:
            row = (await tx.connection.execute(self._s.discard, params)).one_or_none()
        if row is None:
            raise await self._refuse("discard", run_id, "waiting or dead")
        return run_record(row)

    async def cleanup(
        self,
        definitions: Iterable[JobDefinition[Any]],
        *,
        batch_size: int = 1000,
        max_batches: int = 100,
    ) -> dict[str, int]:
        """Delete each job's completed / dead / discarded runs older than its ``retention``:
        DELETEs of at most ``batch_size`` rows, each its own transaction, at most
        ``max_batches`` per job. Returns the number deleted per job id; call again when a job
        hit ``max_batches`` (its count is ``batch_size * max_batches``)."""
        await self._authorize("cleanup")
        if not 1 <= batch_size <= MAX_CLEANUP_BATCH:
            raise BoundExceededError(
                f"cleanup batch_size must be 1..{MAX_CLEANUP_BATCH}, got {batch_size}.",
                fix="use a smaller batch_size and more batches.",
            )
        if max_batches < 1:
            raise ConfigurationError(f"cleanup max_batches must be at least 1, got {max_batches}.")
        deleted: dict[str, int] = {}
        for job in definitions:
            retention = job.retention
            count = 0
            batches = 0
            for state, keep in (
                ("completed", retention.completed),
                ("dead", retention.dead),
                ("discarded", retention.discarded),
            ):
                while batches < max_batches:
                    batches += 1
                    params = {
                        "job_id": job.id,
                        "state": state,
                        "retention": keep.total_seconds(),
                        "batch": batch_size,
                        "now": self._now(),
                    }
                    async with joined(self._backend.database, None) as tx:
                        result = await tx.connection.execute(self._s.delete_batch, params)
                    count += result.rowcount
                    if result.rowcount < batch_size:
                        break
            deleted[job.id] = deleted.get(job.id, 0) + count
        return deleted


def create_job_operations(backend: PostgresJobBackend, *, authorizer: Authorizer) -> JobOperations:
    """J8 operator operations on ``backend``'s runs. ``authorizer(permission, operation)``
    (sync or async) is asked for ``"ship.jobs:manage"`` before every operation and must return
    ``True``; anything else raises :class:`PermissionDeniedError` and changes nothing."""
    return JobOperations(backend, authorizer=authorizer)
