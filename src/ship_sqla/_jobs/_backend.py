"""The PostgreSQL ``JobBackend`` (ADR-0015): durable runs, claims that scale, fenced settles.

J1 ``enqueue`` deduplicates by ``dedupe_key`` (given, or from the job's idempotency policy)
   while a run of that job holding the key is not terminal, and a ``run_id`` that exists already
   (any state) is that run: the caller gets the existing run, ``deduplicated=True``.
J2 ``enqueue`` answers ``rejected="queue-full"`` once the job holds ``queue_depth_limit``
   waiting runs. The check reads at most that many index entries (never the backlog) and buffers
   nothing. It is a hard cap under any concurrency (engines, processes, ``enqueue_many``, units
   of work that enqueue and commit together): an enqueue of a capped job first takes the job's
   gate row (``ENQUEUE_GATE``), whose row lock lasts until its transaction commits, and only
   then counts, in a later statement whose snapshot sees every earlier holder's runs. Enqueuers
   of one capped job therefore take turns from their enqueue to their commit; a REPEATABLE READ
   or SERIALIZABLE unit of work whose snapshot predates another holder's commit fails at the
   gate with 40001 and is re-run (U3). The backend's own enqueue transactions are READ
   COMMITTED whatever the engine's default. Without a limit nothing of this runs: a plain
   enqueue stays one INSERT.
   Why a written row, not an advisory lock: a lock is enough under READ COMMITTED (the count's
   statement snapshot follows it) but a REPEATABLE READ snapshot taken before the lock would
   count without another holder's committed runs; an UPDATE of a row that holder wrote is what
   makes PostgreSQL refuse that snapshot (40001). The row is ``<job_id>#enqueue-gate`` in the
   state table, apart from the job's schedule row, so ticks never wait for an open unit of
   work. The cap bounds what enqueue admits: a retry, a release or an operator retry returns an
   admitted run to waiting without the gate.
J3 A claim is one short transaction: a per-job advisory lock, then ONE statement that counts the
   job's unexpired leases, takes due runs with ``FOR UPDATE SKIP LOCKED`` and leases at most
   ``concurrency.max`` minus that count, whichever process claims. A committed local enqueue
   wakes the local loop (after commit, never after a rollback).
J5 Each claim draws a new fencing token; complete / fail / release / heartbeat act only while it
   is current, else change nothing and answer "stale" (the runtime reports
   ``SHIP_SQLA_JOB_LEASE_STALE``). A lease that lapsed but that no claim retook is still current
   for complete / fail / release; a heartbeat refuses it (a lapsed lease is never revived).
J6 A lapsed lease is retaken by the next claim of its job, as a new attempt, the lapsed one
   recorded in the history; one that lapsed on its final attempt is dead-lettered with
   ``LEASE_LAPSED_FINAL_ATTEMPT`` instead and returned in the claim's ``buried``.
J7 ``release`` returns a run to waiting without consuming its attempt; ``fail`` appends to the
   history and retries at ``retry_at`` or dead-letters.

Speed: claims and completes are batched (one statement for many runs), statement texts are
stable (compiled once by SQLAlchemy, prepared once per connection by asyncpg), and the backend's
own statements run on autocommit connections, so a settle costs one round trip. A claim runs its
generic plan without waiting for its commit's WAL flush (``CLAIM_LOCK_TUNED``). Enqueues that
cannot conflict (generated ids, no dedupe key, no depth limit) take a plain INSERT from
``unnest``; with a depth limit, the gate then the same INSERT bounded by the count
(``ENQUEUE_PLAIN_CAPPED``); the rest take the checked statement. Every request is validated and
encoded by the kernel's :func:`prepare_runs` (the in-memory backend's check too) before any SQL.

Errors: the backend raises; the runtime's loop catches, reports through :meth:`report_error`
(J11) and retries. Every operation on the backend's own connections is bounded by
``operation_timeout`` so a database that stops answering surfaces as
:class:`JobBackendTimeoutError` instead of a hang.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import attrs
from sqlalchemy import MetaData, Table, TextClause
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._jobs import _operations_sql as _ops
from ship_sqla._jobs import _sql
from ship_sqla._jobs._schedules import Schedules
from ship_sqla._jobs._tables import ship_job_runs_table, ship_job_state_table
from ship_sqla._locks import advisory_lock_key, advisory_lock_provider
from ship_sqla._scope import Database, TransactionScope, current_scope, joined
from ship_sqla._sql_errors import database_outage_translated, sqlstate_of
from ship_sqla.kernel import BoundExceededError, Clock, ConfigurationError, ShipError
from ship_sqla.kernel._backend_options import BackendOptions
from ship_sqla.kernel._clock import require_aware
from ship_sqla.kernel._durations import MAX_OPERATION_TIMEOUT, require_duration
from ship_sqla.kernel._ids import new_run_ids
from ship_sqla.kernel._plans.prepare import PreparedRun, prepare_runs
from ship_sqla.kernel._ports import (
    LEASE_LAPSED_FINAL_MESSAGE,
    LEASE_LAPSED_MESSAGE,
    BuriedRun,
    ClaimBatch,
    ClaimedRun,
    EnqueueRequest,
    EnqueueResult,
    LockProvider,
    QueueDepth,
    RunRecord,
    SettleOutcome,
)
from ship_sqla.kernel._waiting import LocalWake

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Sequence
    from datetime import datetime

    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._on_error import ErrorHandler

__all__ = ["JobBackendTimeoutError", "PostgresJobBackend", "create_job_backend"]

logger = logging.getLogger("ship_sqla.jobs")


MAX_ENQUEUE_BATCH: Final = 10_000
"""Requests per ``enqueue_many``: one statement's arrays, bounded (R1)."""
CLAIM_LOCK_NAMESPACE: Final = "ship_sqla.job_claim"
"""The advisory-lock namespace of the per-job claim lock (see :func:`advisory_lock_key`)."""
_ENQUEUE_PASSES: Final = 3
ENQUEUE_GATE_SUFFIX: Final = "#enqueue-gate"
"""A capped job's gate row in the state table is ``<job_id>#enqueue-gate`` (J2, ENQUEUE_GATE)."""

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
    }
)


