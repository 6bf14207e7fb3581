"""The PostgreSQL backend's administration port (:class:`~ship_sqla.kernel.RunAdmin`, J8; cancel,
K2; pause and resume, K3) and its stats (J10's queue gauges, ``jobs stats``).

It checks no permission and no bound: the operator surface
(:class:`~ship_sqla.jobs.JobOperations`) is the gate over it. Every statement is one of the
backend's :class:`~ship_sqla._jobs._sql.JobStatements` and joins the ambient unit of work when
there is one (like every store), else runs as one autocommitted statement of the backend's own,
bounded by its ``operation_timeout``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from ship_sqla._jobs._sql import bulk as bulk_sql
from ship_sqla._jobs._sql import count as count_sql
from ship_sqla._jobs._sql import live as live_sql
from ship_sqla._jobs._sql.admin import (
    CANCEL_LIVE_RUN,
    DEAD_BY_JOB,
    DEAD_BY_JOB_EITHER,
    DELETE_FINISHED_BATCH,
    DEMAND,
    DISCARD_WAITING_OR_DEAD,
    GET_RUN,
    JOB_KNOWN,
    LIST_DEAD_ALL_JOBS,
    LIST_DEAD_OF_JOB,
    LIST_PAUSED,
    PARTITION_WAITS,
    PARTITION_WAITS_BY_KEY,
    PAUSE_JOB,
    QUEUE_DEPTHS,
    RESUME_JOB,
    RETRY_DEAD,
    STATE_COUNTS,
    TELL_FENCED_HOLDER,
)
from ship_sqla._jobs._sql.browse import (
    CONSUMER_PROGRESS,
    DEAD_ERRORS,
    LIST_COMPLETED_ALL_JOBS,
    LIST_COMPLETED_OF_JOB,
    LIST_FINISHED_ALL_JOBS,
    LIST_FINISHED_OF_JOB,
    LIST_RUNNING_ALL_JOBS,
    LIST_RUNNING_OF_JOB,
    LIST_WAITING_ALL_JOBS,
    LIST_WAITING_OF_JOB,
    SCHEDULE_STATES,
    THROUGHPUT,
)
from ship_sqla._jobs._sql.parked import (
    CLAIM_BUILD_UNPARK,
    LIST_PARKED_ALL,
    LIST_PARKED_OF_JOB,
    MOVE_VERSION,
    PARKED_COUNTS,
    UNPARK_BATCH,
    UNPARK_RUN,
)
from ship_sqla._jobs._sql.versions import VERSION_COUNTS
from ship_sqla._jobs._tables import state_row
from ship_sqla._naming import derived_name
from ship_sqla._scope import OWN
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._browse import (
    BrowsedRun,
    ClaimPosition,
    ConsumerKeyProgress,
    CreatedPosition,
    DeadError,
    FinishedPosition,
    LeasePosition,
    ScheduleState,
    ThroughputBucket,
    run_order,
)
from ship_sqla.kernel._partition_waits import judge
from ship_sqla.kernel._ports import (
    TERMINAL_STATES,
    JobDemand,
    JobFailures,
    PausedJob,
    QueueDepth,
    RunRecord,
    StateCount,
)
from ship_sqla.kernel._search import MatchCount
from ship_sqla.kernel._versions import MAX_VERSION_ROWS, VersionCount

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Mapping, Sequence
    from datetime import datetime, timedelta

    from sqlalchemy.sql.expression import Executable

    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections
    from ship_sqla._sql import Template
    from ship_sqla.kernel._browse import RunQuery
    from ship_sqla.kernel._partition_waits import PartitionLimits, PartitionWait
    from ship_sqla.kernel._ports import DeadQuery, RunState
    from ship_sqla.kernel._search import RunFilter

__all__ = ["PostgresRunAdmin", "run_record"]


def _in_order(run_ids: Sequence[str], rows: Sequence[Any]) -> list[str]:
    """The ids of ``rows`` (a batch statement's answer) in the batch's order."""
    changed = {row.id for row in rows}
    return [run_id for run_id in run_ids if run_id in changed]


JIT_OFF: Final = text("SET LOCAL jit = off")
"""Before an operator read (:meth:`PostgresRunAdmin._operator_rows`): its transaction only."""
JIT_OFF_CUSTOM_PLAN: Final = text(
    "SELECT set_config('jit', 'off', true),"
    " set_config('plan_cache_mode', 'force_custom_plan', true)"
)
"""JIT_OFF, and a plan for the parameters given (its transaction only), in one round trip:
before a bulk preview's count (COUNT_MATCHING_*). After five runs of a prepared statement
PostgreSQL may keep a generic plan; the count's, not knowing ``:scan`` (its LIMIT) nor which
branches run, read the job's waiting runs by a sequential scan of the runs table: 280-370 ms
against 160-200 ms at 10,000,000 runs (issue 36)."""


def run_record(row: Any, fields: Container[str] | None = None) -> RunRecord:  # noqa: ANN401 - a Row of the runs table's columns
    """A :class:`RunRecord` from a row of ``{cols}`` (:data:`~ship_sqla._jobs._sql.RUN_COLUMNS`);
    ``fields``: the row's column names when the caller has them (one statement's rows share
    them: ``row._fields`` builds a tuple at each call, 30 us a row, issue 36)."""
    names = row._fields if fields is None else fields
    holder = row.claimed_by if "claimed_by" in names else None
    return RunRecord(
        run_id=row.id,
        job_id=row.job_id,
        state=row.state,
        payload=row.payload,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        key=row.key,
        dedupe_key=row.dedupe_key,
        run_at=row.run_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        lease_expires_at=row.lease_expires_at,
        last_error=row.last_error,
        history=tuple(row.history),
        priority=row.priority,
        tenant=row.tenant_id,
        snoozes=row.snoozes,
        cancel_requested_at=row.cancel_requested_at,
        parent_id=row.parent_id,
        wait_for=row.wait_for,
        lapses=row.lapses,
        consecutive_lapses=row.consecutive_lapses,
        progress=row.progress,
        handler_version=row.handler_version,
        # A column the statement may not have is asked of the row's names first: a missing
        # attribute costs SQLAlchemy an exception, 4 us a row (issue 36). The worker of a
        # running run is its holder (claimed_by; issue 36: the worker filter).
        # J18: a running run's updated_at is its attempt's start (nothing else writes it
        # while it runs).
        started_at=(row.started_at if "started_at" in names else None)
        or (row.updated_at if row.state == "running" else None),
        worker=(row.worker if "worker" in names else None)
        or (holder if row.state == "running" else None),
    )


def run_records(rows: Sequence[Any]) -> list[RunRecord]:
    """:func:`run_record` of each of one statement's ``rows`` (their names read once)."""
    if not rows:
        return []
    fields = frozenset(rows[0]._fields)
    return [run_record(row, fields) for row in rows]


