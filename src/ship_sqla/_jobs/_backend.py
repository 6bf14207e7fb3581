"""The PostgreSQL job backend (ADR-0015): durable runs, claims that scale, fenced settles.

It implements the storage ports of :mod:`ship_sqla.kernel._ports` (:class:`RunStore`,
:class:`ScheduleStore`, and its :class:`RunAdmin` as ``backend.admin``) and nothing else: the
enqueue front, the settle front and the schedules' rules are the kernel's
(:class:`~ship_sqla.kernel._backend_base.JobBackendBase`), shared with the in-memory backend,
which differs from this one only in storage. Every statement is in :mod:`ship_sqla._jobs._sql`,
rendered once per backend (:attr:`PostgresJobBackend.statements`); every connection comes from
one :class:`~ship_sqla._scope.StoreConnections`.

J1 ``insert`` deduplicates by ``dedupe_key`` while a run of that job holding the key is not
   terminal, and a durable ``run_id`` that exists already (any state) is that run: the caller
   gets the existing run, ``deduplicated=True``.
J2 ``insert`` answers ``rejected="queue-full"`` once the job holds ``queue_depth_limit``
   waiting runs. The check reads at most that many index entries (never the backlog) and buffers
   nothing. It is a hard cap under any concurrency (engines, processes, ``enqueue_many``, units
   of work that enqueue and commit together): an insert of a capped job first
   takes the job's gate row (``ENQUEUE_GATE``), whose row lock lasts until its transaction
   commits, and only then counts, in a later statement whose snapshot sees every earlier
   holder's runs. Enqueuers of one capped job therefore take turns from their enqueue to their
   commit; a REPEATABLE READ or SERIALIZABLE unit of work whose snapshot predates another
   holder's commit fails at the gate with 40001 and is re-run (U3). The backend's own enqueue
   transactions are READ COMMITTED whatever the engine's default. Without a limit nothing of
   this runs: a plain enqueue stays one INSERT.
   Why a written row, not an advisory lock: a lock is enough under READ COMMITTED (the count's
   statement snapshot follows it) but a REPEATABLE READ snapshot taken before the lock would
   count without another holder's committed runs; an UPDATE of a row that holder wrote is what
   makes PostgreSQL refuse that snapshot (40001). The row is ``<job_id>#enqueue-gate`` in the
   state table, apart from the job's schedule row. The cap bounds what insert admits: a retry,
   a release or an operator retry returns an admitted run to waiting without the gate, and a
   schedule's tick inserts its occurrence uncapped, without the gate
   (:mod:`ship_sqla.kernel._plans.scheduled_runs`).
J3 A claim is ONE autocommitted statement, one round trip (F1): it reads the job's pause, takes
   due runs with ``FOR UPDATE SKIP LOCKED`` and, for a job with a ``concurrency.max``, leases at
   most what the job's claim gate grants: ``request.max_running`` minus its running runs,
   whichever process claims (:mod:`ship_sqla._jobs._sql.claim`). An uncapped job's claims take
   no exclusion at all. A committed local insert wakes the local loop (after commit, never
   after a rollback).
K1 A committed insert of a due run is announced (NOTIFY on
   :attr:`PostgresJobBackend.wake_channel`, payload the job id): in its own transaction when
   the backend has announced nothing for one gap (folded into the plain INSERT, one more
   statement on the other paths), else right after its commit by the backend's
   :class:`~ship_sqla._notify.Announcer`, in one notify-only transaction for every job
   committed meanwhile; delivered only after the commit, never after a rollback. K8: within a
   gap of the commit, the gaps sharing a fleet-wide budget per runs table
   (:mod:`ship_sqla.kernel._plans.announce`). While a worker runtime runs, the backend's
   :class:`~ship_sqla._notify.Listener` (``listen=``) holds one dedicated LISTEN connection and
   wakes the loop on the announcements of the runtime's jobs, and at once when it first goes
   live and after every reconnect (what committed while nothing listened). Polling stays the
   fallback: a lost notification or listener delays a run by at most the runtime's
   ``poll_interval``.
J5 Each claim draws a new fencing token; every settlement and heartbeat acts only while it is
   current, else changes nothing and answers "stale" (the runtime reports
   ``SHIP_SQLA_JOB_LEASE_STALE``). A lease that lapsed but that no claim retook is still current
   for a settlement; a heartbeat refuses it (a lapsed lease is never revived).
J6 A lapsed lease is retaken by the next claim of its job, as a new attempt, the lapsed one
   recorded in the history; one that lapsed on its final attempt is dead-lettered with
   ``LEASE_LAPSED_FINAL_ATTEMPT`` instead and returned in the claim's ``buried``.
J7 A settlement is applied as the kernel built it (:mod:`ship_sqla.kernel._settlement`): a
   release returns a run to waiting without consuming its attempt; a failure appends to the
   history and goes back to waiting at its retry time or is dead-lettered, as it says.

Speed: claims and settles are batched (one statement for many runs, every kind of settlement
in the same one: ``SETTLE_IF_TOKEN_CURRENT``), statement texts are stable (compiled once by
SQLAlchemy, prepared once per connection by asyncpg), and the backend's own statements run on
autocommit connections, so a claim or a settle costs one round trip. A claim's commit does not
wait for its WAL flush (``:tuned``) unless the backend was made with ``synchronous_claims=True``
(J24); settles, heartbeats and enqueues keep the server's ``synchronous_commit``.

Errors: the backend raises; the runtime's loop catches, reports through :meth:`report_error`
(J11) and retries. Every operation on the backend's own connections is bounded by
``operation_timeout`` so a database that stops answering surfaces as
:class:`JobBackendTimeoutError` instead of a hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypedDict

import attrs
from sqlalchemy import MetaData, Table, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._jobs._admin import PostgresRunAdmin
from ship_sqla._jobs._health import PostgresStorageHealth
from ship_sqla._jobs._insert import RunInserter, inserted
from ship_sqla._jobs._maintenance import PostgresHistoryMaintenance
from ship_sqla._jobs._migrate import refuse_references
from ship_sqla._jobs._schedules import PostgresSchedules
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql import live as live_sql
from ship_sqla._jobs._sql.claim import (
    CLAIM_AGED,
    CLAIM_AGED_GATED,
    CLAIM_AGED_GATED_KEYED,
    CLAIM_AGED_KEYED,
    CLAIM_FAIR,
    CLAIM_FAIR_GATED,
    CLAIM_FAIR_GATED_KEYED,
    CLAIM_FAIR_KEYED,
    CLAIM_GATED,
    CLAIM_GATED_KEYED,
    CLAIM_PARTITIONED,
    CLAIM_PARTITIONED_BY_KEY,
    CLAIM_PARTITIONED_BY_KEY_KEYED,
    CLAIM_PARTITIONED_KEYED,
    CLAIM_UNCAPPED,
    CLAIM_UNCAPPED_KEYED,
)
from ship_sqla._jobs._sql.enqueue import ANNOUNCE, ANNOUNCE_AFTER_COMMIT
from ship_sqla._jobs._sql.history import FINISHED_LEFT_IN_RUNS
from ship_sqla._jobs._sql.settle import (
    CLAIM_STATE_IF_TOKEN,
    FENCE_RUN_FOR_UPDATE,
    HEARTBEAT_IF_TOKEN_CURRENT,
    RECORD_PROGRESS_IF_TOKEN_CURRENT,
    SETTLE_IF_TOKEN_CURRENT,
)
from ship_sqla._jobs._sql_api import sync_job_definitions
from ship_sqla._jobs._tables import (
    declared_history,
    fair_claims_ddl,
    fair_claims_index_name,
    partitioned_claims_ddl,
    partitioned_claims_index_names,
    ship_job_events_table,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    state_row,
)
from ship_sqla._jobs._workers import PostgresWorkerRegistry
from ship_sqla._jobs._workflows import WAIT_LOCK_BUSY_RETRY, PostgresWorkflows
from ship_sqla._locks import AdvisoryLockProvider, advisory_lock_provider
from ship_sqla._naming import quoted_table
from ship_sqla._notify import (
    Announcer,
    Listen,
    Recheck,
    announced_key,
    announcement,
    channel_name,
    check_listen,
    listener_for,
    sender_token,
)
from ship_sqla._schema_probe import MissingTablesError, Needed, missing_relations, require_tables
from ship_sqla._scope import (
    OWN,
    Database,
    StoreConnections,
    TransactionScope,
    Within,
    same_database,
)
from ship_sqla._sql_errors import refused_value
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel import Clock
from ship_sqla.kernel._backend_base import JobBackendBase
from ship_sqla.kernel._durations import MAX_OPERATION_TIMEOUT, require_duration
from ship_sqla.kernel._errors import ConfigurationError, DatabaseTimeoutError
from ship_sqla.kernel._history_partitions import HistoryMaintenance
from ship_sqla.kernel._jobs import KEEP_ROW, history_keep, partition_walk, partition_walk_widest
from ship_sqla.kernel._plans.announce import AnnounceThrottle
from ship_sqla.kernel._plans.claim_floor import ClaimFloors, Floor, LapsedFloors
from ship_sqla.kernel._ports import (
    CANCEL_LAPSED_MESSAGE,
    LEASE_LAPSED_FINAL_MESSAGE,
    LEASE_LAPSED_MESSAGE,
    MAX_CLAIM_BATCH,
    BuriedRun,
    ClaimBatch,
    ClaimedRun,
    EnqueueResult,
    HeartbeatBatch,
    QueueDepth,
    SettleOutcome,
    Suspend,
    crash_loop_message,
)
from ship_sqla.kernel._settlement import (
    Settlement,
    refused,
    released,
    settle_refusal,
)
from ship_sqla.kernel._versions import MAX_VERSION_ROWS, VersionCount
from ship_sqla.kernel._workflows import WorkflowsNotConfiguredError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from datetime import datetime

    from ship_sqla._notify import Listener, Subscription
    from ship_sqla._sql import Template
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._health import HealthBounds, StorageHealth
    from ship_sqla.kernel._jobs import JobDefinition, Retention
    from ship_sqla.kernel._on_error import ErrorHandler
    from ship_sqla.kernel._plans.prepare import PreparedRun
    from ship_sqla.kernel._ports import ClaimRequest, FenceAnswer
    from ship_sqla.kernel._settlement import SettleRequest

__all__ = [
    "JobBackendTimeoutError",
    "PostgresJobBackend",
    "create_job_backend",
]

logger = logging.getLogger("ship_sqla.jobs")

_RUN_COLUMNS = frozenset(
    {
        "id",
        "seq",
        "job_id",
        "state",
        "payload",
        "key",
        "dedupe_key",
        "attempt",
        "max_attempts",
        "run_at",
        "created_at",
        "updated_at",
        "finished_at",
        "lease_expires_at",
        "lease_token",
        "claimed_by",
        "last_error",
        "history",
        "priority",
        "trace_context",
        "snoozes",
        "cancel_requested_at",
        "tenant_id",
        "parent_id",
        "wait_for",
        "lapses",
        "consecutive_lapses",
        "progress",
        "handler_version",
    }
)

_BURIED: Final = 1
_GATE_ANSWER: Final = 2
_FAIR_CURSOR: Final = 3
_BURIED_CHILD: Final = 4
_LAPSED_LEFT: Final = 5
"""A claim row's ``kind``: 0 a claimed run, 1 a buried one, 2 the gate's answer (CLAIM_GATED),
3 where a fair claim's tenant walk stopped (CLAIM_FAIR), 4 a child run the claim cancelled (its
cancel was requested and its lease lapsed): its ``parent_id`` is woken (D5), 5 the lapsed probe
was not complete (J19 for J6: the next probe starts where this one did)."""


@attrs.frozen
class _Taken:
    """J19: what a claim statement's rows say for the floors: the (priority, run_at, seq) of
    each waiting run it claimed, and whether its lapsed probe was complete (no kind 5 row)."""

    positions: list[tuple[int, datetime, int]]
    lapsed_complete: bool = attrs.field(kw_only=True)


_SUSPENDS_AT_ONCE: Final = 8
"""Workflow suspends of one settle batch run at once on an engine (each its own transaction)."""


_MAX_TIMEOUT: Final = MAX_OPERATION_TIMEOUT


class JobBackendTimeoutError(DatabaseTimeoutError):
    """A job backend operation did not finish within ``operation_timeout``; nothing is known
    about whether it took effect (a settle is fenced, so retrying it is safe)."""

    code = "SHIP_SQLA_JOB_BACKEND_TIMEOUT"


def _check_runs_table(table: Table) -> None:
    missing = _RUN_COLUMNS - set(table.c.keys())
    if missing:
        raise ConfigurationError(
            f"table {table.name!r} is not a job runs table: it lacks {sorted(missing)}.",
            fix="pass table=ship_job_runs_table(metadata, ...).",
        )


class PostgresJobBackend(JobBackendBase):
    """The durable job backend on PostgreSQL. Build it with :func:`create_job_backend`.

    Safe for any number of runtimes and processes on one database. With an ``AsyncEngine`` its
    own statements use pooled autocommit connections; with an ``AsyncConnection`` (the test
    path) they run one at a time in SAVEPOINTs of that connection's transaction.
    """

    _partitions_served: frozenset[bool] = frozenset()
    """F8/F9: the partitioned claims whose indexes were seen (False: per tenant, True: per key);
    each backend's own once it has seen one (``|=`` makes an instance attribute)."""

    def __init__(
        self,
        *,
        database: Database,
        table: Table,
        state_table: Table,
        queue_depth_limit: int | None,
        on_error: ErrorHandler | None,
        clock: Clock | None,
        operation_timeout: float,
        listen: Listen = True,
        announce: bool = True,
        workers_table: Table | None = None,
        steps_table: Table | None = None,
        events_table: Table | None = None,
        synchronous_claims: bool = False,
        health_bounds: HealthBounds | None = None,
        history_table: Table | None = None,
        live_only: bool = False,
    ) -> None:
        timeout = self._configure(database, clock, queue_depth_limit, on_error, operation_timeout)
        _check_runs_table(table)
        _check_live_only(live_only, history_table, steps_table)
        self._database = database
        self._table = table
        self._state_table = state_table
        self._history_table = history_table  # J16, J17 (None: built without one)
        self.synchronous_claims: Final = bool(synchronous_claims)  # J24, create_job_backend
        workers_table = PostgresWorkerRegistry.table_or_default(workers_table)
        tables = {"workers": workers_table, "steps": steps_table, "events": events_table}
        self.statements: Final = JobStatements.for_tables(
            table,
            state_table,
            **tables,
            history=history_table,
            server_clock=not self._clock.frozen,
            live_only=live_only,
        )
        """Every statement on this backend's tables, each rendered once (on first use); lent to
        its inserter, schedules, admin port, worker registry, workflow store and the CLI."""
        self._connections = StoreConnections(
            database,
            name="job backend",
            operation_timeout=timeout,
            timeout_error=JobBackendTimeoutError,
        )
        self._inserter = RunInserter(
            self.statements,
            self._connections,
            depth_limit=queue_depth_limit,
            now=self._now,
            wall=self._clock.now,
        )
        self._schedules = PostgresSchedules(
            self.statements,
            self._connections,
            self._inserter,
            now=self._now,
            wake=self.wake,
        )
        # K1: announce due runs to other processes' listeners; listen while a runtime runs.
        self.wake_channel: Final = channel_name("ship_sqla.jobs", self.statements.runs_name)
        """The NOTIFY channel of this runs table (payload: the job id), the same in every
        process: enqueues announce on it, listeners wake on it."""
        # K2: an operator's cancel of a running run is announced on this channel (payload: the
        # run id); a gap in listening needs no catching up: the heartbeat's answer covers it.
        self.cancel_channel: Final = channel_name(
            "ship_sqla.jobs.cancel", self.statements.runs_name
        )
        """The NOTIFY channel of cancel requests of this runs table, the same in every
        process: an operator's cancel sends on it, runtimes' listeners cancel the handler."""
        self._wire_announcements(database, listen=listen, announce=announce)
        self._fair_cursors: dict[str, str] = {}  # F2: per fair job, where its last walk stopped
        self.claim_floors = ClaimFloors()  # J19: where each job's next priority walk starts
        self.lapsed_floors = LapsedFloors()  # J19 for J6: where each job's lapsed probe starts
        self.history: Final = live_only  # J16: runs that end move to history
        self._keeps: dict[str, int] = {}  # J18: per job, what its completed runs leave there
        self._fair_served = False  # F2: whether fair claims' index exists (asked until it does)
        self._tables_served = False
        self._wire_stores(workers_table, steps_table, events_table, health_bounds)

    def _configure(
        self,
        database: Database,
        clock: Clock | None,
        queue_depth_limit: int | None,
        on_error: ErrorHandler | None,
        operation_timeout: float,
    ) -> float:
        """The base options; the operation timeout, checked."""
        _require_database(database)
        self._set_options(
            clock=clock,
            queue_depth_limit=queue_depth_limit,
            on_error=on_error,
            default_lock_provider=_default_locks(database, clock),
        )
        return require_duration(operation_timeout, "operation_timeout", maximum=_MAX_TIMEOUT)

    def _storage_health_reader(
        self, bounds: HealthBounds | None, steps_table: Table | None, events_table: Table | None
    ) -> PostgresStorageHealth:
        """J22: the storage health of every table this backend was given."""
        tables = (
            ("runs", self._table),
            ("state", self._state_table),
            ("workers", self._workers.table),
            ("steps", steps_table),
            ("events", events_table),
        )
        named = {role: quoted_table(t) for role, t in tables if t is not None}
        return PostgresStorageHealth(
            self.statements, self._connections, named, bounds, history=self._maintenance
        )

    def _wire_stores(
        self,
        workers_table: Table,
        steps_table: Table | None,
        events_table: Table | None,
        health_bounds: HealthBounds | None = None,
    ) -> None:
        """The ports this backend carries apart: its admin (J8), worker registry (F6),
        workflow store (D1-D6) and storage-health reader (J22)."""
        self._steps_table = steps_table
        self._admin = PostgresRunAdmin(
            self.statements,
            self._connections,
            now=self._now,
            wake=self.wake,
            cancel_channel=self.cancel_channel,
            wake_channel=self.wake_channel,
            wake_payload=self._wake_payload,
            cancel_requested=self._cancel_requested,
            child_ended=self._child_ended,
            history=self.history,
        )
        # F6, F5: the worker registry and the queue-sampler lease, on their own (optional) table.
        self._workers = PostgresWorkerRegistry(
            workers_table, self.statements, self._connections, now=self._now
        )
        # SPEC §13: the workflow store, on the steps and events tables.
        self._workflows: PostgresWorkflows | None = (
            PostgresWorkflows(
                self.statements,
                self._connections,
                now=self._now,
                wake=self.wake,
                announce=self._announce_woken,
                steps_table=steps_table,
                events_table=events_table,
            )
            if steps_table is not None and events_table is not None
            else None
        )
        # J17: the history's maintenance (None: a backend built without a history table).
        self._maintenance = (
            None
            if self._history_table is None
            else PostgresHistoryMaintenance(
                self._history_table,
                self.statements,
                self._connections,
                self._clock.now,
                runs=self._table,
            )
        )
        self._health = self._storage_health_reader(health_bounds, steps_table, events_table)

    def _wire_announcements(self, database: Database, *, listen: Listen, announce: bool) -> None:
        """K1, K8, K2, F1: the announcer of committed due runs, the one listener and the
        channels a runtime on this backend subscribes to while it listens."""
        self._sender = sender_token()
        self._announcer: Announcer | None = None
        """K1, K8: announces committed due runs by the kernel's rule; None: ``announce=False``."""
        if announce:
            self._announcer = Announcer(
                channel=self.wake_channel,
                sender=self._sender,
                send=self._send_announcement,
                report_error=self.report_error,
                concurrent=self._connections.concurrent,
                pool=self._connections.pool_in_use,
            )
        # F1: freed fleet slots of capped jobs, announced at most once per job per window.
        self._room_throttle = AnnounceThrottle()
        self._room_tasks: set[asyncio.Task[None]] = set()
        # F1: jobs whose freed slots came inside the window, announced at its end (never lost).
        self._room_pending: set[str] = set()
        self._room_trailing: asyncio.TimerHandle | None = None
        self._listener = listener_for(
            database,
            check_listen(listen, "create_job_backend"),
            name="job backend",
            report_error=self.report_error,
        )
        self._listen_channels: dict[str, tuple[Callable[[str], object], Callable[[], object]]] = {
            self.wake_channel: (self._announced, self.wake),
            self.cancel_channel: (self._cancel_requested, _nothing_missed),
        }
        """What this backend subscribes to on its listener while a runtime listens: channel ->
        (on_notify(payload), on_gap()). Each channel is one subscription of the one listener."""
        self._subscriptions: list[Subscription] = []
        self._listening: Counter[str] = Counter()
        self._recheck = Recheck(self.wake, self._clock)

    # --- properties ---------------------------------------------------------------------------

    @property
    def table(self) -> Table:
        return self._table

    @property
    def workflows(self) -> PostgresWorkflows | None:
        """The workflow store (SPEC §13) on this backend's steps and events tables."""
        return self._workflows

    @property
    def state_table(self) -> Table:
        return self._state_table

    @property
    def history_table(self) -> Table | None:
        """J16, J17: the run history table (None: built without one)."""
        return self._history_table

    @property
    def history_maintenance(self) -> PostgresHistoryMaintenance | None:
        """J17: the maintenance of :attr:`history_table` (None: built without one)."""
        return self._maintenance

    @property
    def store_connections(self) -> StoreConnections:
        """How this backend's own statements reach the database (the history migration's)."""
        return self._connections

    async def maintain_history(self, retentions: Sequence[Retention] = ()) -> HistoryMaintenance:
        """J17: one maintenance pass over the history's partitions (create days ahead, drop
        expired ones, analyze the parent, count the DEFAULT partitions' strays) and the runs
        table's bloated indexes (rebuilt concurrently), each DDL under
        a 1 s ``lock_timeout`` (deferred, not waited for). ``retentions``: the registered
        jobs'; each class keeps the longest of those and the history table's own."""
        if self._maintenance is None:
            return HistoryMaintenance()
        return await self._maintenance.maintain(retentions)

    async def rebuild_runs_indexes(self) -> HistoryMaintenance:
        """J16, J17: the maintenance pass's index rebuild step alone (the runs table's bloated
        indexes rebuilt concurrently under a 1 s ``lock_timeout``; skipped while a snapshot
        older than that is held): the fleet sampler's early rebuild after a held snapshot's
        release (:class:`~ship_sqla.kernel._early_rebuild.EarlyRebuild`)."""
        if self._maintenance is None:
            return HistoryMaintenance()
        return await self._maintenance.rebuild_indexes()

    @property
    def database(self) -> Database:
        return self._database

    @property
    def workers_table(self) -> Table:
        return self._workers.table

    @property
    def workers(self) -> PostgresWorkerRegistry:
        """The worker registry (F6) and queue-sampler lease (F5) of the runtimes on this backend
        (:class:`~ship_sqla.kernel.WorkerRegistry`), on :attr:`workers_table`."""
        return self._workers

    @property
    def admin(self) -> PostgresRunAdmin:
        """The administration port (:class:`~ship_sqla.kernel.RunAdmin`) over this backend's
        runs; it checks no permission: operators go through
        :func:`~ship_sqla.kernel.create_job_operations`."""
        return self._admin

    @property
    def listener(self) -> Listener | None:
        """The listener this backend's runtimes are woken through (K1), or None: ``listen=False``
        or a backend on an ``AsyncConnection``. It holds a connection only while a runtime in
        worker mode runs on this backend."""
        return self._listener

    def _now(self) -> datetime | None:
        """``:now`` for ``coalesce(:now, now())``: the clock's time only when it is frozen."""
        return now_bound(self._clock)

    # --- insert (J1, J2) ----------------------------------------------------------------------

    async def insert(
        self,
        job: JobDefinition[Any],
        runs: Sequence[PreparedRun],
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope
    ) -> list[EnqueueResult]:
        """Store prepared runs of ``job`` (J1, J2; see the module docstring), results in order.
        Joins the given or ambient unit of work, else runs in a short transaction of the
        backend's own (one autocommitted INSERT when nothing needs checking); a committed due
        run wakes the local loop after commit (J3) and, announced in the same transaction or
        right after it, other processes' listeners (K1, K8; see
        :mod:`ship_sqla.kernel._plans.announce`)."""
        if scope is not None and not isinstance(scope, TransactionScope):
            raise ConfigurationError(
                f"scope= must be a TransactionScope, got {type(scope).__name__}.",
                fix="pass the scope uow.run gave your repositories, or nothing.",
            )
        if not runs:
            return []
        for run in runs:
            if run.run_at is not None:  # J19: a back-dated run lowers this backend's floor
                self.claim_floors.lower(job.id, run.priority, run.run_at)
        announce = self._announce_channel(job.id)
        sample = self._wants_fleet_sample()
        # F8/F9: runs with partition keys take the transaction path (insert_on stores the keys).
        keyed = any(run.partition is not None for run in runs)
        if keyed and True not in self._partitions_served:
            await self._require_partitioned_claims([job.id], by_key=True)
        if not keyed and self._inserter.one_statement(runs):
            # The plain enqueue: a COPY or one INSERT, joined or on its own (one autocommitted
            # statement, or a bulk's COPY and its announcement in one transaction), as the
            # connection layer decides.
            due_now, fleet_seq = await self._inserter.store_plain(
                job.id, runs, announce=announce, sample=sample, scope=scope
            )
            if due_now:
                await self._connections.after_commit(
                    scope,
                    self.wake,
                    lambda: self._committed(
                        job.id, folded=announce is not None, fleet_seq=fleet_seq
                    ),
                )
            return inserted(runs)
        async with self._connections.transaction("enqueue", scope=scope) as tx:
            results, due_now, fleet_seq = await self._inserter.insert_on(
                tx, job.id, runs, announce=announce, sample=sample
            )
            if due_now:
                tx.after_commit(self.wake)
                tx.after_commit(
                    lambda: self._committed(
                        job.id, folded=announce is not None, fleet_seq=fleet_seq
                    )
                )
        return results

    # --- push wake (K1) -----------------------------------------------------------------------

    def _announce_channel(self, job_id: str) -> tuple[str, str] | None:
        """The (channel, payload) an enqueue of ``job_id`` announces in its own transaction, or
        None: announced after its commit instead (or never: ``announce=False``)."""
        announcer = self._announcer
        return None if announcer is None else announcer.fold(job_id)

    def _wants_fleet_sample(self) -> bool:
        """Whether the next plain enqueue should answer the ``seq`` it takes (K8's rate)."""
        announcer = self._announcer
        return announcer is not None and announcer.wants_fleet_sample()

    def _wake_payload(self, job_id: str) -> str:
        """The wake channel's payload announcing ``job_id`` from this backend (a resume's, K3)."""
        return announcement(self._sender, job_id)

    def _committed(self, job_id: str, *, folded: bool, fleet_seq: int | None = None) -> None:
        """A due run of ``job_id`` committed (``folded``: its transaction announced it, and
        read the table's ``fleet_seq``, when it did)."""
        if self._announcer is not None:
            self._announcer.committed(job_id, folded=folded, fleet_seq=fleet_seq)

    def _announce_woken(self, job_ids: Iterable[str]) -> None:
        """D3, D5: runs of these jobs became due by an event or a child's end that committed:
        announced as a committed enqueue is, after the commit."""
        for job_id in job_ids:
            self._committed(job_id, folded=False)

    async def _send_announcement(self, payloads: list[str]) -> None:
        """The announcer's send: ANNOUNCE_AFTER_COMMIT on a connection of the backend's own."""
        await self._connections.rows(
            "announce",
            self.statements[ANNOUNCE_AFTER_COMMIT],
            {"channel": self.wake_channel, "payloads": payloads},
            scope=OWN,
        )

    def start_listening(self, job_ids: Sequence[str]) -> None:
        """K1: a runtime executing ``job_ids`` starts waiting on this backend: subscribe to its
        listener (whose connection opens with the first subscription), so an announcement of
        one of these jobs from any process ends ``wait_for_work`` at once. Counted: every call
        is matched by one :meth:`stop_listening`. No-op without a listener."""
        if self._listener is None:
            return
        self._listening.update(job_ids)
        if not self._subscriptions:
            self._subscriptions = [
                self._listener.subscribe(channel, on_notify, on_gap=on_gap)
                for channel, (on_notify, on_gap) in self._listen_channels.items()
            ]

    async def stop_listening(self, job_ids: Sequence[str]) -> None:
        """The runtime that called :meth:`start_listening` with ``job_ids`` stopped; the last
        one closes the subscriptions (and so the listener's connection) and waits for that."""
        self._listening.subtract(job_ids)
        self._listening = +self._listening
        if self._listening:
            return
        await self._flush_room()
        if not self._subscriptions:
            return
        subscriptions, self._subscriptions = self._subscriptions, []
        await self._recheck.close()
        for subscription in subscriptions:
            await subscription.close()

    def room_freed(self, job_ids: Iterable[str]) -> None:
        """F1: settles of these capped jobs' runs landed here, so their fleet cap has room:
        announce each on the wake channel, so the other processes' runtimes claim it too rather
        than at their next poll. At most once per job per 250 ms from this backend (measured on
        the event loop's time: it bounds load, it decides nothing); a job freed again inside
        that window is announced once more at its end, so no freed slot goes unannounced (a
        runtime parked on the cap would otherwise wait for its poll). In a task of its own; a
        failure is reported (J11)."""
        if not self._connections.concurrent:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        wanted: list[str] = []
        for job_id in job_ids:
            if self._room_throttle.wanted(job_id, now):
                wanted.append(job_id)
                self._room_throttle.announced(job_id, now)
            else:
                self._room_pending.add(job_id)
        if self._room_pending and self._room_trailing is None:
            self._room_trailing = loop.call_later(self._room_throttle.window, self._room_due)
        if wanted:
            task = loop.create_task(self._announce_room(wanted))
            self._room_tasks.add(task)
            task.add_done_callback(self._room_tasks.discard)

    async def _flush_room(self) -> None:
        """F1: the last runtime here stopped: freed slots still throttled are announced now,
        and every announcement or parent wake under way is awaited, so none runs after the
        stop (on an engine disposed, or a database dropped, since)."""
        if self._room_trailing is not None:
            self._room_trailing.cancel()
            self._room_trailing = None
        pending, self._room_pending = self._room_pending, set()
        if pending:
            await self._announce_room(sorted(pending))
        while self._room_tasks:
            await asyncio.gather(*self._room_tasks, return_exceptions=True)

    def _room_due(self) -> None:
        """The end of a window in which freed slots were throttled: announce them now."""
        self._room_trailing = None
        pending, self._room_pending = self._room_pending, set()
        self.room_freed(pending)

    async def _announce_room(self, job_ids: Sequence[str]) -> None:
        try:
            for job_id in job_ids:
                await self._connections.execute(
                    "announce freed slots",
                    self.statements[ANNOUNCE],
                    {"channel": self.wake_channel, "payload": self._wake_payload(job_id)},
                    scope=OWN,
                )
        except Exception as exc:  # noqa: BLE001 - J11: reported; the others still poll
            self.report_error(exc)

    def _announced(self, payload: str) -> None:
        """A notification on the wake channel: wake the local loop when a runtime here runs the
        job, and again at the rechecks (for senders of earlier versions, which silenced
        enqueues for a window). Our own announcements are ignored: their commits woke this
        process already."""
        job_id = announced_key(payload, self._sender)
        if job_id is not None and job_id in self._listening:
            self.wake()
            self._recheck.arm()

    # --- claim, heartbeat, settle -------------------------------------------------------------

    async def require_support(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """A worker's start check, asked once per backend (the one probe,
        :func:`~ship_sqla._schema_probe.require_tables`): the runs and state tables exist, else
        :class:`~ship_sqla.errors.MissingTablesError` names them and the command that creates
        them; and a fair job (F2) needs ``<runs>_tenant_idx`` on the runs table
        (``ship_job_runs_table(..., fair_claims=True)``), so a worker without it fails there."""
        definitions = list(definitions)
        self._require_same_database(definitions)
        self._keeps.update((job.id, history_keep(job.retention)) for job in definitions)
        fair = [job.id for job in definitions if job.fairness is not None]
        await self.require_tables("the job worker", fair_claims=bool(fair))
        await self._require_history_shape()
        for by_key in (False, True):
            wanted = "key" if by_key else "tenant"
            partitioned = [job.id for job in definitions if job.partition == wanted]
            if partitioned:
                # F8/F9 first: the tenant's indexes include the fair claims' one.
                await self._require_partitioned_claims(partitioned, by_key=by_key)
        if fair:
            await self._require_fair_claims(fair)
        if self._definitions_table is not None:
            await self.sync_definitions(definitions)

    async def _require_history_shape(self) -> None:
        """J16, a worker's start: without a history table, say (once) that runs end in place
        and how to move them out; with one, the history table exists (MissingTablesError), no
        foreign key references the runs table (a move would delete, or be refused by, what
        references it: ConfigurationError), and finished runs still in the runs table are
        reported (warning) with the migration that moves them."""
        if self._shape_checked:
            return
        runs = quoted_table(self._table)
        if not self.history:
            logger.warning(
                "J16: the runs table %s keeps finished runs (no history table declared): it"
                " grows with every run. Declare ship_job_history_table(metadata) beside"
                " ship_job_runs_table(metadata) (the steps table after it), create it, then run"
                " `ship-sqla jobs maintain --migrate` (docs/howto/history.md).",
                runs,
            )
            self._shape_checked = True
            return
        assert self._history_table is not None  # noqa: S101 - history implies it
        needed = [Needed.table(self._history_table, "history")]
        await require_tables(self._connections, needed, surface="the job worker")
        await refuse_references(self)
        await self._settle_without_steps()
        rows = await self._connections.rows(
            "history_left_over", self.statements[FINISHED_LEFT_IN_RUNS], {}, scope=OWN
        )
        if rows and rows[0][0]:
            logger.warning(
                "J16: finished runs are still in the runs table %s (they stay readable; new"
                " ones move to %s). Move them: `ship-sqla jobs maintain --migrate`"
                " (docs/howto/history.md).",
                runs,
                quoted_table(self._history_table),
            )
        self._shape_checked = True

    async def _settle_without_steps(self) -> None:
        """J16, J18: without a steps table in the database (an application with no workflows),
        the moving settle (asked once per backend) asks no steps table whether an ended run is
        a workflow run (none is: its payload leaves as any run's)."""
        steps = self._steps_table
        if steps is None:
            self._steps_probed = True
            return
        needed = [Needed.table(steps, "steps")]
        missing = await missing_relations(self._connections, needed, surface="the job worker")
        self._steps_probed = True
        if not missing:
            return
        stepless = JobStatements.for_tables(
            self._table,
            self._state_table,
            history=self._history_table,
            server_clock=not self._clock.frozen,
            live_only=True,
        )
        self._settle_moving = stepless[live_sql.SETTLE_MOVING]

    _steps_probed = False
    """J16: whether :meth:`_settle_without_steps` has asked the database (a worker's start, else
    the first moving settle: a caller settling without a runtime, on a database without the
    steps table, `schema apply --only jobs`)."""

    _settle_moving: TextClause | None = None
    """J16: the moving settle rendered without a steps table (None: the statements' own)."""

    _shape_checked = False
    """J16: whether :meth:`_require_history_shape` has passed (asked once per backend)."""

    _definitions_table: Table | None = None
    """E8: the job definitions table a worker's start upserts (:meth:`serve_sql_enqueue`)."""

    def serve_sql_enqueue(self, definitions_table: Table) -> None:
        """E8: every worker started on this backend upserts its jobs' rows of
        ``definitions_table`` (:func:`~ship_sqla._jobs._sql_api.ship_job_definitions_table`), so
        ``<runs>_enqueue_v1`` callers cap, default and refuse as this backend does."""
        self._definitions_table = definitions_table

    async def sync_definitions(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """E8: upsert ``definitions``' rows of the definitions table (:meth:`serve_sql_enqueue`),
        with this backend's ``queue_depth_limit``, in a transaction of the backend's own."""
        table = self._definitions_table
        if table is None:
            raise ConfigurationError(
                "sync_definitions() on a backend without a definitions table.",
                fix="call backend.serve_sql_enqueue(ship_job_definitions_table(metadata)) first.",
            )
        async with self._connections.transaction("definitions", scope=OWN) as tx:
            await sync_job_definitions(
                tx.connection, table, definitions, queue_depth_limit=self._queue_depth_limit
            )

    def _require_same_database(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """J13: a transactional job's fence and completion join its unit of work's transaction,
        so that unit of work must be on this backend's database (its engine)."""
        for job in definitions:
            bind = getattr(job.transaction, "bind", None)
            if bind is not None and not same_database(bind, self._database):
                raise ConfigurationError(
                    f"job {job.id!r} is transactional (transaction=) on another database than"
                    " this job backend's: its claim's fence and completion could not join the"
                    " handler's transaction.",
                    fix="build the job's unit of work on the backend's engine"
                    " (create_unit_of_work(backend.database, ...)).",
                )

    async def require_tables(
        self, surface: str, *, fair_claims: bool = False, strict: bool = False
    ) -> None:
        """Return once the runs and state tables have been seen to exist (one probe, asked
        until it answers); else raise :class:`~ship_sqla.errors.MissingTablesError` naming
        the missing ones, ``surface`` (who asked: a worker, the dashboard) and the ``ship-sqla
        schema apply`` command that creates them (``fair_claims``: with the fair claims'
        index). A database it cannot reach decides nothing (``strict``: raises that error;
        :func:`~ship_sqla._schema_probe.require_tables`)."""
        if self._tables_served:
            return
        self._tables_served = await require_tables(
            self._connections,
            [Needed.table(self._table, "runs"), Needed.table(self._state_table, "state")],
            surface=surface,
            fair_claims=fair_claims,
            strict=strict,
        )

    async def _require_fair_claims(self, job_ids: Sequence[str]) -> None:
        """Return once the runs table has been seen to have the fair claims' index; else raise
        MissingTablesError (a ConfigurationError) naming ``job_ids``, the index and its DDL."""
        if self._fair_served:
            return
        s, index = self.statements, fair_claims_index_name(self._table)
        ddl = fair_claims_ddl(self._table)
        needed = Needed.index(self._table, index, ddl)
        if not await missing_relations(self._connections, [needed], surface="the job worker"):
            self._fair_served = True
            return
        raise MissingTablesError(
            f"job(s) {', '.join(map(repr, job_ids))} have fairness= (F2), but the runs table"
            f" {s.runs_name} has no index {index}, which fair claims read (without it each"
            " claim would read every waiting run of the job).",
            fix="declare the table with ship_job_runs_table(metadata, ..., fair_claims=True)"
            f" and migrate (Alembic autogenerate adds the index; by hand: {ddl}), or drop"
            " fairness= from these jobs.",
            missing=(needed.relation,),
        )

    async def _require_partitioned_claims(
        self, job_ids: Sequence[str], *, by_key: bool = False
    ) -> None:
        """Return once the runs table has been seen to have the partitioned claims' indexes
        (F8, F9; ``by_key``: per partition key, whose index is also the sign of the
        ``partition_key`` column); else raise MissingTablesError naming ``job_ids``, the
        indexes and their DDL."""
        if by_key in self._partitions_served:
            return
        names = partitioned_claims_index_names(self._table, by_key=by_key)
        ddls = partitioned_claims_ddl(self._table, by_key=by_key)
        needed = [Needed.index(self._table, n, d) for n, d in zip(names, ddls, strict=True)]
        missing = await missing_relations(self._connections, needed, surface="the job worker")
        if not missing:
            self._partitions_served |= {by_key}
            return
        kind, flag = (
            ("partition key", "partition_keys") if by_key else ("tenant", "partitioned_claims")
        )
        column = (
            f"ALTER TABLE {self.statements.runs_name} ADD COLUMN IF NOT EXISTS partition_key text; "
            if by_key
            else ""
        )
        raise MissingTablesError(
            f"job(s) {', '.join(map(repr, job_ids))} have a limit per {kind} (F8/F9:"
            f" RateLimit(..., partition='{'key' if by_key else 'tenant'}') or Concurrency(max=N,"
            f" partition=...)), but the runs table {self.statements.runs_name} lacks"
            f" {', '.join(n.relation for n in missing)}, which their claims (and enqueues) read"
            " (without them each claim would read every waiting or running run of the job).",
            fix=f"declare the table with ship_job_runs_table(metadata, ..., {flag}=True) and"
            " migrate (Alembic autogenerate adds them; by hand:"
            f" {column}{'; '.join(n.ddl or '' for n in missing)}), or drop partition= from"
            " these jobs' limits.",
            missing=tuple(n.relation for n in missing),
        )

    async def claim(self, request: ClaimRequest) -> ClaimBatch:
        """Claim up to ``request.limit`` due runs (J3, J6, F1, F3); see the module docstring."""
        if request.limit < 1:
            return ClaimBatch()

        job_id, cap, rate = request.job_id, request.max_running, request.rate_limit
        params: dict[str, Any] = {
            "job_id": job_id,
            "limit": request.limit,
            "lapsed_limit": request.limit + (cap or 0),
            "lease": request.lease,
            "worker": request.worker,
            "exclude_keys": list(request.exclude_keys),
            "lapsed_final": LEASE_LAPSED_FINAL_MESSAGE,
            "lapsed": LEASE_LAPSED_MESSAGE,
            "cancel_lapsed": CANCEL_LAPSED_MESSAGE,
            "max_lapses": request.max_lapses,
            "crash_loop": (
                None if request.max_lapses is None else crash_loop_message(request.max_lapses)
            ),
            "pause_row": state_row(job_id, "paused"),
            "tuned": self._connections.concurrent and not self.synchronous_claims,
            "now": self._now(),
            "lapsed_window": None,  # J6: from the start (a partitioned claim always is)
        }
        s, fair = self.statements, request.fairness
        if fair is not None:
            if not self._fair_served:
                await self._require_fair_claims([job_id])
            params["after_tenant"] = self._fair_cursors.get(job_id)
            params["max_tenants"] = fair.max_tenants
            params["weight_tenants"] = [tenant for tenant, _ in fair.weights]
            params["weights"] = [weight for _, weight in fair.weights]
            params["default_weight"] = fair.default_weight
        if request.partition is not None:
            return await self._claim_partitioned(params, request)
        _aging_params(params, request)
        # J19 for J6: the lapsed probe starts at this backend's lapsed floor (kernel), read
        # and recorded at a time before the statement's (so never above what it probed).
        probed_at = self._clock.now()
        lapsed_window = self.lapsed_floors.window(job_id, probed_at)
        params["lapsed_window"] = lapsed_window
        floors: tuple[Floor, ...] = ()
        floored = fair is None and request.aging is None
        if floored:
            # J19: the priority walk starts at this backend's floors (kernel ClaimFloors).
            floors = self.claim_floors.floors(job_id, self._clock.now())
            params["floor_priorities"] = [floor.priority for floor in floors]
            params["floor_run_ats"] = [floor.run_at for floor in floors]
            params["floor_seqs"] = [floor.seq for floor in floors]
        if cap is not None or rate is not None:
            params["max_running"] = cap
            params["rate_limit"] = None if rate is None else rate.limit
            params["rate_period"] = None if rate is None else rate.period
            params["gate_row"] = state_row(job_id, "claim-gate")
        statement = s[_claim_template(request)]
        batch, gate_created, taken = await self._claim_with(statement, params, request)
        if gate_created and not batch and not batch.buried:
            # The job's first gated claim made its gate, which grants nothing: claim again.
            batch, _, taken = await self._claim_with(statement, params, request)
        # J19: what the claim took spaces a full walk or probe from the next (kernel
        # sweep_spacing): under a held horizon they read every entry it kept.
        ended = self._clock.now()
        took = (ended - probed_at).total_seconds()
        self.lapsed_floors.record(
            job_id, probed_at, lapsed_window, complete=taken.lapsed_complete, took=took
        )
        if floored:
            self.claim_floors.record(job_id, ended, floors, taken.positions, took=took)
        return batch

    async def _claim_partitioned(self, params: dict[str, Any], request: ClaimRequest) -> ClaimBatch:
        """F8/F9 (CLAIM_PARTITIONED): the limits per partition, one gate row each; the walk over
        the partitions is the fair claim's (F2), with its weights when the job has some, at
        most ``partition_walk`` partitions wide (no wider than the claim can take from)."""
        by_key = request.partition == "key"
        if by_key not in self._partitions_served:
            await self._require_partitioned_claims([request.job_id], by_key=by_key)
        job_id, fair, rate = request.job_id, request.fairness, request.rate_limit
        # J6: every lapsed lease the claim meets, up to the most a claim takes (each partition's
        # gate decides which it retakes; a partitioned job has no one cap to bound them by).
        params["lapsed_limit"] = MAX_CLAIM_BATCH
        params["after_tenant"] = self._fair_cursors.get(job_id)
        params["max_tenants"] = partition_walk(fair, request.limit)
        params["widest"] = partition_walk_widest(fair, request.limit)
        params["weight_tenants"] = [] if fair is None else [tenant for tenant, _ in fair.weights]
        params["weights"] = [] if fair is None else [weight for _, weight in fair.weights]
        params["default_weight"] = 1 if fair is None else fair.default_weight
        params["max_running"] = request.max_running
        params["rate_limit"] = None if rate is None else rate.limit
        params["rate_period"] = None if rate is None else rate.period
        params["gate_row"] = state_row(job_id, "claim-gate")
        s = self.statements
        if by_key:
            keyed = CLAIM_PARTITIONED_BY_KEY_KEYED, CLAIM_PARTITIONED_BY_KEY
        else:
            keyed = CLAIM_PARTITIONED_KEYED, CLAIM_PARTITIONED
        statement = s[keyed[0]] if request.exclude_keys else s[keyed[1]]
        batch, _, _ = await self._claim_with(statement, params, request, walked=True)
        return batch

    async def _claim_with(
        self,
        statement: TextClause,
        params: dict[str, Any],
        request: ClaimRequest,
        *,
        walked: bool = False,
    ) -> tuple[ClaimBatch, bool, _Taken]:
        """One claim statement (F1: one autocommitted statement, one round trip: it reads the
        job's pause, K3, and a gated one takes the job's claim gate for that statement only):
        the batch, whether this statement made the job's claim gate, and (J19) the
        (priority, run_at, seq) of each waiting run it claimed and whether its lapsed probe was
        complete."""
        job_id, lease = request.job_id, request.lease
        rows = await self._connections.rows(
            f"claim of job {job_id!r}", statement, params, scope=OWN
        )
        rows, lapsed_complete = _lapsed_left(rows)
        claimed: list[ClaimedRun] = []
        buried: list[BuriedRun] = []
        ended_children: list[str] = []
        rate_wait: float | None = None
        created = False
        # Rows come in claim order, (priority DESC, run_at, seq), then the dead-lettered ones,
        # then the gate's answer, then a fair claim's cursor; read by position (CLAIM_COLUMNS).
        if walked or request.fairness is not None:
            self._fair_cursors.pop(job_id, None)
        for row in rows:
            run_id, kind, parent_id = row[0], row[14], row[17]
            if kind == _FAIR_CURSOR:
                # F2: the walk stopped at max_tenants; the next fair claim starts after here.
                self._fair_cursors[job_id] = run_id
                continue
            if kind == _GATE_ANSWER:
                rate_wait, created = row[15], row[16]
                continue
            if kind in (_BURIED, _BURIED_CHILD):
                if parent_id is not None:
                    ended_children.append(parent_id)
                if kind == _BURIED:
                    buried.append(_buried(row, job_id, request.max_lapses))
                continue
            claimed.append(_claimed(row, job_id, lease))
        if ended_children:
            await self._wake_parents(ended_children)  # D5: after the burial committed
        if self.history and (buried or ended_children):
            await self._move_finished(job_id)
        # The runtime reports and counts the buried runs (J6, J10); nothing is logged here twice.
        more_due = job_id in self._fair_cursors and (walked or request.fairness is not None)
        batch = ClaimBatch(claimed, buried, rate_wait=rate_wait, more_due=more_due)
        return batch, created, _Taken(_positions(rows), lapsed_complete=lapsed_complete)

    async def _move_finished(self, job_id: str) -> None:
        """J16: the claim ended runs in place (J6's burial; the claim is unchanged): move the
        job's finished rows into history, a bounded batch, its own statement."""
        await self._connections.execute(
            f"move of job {job_id!r}'s finished runs",
            self.statements[live_sql.MOVE_FINISHED],
            {"job_id": job_id, "batch": MOVE_BATCH},
            scope=OWN,
        )

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> HeartbeatBatch:
        """Extend each run's lease by its claim's ``lease``; False where stale or lapsed; the
        held runs whose cancel an operator requested in ``cancel_requested`` (K2)."""
        if not runs:
            return HeartbeatBatch()
        params = {
            "ids": [run.run_id for run in runs],
            "tokens": [run.token for run in runs],
            "leases": [run.lease for run in runs],
            "now": self._now(),
        }
        rows = await self._connections.rows(
            "heartbeat", self.statements[HEARTBEAT_IF_TOKEN_CURRENT], params, scope=OWN
        )
        # By position (HEARTBEAT_COLUMNS): (run id, token, cancel requested).
        beaten = {(run_id, token) for run_id, token, _ in rows}
        return HeartbeatBatch(
            ((run.run_id, run.token) in beaten for run in runs),
            (run_id for run_id, _, cancel_requested in rows if cancel_requested),
        )

    async def _settle_if_tokens_current(
        self, settlements: Sequence[SettleRequest]
    ) -> list[SettleOutcome]:
        """Every settlement of the batch in ONE statement (SETTLE_IF_TOKEN_CURRENT). A (run,
        token) named twice is sent once: its repeats are stale, as one-by-one settles would
        answer."""
        sent: list[int] = []
        seen: set[tuple[str, int]] = set()
        for index, settlement in enumerate(settlements):
            claim = (settlement.run.run_id, settlement.run.token)
            if claim not in seen:
                seen.add(claim)
                sent.append(index)
        if any(isinstance(settlements[i], Suspend) for i in sent):
            return await self._settle_with_suspends(settlements, sent)
        return await self._settle_batch(settlements, sent)

    async def _settle_batch(
        self, settlements: Sequence[SettleRequest], sent: Sequence[int]
    ) -> list[SettleOutcome]:
        """SETTLE_IF_TOKEN_CURRENT for the settlements at ``sent`` (no suspends, no repeats);
        the others answer stale. J23: when the database refuses a value of the batch, the batch
        is settled in halves until the refused settlement is alone, and that one is replaced by
        :func:`~ship_sqla.kernel._settlement.refused`; every other lands as if nothing happened
        (a refusal costs a few more round trips, only when one happens)."""
        try:
            return await self._settle_statement(settlements, sent)
        except Exception as exc:
            if not refused_value(exc):
                raise
            if len(sent) == 1:
                outcomes: list[SettleOutcome] = ["stale"] * len(settlements)
                outcomes[sent[0]] = await self._refuse(settlements[sent[0]], exc)
                return outcomes
        half = len(sent) // 2
        first = await self._settle_batch(settlements, sent[:half])
        second = await self._settle_batch(settlements, sent[half:])
        return [second[i] if first[i] == "stale" else first[i] for i in range(len(settlements))]

    async def _refuse(self, settlement: SettleRequest, error: BaseException) -> SettleOutcome:
        """J23: the database refused ``settlement``: settle the dead letter that replaces it
        (the refusal typed in the run's history) and report it; the answer is "refused" (or
        "cancelled", or "stale" when the claim was lost meanwhile)."""
        # The refusal's text quotes what was refused, which a constraint on the error text may
        # refuse again: then the bare refusal, naming only the cause's type.
        for quoting in (True, False):
            refusal = settle_refusal(settlement, error, quoting=quoting)
            try:
                [outcome] = await self._settle_statement([refused(settlement, refusal)], [0])
            except Exception as again:
                if not refused_value(again):
                    raise
                continue
            self.report_error(refusal)
            return outcome
        # Nothing of this run can be stored (a constraint on its state): it stays claimed until
        # its lease lapses; the batch's other runs are not held up for it.
        self.report_error(settle_refusal(settlement, error, quoting=False, stored=False))
        return "refused"

    # --- the fenced transaction of a transactional handler (J13, J14) -------------------------

    def _require_joined(self, what: str) -> None:
        self._connections.require_joined(
            what,
            fix="declare the job with transaction=create_unit_of_work(<the backend's"
            " engine>, ...): the runtime runs it inside that unit of work.",
        )

    async def _fence(self, run: ClaimedRun) -> FenceAnswer:
        self._require_joined("a run's fence")
        params = {
            "id": run.run_id,
            "token": run.token,
            "idle_ms": str(max(1, round(run.lease * 1000))),
        }
        rows = await self._connections.rows(
            "fence", self.statements[FENCE_RUN_FOR_UPDATE], params, scope=None
        )
        if not rows:
            return "stale"
        current, cancel_requested, _ = rows[0]
        if not current:
            return "stale"
        return "cancel-requested" if cancel_requested else "held"

    async def _settle_joined(self, settlement: Settlement) -> SettleOutcome:
        self._require_joined("a settle within the handler's transaction")
        [outcome] = await self._settle_statement([settlement], [0], scope=None)
        return outcome

    async def _record_progress(self, run: ClaimedRun, progress_json: str) -> bool:
        self._require_joined("a run's progress")
        params = {"id": run.run_id, "token": run.token, "progress": progress_json}
        rows = await self._connections.rows(
            "record progress",
            self.statements[RECORD_PROGRESS_IF_TOKEN_CURRENT],
            params,
            scope=None,
        )
        return bool(rows)

    async def claim_state(self, run: ClaimedRun) -> str | None:
        rows = await self._connections.rows(
            "claim state",
            self.statements[live_sql.CLAIM_STATE_EITHER if self.history else CLAIM_STATE_IF_TOKEN],
            {"id": run.run_id, "token": run.token, "attempt": run.attempt},
            scope=OWN,
        )
        return None if not rows else str(rows[0][0])

    async def _settle_statement(
        self,
        settlements: Sequence[SettleRequest],
        sent: Sequence[int],
        *,
        scope: Within = OWN,
    ) -> list[SettleOutcome]:
        """One SETTLE_IF_TOKEN_CURRENT (see :meth:`_settle_batch`); ``scope=None``: joined to
        the active unit of work (J13), its children's parents woken after that commit."""
        batch = [_settlement_at(settlements, i) for i in sent]
        completions_only = all(
            settlement.state == "completed" and settlement.entry is None for settlement in batch
        )
        params = {
            "ids": [settlement.run.run_id for settlement in batch],
            "tokens": [settlement.run.token for settlement in batch],
            "now": self._now(),
        }
        # A batch of plain completions (no history entry, so no duplicate) sends no other field
        # (the statement reads the missing elements as NULL, a NULL state as a completion): six
        # arrays less to encode.
        params.update(_SETTLE_FIELDS_NONE if completions_only else _settle_fields(batch))
        statement = self.statements[SETTLE_IF_TOKEN_CURRENT]
        if self.history:
            if not self._steps_probed:  # J16: once, when no worker's start asked (a caller's)
                await self._settle_without_steps()
            moving = self._settle_moving
            statement = self.statements[live_sql.SETTLE_MOVING] if moving is None else moving
            params.update(self._history_fields(batch))
        rows = await self._connections.rows("settle", statement, params, scope=scope)
        # By position, as a claim's (SETTLE_COLUMNS): (ordinal, new state, parent id).
        landed: dict[int, str] = {ordinal: state for ordinal, state, _ in rows}
        ended_children = [
            parent_id
            for _, state, parent_id in rows
            if parent_id is not None and state != "waiting"
        ]
        if ended_children:
            if scope is OWN:
                await self._wake_parents(ended_children)
            else:
                await self._connections.after_commit(
                    scope, partial(self._wake_parents, ended_children)
                )
        outcomes: list[SettleOutcome] = ["stale"] * len(settlements)
        for position, (index, settlement) in enumerate(zip(sent, batch, strict=True), start=1):
            state = landed.get(position)
            if state is not None:
                outcomes[index] = settlement.landed(state)
        return outcomes

    def _history_fields(self, batch: Sequence[Settlement]) -> dict[str, list[Any]]:
        """SETTLE_MOVING's arrays beside the settle's (J16, J18): each attempt's start (its
        claim's time) and, unless every job keeps the default, each run's keep code."""
        keeps = [self._keeps.get(s.run.job_id, KEEP_ROW) for s in batch]
        return {
            "starts": [s.run.lease_expires_at - timedelta(seconds=s.run.lease) for s in batch],
            "keeps": [] if all(keep == KEEP_ROW for keep in keeps) else keeps,
        }

    async def _settle_with_suspends(
        self, settlements: Sequence[SettleRequest], sent: Sequence[int]
    ) -> list[SettleOutcome]:
        """A batch holding workflow suspends (D3): each suspend in its own short transaction
        (an event wait takes its wait lock), the other settlements in one statement as ever."""
        outcomes: list[SettleOutcome] = ["stale"] * len(settlements)
        others = [i for i in sent if not isinstance(settlements[i], Suspend)]
        if others:
            answered = await self._settle_batch(settlements, others)
            for index in others:
                outcomes[index] = answered[index]
        workflows = self._require_workflows()
        suspends = [i for i in sent if isinstance(settlements[i], Suspend)]
        # Each suspend is its own short transaction: on an engine several run at once (each on
        # its own pooled connection), so a batch of many does not take one round trip each.
        room = asyncio.Semaphore(_SUSPENDS_AT_ONCE if self._connections.concurrent else 1)

        async def suspend(index: int) -> None:
            settlement = settlements[index]
            assert isinstance(settlement, Suspend)  # noqa: S101 - chosen above
            async with room:
                try:
                    outcome = await workflows.suspend(settlement)
                except Exception as exc:
                    if not refused_value(exc):
                        raise
                    outcome = await self._refuse(settlement, exc)  # J23: this run alone
                if outcome is None:
                    outcome = await self._defer_wait(settlement)
            outcomes[index] = outcome

        await asyncio.gather(*(suspend(index) for index in suspends))
        return outcomes

    async def _defer_wait(self, settlement: Suspend) -> SettleOutcome:
        """An event wait whose lock was held (a publish of its event in flight): the run goes
        back to waiting for a moment, its attempt unspent and no history written (a release
        without an error), and its replay begins the wait again."""
        retry_at = self._clock.now() + timedelta(seconds=WAIT_LOCK_BUSY_RETRY)
        deferred = released(settlement.run, retry_at, reason="lock-held")
        [outcome] = await self._settle_batch([deferred], [0])
        return "suspended" if outcome == "released" else outcome

    def _child_ended(self, parent_id: str) -> None:
        """D5: an operator ended a child run (cancel, discard): wake its parent, in a task of
        its own (after the operator's commit)."""
        task = asyncio.get_running_loop().create_task(self._wake_parents([parent_id]))
        self._room_tasks.add(task)
        task.add_done_callback(self._room_tasks.discard)

    async def _wake_parents(self, parent_ids: Sequence[str]) -> None:
        """D5: wake the parents of children whose ends just committed. Never raises (the settle
        landed): a failure is reported, and the parents' recheck finds their children ended."""
        if self._workflows is None:
            return
        try:
            await self._workflows.wake_parents(parent_ids)
        except Exception as exc:  # noqa: BLE001 - J11: reported; CHILDREN_RECHECK is the fallback
            self.report_error(exc)

    def _require_workflows(self) -> PostgresWorkflows:
        if self._workflows is None:  # pragma: no cover - the runtime binds no store then
            raise WorkflowsNotConfiguredError(
                "this job backend has no workflow tables.",
                fix="pass steps_table= and events_table= to create_job_backend.",
            )
        return self._workflows

    # --- schedules (J9) and the queue gauges (J10) --------------------------------------------

    async def install_schedules(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """Upsert one state row per scheduled job; an unchanged trigger keeps its next_at."""
        await self._schedules.install(definitions)

    async def tick_schedules(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire each due occurrence once (SKIP LOCKED; catch-up is ONE run); the runs created."""
        return await self._schedules.tick(definitions)

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """J10's queue gauges (:meth:`PostgresRunAdmin.queue_depths`)."""
        return await self._admin.queue_depths(job_ids)

    async def parked_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """D10's gauge (the run administration's ``parked_counts``)."""
        return await self._admin.parked_counts(job_ids)

    async def version_counts(
        self, job_ids: Sequence[str] | None = None, *, limit: int = MAX_VERSION_ROWS
    ) -> list[VersionCount]:
        """D9's counts (:meth:`PostgresRunAdmin.version_counts`)."""
        return await self._admin.version_counts(job_ids, limit=limit)

    async def storage_health(self) -> StorageHealth:
        """J22: the ship tables' statistics and the oldest held snapshot
        (:class:`~ship_sqla.kernel._health.StorageHealthSource`), judged by the backend's
        ``health_bounds``."""
        return await self._health.storage_health()


class _BackendTables(TypedDict):
    """``create_job_backend``'s tables, as ``PostgresJobBackend`` takes them."""

    table: Table
    state_table: Table
    steps_table: Table
    events_table: Table
    history_table: Table
    live_only: bool


def _default_tables(
    table: Table | None,
    state_table: Table | None,
    steps_table: Table | None,
    events_table: Table | None,
    history_table: Table | None,
) -> _BackendTables:
    """``create_job_backend``'s tables: those given, else the factories' under their default
    names (the steps and events tables beside ``table``). J16's move is on (``live_only``) when
    the history table was given or declared beside ``table``, and when no runs table was given:
    then the tables are those ``ship-sqla schema apply`` creates, the history included (the
    tutorial's ``create_job_backend(database=engine)``)."""
    if history_table is None and table is not None:
        history_table = declared_history(table)  # J16: declared beside the runs table
    live_only = history_table is not None or table is None
    if table is None:
        table = ship_job_runs_table(MetaData())
    if state_table is None:
        state_table = ship_job_state_table(MetaData())
    if steps_table is None:
        steps_table = ship_job_steps_table(
            MetaData(), schema=table.schema, runs_table=table.name, runs_fkey=not live_only
        )
    if events_table is None:
        events_table = ship_job_events_table(MetaData(), schema=table.schema)
    if history_table is None:
        history_table = ship_job_history_table(MetaData(), schema=table.schema)
    return _BackendTables(
        table=table,
        state_table=state_table,
        steps_table=steps_table,
        events_table=events_table,
        history_table=history_table,
        live_only=live_only,
    )


def _require_database(database: object) -> None:
    if not isinstance(database, AsyncEngine | AsyncConnection):
        raise ConfigurationError(
            f"create_job_backend needs an AsyncEngine or AsyncConnection, got"
            f" {type(database).__name__}.",
            fix="pass create_async_engine('postgresql+asyncpg://...').",
        )


def _default_locks(database: Database, clock: Clock | None) -> AdvisoryLockProvider | None:
    """J4: a runtime given no lock provider locks single-runner keys with advisory locks on the
    backend's engine (a connection, the test path, has none to lend)."""
    if isinstance(database, AsyncEngine):
        return advisory_lock_provider(database, clock=clock)
    return None


def _nothing_missed() -> None:
    """A gap in listening to the cancel channel: nothing to look for, the holders' heartbeats
    answer every request within a third of a lease (K2's fallback)."""


_SETTLE_FIELDS_NONE: Final[dict[str, list[Any]]] = {
    "states": [],
    "ats": [],
    "refunds": [],
    "snoozes_added": [],
    "errors": [],
    "entry_kinds": [],
    "keeps_lapses": [],
    "wait_fors": [],
}


def _lapsed_left(rows: Sequence[Sequence[Any]]) -> tuple[list[Sequence[Any]], bool]:
    """J19 for J6: a claim statement's rows without its kind 5 row, and whether its lapsed probe
    was complete (no such row)."""
    kept = [row for row in rows if row[14] != _LAPSED_LEFT]
    return kept, len(kept) == len(rows)


def _positions(rows: Sequence[Sequence[Any]]) -> list[tuple[int, datetime, int]]:
    """J19: (priority, run_at, seq) of each waiting run a claim statement's rows claimed (kind
    0, not a retaken lapsed lease), by position (CLAIM_COLUMNS)."""
    return [(row[10], row[8], row[9]) for row in rows if row[14] == 0 and not row[20]]


def _claimed(row: Sequence[Any], job_id: str, lease: float) -> ClaimedRun:
    """A claimed run from a claim statement's row (by position: CLAIM_COLUMNS)."""
    (
        run_id,
        payload,
        attempt,
        max_attempts,
        token,
        key,
        lease_expires_at,
        created_at,
        _run_at,
        _seq,
        priority,
        trace_context,
        snoozes,
        tenant,
        _kind,
        _rate_wait,
        _created,
        _parent_id,
        lapses,
        consecutive_lapses,
        retaken,
        handler_version,
    ) = row
    return ClaimedRun(
        run_id,
        job_id,
        payload,
        attempt,
        max_attempts,
        token,
        key,
        lease_expires_at,
        created_at,
        lease,
        priority=priority,
        trace_context=trace_context,
        snoozes=snoozes,
        tenant=tenant,
        lapses=lapses,
        consecutive_lapses=consecutive_lapses,
        retaken=retaken,
        handler_version=handler_version,
        run_at=_run_at,
    )


MOVE_BATCH: Final = 1000
"""How many finished rows one MOVE_FINISHED moves at most."""


def _check_live_only(live_only: bool, history: Table | None, steps: Table | None) -> None:
    """J16: live_only needs a history table; runs move out of the runs table, so a steps table
    whose foreign key cascades a run's deletion to its steps would lose a finished workflow's
    steps at its end."""
    if live_only and history is None:
        raise ConfigurationError(
            "live_only=True needs a history table (J16: ended runs move there).",
            fix="pass history_table=ship_job_history_table(metadata).",
        )
    if not live_only or steps is None:
        return
    if any(fk.ondelete for fk in steps.foreign_keys if fk.column.table.name != steps.name):
        raise ConfigurationError(
            f"the steps table {steps.name!r} has a foreign key to the runs table: with a"
            " history table, a run that ends leaves the runs table and would take its steps.",
            fix="declare it ship_job_steps_table(metadata, ..., runs_fkey=False) (and drop the"
            " constraint from the database: ALTER TABLE ... DROP CONSTRAINT <steps>_run_fkey).",
        )


def _buried(row: Sequence[Any], job_id: str, max_lapses: int | None) -> BuriedRun:
    """A run a claim dead-lettered (J6), from its row (by position: CLAIM_COLUMNS); J15: the
    claim's own rule read back: a crash loop when this lapse was the ``max_lapses``-th."""
    consecutive_lapses = row[19]
    crash_loop = max_lapses is not None and consecutive_lapses >= max_lapses
    return BuriedRun(row[0], job_id, row[2], row[5], crash_loop=crash_loop)


def _settle_fields(batch: Sequence[Settlement]) -> dict[str, list[Any]]:
    """SETTLE_IF_TOKEN_CURRENT's arrays of a batch's settlements, as the kernel built them."""
    return {
        "states": [settlement.state for settlement in batch],
        "ats": [settlement.run_at for settlement in batch],
        "refunds": [not settlement.spends_attempt for settlement in batch],
        "snoozes_added": [settlement.snoozes_added for settlement in batch],
        "errors": [None if s.entry is None else s.entry.error for s in batch],
        "entry_kinds": [None if s.entry is None else s.entry.kind for s in batch],
        "keeps_lapses": [settlement.keeps_lapses for settlement in batch],
        "wait_fors": [settlement.wait_for for settlement in batch],
    }


def _settlement_at(settlements: Sequence[SettleRequest], index: int) -> Settlement:
    settlement = settlements[index]
    assert isinstance(settlement, Settlement)  # noqa: S101 - suspends are settled apart
    return settlement


def create_job_backend(
    *,
    database: Database,
    table: Table | None = None,
    state_table: Table | None = None,
    queue_depth_limit: int | None = None,
    on_error: ErrorHandler | None = None,
    clock: Clock | None = None,
    operation_timeout: float = 30.0,
    listen: Listen = True,
    announce: bool = True,
    workers_table: Table | None = None,
    steps_table: Table | None = None,
    events_table: Table | None = None,
    synchronous_claims: bool = False,
    health_bounds: HealthBounds | None = None,
    history_table: Table | None = None,
) -> PostgresJobBackend:
    """The PostgreSQL job backend (seed: ``createDrizzleJobBackend``).

    ``database``: the application's ``AsyncEngine`` (or an ``AsyncConnection`` in a transaction,
    for tests). ``table`` / ``state_table``: from :func:`ship_job_runs_table` /
    :func:`ship_job_state_table` on the application's metadata (defaults: those tables under
    their default names). ``queue_depth_limit`` (J2, None: unlimited), ``on_error`` (receives
    what the loop absorbs, J11), ``clock`` (one clock for the process; a ``FrozenClock`` in
    tests), ``operation_timeout`` (seconds any one backend operation may take before
    :class:`JobBackendTimeoutError`; finite, positive, at most an hour, else
    ``ConfigurationError``). How a worker runs on it (``poll_interval``, ``max_in_flight``,
    ``meter_provider``, ``lock_provider``) is given to
    :func:`~ship_sqla.kernel.start_job_runtime` (J3); the backend's ``default_lock_provider``
    (J4), what a runtime locks single-runner keys with when given none, is
    :func:`advisory_lock_provider` on ``database`` when it is an engine, else None.

    ``listen`` (K1, push wake): True (default) gives a worker runtime on this backend one
    dedicated LISTEN connection, made from the engine's URL, so an enqueue committed in ANY
    process starts its run within milliseconds instead of at the next poll; False (behind a
    transaction-mode pooler such as PgBouncer, which accepts LISTEN and delivers nothing) keeps
    polling only; a ``postgresql://`` URL listens through that server instead (e.g. directly,
    past the pooler). Enqueues announce their due runs whatever ``listen`` says (other
    processes may listen): each within a few milliseconds of its commit, in its own transaction
    or after it, with the table's notifying commits kept under a fleet-wide budget
    (:mod:`ship_sqla.kernel._plans.announce`; docs/production.md, "Push wake").
    ``announce=False`` announces nothing: for producers no runtime listens to (every worker
    behind a transaction-mode pooler polls anyway).

    ``workers_table`` (F6): the worker registry's table, from :func:`ship_job_workers_table`
    (default: that table under its default name). Optional in the database: a worker runtime
    probes it once at start and, when it is absent, logs so and runs unregistered, sampling its
    own queue gauges (one sampler per fleet needs the registry, F5).

    ``steps_table`` / ``events_table`` (SPEC §13, durable workflows): from
    :func:`ship_job_steps_table` / :func:`ship_job_events_table` (defaults: those tables under
    their default names, beside ``table``). Needed in the database only by jobs whose handlers
    call the workflow methods (``ctx.step``, ``ctx.sleep``, ...).

    ``synchronous_claims`` (J24): False (default) commits claims with ``synchronous_commit=off``
    (a claim acknowledged just before a crash or failover may be lost, its run run again, J6);
    True: the server's own, as enqueues and settles (docs/production.md, "Failover").
    ``health_bounds`` (J22): when :meth:`PostgresJobBackend.storage_health` is an alarm
    (default :class:`~ship_sqla.jobs.HealthBounds`: a snapshot held 5 minutes, ...).
    ``history_table`` (J16, J17): from :func:`ship_job_history_table`, kept by maintenance
    (``ship-sqla jobs maintain``, F5's holder). The runs table holds live runs only (J16,
    docs/jobs.md "The tables") when it is given, or declared in ``table``'s metadata, or no
    ``table`` is given (the tables ``ship-sqla schema apply`` creates); a worker's start checks
    that shape. A ``table`` whose metadata declares no history keeps runs in place (warned).
    """
    tables = _default_tables(table, state_table, steps_table, events_table, history_table)
    return PostgresJobBackend(
        database=database,
        **tables,
        queue_depth_limit=queue_depth_limit,
        on_error=on_error,
        clock=clock,
        operation_timeout=operation_timeout,
        listen=listen,
        announce=announce,
        workers_table=workers_table,
        synchronous_claims=synchronous_claims,
        health_bounds=health_bounds,
    )


_CLAIMS: Final = {
    # (gated, fair, aged, keyed) -> the claim statement (F1/F3 gate, F2, F10, J4).
    (gated, fair, aged, keyed): template
    for gated, fair, aged, keyed, template in (
        (False, False, False, False, CLAIM_UNCAPPED),
        (False, False, False, True, CLAIM_UNCAPPED_KEYED),
        (False, False, True, False, CLAIM_AGED),
        (False, False, True, True, CLAIM_AGED_KEYED),
        (False, True, False, False, CLAIM_FAIR),
        (False, True, False, True, CLAIM_FAIR_KEYED),
        (True, False, False, False, CLAIM_GATED),
        (True, False, False, True, CLAIM_GATED_KEYED),
        (True, False, True, False, CLAIM_AGED_GATED),
        (True, False, True, True, CLAIM_AGED_GATED_KEYED),
        (True, True, False, False, CLAIM_FAIR_GATED),
        (True, True, False, True, CLAIM_FAIR_GATED_KEYED),
    )
}


def _claim_template(request: ClaimRequest) -> Template:
    """The claim statement for ``request``: gated with a cap or a rate limit, fair with
    ``fairness`` (F2: a fair claim ignores priorities, aged or not), aged with ``aging`` (F10),
    keyed when it excludes single-runner keys (J4)."""
    gated = request.max_running is not None or request.rate_limit is not None
    fair = request.fairness is not None
    aged = request.aging is not None and not fair
    return _CLAIMS[gated, fair, aged, bool(request.exclude_keys)]


def _aging_params(params: dict[str, Any], request: ClaimRequest) -> None:
    """F10: the aged claim's parameters (the kernel's ``Aging``, ``every`` in microseconds)."""
    aging = request.aging
    if aging is not None and request.fairness is None:
        params["aging_step"] = aging.step
        params["aging_every_us"] = aging.every_us
        params["aging_ceiling"] = aging.ceiling