class JobBackendTimeoutError(ShipError, TimeoutError):
    """A backend operation did not finish within ``operation_timeout``; nothing is known about
    whether it took effect (a settle is fenced, so retrying it is safe)."""

    code = "SHIP_SQLA_JOB_BACKEND_TIMEOUT"


@attrs.frozen
class _Statements:
    enqueue_many: TextClause
    enqueue_plain: TextClause
    enqueue_gate: TextClause
    enqueue_plain_capped: TextClause
    claim_lock: TextClause
    claim_lock_tuned: TextClause
    claim: TextClause
    complete: TextClause
    heartbeat: TextClause
    fail: TextClause
    release: TextClause
    get_run: TextClause
    queue_depths: TextClause
    list_dead: TextClause
    retry: TextClause
    discard: TextClause
    delete_finished: TextClause

    @classmethod
    def for_table(cls, runs: str, state: str) -> _Statements:
        def r(template: str) -> TextClause:
            return _sql.render(template, runs=runs)

        return cls(
            enqueue_many=r(_sql.ENQUEUE_MANY),
            enqueue_plain=r(_sql.ENQUEUE_PLAIN),
            enqueue_gate=_sql.render_gate(_sql.ENQUEUE_GATE, state=state),
            enqueue_plain_capped=r(_sql.ENQUEUE_PLAIN_CAPPED),
            claim_lock=r(_sql.CLAIM_LOCK),
            claim_lock_tuned=r(_sql.CLAIM_LOCK_TUNED),
            claim=r(_sql.CLAIM_DUE_AND_LAPSED_SKIP_LOCKED),
            complete=r(_sql.COMPLETE_IF_TOKEN_CURRENT),
            heartbeat=r(_sql.HEARTBEAT_IF_TOKEN_CURRENT),
            fail=r(_sql.FAIL_IF_TOKEN_CURRENT),
            release=r(_sql.RELEASE_IF_TOKEN_CURRENT),
            get_run=r(_ops.OPS_GET_RUN),
            queue_depths=r(_sql.QUEUE_DEPTHS),
            list_dead=r(_ops.OPS_LIST_DEAD_OF_JOB),
            retry=r(_ops.OPS_RETRY_DEAD),
            discard=r(_ops.OPS_DISCARD_WAITING_OR_DEAD),
            delete_finished=r(_ops.OPS_DELETE_FINISHED_BATCH),
        )


_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def _quoted(table: Table) -> str:
    """The table's quoted, schema-qualified name: configuration, never user input."""
    return str(_PREPARER.format_table(table))


def _check_runs_table(table: Table) -> None:
    missing = _RUN_COLUMNS - set(table.c.keys())
    if missing:
        raise ConfigurationError(
            f"table {table.name!r} is not a job runs table: it lacks {sorted(missing)}.",
            fix="pass table=ship_job_runs_table(metadata, ...).",
        )