class PostgresRunAdmin:
    """:class:`~ship_sqla.kernel.RunAdmin` over one PostgreSQL job backend's runs table, and
    the dashboard's :class:`~ship_sqla.kernel._browse.RunBrowser` (S2)."""

    __slots__ = (
        "_cancel_channel",
        "_cancel_requested",
        "_child_ended",
        "_connections",
        "_history",
        "_now",
        "_s",
        "_wake",
        "_wake_channel",
        "_wake_payload",
    )

    def __init__(
        self,
        statements: JobStatements,
        connections: StoreConnections,
        *,
        now: Callable[[], datetime | None],
        wake: Callable[[], None],
        cancel_channel: str,
        wake_channel: str,
        wake_payload: Callable[[str], str],
        cancel_requested: Callable[[str], None],
        child_ended: Callable[[str], None] | None = None,
        history: bool = False,
    ) -> None:
        self._child_ended = child_ended
        # J16: the backend has a history table; every read of finished runs reads both tables.
        self._history = history
        self._s = statements
        self._connections = connections
        self._now = now
        self._wake = wake
        self._cancel_channel = cancel_channel
        self._wake_channel = wake_channel
        self._wake_payload = wake_payload
        self._cancel_requested = cancel_requested

    async def _operator_rows(
        self,
        what: str,
        statement: Executable,
        params: Mapping[str, Any],
        *,
        jit_off: bool = True,
        settings: Executable = JIT_OFF,
    ) -> Sequence[Any]:
        """The rows of one operator read (a dashboard page, ``jobs demand``); with ``jit_off``
        (the reads across jobs) with JIT off, in a short transaction of its own (S2): these
        reads walk recursive CTEs whose row estimates (the planner's tenfold guess per
        recursion) put their cost past ``jit_above_cost`` although they read a bounded number of
        index entries; compiling them took 1-3 s at 1,000,000 runs, executing them
        milliseconds. ``settings``: that statement (a count's also asks a custom plan,
        JIT_OFF_CUSTOM_PLAN). Three round trips more (BEGIN, SET LOCAL, COMMIT), so a one-job read,
        costed far below the threshold, runs alone; never on an enqueue, claim or settle."""
        if not jit_off:
            return await self._connections.rows(what, statement, params, scope=None, by_name=True)
        async with self._connections.transaction(what, scope=OWN) as tx:
            await tx.connection.execute(settings)
            return (await tx.connection.execute(statement, params)).all()

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._connections.rows(
            "get_run",
            self._s[live_sql.GET_RUN_EITHER if self._history else GET_RUN],
            {"id": run_id},
            scope=None,
            by_name=True,
        )
        return run_record(rows[0]) if rows else None

    async def list_dead(self, query: DeadQuery) -> list[RunRecord]:
        after_at, after_id = query.after if query.after is not None else (None, None)
        params: dict[str, Any] = {
            "limit": query.limit,
            "after_at": after_at,
            "after_id": after_id,
            "tenant": query.tenant,
        }
        if self._history:
            of_job = live_sql.LIST_DEAD_OF_JOB_EITHER
            all_jobs = live_sql.LIST_DEAD_ALL_JOBS_EITHER
        else:
            of_job, all_jobs = LIST_DEAD_OF_JOB, LIST_DEAD_ALL_JOBS
        statement = self._s[all_jobs]
        if query.job_id is not None:
            statement = self._s[of_job]
            params["job_id"] = query.job_id
        rows = await self._operator_rows(
            "list_dead", statement, params, jit_off=query.job_id is None
        )
        return run_records(rows)

    async def retry_dead(self, run_id: str) -> RunRecord | None:
        """A dead run waits again, due now, with exactly one more attempt; the local loop is
        woken after commit (J3). None when the run is not dead, or a newer live run holds its
        dedupe key (J1: the statement checks, and a concurrent enqueue that wins the race anyway
        trips the unique index, 23505)."""
        params = {"id": run_id, "now": self._now()}
        # J16: a dead run in history moves back; else one the runs table still holds (an older
        # release's) waits again in place.
        # A 23505 rolls back only its own statement (its transaction, or a savepoint in the
        # caller's unit of work, which goes on: _rows_unless_duplicate).
        statements = (live_sql.RETRY_DEAD_BACK, RETRY_DEAD) if self._history else (RETRY_DEAD,)
        rows: Sequence[Any] | None = []
        for statement in statements:
            rows = await self._rows_unless_duplicate("retry", statement, params)
            if rows is None or rows:
                break
        if not rows:
            return None
        await self._connections.after_commit(None, self._wake)
        return run_record(rows[0])

    # --- D10: parked runs ------------------------------------------------------------------

    async def list_parked(
        self, *, job_id: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[RunRecord]:
        """D10: LIST_PARKED_OF_JOB or LIST_PARKED_ALL, one keyset page."""
        params: dict[str, Any] = {"limit": limit, "after_id": None, "after_job": None}
        if after is not None:
            params["after_job"], params["after_id"] = after
        statement = LIST_PARKED_ALL
        if job_id is not None:
            statement = LIST_PARKED_OF_JOB
            params["job_id"] = job_id
            if after is not None and after[0] != job_id:
                if after[0] > job_id:
                    return []  # the cursor is past this job's runs
                params["after_id"] = None
        rows = await self._connections.rows(
            "list_parked", self._s[statement], params, scope=None, by_name=True
        )
        return run_records(rows)

    async def parked_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """D10: PARKED_COUNTS, parked runs per job."""
        rows = await self._connections.rows(
            "parked_counts", self._s[PARKED_COUNTS], {"job_ids": list(job_ids)}, scope=OWN
        )
        return {str(job_id): int(runs) for job_id, runs in rows}

    async def unpark(self, run_id: str) -> RunRecord | None:
        """D10: UNPARK_RUN; wakes the local loop after commit."""
        params = {"id": run_id, "now": self._now()}
        rows = await self._connections.rows(
            "unpark", self._s[UNPARK_RUN], params, scope=None, by_name=True
        )
        if not rows:
            return None
        await self._connections.after_commit(None, self._wake)
        return run_record(rows[0])

    async def move_version(self, run_id: str, version: int) -> RunRecord | None:
        """D10: MOVE_VERSION; wakes the local loop after commit."""
        params = {"id": run_id, "version": version, "now": self._now()}
        rows = await self._connections.rows(
            "move_version", self._s[MOVE_VERSION], params, scope=None, by_name=True
        )
        if not rows:
            return None
        await self._connections.after_commit(None, self._wake)
        return run_record(rows[0])

    async def claim_build_unpark(self, job_id: str, build_id: str) -> bool:
        """D10: CLAIM_BUILD_UNPARK on the job's ``<job_id>#unparked-by`` row."""
        params = {"row": state_row(job_id, "unparked-by"), "build": build_id, "now": self._now()}
        rows = await self._connections.rows(
            "claim_build_unpark", self._s[CLAIM_BUILD_UNPARK], params, scope=OWN
        )
        return bool(rows)

    async def unpark_batch(self, job_id: str, *, limit: int) -> int:
        """D10: UNPARK_BATCH, one bounded batch; wakes the local loop when it unparked any."""
        params = {"job_id": job_id, "limit": limit, "now": self._now()}
        count = await self._connections.count(
            "unpark_batch", self._s[UNPARK_BATCH], params, scope=OWN
        )
        if count:
            self._wake()
        return count

    async def discard(self, run_id: str) -> RunRecord | None:
        params = {"id": run_id, "now": self._now()}
        statements = (
            (
                live_sql.DISCARD_WAITING_MOVING,
                live_sql.DISCARD_DEAD_IN_HISTORY,
                DISCARD_WAITING_OR_DEAD,
            )
            if self._history
            else (DISCARD_WAITING_OR_DEAD,)
        )
        rows: Sequence[Any] = []
        for statement in statements:
            rows = await self._connections.rows(
                "discard", self._s[statement], params, scope=None, by_name=True
            )
            if rows:
                break
        record = run_record(rows[0]) if rows else None
        await self._after_child_ended(record)
        return record

    async def _after_child_ended(self, record: RunRecord | None) -> None:
        """D5: a child an operator ended (in the statement just run) wakes its parent once
        that commits."""
        if record is None or record.parent_id is None or self._child_ended is None:
            return
        if record.state in TERMINAL_STATES:
            parent, wake = record.parent_id, self._child_ended
            await self._connections.after_commit(None, lambda: wake(parent))

    async def cancel(self, run_id: str) -> RunRecord | None:
        """K2 (CANCEL_LIVE_RUN): a waiting run is cancelled; a running one's request is recorded
        and announced on the cancel channel in the same transaction (delivered on its commit,
        to every process's listener); this process's runtimes are told after the commit
        without waiting for the notification. None: finished or unknown, nothing changed.
        A run whose transactional handler is inside its transaction (J13) is announced first
        (TELL_FENCED_HOLDER): its row is locked until that transaction ends; the holder may
        then end it cancelled before the request lands, and the cancelled run is answered."""
        params = {"id": run_id, "channel": self._cancel_channel, "now": self._now()}
        # J13: a transactional handler's fence holds the row to its transaction's end; told
        # first (in a statement of its own: delivered now, unless the caller's unit of work
        # holds it to its commit), its handler is cancelled and rolls back, so the request
        # below waits for that rollback instead of the handler's end.
        told = await self._connections.rows(
            "cancel",
            self._s[TELL_FENCED_HOLDER],
            {"id": run_id, "channel": self._cancel_channel},
            scope=None,
        )
        if told:
            await self._connections.after_commit(None, lambda: self._cancel_requested(run_id))
        cancel = live_sql.CANCEL_MOVING if self._history else CANCEL_LIVE_RUN
        rows = await self._connections.rows(
            "cancel", self._s[cancel], params, scope=None, by_name=True
        )
        row = rows[0] if rows else None
        if row is None and told:
            # The holder, told first, may have ended the run cancelled before the request came
            # (its own settle woke any parent): this cancel's doing, answered so.
            ended = await self.get_run(run_id)
            return ended if ended is not None and ended.state == "cancelled" else None
        if row is not None and row.told:
            await self._connections.after_commit(None, lambda: self._cancel_requested(run_id))
        record = None if row is None else run_record(row)
        await self._after_child_ended(record)
        return record

    # --- issue 36 item 5: one statement per batch (bulk_sql) ---------------------------------

    async def retry_dead_batch(self, run_ids: Sequence[str]) -> list[str]:
        """J8 for a batch (RETRY_DEAD_BATCH_BACK, J16; RETRY_DEAD_BATCH without history): the
        ids retried, in one statement; the local loop woken after commit. A concurrent enqueue
        that takes a dedupe key first (23505) sends the batch down the single-run path (a
        savepoint keeps a joined unit of work usable)."""
        template = bulk_sql.RETRY_DEAD_BATCH_BACK if self._history else bulk_sql.RETRY_DEAD_BATCH
        rows = await self._rows_unless_duplicate(
            "retry_batch", template, {"ids": list(run_ids), "now": self._now()}
        )
        if rows is None:  # 23505: one at a time, each judged as retry_dead judges it
            return [run_id for run_id in run_ids if await self.retry_dead(run_id) is not None]
        if rows:
            await self._connections.after_commit(None, self._wake)
        return _in_order(run_ids, rows)

    async def discard_batch(self, run_ids: Sequence[str]) -> list[str]:
        """J8 for a batch (DISCARD_BATCH_MOVING, J16; DISCARD_BATCH): the ids discarded, in one
        statement; the parents of the children it ended woken after commit (D5)."""
        template = bulk_sql.DISCARD_BATCH_MOVING if self._history else bulk_sql.DISCARD_BATCH
        rows = await self._connections.rows(
            "discard_batch",
            self._s[template],
            {"ids": list(run_ids), "now": self._now()},
            scope=None,
            by_name=True,
        )
        await self._after_children_ended(rows)
        return _in_order(run_ids, rows)

    async def cancel_batch(self, run_ids: Sequence[str]) -> list[str]:
        """K2 for a batch (CANCEL_BATCH_MOVING, J16; CANCEL_BATCH): the ids cancelled or whose
        cancel was requested, in one statement; a row someone holds (J13's fence) is skipped
        by it and cancelled with :meth:`cancel` after, told first, one at a time."""
        template = bulk_sql.CANCEL_BATCH_MOVING if self._history else bulk_sql.CANCEL_BATCH
        params = {"ids": list(run_ids), "channel": self._cancel_channel, "now": self._now()}
        rows = await self._connections.rows(
            "cancel_batch", self._s[template], params, scope=None, by_name=True
        )
        done = [row for row in rows if row.state != "skipped"]
        told = [row.id for row in done if row.told]
        if told:
            requested = self._cancel_requested

            def tell() -> None:
                for run_id in told:
                    requested(run_id)

            await self._connections.after_commit(None, tell)
        await self._after_children_ended(done)
        changed = set(_in_order(run_ids, done))
        for row in rows:
            if row.state == "skipped" and await self.cancel(row.id) is not None:
                changed.add(row.id)
        return [run_id for run_id in run_ids if run_id in changed]

    async def _rows_unless_duplicate(
        self, what: str, template: Template, params: Mapping[str, Any]
    ) -> Sequence[Any] | None:
        """The rows of one statement that may trip a unique index (a dedupe key: a single
        retry_dead or a batch), or None when it did (23505): nothing it did stays (its own
        transaction, or a savepoint in a joined unit of work, which goes on)."""
        statement = self._s[template]
        try:
            if not self._connections.joins(None):
                return await self._connections.rows(
                    what, statement, params, scope=None, by_name=True
                )
            async with (
                self._connections.transaction(what, scope=None) as tx,
                tx.connection.begin_nested(),
            ):
                return (await tx.connection.execute(statement, params)).all()
        except IntegrityError as exc:
            if sqlstate_of(exc) != "23505":
                raise
            return None

    async def _after_children_ended(self, rows: Sequence[Any]) -> None:
        """D5: the parents of the children a batch ended wake once it commits."""
        if self._child_ended is None:
            return
        wake = self._child_ended
        parents = sorted(
            {row.parent_id for row in rows if row.parent_id and row.state in TERMINAL_STATES}
        )
        if parents:

            def wake_parents() -> None:
                for parent in parents:
                    wake(parent)

            await self._connections.after_commit(None, wake_parents)

    async def job_known(self, job_id: str) -> bool:
        """Issue 25 (JOB_KNOWN): whether a run of ``job_id`` (any state) or a state row of it
        (schedule, pause, claim gate, enqueue gate) is stored; one bounded statement."""
        params = {
            "job_id": job_id,
            "state_rows": [
                job_id,
                state_row(job_id, "paused"),
                state_row(job_id, "claim-gate"),
                state_row(job_id, "enqueue-gate"),
            ],
        }
        [(known,)] = await self._connections.rows(
            "job_known",
            self._s[live_sql.JOB_KNOWN_EITHER if self._history else JOB_KNOWN],
            params,
            scope=None,
        )
        return bool(known)

    async def pause(self, job_id: str) -> bool:
        """K3 (PAUSE_JOB): once committed, no claim that starts takes a run of ``job_id``."""
        params = {"pause_row": state_row(job_id, "paused"), "now": self._now()}
        rows = await self._connections.rows("pause", self._s[PAUSE_JOB], params, scope=None)
        return bool(rows)

    async def resume(self, job_id: str) -> bool:
        """K3 (RESUME_JOB): the job's runs are claimable again; the local loop is woken after
        the commit, other processes' listeners by the notification it sends."""
        params = {
            "pause_row": state_row(job_id, "paused"),
            "channel": self._wake_channel,
            "payload": self._wake_payload(job_id),
        }
        rows = await self._connections.rows("resume", self._s[RESUME_JOB], params, scope=None)
        if rows:
            await self._connections.after_commit(None, self._wake)
        return bool(rows)

    async def paused(self, *, limit: int) -> list[PausedJob]:
        rows = await self._connections.rows(
            "paused", self._s[LIST_PAUSED], {"limit": limit}, scope=None, by_name=True
        )
        return [PausedJob(row.job_id, row.paused_at) for row in rows]

    async def delete_finished(
        self, job_id: str, state: RunState, *, older_than: timedelta, limit: int
    ) -> int:
        """One bounded DELETE through ``<runs>_finished_idx`` (its own short transaction)."""
        params = {
            "job_id": job_id,
            "state": state,
            "retention": older_than.total_seconds(),
            "batch": limit,
            "now": self._now(),
        }
        return await self._connections.count(
            "cleanup", self._s[DELETE_FINISHED_BATCH], params, scope=None
        )

    async def partition_waits(
        self, limits: Sequence[PartitionLimits], *, max_partitions: int, cap: int
    ) -> list[PartitionWait]:
        """F8/F9 seen (PARTITION_WAITS, PARTITION_WAITS_BY_KEY): one bounded statement per kind
        of partition asked for; the kernel judges each row."""
        found: list[PartitionWait] = []
        for by, statement in (("tenant", PARTITION_WAITS), ("key", PARTITION_WAITS_BY_KEY)):
            jobs = [job for job in limits if job.by == by]
            if jobs:
                found += await self._partition_waits(statement, jobs, max_partitions, cap)
        order = {job.job_id: index for index, job in enumerate(limits)}
        return sorted(found, key=lambda wait: order[wait.job_id])

    async def _partition_waits(
        self, statement: Template, limits: Sequence[PartitionLimits], max_partitions: int, cap: int
    ) -> list[PartitionWait]:
        params = {
            "job_ids": [job.job_id for job in limits],
            "gates": [state_row(job.job_id, "claim-gate") for job in limits],
            "max_runnings": [job.max_running for job in limits],
            "rate_limits": [job.rate_limit for job in limits],
            "rate_periods": [job.rate_period for job in limits],
            "max_partitions": max_partitions,
            "cap": cap,
            "now": self._now(),
        }
        rows = await self._connections.rows(
            "partition waits", self._s[statement], params, scope=OWN, by_name=True
        )
        of = {job.job_id: job for job in limits}
        waits = (
            judge(
                of[row.job_id],
                row.tenant,
                due=int(row.due),
                running=int(row.running),
                started=int(row.started),
                oldest_start=row.oldest_start,
                cap=cap,
            )
            for row in rows
        )
        return [wait for wait in waits if wait is not None]

    async def demand(
        self, job_ids: Sequence[str] | None, *, cap: int, max_jobs: int
    ) -> list[JobDemand]:
        """F5 (DEMAND): one bounded statement, on its own autocommitted connection."""
        params = {
            "job_ids": list(job_ids or ()),
            "all_jobs": job_ids is None,
            "cap": cap,
            "max_jobs": max_jobs,
            "now": self._now(),
        }
        rows = await self._operator_rows("demand", self._s[DEMAND], params)
        return [
            JobDemand(
                row.job_id,
                int(row.due),
                int(row.delayed),
                int(row.running),
                None if row.oldest_due_age is None else max(float(row.oldest_due_age), 0.0),
                cap,
            )
            for row in rows
        ]

    async def dead_by_job(self, *, cap: int, max_jobs: int) -> list[JobFailures]:
        """DEAD_BY_JOB (the overview's failing jobs, issue 36): every job with dead runs, at
        most ``max_jobs``, each with its dead runs counted up to ``cap``. One bounded read."""
        statement = self._s[DEAD_BY_JOB_EITHER if self._history else DEAD_BY_JOB]
        params = {"cap": cap, "max_jobs": max_jobs}
        rows = await self._operator_rows("dead_by_job", statement, params)
        return [
            JobFailures(row.job_id, int(row.dead), int(row.dead) >= cap, row.last_dead_at)
            for row in rows
        ]

    async def state_counts(self, *, limit: int) -> list[StateCount]:
        params = {"limit": limit, "now": self._now()}
        rows = await self._connections.rows(
            "state_counts",
            self._s[live_sql.STATE_COUNTS_EITHER if self._history else STATE_COUNTS],
            params,
            scope=None,
            by_name=True,
        )
        return [
            StateCount(
                row.job_id,
                row.state,
                int(row.runs),  # J16: sum() over both tables is numeric (a Decimal)
                None if row.oldest_due_age is None else float(row.oldest_due_age),
            )
            for row in rows
        ]

    async def version_counts(
        self, job_ids: Sequence[str] | None = None, *, limit: int = MAX_VERSION_ROWS
    ) -> list[VersionCount]:
        """D9: VERSION_COUNTS, live runs per (job, handler version, state)."""
        params = {"job_ids": None if job_ids is None else list(job_ids), "limit": limit}
        rows = await self._connections.rows(
            "version_counts", self._s[VERSION_COUNTS], params, scope=OWN
        )
        return [VersionCount(job_id, version, state, runs) for job_id, version, state, runs in rows]

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """J10's queue gauges: waiting runs per job and the age of the oldest due one, for
        every job of ``job_ids`` (sampled by worker runtimes with metrics)."""
        params = {"job_ids": list(job_ids), "now": self._now()}
        rows = await self._connections.rows(
            "queue_depths", self._s[QUEUE_DEPTHS], params, scope=OWN
        )
        return {job_id: QueueDepth(depth, float(age)) for job_id, depth, age in rows}

    # --- the dashboard's reads (RunBrowser, S2) -----------------------------------------------

    async def list_runs(self, query: RunQuery, *, max_jobs: int) -> list[BrowsedRun]:
        """LIST_WAITING_* / LIST_RUNNING_* / LIST_FINISHED_*: one bounded page, in the state's
        order, through the index that order already has."""
        params: dict[str, Any] = {"limit": query.limit, "tenant": query.tenant}
        after = query.after
        order = run_order(query.state)
        if order == "claim":
            of_job, all_jobs = self._s[LIST_WAITING_OF_JOB], self._s[LIST_WAITING_ALL_JOBS]
            claim = after if isinstance(after, ClaimPosition) else None
            params["after_priority"] = None if claim is None else claim.priority
            params["after_run_at"] = None if claim is None else claim.run_at
            params["after_seq"] = None if claim is None else claim.seq
        elif order == "lease":
            of_job, all_jobs = self._s[LIST_RUNNING_OF_JOB], self._s[LIST_RUNNING_ALL_JOBS]
            lease = after if isinstance(after, LeasePosition) else None
            params["after_at"] = None if lease is None else lease.lease_expires_at
            params["after_id"] = None if lease is None else lease.run_id
        elif order == "finished":  # J18: completed runs, newest finished first
            of_job, all_jobs = self._s[LIST_COMPLETED_OF_JOB], self._s[LIST_COMPLETED_ALL_JOBS]
            if self._history:  # J16: the finished runs are in history
                of_job = self._s[live_sql.LIST_COMPLETED_OF_JOB_EITHER]
                all_jobs = self._s[live_sql.LIST_COMPLETED_ALL_JOBS_EITHER]
            finished = after if isinstance(after, FinishedPosition) else None
            params["finished_from"] = query.time_from
            params["finished_to"] = query.time_to
            params["after_at"] = None if finished is None else finished.finished_at
            params["after_id"] = None if finished is None else finished.run_id
        else:
            of_job, all_jobs = self._s[LIST_FINISHED_OF_JOB], self._s[LIST_FINISHED_ALL_JOBS]
            if self._history:  # J16: the finished runs are in history
                of_job = self._s[live_sql.LIST_FINISHED_OF_JOB_EITHER]
                all_jobs = self._s[live_sql.LIST_FINISHED_ALL_JOBS_EITHER]
            created = after if isinstance(after, CreatedPosition) else None
            params["state"] = query.state
            params["created_from"] = query.time_from
            params["created_to"] = query.time_to
            params["after_at"] = None if created is None else created.created_at
            params["after_id"] = None if created is None else created.run_id
        statement = all_jobs
        if query.job_id is not None:
            statement = of_job
            params["job_id"] = query.job_id
        else:
            params["max_jobs"] = max_jobs
        rows = await self._operator_rows(
            "list_runs", statement, params, jit_off=query.job_id is None
        )
        records = run_records(rows)
        return [BrowsedRun(record, row.seq) for record, row in zip(records, rows, strict=True)]

    async def newest_dead_errors(self, job_id: str, *, limit: int) -> list[DeadError]:
        """DEAD_ERRORS (_EITHER): one job's newest dead runs' errors, four columns, one
        bounded statement (``<runs>_browse_idx``, the history's browse index)."""
        statement = self._s[live_sql.DEAD_ERRORS_EITHER if self._history else DEAD_ERRORS]
        rows = await self._operator_rows(
            "newest_dead_errors",
            statement,
            {"job_id": job_id, "limit": limit},
            jit_off=False,
        )
        return [DeadError(row.id, row.job_id, row.last_error, row.finished_at) for row in rows]

    async def count_matching(
        self, flt: RunFilter, states: tuple[RunState, ...], *, scan: int, max_jobs: int
    ) -> MatchCount:
        """COUNT_MATCHING_*: a bulk preview's count in one bounded statement (its module doc:
        at most ``scan`` index entries in all; across jobs, the first ``max_jobs`` of each
        state, as the runs pages across jobs read them)."""
        params: dict[str, Any] = {
            "waiting": "waiting" in states,
            "running": "running" in states,
            "dead": "dead" in states,
            "scan": scan,
            "max_jobs": max_jobs,
            "run_id": flt.run_id,
            "tenant": flt.tenant,
            "worker": flt.worker,
            "error": flt.error,
            "time_from": flt.time_from,
            "time_to": flt.time_to,
            "payload": json.dumps([[list(path), value] for path, value in flt.payload]),
            "tenant_index": self._index_name("_tenant_idx"),
            "running_index": self._index_name("_running_idx"),
        }
        if self._history:
            of_job, all_jobs = (
                count_sql.COUNT_MATCHING_OF_JOB_EITHER,
                count_sql.COUNT_MATCHING_ALL_JOBS_EITHER,
            )
        else:
            of_job, all_jobs = count_sql.COUNT_MATCHING_OF_JOB, count_sql.COUNT_MATCHING_ALL_JOBS
        statement = all_jobs
        if flt.job_id is not None:
            statement = of_job
            params["job_id"] = flt.job_id
        rows = await self._operator_rows(
            "count_matching", self._s[statement], params, settings=JIT_OFF_CUSTOM_PLAN
        )
        row = rows[0]
        return MatchCount(int(row.matched), int(row.scanned), bool(row.stopped))

    def _index_name(self, suffix: str) -> str:
        """The runs table's index ``<runs><suffix>`` as ``to_regclass`` reads it (quoted, in
        the table's schema; without one, the search path's, as the table's name)."""
        parts = [self._s.runs_schema] if self._s.runs_schema else []
        parts.append(str(derived_name(self._s.runs_table, suffix)))
        return ".".join('"' + part.replace('"', '""') + '"' for part in parts)

    async def throughput(
        self, *, bucket_seconds: int, buckets: int, cap: int, max_jobs: int
    ) -> list[ThroughputBucket]:
        """THROUGHPUT: one bounded statement."""
        params = {
            "bucket": bucket_seconds,
            "buckets": buckets,
            "cap": cap,
            "max_jobs": max_jobs,
            "now": self._now(),
        }
        rows = await self._operator_rows(
            "throughput",
            self._s[live_sql.THROUGHPUT_EITHER if self._history else THROUGHPUT],
            params,
        )
        return [
            ThroughputBucket(row.start, int(row.completed), int(row.dead), bool(row.capped))
            for row in rows
        ]

    async def schedule_states(self, *, limit: int) -> list[ScheduleState]:
        """SCHEDULE_STATES."""
        rows = await self._connections.rows(
            "schedules", self._s[SCHEDULE_STATES], {"limit": limit}, scope=None, by_name=True
        )
        return [ScheduleState(row.job_id, row.trigger, row.next_at, row.updated_at) for row in rows]

    async def consumer_progress(
        self, *, limit: int, after: tuple[str, str] | None = None
    ) -> list[ConsumerKeyProgress]:
        """CONSUMER_PROGRESS."""
        params = {
            "limit": limit,
            "after_job": None if after is None else after[0],
            "after_key": None if after is None else after[1],
        }
        rows = await self._connections.rows(
            "consumer progress",
            self._s[live_sql.CONSUMER_PROGRESS_EITHER if self._history else CONSUMER_PROGRESS],
            params,
            scope=None,
            by_name=True,
        )
        return [
            ConsumerKeyProgress(
                job_id=row.job_id,
                key=row.key,
                run_id=row.run_id,
                state=row.state,
                progress=row.progress,
                live_run_id=row.live_run_id,
                live_state=row.live_state,
            )
            for row in rows
        ]
