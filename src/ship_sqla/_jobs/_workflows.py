"""The PostgreSQL workflow store (SPEC §13): steps and events of one job backend, on its
connections (:mod:`ship_sqla._jobs._sql.workflows` states the statements' rules).

Reads and fenced step writes join the ambient (or given) unit of work, so a transactional
step's result commits with its writes (D2); outside one, each is one autocommitted statement.
A suspend (:meth:`PostgresWorkflows.suspend`) and a publish hold the event's wait lock to their
transaction's end: a suspend is a short transaction of the store's own, a publish joins the
publisher's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy.exc import DBAPIError, IntegrityError

from ship_sqla._jobs._admin import run_record
from ship_sqla._jobs._sql import live as live_sql
from ship_sqla._jobs._sql import workflows as sql
from ship_sqla._naming import quoted_table
from ship_sqla._scope import OWN
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._evolution import PATCH_PREFIX, PatchFigure, patch_step_name
from ship_sqla.kernel._workflows import (
    CHILDREN_RECHECK,
    ChildOutcome,
    StepRecord,
    WorkflowEvent,
    WorkflowsNotConfiguredError,
    event_wait_key,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Sequence
    from datetime import datetime, timedelta

    from sqlalchemy import Table, TextClause

    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections
    from ship_sqla.kernel._ports import ClaimedRun, RunRecord, SettleOutcome, Suspend
    from ship_sqla.kernel._workflows import NewStep

__all__ = ["WAIT_LOCK_BUSY_RETRY", "PostgresWorkflows", "wait_lock_key"]

_LOCK_NAMESPACE: Final = b"ship_sqla.workflow.event\x1f"
WAIT_LOCK_BUSY_RETRY: Final = 0.2
"""Seconds a run whose event wait found the wait lock held (a publish of that event in flight)
waits before it is replayed and the wait begins again."""


def wait_lock_key(wait_key: str) -> int:
    """The advisory-lock key an event wait and a publish of ``wait_key`` share: a namespaced
    64-bit hash (the key space is shared with every other user of advisory locks, SPEC §10)."""
    digest = hashlib.sha256(_LOCK_NAMESPACE + wait_key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _step(row: Any) -> StepRecord:  # noqa: ANN401 - a Row of LOAD_STEPS
    return StepRecord(
        run_id=row.run_id,
        name=row.name,
        seq=row.seq,
        kind=row.kind,
        state=row.state,
        result_json=row.result_json,
        wake_at=row.wake_at,
        created_at=row.created_at,
        finished_at=row.finished_at,
        event_name=row.event_name,
        event_key=row.event_key,
        due=row.due,
    )


@asynccontextmanager
async def _tables_named(steps: Table, events: Table) -> AsyncIterator[None]:
    """A statement on a database without the workflow tables is a clear configuration error
    (naming them and the fix), not a bare UndefinedTable."""
    try:
        yield
    except DBAPIError as exc:
        if sqlstate_of(exc) != "42P01":
            raise
        raise WorkflowsNotConfiguredError(
            f"the workflow tables {quoted_table(steps)} and {quoted_table(events)} are not both"
            f" in the database ({exc.orig}).",
            fix="add ship_job_steps_table(metadata) and ship_job_events_table(metadata) to your"
            " migrations (docs/workflows.md), or pass create_job_backend(steps_table=...,"
            " events_table=...) naming yours.",
        ) from exc


class PostgresWorkflows:
    """:class:`~ship_sqla.kernel._workflows.WorkflowStore` and
    :class:`~ship_sqla.kernel._workflows.WorkflowAdmin` on PostgreSQL (the backend's
    ``workflows``)."""

    def __init__(
        self,
        statements: JobStatements,
        connections: StoreConnections,
        *,
        now: Callable[[], datetime | None],
        wake: Callable[[], None],
        announce: Callable[[Iterable[str]], None],
        steps_table: Table,
        events_table: Table,
    ) -> None:
        self._s = statements
        self._connections = connections
        self._now = now
        self._wake = wake
        self._announce = announce
        self.steps_table = steps_table
        self.events_table = events_table

    def _named(self) -> contextlib.AbstractAsyncContextManager[None]:
        return _tables_named(self.steps_table, self.events_table)

    async def _rows(
        self,
        what: str,
        statement: TextClause,
        params: dict[str, Any],
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope
        by_name: bool = True,
    ) -> Sequence[Any]:
        """The rows of ``statement`` alone: in the given or ambient unit of work, else
        autocommitted; the workflow tables named when they are missing."""
        async with self._named():
            return await self._connections.rows(
                what, statement, params, scope=scope, by_name=by_name
            )

    def _step_params(self, run: ClaimedRun, step: NewStep) -> dict[str, Any]:
        """What every statement storing ``step`` of ``run`` binds (the fence and the step)."""
        return {
            "run_id": run.run_id,
            "token": run.token,
            "name": step.name,
            "seq": step.seq,
            "kind": step.kind,
            "result": step.result_json,
            "wake_at": step.wake_at,
            "wake_after": step.wake_after,
            "event_name": step.event_name,
            "event_key": step.event_key,
            "now": self._now(),
        }

    # --- the port ---------------------------------------------------------------------------

    async def load_steps(self, run_id: str) -> list[StepRecord]:
        params = {"run_id": run_id, "now": self._now()}
        rows = await self._rows("load steps", self._s[sql.LOAD_STEPS], params)
        return [_step(row) for row in rows]

    async def save_step(self, run: ClaimedRun, step: NewStep, *, scope: Any = None) -> bool:  # noqa: ANN401
        params = self._step_params(run, step)
        rows = await self._rows(
            "save step", self._s[sql.SAVE_STEP], params, scope=scope, by_name=False
        )
        return bool(rows)

    async def begin_wait(self, run: ClaimedRun, step: NewStep) -> StepRecord | None:
        params = self._step_params(run, step)
        rows = await self._rows("begin wait", self._s[sql.BEGIN_WAIT], params)
        return _step(rows[0]) if rows else None

    async def match_event(self, run_id: str, step: StepRecord) -> WorkflowEvent | None:
        params = {"run_id": run_id, "name": step.name}
        rows = await self._rows("match event", self._s[sql.MATCH_EVENT], params)
        if not rows:
            return None
        row = rows[0]
        return WorkflowEvent(row.name, row.key, json.loads(row.payload_json), row.id)

    async def adopt_children(self, parent: ClaimedRun, child_ids: Sequence[str]) -> None:
        ids = list(child_ids)
        params = {"parent_id": parent.run_id, "token": parent.token, "ids": ids}
        async with self._named():
            await self._connections.execute(
                "adopt children", self._s[sql.ADOPT_CHILDREN], params, scope=OWN
            )
            if self._s.live_only:
                # J16: the children already in history, in a snapshot taken after that
                # statement ended (ADOPT_ENDED_CHILDREN).
                await self._connections.execute(
                    "adopt ended children",
                    self._s[live_sql.ADOPT_ENDED_CHILDREN],
                    {"parent_id": parent.run_id, "ids": ids},
                    scope=OWN,
                )

    async def children(self, run_id: str) -> list[ChildOutcome]:
        params = {"run_id": run_id}
        # J16: with a history table, the finished children are there.
        children = sql.CHILDREN if not self._s.live_only else live_sql.CHILDREN_EITHER
        rows = await self._rows("children", self._s[children], params)
        return [ChildOutcome(row.id, row.job_id, row.state, row.last_error) for row in rows]

    async def publish_event(
        self,
        name: str,
        key: str,
        payload_json: str,
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope
    ) -> int:
        wait_key = event_wait_key(name, key)
        params = {
            "name": name,
            "key": key,
            "payload": payload_json,
            "wait_key": wait_key,
            "now": self._now(),
        }
        async with self._named(), self._connections.transaction("publish event", scope=scope) as tx:
            await tx.connection.execute(
                self._s[sql.WAIT_LOCK_SHARED], {"lock_key": wait_lock_key(wait_key)}
            )
            row = (await tx.connection.execute(self._s[sql.PUBLISH_EVENT], params)).one()
            woken = list(row.job_ids or ())
            if woken:
                tx.after_commit(self._wake)
                tx.after_commit(lambda: self._announce(woken))
        return int(row.id)

    # --- what the backend's settle calls ------------------------------------------------------

    async def suspend(self, settlement: Suspend) -> SettleOutcome | None:
        """D3 (SUSPEND_RUN), in a short transaction of the store's own; an event wait first
        takes its wait lock (exclusive). None: that lock is held (a publish of the event is in
        flight) and nothing was done: the caller hands the run back for a moment
        (:data:`WAIT_LOCK_BUSY_RETRY`) instead of blocking its settles behind the publisher's
        transaction, and the wait begins at the replay."""
        step = settlement.step
        run = settlement.run
        params = {
            **self._step_params(run, step),
            "wait": settlement.wait,
            "recheck": CHILDREN_RECHECK,
        }
        async with (
            self._named(),
            self._connections.transaction("suspend", scope=OWN) as tx,
        ):
            connection = tx.connection
            if settlement.wait == "event":
                assert step.event_name is not None  # noqa: S101 - an event wait names its event
                key = wait_lock_key(event_wait_key(step.event_name, step.event_key or ""))
                locked = await connection.execute(self._s[sql.WAIT_LOCK], {"lock_key": key})
                if not locked.scalar_one():
                    return None
            row = (await connection.execute(self._s[sql.SUSPEND_RUN], params)).one_or_none()
        if row is None:
            return "stale"
        return "cancelled" if row.state == "cancelled" else "suspended"

    async def wake_parents(self, parent_ids: Iterable[str]) -> None:
        """D5 (WAKE_PARENTS): after children's ends committed; wakes this process (and, through
        the announcement, others) when a waiting parent became due."""
        parents = sorted(set(parent_ids))
        if not parents:
            return
        async with self._named():
            rows = await self._connections.rows(
                "wake parents",
                self._s[sql.WAKE_PARENTS],
                {"parents": parents, "now": self._now()},
                scope=OWN,
                by_name=True,
            )
        due = [row.job_id for row in rows if row.state == "waiting"]
        if due:
            self._wake()
            self._announce(due)

    # --- the admin side (D6) ------------------------------------------------------------------

    async def list_steps(self, run_id: str) -> list[StepRecord]:
        return await self.load_steps(run_id)

    async def rerun_from_step(self, run_id: str, step: str) -> RunRecord | None:
        params = {"run_id": run_id, "step": step, "now": self._now()}
        try:
            async with self._connections.transaction("rerun from step", scope=None) as tx:
                row = (
                    await tx.connection.execute(self._s[sql.RERUN_FROM_STEP], params)
                ).one_or_none()
                if row is None and self._s.live_only:  # J16: a dead run is in history
                    statement = self._s[live_sql.RERUN_FROM_STEP_BACK]
                    row = (await tx.connection.execute(statement, params)).one_or_none()
                if row is not None:
                    tx.after_commit(self._wake)
        except IntegrityError as exc:
            if sqlstate_of(exc) != "23505":
                raise
            return None  # a newer live run holds its dedupe key (J1)
        return None if row is None else run_record(row)

    # --- D8: the patch figures ------------------------------------------------------------------

    async def patch_ids(self, *, limit: int) -> list[str]:
        rows = await self._rows("patch ids", self._s[sql.PATCH_IDS], {"limit": limit})
        return [row.name.removeprefix(PATCH_PREFIX) for row in rows]

    async def patch_holding(self, job_id: str, patch_id: str, *, read: int) -> PatchFigure:
        params = {"job_id": job_id, "name": patch_step_name(patch_id), "read": read}
        [row] = await self._rows("patch holding", self._s[sql.PATCH_HOLDING], params)
        return PatchFigure(row.runs, row.read, row.read < read)

    async def patch_lacking(
        self, job_id: str, patch_id: str, *, read: int
    ) -> tuple[datetime | None, PatchFigure]:
        params = {"job_id": job_id, "name": patch_step_name(patch_id), "read": read}
        lacking = sql.PATCH_LACKING_EITHER if self._s.live_only else sql.PATCH_LACKING
        [row] = await self._rows("patch lacking", self._s[lacking], params)
        return row.first_marker_at, PatchFigure(row.runs, row.read, row.read < read)

    async def delete_events(self, *, older_than: timedelta, limit: int) -> int:
        params = {
            "older_than": older_than.total_seconds(),
            "limit": limit,
            "now": self._now(),
        }
        async with self._named():
            return await self._connections.count(
                "delete events", self._s[sql.DELETE_OLD_EVENTS], params, scope=None
            )