def _segments(rows: list[dict[str, Any]]) -> list[list[int]]:
    """Consecutive runs of requests that repeat no run id and no dedupe key among themselves.

    One statement decides its requests against the stored runs only, so a request that repeats
    an earlier one of the same batch goes in the next statement, which sees the earlier insert:
    a batch then behaves exactly like its requests enqueued one by one. A batch without such
    repeats (the usual case) is one statement.
    """
    segments: list[list[int]] = []
    current: list[int] = []
    ids: set[str] = set()
    dedupe_keys: set[str] = set()
    for index, row in enumerate(rows):
        key = row["dedupe_key"]
        if row["id"] in ids or (key is not None and key in dedupe_keys):
            segments.append(current)
            current, ids, dedupe_keys = [], set(), set()
        current.append(index)
        ids.add(row["id"])
        if key is not None:
            dedupe_keys.add(key)
    segments.append(current)
    return segments


class PostgresJobBackend(BackendOptions):
    """The durable ``JobBackend`` on PostgreSQL. Build it with :func:`create_job_backend`.

    Safe for any number of runtimes and processes on one database. With an ``AsyncEngine`` its
    own statements use pooled autocommit connections; with an ``AsyncConnection`` (the test
    path) they run one at a time in SAVEPOINTs of that connection's transaction.
    """

    def __init__(
        self,
        *,
        database: Database,
        table: Table,
        state_table: Table,
        lock_provider: LockProvider | None,
        poll_interval: float,
        queue_depth_limit: int | None,
        max_in_flight: int,
        meter_provider: Any,  # noqa: ANN401 - an OpenTelemetry MeterProvider
        on_error: ErrorHandler | None,
        clock: Clock | None,
        operation_timeout: float,
    ) -> None:
        if not isinstance(database, AsyncEngine | AsyncConnection):
            raise ConfigurationError(
                f"create_job_backend needs an AsyncEngine or AsyncConnection, got"
                f" {type(database).__name__}.",
                fix="pass create_async_engine('postgresql+asyncpg://...').",
            )
        self._set_options(
            clock=clock,
            lock_provider=lock_provider,
            poll_interval=poll_interval,
            queue_depth_limit=queue_depth_limit,
            max_in_flight=max_in_flight,
            on_error=on_error,
            meter_provider=meter_provider,
        )
        timeout = require_duration(
            operation_timeout, "operation_timeout", maximum=MAX_OPERATION_TIMEOUT
        )
        _check_runs_table(table)
        self._database = database
        self._table = table
        self._state_table = state_table
        self._operation_timeout = timeout
        self._runs_name = _quoted(table)
        self._s = _Statements.for_table(self._runs_name, _quoted(state_table))
        self._autocommit: AsyncEngine | None = None
        self._read_committed: AsyncEngine | None = None
        if isinstance(database, AsyncEngine):
            self._autocommit = database.execution_options(isolation_level="AUTOCOMMIT")
            # The claim's snapshot must be taken after its lock is granted: READ COMMITTED takes
            # one per statement, whatever isolation the application's engine defaults to.
            self._read_committed = database.execution_options(isolation_level="READ COMMITTED")
        # One AsyncConnection cannot serve concurrent tasks: the test path takes turns.
        self._turn = asyncio.Lock()
        self._wakeup = LocalWake()
        self._leases: dict[str, float] = {}
        self._claim_keys: dict[str, int] = {}
        self._schedule_half: Schedules | None = None

    # --- JobBackend properties ------------------------------------------------------------------

    @property
    def table(self) -> Table:
        return self._table

    @property
    def state_table(self) -> Table:
        return self._state_table

    @property
    def database(self) -> Database:
        return self._database

    # --- connections ----------------------------------------------------------------------------

    def _now(self) -> datetime | None:
        """``:now`` for ``coalesce(:now, now())``: the clock's time only when it is frozen."""
        return self._clock.now() if self._clock.frozen else None

    @asynccontextmanager
    async def _deadline(self, what: str) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self._operation_timeout):
                # Inside the timeout: its own TimeoutError must stay JobBackendTimeoutError.
                with database_outage_translated(f"job backend {what}", driver_only=True):
                    yield
        except TimeoutError as exc:
            raise JobBackendTimeoutError(
                f"{what} did not finish within {self._operation_timeout} s (database"
                " unreachable, overloaded, or a lock held for long).",
                fix="check the database; the runtime retries on its next poll. Raise"
                " operation_timeout if such waits are expected.",
            ) from exc

    @asynccontextmanager
    async def _autocommitted(self) -> AsyncIterator[AsyncConnection]:
        """A connection on which each statement commits by itself."""
        if self._autocommit is not None:
            async with self._autocommit.connect() as connection:
                yield connection
            return
        assert isinstance(self._database, AsyncConnection)  # noqa: S101 - by construction
        async with self._turn, self._database.begin_nested():
            yield self._database

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        """A short READ COMMITTED transaction of the backend's own (a SAVEPOINT of the test
        path's transaction, whose isolation the test chose)."""
        if self._read_committed is not None:
            async with self._read_committed.begin() as connection:
                yield connection
            return
        assert isinstance(self._database, AsyncConnection)  # noqa: S101 - by construction
        async with self._turn, self._database.begin_nested():
            yield self._database

    @asynccontextmanager
    async def _joined(
        self, scope: TransactionScope | None, *, one_statement: bool = False
    ) -> AsyncIterator[Any]:
        """The given or ambient unit of work, else a short transaction of the backend's own
        (``one_statement``: on an engine, one autocommitted statement)."""
        if scope is None:
            scope = current_scope()
        if scope is None and isinstance(self._database, AsyncConnection):
            async with self._turn, joined(self._database, None) as tx:
                yield tx
            return
        alone = self._autocommit if one_statement else None
        # An own transaction is READ COMMITTED whatever the engine's default: the J2 gate then
        # waits for a concurrent holder instead of failing with 40001, which nobody would
        # re-run outside a unit of work, and a lost ON CONFLICT race's re-run sees the winner.
        async with joined(
            self._database, scope, alone=alone, isolation_level="READ COMMITTED"
        ) as tx:
            yield tx

    def _claim_key(self, job_id: str) -> int:
        key = self._claim_keys.get(job_id)
        if key is None:
            key = advisory_lock_key(CLAIM_LOCK_NAMESPACE, f"{self._runs_name}/{job_id}")
            self._claim_keys[job_id] = key
        return key

    # --- enqueue --------------------------------------------------------------------------------

    async def enqueue(
        self,
        job: JobDefinition[Any],
        payload: Any,  # noqa: ANN401 - the job's typed payload
        *,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        run_id: str | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope
    ) -> EnqueueResult:
        """Insert one run (J1, J2). Joins the unit of work; wakes the local loop after commit."""
        request = EnqueueRequest(
            payload=payload, dedupe_key=dedupe_key, run_at=run_at, run_id=run_id
        )
        [result] = await self.enqueue_many(job, [request], scope=scope)
        return result

    async def enqueue_many(
        self,
        job: JobDefinition[Any],
        requests: Sequence[EnqueueRequest],
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope
    ) -> list[EnqueueResult]:
        """Insert many runs of one job in one statement; results in request order.

        Every request is validated and encoded (:func:`prepare_runs`) before any SQL runs: one
        bad request writes nothing. With a ``queue_depth_limit`` the job's gate is taken first
        and held until the enqueuing transaction commits (J2, see the module docstring).
        """
        if len(requests) > MAX_ENQUEUE_BATCH:
            raise BoundExceededError(
                f"enqueue_many got {len(requests)} requests; at most {MAX_ENQUEUE_BATCH} go in"
                " one statement.",
                fix=f"split the requests into batches of at most {MAX_ENQUEUE_BATCH}.",
            )
        if not requests:
            return []
        if scope is not None and not isinstance(scope, TransactionScope):
            raise ConfigurationError(
                f"scope= must be a TransactionScope, got {type(scope).__name__}.",
                fix="pass the scope uow.run gave your repositories, or nothing.",
            )
        self._leases[job.id] = job.concurrency.lease
        # Every request is validated and encoded before any statement runs.
        prepared = prepare_runs(job, requests)
        if self._nothing_to_check(job, prepared):
            plain = _PlainBatch.of(prepared)
            # One INSERT: outside a unit of work it commits by itself, which saves the BEGIN
            # and COMMIT round trips (two of three for a single run).
            async with self._joined(scope, one_statement=True) as tx:
                await self._enqueue_plain(tx.connection, job, plain)
                if plain.due_by(self._clock.now()):
                    tx.after_commit(self._wakeup.wake)
            return [EnqueueResult(run_id=run_id) for run_id in plain.ids]
        if self._queue_depth_limit is not None and _fresh_only(prepared):
            plain = _PlainBatch.of(prepared)
            async with self._joined(scope) as tx:
                room = await self._enqueue_plain_capped(tx.connection, job, plain)
                if plain.due_by(self._clock.now(), first=room):
                    tx.after_commit(self._wakeup.wake)
            full = EnqueueResult(run_id=None, rejected="queue-full")
            return [EnqueueResult(run_id=run_id) for run_id in plain.ids[:room]] + [full] * (
                len(plain.ids) - room
            )
        rows = _checked_rows(prepared)
        async with self._joined(scope) as tx:
            results, due_now = await self._enqueue_checked(tx.connection, job, rows)
            if due_now:
                tx.after_commit(self._wakeup.wake)
        return results

    def _nothing_to_check(
        self,
        _job: JobDefinition[Any],
        prepared: Sequence[PreparedRun],
    ) -> bool:
        """Fresh generated ids, no dedupe key (given or from the idempotency policy), no depth
        limit: no run can conflict or be rejected, so ENQUEUE_PLAIN serves (the common
        enqueue)."""
        return self._queue_depth_limit is None and _fresh_only(prepared)

    async def _enqueue_plain(
        self, connection: AsyncConnection, job: JobDefinition[Any], batch: _PlainBatch
    ) -> None:
        """Runs with fresh ids, no dedupe key, no depth limit: nothing can conflict."""
        await connection.execute(
            self._s.enqueue_plain,
            {
                "job_id": job.id,
                "max_attempts": job.retry.attempts,
                "now": self._now(),
                "ids": batch.ids,
                "payloads": batch.payloads,
                "keys": batch.keys,
                "run_ats": batch.run_ats,
            },
        )

    async def _take_gate(self, connection: AsyncConnection, job: JobDefinition[Any]) -> None:
        """The job's enqueue gate, held until ``connection``'s transaction ends (J2 hard cap:
        ENQUEUE_GATE). Only with a ``queue_depth_limit``."""
        await connection.execute(
            self._s.enqueue_gate, {"gate": f"{job.id}{ENQUEUE_GATE_SUFFIX}", "now": self._now()}
        )

    async def _enqueue_plain_capped(
        self, connection: AsyncConnection, job: JobDefinition[Any], batch: _PlainBatch
    ) -> int:
        """Fresh runs of a capped job, after its gate: the first ``room`` go in; ``room``."""
        await self._take_gate(connection, job)
        room = await connection.scalar(
            self._s.enqueue_plain_capped,
            {
                "job_id": job.id,
                "max_attempts": job.retry.attempts,
                "depth_limit": self._queue_depth_limit,
                "now": self._now(),
                "ids": batch.ids,
                "payloads": batch.payloads,
                "keys": batch.keys,
                "run_ats": batch.run_ats,
            },
        )
        return min(int(room), len(batch.ids))

    async def _enqueue_checked(
        self, connection: AsyncConnection, job: JobDefinition[Any], rows: list[dict[str, Any]]
    ) -> tuple[list[EnqueueResult], bool]:
        """Runs that may be deduplicated (J1) or rejected (J2): ENQUEUE_MANY, per segment,
        after the job's gate when a limit is set (J2 hard cap: ENQUEUE_GATE)."""
        if self._queue_depth_limit is not None:
            await self._take_gate(connection, job)
        results: list[EnqueueResult | None] = [None] * len(rows)
        due_now = False
        for segment in _segments(rows):
            todo = segment
            for _ in range(_ENQUEUE_PASSES):
                todo, inserted_due = await self._enqueue_pass(connection, job, rows, todo, results)
                due_now = due_now or inserted_due
                if not todo:
                    break
            if todo:
                raise RuntimeError(
                    f"enqueue of job {job.id!r}: {len(todo)} runs kept conflicting with"
                    f" concurrent inserts after {_ENQUEUE_PASSES} passes; nothing of this"
                    " call is settled."
                )
        return [result for result in results if result is not None], due_now

    async def _enqueue_pass(
        self,
        connection: AsyncConnection,
        job: JobDefinition[Any],
        rows: list[dict[str, Any]],
        todo: list[int],
        results: list[EnqueueResult | None],
    ) -> tuple[list[int], bool]:
        """One ENQUEUE_MANY over ``rows[todo]``; fills ``results``; returns the lost races."""
        now = self._now()
        batch = [rows[i] for i in todo]
        params = {
            "job_id": job.id,
            "max_attempts": job.retry.attempts,
            "depth_limit": self._queue_depth_limit,
            "now": now,
            "ids": [row["id"] for row in batch],
            "payloads": [row["payload"] for row in batch],
            "dedupe_keys": [row["dedupe_key"] for row in batch],
            "keys": [row["key"] for row in batch],
            "run_ats": [row["run_at"] for row in batch],
        }
        answer = (await connection.execute(self._s.enqueue_many, params)).all()
        lost: list[int] = []
        due_now = False
        wall = self._clock.now()
        for row in answer:
            index = todo[row.ord - 1]
            if row.inserted:
                results[index] = EnqueueResult(run_id=row.id)
                run_at = rows[index]["run_at"]
                due_now = due_now or run_at is None or run_at <= wall
            elif row.existing_id is not None:
                results[index] = EnqueueResult(run_id=row.existing_id, deduplicated=True)
            elif row.room is not None and row.rn > row.room:
                results[index] = EnqueueResult(run_id=None, rejected="queue-full")
            else:
                lost.append(index)
        return lost, due_now

    # --- claim and settle -----------------------------------------------------------------------

    async def claim(
        self,
        job: JobDefinition[Any],
        *,
        worker: str,
        limit: int,
        exclude_keys: Sequence[str] = (),
    ) -> ClaimBatch:
        """Claim up to ``limit`` due runs of ``job`` (J3, J6); see the module docstring."""
        if limit < 1:
            return ClaimBatch()
        lease = job.concurrency.lease
        self._leases[job.id] = lease
        params = {
            "job_id": job.id,
            "limit": limit,
            "max_running": job.concurrency.max,
            "lease": lease,
            "worker": worker,
            "exclude_keys": list(exclude_keys),
            "lapsed_final": LEASE_LAPSED_FINAL_MESSAGE,
            "lapsed": LEASE_LAPSED_MESSAGE,
            "now": self._now(),
        }
        lock = self._s.claim_lock_tuned if self._autocommit is not None else self._s.claim_lock
        async with self._deadline(f"claim of job {job.id!r}"), self._transaction() as connection:
            await connection.execute(lock, {"claim_key": self._claim_key(job.id)})
            rows = (await connection.execute(self._s.claim, params)).all()
        job_id = job.id
        claimed: list[ClaimedRun] = []
        buried: list[BuriedRun] = []
        # Rows come in claim order, (run_at, seq), then the dead-lettered ones.
        for (
            run_id,
            payload,
            attempt,
            max_attempts,
            token,
            key,
            expires,
            created,
            _,
            _,
            dead,
        ) in rows:
            if dead:
                buried.append(BuriedRun(run_id, job_id, attempt, key))
                continue
            claimed.append(
                ClaimedRun(
                    run_id, job_id, payload, attempt, max_attempts, token, key, expires, created
                )
            )
        # The runtime reports and counts the buried runs (J6, J10); nothing is logged here twice.
        return ClaimBatch(claimed, buried)

    def _lease_of(self, run: ClaimedRun) -> float:
        lease = self._leases.get(run.job_id)
        if lease is None:
            raise ConfigurationError(
                f"heartbeat of run {run.run_id!r}: job {run.job_id!r} was never claimed through"
                " this backend, so its lease length is unknown.",
                fix="heartbeat runs with the backend that claimed them.",
            )
        return lease

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> list[bool]:
        """Extend each run's lease by its job's ``concurrency.lease``; False where stale."""
        if not runs:
            return []
        params = {
            "ids": [run.run_id for run in runs],
            "tokens": [run.token for run in runs],
            "leases": [self._lease_of(run) for run in runs],
            "now": self._now(),
        }
        async with self._deadline("heartbeat"), self._autocommitted() as connection:
            beaten = {
                (row.id, row.token) for row in await connection.execute(self._s.heartbeat, params)
            }
        return [(run.run_id, run.token) in beaten for run in runs]

    async def complete(self, runs: Sequence[ClaimedRun]) -> list[SettleOutcome]:
        """Complete many runs in one statement: "completed", or "stale" where the token is not
        current (nothing changed for those)."""
        if not runs:
            return []
        params = {
            "ids": [run.run_id for run in runs],
            "tokens": [run.token for run in runs],
            "now": self._now(),
        }
        async with self._deadline("complete"), self._autocommitted() as connection:
            answered = (await connection.execute(self._s.complete, params)).all()
        if len(answered) == len(runs):
            # As many rows as runs: every (id, token) was distinct and current.
            return ["completed"] * len(runs)
        done = set(answered)
        # A claim named twice completes once: its repeat finds the run completed, i.e. stale.
        outcomes: list[SettleOutcome] = []
        for run in runs:
            claim = (run.run_id, run.token)
            outcomes.append("completed" if claim in done else "stale")
            done.discard(claim)
        return outcomes

    async def fail(
        self, run: ClaimedRun, error: str, *, retry_at: datetime | None
    ) -> SettleOutcome:
        """Record a failed attempt: "retrying" (waiting at ``retry_at``), "dead" (``retry_at``
        None or attempts spent), or "stale" with nothing changed."""
        if retry_at is not None:
            require_aware(retry_at, "retry_at")
        params = {
            "id": run.run_id,
            "token": run.token,
            "error": error,
            "retry_at": retry_at,
            "now": self._now(),
        }
        async with self._deadline("fail"), self._autocommitted() as connection:
            state = (await connection.execute(self._s.fail, params)).scalar_one_or_none()
        if state is None:
            return "stale"
        if state == "dead":
            return "dead"
        assert retry_at is not None  # noqa: S101 - waiting again implies a retry time
        if retry_at <= self._clock.now():
            self._wakeup.wake()
        return "retrying"

    async def release(
        self, run: ClaimedRun, *, run_at: datetime, error: str | None = None
    ) -> SettleOutcome:
        """Return a claimed run to waiting at ``run_at`` without consuming its attempt (J7)."""
        params = {
            "id": run.run_id,
            "token": run.token,
            "run_at": require_aware(run_at, "run_at"),
            "error": error,
            "now": self._now(),
        }
        async with self._deadline("release"), self._autocommitted() as connection:
            released = (await connection.execute(self._s.release, params)).scalar_one_or_none()
        if released is None:
            return "stale"
        if run_at <= self._clock.now():
            self._wakeup.wake()
        return "released"

    # --- schedules (J9; the logic is in _schedules.py) -------------------------------------------

    def _schedules(self) -> Schedules:
        if self._schedule_half is None:
            self._schedule_half = Schedules(
                state=_quoted(self._state_table),
                runs=self._runs_name,
                transaction=self._transaction,
                deadline=self._deadline,
                now=self._now,
                wake=self._wakeup.wake,
            )
        return self._schedule_half

    async def schedule(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """Upsert one state row per scheduled job; an unchanged trigger keeps its next_at."""
        await self._schedules().install(definitions)

    async def tick(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire each due occurrence once (SKIP LOCKED; catch-up is ONE run); the runs created."""
        return await self._schedules().tick(definitions)

    def wake(self) -> None:
        """Wake this process's worker loop now (after an operator retry has committed)."""
        self._wakeup.wake()

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109 - the poll interval
        """Return when a local enqueue/retry committed, or after ``timeout`` seconds (J3)."""
        await self._wakeup.wait(self._clock, timeout)

    # --- inspection and operator operations ------------------------------------------------------

    async def get_run(self, run_id: str) -> RunRecord | None:
        """One run as operators see it, or None."""
        async with self._deadline("get_run"), self._autocommitted() as connection:
            row = (await connection.execute(self._s.get_run, {"id": run_id})).one_or_none()
        return None if row is None else run_record(row)

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """J10's queue gauges: waiting runs per job and the age of the oldest due one, for
        every job of ``job_ids`` (sampled by worker runtimes with metrics)."""
        params = {"job_ids": list(job_ids), "now": self._now()}
        async with self._deadline("queue_depths"), self._autocommitted() as connection:
            rows = (await connection.execute(self._s.queue_depths, params)).all()
        return {job_id: QueueDepth(depth, float(age)) for job_id, depth, age in rows}

    async def list_failed(
        self, job_id: str, *, limit: int = 100, before: RunRecord | None = None
    ) -> list[RunRecord]:
        """Dead runs of ``job_id``, newest first: a page of at most ``limit`` (R1), continuing
        after ``before`` (the last record of the previous page)."""
        if not 1 <= limit <= 1000:  # noqa: PLR2004 - the documented page bound
            raise BoundExceededError(
                f"list_failed limit must be 1..1000, got {limit}.",
                fix="page with before=<last record of the previous page>.",
            )
        params = {
            "job_id": job_id,
            "limit": limit,
            "after_at": before.finished_at if before is not None else None,
            "after_id": before.run_id if before is not None else None,
        }
        async with self._deadline("list_failed"), self._autocommitted() as connection:
            rows = (await connection.execute(self._s.list_dead, params)).all()
        return [run_record(row) for row in rows]

    async def retry(self, run_id: str) -> bool:
        """Operator retry (J8): a dead run gets one more attempt and waits, due now. False when
        the run is not dead, or a newer live run holds its dedupe key (J1)."""
        try:
            async with self._deadline("retry"), self._autocommitted() as connection:
                row = (
                    await connection.execute(self._s.retry, {"id": run_id, "now": self._now()})
                ).one_or_none()
        except IntegrityError as exc:
            if sqlstate_of(exc) == "23505":  # a concurrent enqueue took the dedupe key
                return False
            raise
        if row is None:
            return False
        self._wakeup.wake()
        return True

    async def discard(self, run_id: str) -> bool:
        """Operator discard (J8): a waiting or dead run becomes discarded. False otherwise."""
        async with self._deadline("discard"), self._autocommitted() as connection:
            row = (
                await connection.execute(self._s.discard, {"id": run_id, "now": self._now()})
            ).one_or_none()
        return row is not None

    async def cleanup(self, job: JobDefinition[Any], *, limit: int = 1000) -> int:
        """Delete at most ``limit`` terminal runs of ``job`` past their retention (bounded
        batches through ``<runs>_finished_idx``); the number deleted."""
        if limit < 1:
            raise ConfigurationError(f"cleanup limit must be at least 1, got {limit!r}.")
        retention = job.retention
        deleted = 0
        for state, keep in (
            ("completed", retention.completed),
            ("dead", retention.dead),
            ("discarded", retention.discarded),
        ):
            if deleted >= limit:
                break
            params = {
                "job_id": job.id,
                "state": state,
                "retention": keep.total_seconds(),
                "batch": limit - deleted,
                "now": self._now(),
            }
            async with self._deadline("cleanup"), self._autocommitted() as connection:
                result = await connection.execute(self._s.delete_finished, params)
            deleted += result.rowcount
        return deleted


@attrs.frozen
class _PlainBatch:
    """ENQUEUE_PLAIN's parameters, built column by column from the prepared runs: no per-run
    dict (a batch of 10,000 is where this shows)."""

    ids: list[str]
    payloads: str
    """The encoded payloads as ONE JSON array, in request order (joined, not re-encoded)."""
    keys: list[str | None]
    run_ats: list[datetime | None]

    @classmethod
    def of(cls, prepared: Sequence[PreparedRun]) -> _PlainBatch:
        return cls(
            new_run_ids(len(prepared)),
            "[" + ",".join([run.payload_json for run in prepared]) + "]",
            [run.key for run in prepared],
            [run.run_at for run in prepared],
        )

    def due_by(self, now: datetime, *, first: int | None = None) -> bool:
        """A run of the batch (of its ``first`` ones, when given: those inserted) is due at
        ``now`` (the local loop is worth waking)."""
        run_ats = self.run_ats if first is None else self.run_ats[:first]
        return any(run_at is None or run_at <= now for run_at in run_ats)


def _fresh_only(prepared: Sequence[PreparedRun]) -> bool:
    """No caller-given run id and no dedupe key: no run of the batch can conflict (J1)."""
    return all(run.run_id is None and run.dedupe_key is None for run in prepared)


def _checked_rows(prepared: Sequence[PreparedRun]) -> list[dict[str, Any]]:
    """ENQUEUE_MANY's rows: each prepared run with its id (the caller's, else a new one)."""
    fresh = iter(new_run_ids(sum(1 for run in prepared if run.run_id is None)))
    return [
        {
            "id": run.run_id if run.run_id is not None else next(fresh),
            "payload": run.payload_json,
            "dedupe_key": run.dedupe_key,
            "key": run.key,
            "run_at": run.run_at,
        }
        for run in prepared
    ]


def run_record(row: Any) -> RunRecord:  # noqa: ANN401 - a Row of the runs table's columns
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
    )


def create_job_backend(
    *,
    database: Database,
    table: Table | None = None,
    state_table: Table | None = None,
    lock_provider: LockProvider | None = None,
    poll_interval: float = 1.0,
    queue_depth_limit: int | None = None,
    max_in_flight: int = 100,
    meter_provider: Any = None,  # noqa: ANN401 - an OpenTelemetry MeterProvider
    on_error: ErrorHandler | None = None,
    clock: Clock | None = None,
    operation_timeout: float = 30.0,
) -> PostgresJobBackend:
    """The PostgreSQL ``JobBackend`` (seed: ``createDrizzleJobBackend``).

    ``database``: the application's ``AsyncEngine`` (or an ``AsyncConnection`` in a transaction,
    for tests). ``table`` / ``state_table``: from :func:`ship_job_runs_table` /
    :func:`ship_job_state_table` on the application's metadata (defaults: those tables under
    their default names). ``lock_provider``: cross-process exclusion for single-runner jobs
    (J4); by default :func:`advisory_lock_provider` on ``database`` when it is an engine.
    ``poll_interval`` (seconds), ``queue_depth_limit`` (J2, None: unlimited), ``max_in_flight``
    (runs one runtime executes at once), ``on_error`` (receives what the loop absorbs, J11),
    ``clock`` (one clock for the process; a ``FrozenClock`` in tests), ``operation_timeout``
    (seconds any one backend operation may take before :class:`JobBackendTimeoutError`),
    ``meter_provider`` (J10; None: OpenTelemetry's global provider, so metrics are on as soon
    as the application installs an SDK). Durations must be finite, positive and bounded
    (``poll_interval`` and ``operation_timeout`` at most an hour): ``ConfigurationError``.
    """
    if table is None:
        table = ship_job_runs_table(MetaData())
    if state_table is None:
        state_table = ship_job_state_table(MetaData())
    if lock_provider is None and isinstance(database, AsyncEngine):
        lock_provider = advisory_lock_provider(database, clock=clock)
    return PostgresJobBackend(
        database=database,
        table=table,
        state_table=state_table,
        lock_provider=lock_provider,
        poll_interval=poll_interval,
        queue_depth_limit=queue_depth_limit,
        max_in_flight=max_in_flight,
        meter_provider=meter_provider,
        on_error=on_error,
        clock=clock,
        operation_timeout=operation_timeout,
    )
