"""The in-memory reference job backend: the ports of :mod:`ship_sqla.kernel._ports` over dicts.

It is the executable statement of the storage contract: the conformance suite runs against it
and against the PostgreSQL backend, and property tests use it as the model. It differs from the
PostgreSQL backend only in where runs live: the enqueue front, the settle front and the
schedules' rules are the same code (:class:`~ship_sqla.kernel._backend_base.JobBackendBase`,
:mod:`~ship_sqla.kernel._plans.prepare`, :mod:`~ship_sqla.kernel._plans.scheduled_runs`), and
the operator surface is the same gate (:class:`~ship_sqla.kernel.JobOperations`) over its
:attr:`~InMemoryJobBackend.admin`. Time comes only from the injected clock.

- J1 ``insert`` of a run whose dedupe key a non-terminal run of the same job holds returns that
  run, ``deduplicated=True``. A durable run id that already exists (any state) is also returned
  deduplicated: a durable id is inserted once.
- J2 ``insert`` is rejected ``"queue-full"`` once the job holds ``queue_depth_limit`` waiting
  runs (due or delayed). Deduplication is checked first: a duplicate is never "full". It is a
  hard cap: a call counts and inserts without awaiting in between, so no concurrent task can
  take the same place (the PostgreSQL backend gets the same from its per-job gate).
- J3 ``claim`` never lets the job's running runs exceed ``request.max_running`` (whoever claimed
  them, live or lapsed leases alike: a lapsed run holds its slot until a claim retakes it, which
  moves the slot, or buries it), takes due runs by priority (higher first, K6), then ``run_at``,
  then creation order, and skips ``exclude_keys``.
- J5 Every claim draws a new fencing token (per run, increasing). A settlement acts only while
  the run is running under that token; otherwise it changes nothing and answers "stale". A
  lease that lapsed but that no claim has retaken is still current for a settlement (nobody
  else holds the run), but ``heartbeat`` refuses it (False): a lapsed lease is never revived,
  its holder stops.
- J6 A running run whose lease lapsed is retaken by the next claim (a new attempt), the lapsed
  attempt recorded in its history (``LEASE_LAPSED_MESSAGE``). One that lapsed on its final
  attempt is dead-lettered with ``LEASE_LAPSED_FINAL_MESSAGE`` instead and reported in the
  claim's ``buried``.
- J15 Every lapsed run a claim meets (retaken, dead-lettered or cancelled) counts one more
  ``lapses`` and ``consecutive_lapses``; one whose ``consecutive_lapses`` reaches
  ``request.max_lapses`` is dead-lettered (``crash_loop_message``, ``buried`` with
  ``crash_loop``), attempts left or not. Any settlement but a release, and a suspend, sets
  ``consecutive_lapses`` back to 0; an operator's retry (or rerun) of a dead run too.
- J7, K4 ``settle`` applies each :class:`~ship_sqla.kernel._settlement.Settlement` as built: its
  state and ``run_at``, its attempt refunded unless it ``spends_attempt``, ``snoozes_added``,
  its history ``entry`` (every entry carries its ``kind``); retry or dead was decided when the
  settlement was built. Claims add ``"lapsed"`` and ``"cancelled"`` entries of their own.
- K2 :meth:`InMemoryRunAdmin.cancel` makes a waiting run cancelled at once; a running one is
  marked cancel-requested and the watchers (:meth:`watch_cancel_requests`: the runtimes on this
  backend) are told at once; ``heartbeat`` names it in ``cancel_requested`` too. Its holder's
  cancellation, and any other settlement but a completion, ends it cancelled; once its lease
  lapses the next claim ends it cancelled (``CANCEL_LAPSED_MESSAGE``), never retakes it. A
  terminal run is never touched.
- K3 a claim of a paused job takes nothing; enqueue and schedules still add its runs; resume
  wakes the local loop.
- Terminal runs (completed, dead, discarded, cancelled) never change state again except through
  :meth:`InMemoryRunAdmin.retry_dead` (an operator's one more attempt for a dead run).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from ship_sqla.kernel._backend_base import JobBackendBase
from ship_sqla.kernel._browse import (
    BrowsedRun,
    ClaimPosition,
    ConsumerKeyProgress,
    CreatedPosition,
    FinishedPosition,
    LeasePosition,
    RunOrder,
    ScheduleState,
    ThroughputBucket,
    run_order,
)
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._health import UNKNOWN_HEALTH
from ship_sqla.kernel._jobs import KEEP_NONE, KEEP_PAYLOAD, KEEP_ROW, history_keep
from ship_sqla.kernel._memory.partitions import Starts, choose_partitioned
from ship_sqla.kernel._memory.transactions import active_transaction, required_transaction
from ship_sqla.kernel._memory.workers import InMemoryWorkerRegistry
from ship_sqla.kernel._memory.workflows import InMemoryWorkflowStore
from ship_sqla.kernel._partition_waits import judge, window_measure
from ship_sqla.kernel._plans.claim_floor import (
    ClaimFloors,
    LapsedFloors,
    below_floor,
    lapsed_probe_complete,
)
from ship_sqla.kernel._plans.fairness import counted_for_shares, fair_shares
from ship_sqla.kernel._plans.scheduled_runs import (
    fire_due,
    installable,
    schedule_states,
    scheduled_only,
)
from ship_sqla.kernel._ports import (
    CANCEL_LAPSED_MESSAGE,
    LEASE_LAPSED_FINAL_MESSAGE,
    LEASE_LAPSED_MESSAGE,
    TERMINAL_STATES,
    BuriedRun,
    ClaimBatch,
    ClaimedRun,
    EnqueueResult,
    HeartbeatBatch,
    JobDemand,
    JobFailures,
    PausedJob,
    QueueDepth,
    RunRecord,
    RunState,
    SettleOutcome,
    StateCount,
    Suspend,
    crash_loop_message,
)
from ship_sqla.kernel._priority import effective_priority
from ship_sqla.kernel._settlement import DIVERGED, refused, settle_refusal
from ship_sqla.kernel._versions import MAX_VERSION_ROWS, VersionCount
from ship_sqla.kernel._workflows import unstorable_step

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Sequence

    from ship_sqla.kernel._browse import RunQuery
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._health import StorageHealth
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._memory.transactions import InMemoryTransaction
    from ship_sqla.kernel._on_error import ErrorHandler
    from ship_sqla.kernel._partition_waits import PartitionLimits, PartitionWait
    from ship_sqla.kernel._plans.prepare import PreparedRun
    from ship_sqla.kernel._ports import ClaimRequest, DeadQuery, FenceAnswer, HistoryKind
    from ship_sqla.kernel._priority import Aging
    from ship_sqla.kernel._settlement import Settlement, SettleRequest
    from ship_sqla.kernel._versions import LiveState

__all__ = ["InMemoryJobBackend", "InMemoryRunAdmin"]

logger = logging.getLogger("ship_sqla.jobs")


class _Run:
    """The stored form of a run. ``payload_json`` is JSON text, as PostgreSQL would store it."""

    __slots__ = (
        "attempt",
        "cancel_requested_at",
        "consecutive_lapses",
        "created_at",
        "dedupe_key",
        "finished_at",
        "handler_version",
        "history",
        "job_id",
        "key",
        "lapses",
        "last_error",
        "last_worker",
        "lease_expires_at",
        "max_attempts",
        "parent_id",
        "partition",
        "payload_json",
        "priority",
        "progress",
        "run_at",
        "run_id",
        "seq",
        "snoozes",
        "started_at",
        "state",
        "tenant",
        "token",
        "trace_context",
        "updated_at",
        "wait_for",
        "worker",
    )

    def __init__(self, job_id: str, prepared: PreparedRun, now: datetime, seq: int) -> None:
        self.run_id = prepared.run_id
        self.job_id = job_id
        self.payload_json: str | None = prepared.payload_json
        self.key = prepared.key
        self.dedupe_key = prepared.dedupe_key
        self.max_attempts = prepared.max_attempts
        self.priority = prepared.priority
        self.tenant = prepared.tenant
        self.partition = prepared.partition
        self.handler_version = prepared.handler_version
        self.trace_context: dict[str, str] | None = (
            None if prepared.trace_context is None else json.loads(prepared.trace_context)
        )
        self.run_at = prepared.run_at if prepared.run_at is not None else now
        self.created_at = now
        self.updated_at = now
        self.seq = seq
        self.state: RunState = "waiting"
        self.attempt = 0
        self.token = 0
        self.lease_expires_at: datetime | None = None
        self.finished_at: datetime | None = None
        self.last_error: str | None = None
        self.history: list[dict[str, Any]] = []
        self.snoozes = 0
        self.lapses = 0
        self.consecutive_lapses = 0
        self.progress: dict[str, Any] | None = None
        self.worker: str | None = None
        self.started_at: datetime | None = None
        self.last_worker: str | None = None
        self.cancel_requested_at: datetime | None = None
        self.parent_id: str | None = None
        self.wait_for: str | None = None

    def record(self) -> RunRecord:
        return RunRecord(
            run_id=self.run_id,
            job_id=self.job_id,
            state=self.state,
            payload=None if self.payload_json is None else json.loads(self.payload_json),
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            key=self.key,
            dedupe_key=self.dedupe_key,
            run_at=self.run_at,
            created_at=self.created_at,
            updated_at=self.updated_at,
            finished_at=self.finished_at,
            lease_expires_at=self.lease_expires_at,
            last_error=self.last_error,
            history=tuple(dict(entry) for entry in self.history),
            snoozes=self.snoozes,
            priority=self.priority,
            tenant=self.tenant,
            cancel_requested_at=self.cancel_requested_at,
            parent_id=self.parent_id,
            wait_for=self.wait_for,
            lapses=self.lapses,
            consecutive_lapses=self.consecutive_lapses,
            progress=None if self.progress is None else dict(self.progress),
            handler_version=self.handler_version,
            # J18: known for a run a settle moved to history (live_only), as PostgreSQL's,
            # and for a running one (its updated_at: the start its claim recorded).
            started_at=self.updated_at
            if self.state == "running"
            else (self.started_at if self.last_worker is not None else None),
            # the worker holding a running run, as PostgreSQL's record (issue 36's worker filter)
            worker=self.worker if self.state == "running" else self.last_worker,
        )


def _crash_loops(run: _Run, max_lapses: int | None) -> bool:
    """J15: a lapse now would be the run's ``max_lapses``-th in a row."""
    return max_lapses is not None and run.consecutive_lapses + 1 >= max_lapses


def _claim_order(run: _Run) -> tuple[int, datetime, int]:
    """K6: higher priority first, then ``run_at``, then creation order."""
    return -run.priority, run.run_at, run.seq


def _lease_order(run: _Run) -> tuple[datetime, str]:
    """A running run's place on the runs page: soonest lease to lapse first, then run id."""
    if run.lease_expires_at is None:  # every claim sets it; nothing running clears it
        raise ValueError(f"running run {run.run_id!r} has no lease_expires_at")
    return run.lease_expires_at, run.run_id


def _order_time(run: _Run, order: RunOrder) -> datetime | None:
    """The time a page of runs in ``order`` is ordered and ranged by (the state's own time)."""
    return {
        "claim": run.run_at,
        "lease": run.lease_expires_at,
        "created": run.created_at,
        "finished": run.finished_at,
    }[order]


def _in_time(at: datetime | None, start: datetime | None, end: datetime | None) -> bool:
    """``at`` in ``[start, end)`` (None: unbounded on that side; no time: in no range)."""
    if start is None and end is None:
        return True
    return at is not None and (start is None or at >= start) and (end is None or at < end)


def _newest_key(run: _Run, order: RunOrder) -> tuple[datetime, str]:
    """A finished run's place, newest first: (creation or finish time, run id)."""
    at = run.finished_at if order == "finished" else run.created_at
    if at is None:  # every end sets finished_at
        raise ValueError(f"finished run {run.run_id!r} has no finished_at")
    return at, run.run_id


def _end_wait(run: _Run, settlement: SettleRequest) -> None:
    """D4, D5: what the run waited for ends with its settlement (as SETTLE and SUSPEND_RUN
    clear it on PostgreSQL); a suspend that lands sets its own."""
    if not isinstance(settlement, Suspend) or run.cancel_requested_at is not None:
        run.wait_for = None


def _partition_of(by: str) -> Callable[[_Run], str | None]:
    """F8/F9: a run's partition: its tenant, or its partition key."""
    if by == "key":
        return lambda run: run.partition
    return lambda run: run.tenant


def _aged_order(aging: Aging, now: datetime) -> Callable[[_Run], tuple[int, datetime, int]]:
    """F10: claim order by effective priority (a waiting run's, aged at ``now``; a lapsed
    run's own, as PostgreSQL's aged claim orders them), then ``run_at``, then creation order."""

    def order(run: _Run) -> tuple[int, datetime, int]:
        if run.state != "waiting":
            return _claim_order(run)
        return -effective_priority(run.priority, run.run_at, now, aging), run.run_at, run.seq

    return order


def _choose(
    candidates: list[_Run],
    room: int,
    limit: int,
    rank: dict[str, int] | None,
    aging: tuple[Aging, datetime] | None = None,
) -> list[_Run]:
    """The runs a claim takes: at most ``room`` due runs and ``limit`` in all, lapsed ones
    retaken first by claim order (K6; by effective priority with ``aging``, F10); a fair claim
    (F2) takes only the due runs its shares ranked, by rank first, so a smaller room cuts
    every tenant alike (priorities, aged or not, are not used there)."""
    retakable = [run for run in candidates if run.state == "running"]
    waiting = [run for run in candidates if run.state == "waiting"]
    if rank is None:
        order = _claim_order if aging is None else _aged_order(*aging)
        due = heapq.nsmallest(room, waiting, key=order)
        return heapq.nsmallest(limit, retakable + due, key=order)
    ranks = rank

    def fair_order(run: _Run) -> tuple[int, int, datetime, int]:
        return (ranks.get(run.run_id, 0), *_claim_order(run))

    due = heapq.nsmallest(room, (run for run in waiting if run.run_id in ranks), key=fair_order)
    return heapq.nsmallest(limit, retakable + due, key=fair_order)


def _scan(
    live: Iterable[_Run],
    now: datetime,
    excluded: frozenset[str],
    fenced: Container[str],
    max_lapses: int | None,
    *,
    lapsed_after: datetime | None,
) -> tuple[int, list[_Run], list[_Run], int]:
    """(running runs holding a slot: live or retakable leases, claimable runs, lapsed runs that
    end here: on their final attempt, at their ``max_lapses``-th lapse in a row, J15, or
    cancel-requested, K2, and how many lapsed runs the probe found). A run a transaction fenced
    (J13) holds its slot and is skipped, lease or not, as ``FOR UPDATE SKIP LOCKED`` skips it;
    so is a lapsed run whose lease expired at or before ``lapsed_after`` (J19 for J6: below the
    lapsed floor, kernel LapsedFloors; None: the probe reads every lapsed run)."""
    held = found = 0
    candidates: list[_Run] = []
    lapsed_on_final: list[_Run] = []
    for run in live:
        if run.state == "running":
            assert run.lease_expires_at is not None  # noqa: S101 - running implies a lease
            if (
                run.lease_expires_at > now
                or run.run_id in fenced
                or (lapsed_after is not None and run.lease_expires_at <= lapsed_after)
            ):
                held += 1
                continue
            found += 1
            if (
                run.attempt >= run.max_attempts
                or run.cancel_requested_at is not None
                or _crash_loops(run, max_lapses)
            ):
                lapsed_on_final.append(run)
            else:
                held += 1
                if run.key not in excluded:
                    candidates.append(run)
        elif run.run_at <= now and run.key not in excluded:
            candidates.append(run)
    return held, candidates, lapsed_on_final, found


class InMemoryJobBackend(JobBackendBase):
    """Runs kept in this process: the reference backend and the model for property tests.

    ``insert`` (so ``enqueue``) accepts ``scope=`` for signature compatibility and ignores it
    (there are no transactions in memory), so the local wake happens at once. Safe for any
    number of runtimes and callers in one event loop; not thread-safe. Its
    ``default_lock_provider`` is None: a runtime on it takes single-runner locks (J4) only from
    the ``lock_provider`` it is started with (an :class:`InMemoryLockProvider`, say).

    ``live_only`` (J16, J18): True (default, as the PostgreSQL backend whose metadata declares
    a history table): a run that ends moves to the history, slim (a completed run's payload is
    kept only on request, J18); False: the legacy in-place shape (runs end where they are).
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        queue_depth_limit: int | None = None,
        on_error: ErrorHandler | None = None,
        live_only: bool = True,
    ) -> None:
        self._set_options(clock=clock, queue_depth_limit=queue_depth_limit, on_error=on_error)
        self._runs: dict[str, _Run] = {}
        # J16: with live_only, ``_runs`` is the runs table (live runs only) and ``_history`` the
        # history table: a run that ends moves there (slim, J18), a retried dead run moves back.
        self.live_only: Final = live_only
        self._history: dict[str, _Run] = {}
        self._keeps: dict[str, int] = {}
        # Non-terminal runs per job, in creation order: what claim and the J2 count look at.
        self._live: dict[str, dict[str, _Run]] = {}
        self._waiting: dict[str, int] = {}
        self._dedupe: dict[tuple[str, str], str] = {}
        self._seq = itertools.count()
        # job id -> (trigger text, next_at): the state table of the PostgreSQL backend (J9).
        self._schedules: dict[str, tuple[str, datetime]] = {}
        # job id -> when it was paused (K3): the PostgreSQL backend's ``<job_id>#paused`` rows.
        self._paused: dict[str, datetime] = {}
        # D10: per job, the last build whose worker unparked its parked runs.
        self._unparked_by: dict[str, str] = {}
        # job id -> its recent starts as (time, count) pairs (F3): the PostgreSQL backend's
        # claim gate's rate_at/rate_n.
        self._starts: dict[str, list[tuple[datetime, int]]] = {}
        # job id -> the tenant its last fair claim's walk stopped at (F2, CLAIM_FAIR's cursor).
        self._fair_cursors: dict[str, str] = {}
        self.claim_floors = ClaimFloors()
        self.lapsed_floors = LapsedFloors()  # J19 for J6: where each job's lapsed probe starts
        """J19: where the next claim of each job starts its priority walk (as a PostgreSQL
        backend's; shared by every runtime on this store, so its own enqueues lower it)."""
        # (job id, partition) -> its recent starts (F8): CLAIM_PARTITIONED's gate rows.
        self._partition_starts: Starts = {}
        # run id -> the transaction that fenced it (J13): held until that transaction ends.
        self._fenced: dict[str, InMemoryTransaction] = {}
        self._admin = InMemoryRunAdmin(self)
        self._workers = InMemoryWorkerRegistry(self._clock)
        self._workflows = InMemoryWorkflowStore(self)

    @property
    def admin(self) -> InMemoryRunAdmin:
        """The administration port (:class:`~ship_sqla.kernel.RunAdmin`) over these runs. It
        checks no permission: operators go through
        :func:`~ship_sqla.kernel.create_job_operations`."""
        return self._admin

    @property
    def workflows(self) -> InMemoryWorkflowStore:
        """The workflow store (SPEC §13): steps and events of these runs, and their operator
        side (D6)."""
        return self._workflows

    @property
    def workers(self) -> InMemoryWorkerRegistry:
        """The worker registry (F6) of the runtimes on this backend, and their queue-sampler
        lease (F5)."""
        return self._workers

    # --- insert (J1, J2) ----------------------------------------------------------------------

    async def insert(
        self,
        job: JobDefinition[Any],
        runs: Sequence[PreparedRun],
        *,
        scope: Any = None,  # noqa: ANN401, ARG002 - the active InMemoryUnitOfWork's, if any
    ) -> list[EnqueueResult]:
        """Store prepared runs of ``job`` (J1, then J2); inside an
        :class:`~ship_sqla.kernel.InMemoryUnitOfWork` run, removed again if it rolls back."""
        tx = active_transaction()
        if tx is None:
            return self._insert_all(job.id, runs, capped=True)
        before = set(self._runs)
        results = self._insert_all(job.id, runs, capped=True)
        created = [
            r.run_id
            for r in results
            if r.run_id is not None and not r.deduplicated and r.run_id not in before
        ]
        tx.on_rollback(lambda: self._uninsert(created))
        return results

    def _uninsert(self, run_ids: Sequence[str]) -> None:
        """Undo the insert of ``run_ids`` (still waiting: their transaction never committed)."""
        for run_id in run_ids:
            run = self._runs.pop(run_id, None)
            if run is None:
                continue
            self._live.get(run.job_id, {}).pop(run_id, None)
            if run.state == "waiting":
                self._waiting[run.job_id] -= 1
            if run.dedupe_key is not None and self._dedupe.get((run.job_id, run.dedupe_key)) == (
                run_id
            ):
                del self._dedupe[(run.job_id, run.dedupe_key)]

    def _insert_all(
        self, job_id: str, runs: Sequence[PreparedRun], *, capped: bool
    ) -> list[EnqueueResult]:
        """The one insert path (``insert``, and a tick with ``capped=False``): the runs one
        after another, with no await in between, so atomic in the event loop as one statement
        is in PostgreSQL; wakes the local loop when one it stored is due."""
        now = self._clock.now()
        results: list[EnqueueResult] = []
        due = False
        for prepared in runs:
            result, created = self._insert(job_id, prepared, now, capped=capped)
            results.append(result)
            due = due or (created is not None and created.run_at <= now)
        if due:
            self.wake()
        return results

    def _insert(
        self, job_id: str, prepared: PreparedRun, now: datetime, *, capped: bool
    ) -> tuple[EnqueueResult, _Run | None]:
        run_id, dedupe_key = prepared.run_id, prepared.dedupe_key
        if prepared.durable_id and (run_id in self._runs or run_id in self._history):
            return EnqueueResult(run_id=run_id, deduplicated=True), None
        if dedupe_key is not None:
            existing = self._dedupe.get((job_id, dedupe_key))
            if existing is not None:
                return EnqueueResult(run_id=existing, deduplicated=True), None
        limit = self._queue_depth_limit if capped else None
        if limit is not None and self._waiting.get(job_id, 0) >= limit:
            return EnqueueResult(run_id=None, rejected="queue-full"), None
        run = _Run(job_id, prepared, now, next(self._seq))
        self.claim_floors.lower(job_id, run.priority, run.run_at)  # J19
        self._runs[run.run_id] = run
        self._live.setdefault(job_id, {})[run.run_id] = run
        self._waiting[job_id] = self._waiting.get(job_id, 0) + 1
        if dedupe_key is not None:
            self._dedupe[(job_id, dedupe_key)] = run.run_id
        return EnqueueResult(run_id=run.run_id), run

    # --- claim and settle ---------------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimBatch:
        now = self._clock.now()
        live = self._live.get(request.job_id)
        if not live or request.limit < 1 or request.job_id in self._paused:
            return ClaimBatch()
        max_lapses = request.max_lapses
        window, (held, candidates, lapsed_on_final, found) = self._probe(request, live, now)
        buried = self._end_lapsed(lapsed_on_final, max_lapses, now)
        started: dict[str, datetime] = {}
        if request.partition is not None:
            # F8/F9: the limits hold per partition (kernel/_memory/partitions.py).
            choice = choose_partitioned(
                request,
                live.values(),
                candidates,
                buried={run.run_id for run in lapsed_on_final},
                starts=self._partition_starts,
                cursors=self._fair_cursors,
                now=now,
            )
            chosen, started, rate_wait = choice.chosen, choice.started, choice.rate_wait
        else:
            chosen, rate_wait, started_at = self._choose_floored(
                request, live.values(), held, candidates, now
            )
            started = dict.fromkeys((run.run_id for run in chosen), started_at)
            handled = len(lapsed_on_final) + sum(run.state == "running" for run in chosen)
            self._record_lapsed_probe(request, now, window, found, handled)
        lease = request.lease
        expires_at = now + timedelta(seconds=lease)
        claimed: list[ClaimedRun] = []
        for run in chosen:
            retaken = run.state == "running"
            if not retaken:
                self._waiting[run.job_id] -= 1
            else:
                # J6: the attempt that lapsed is history too (its holder never settled it);
                # J15: one more lapse.
                self._append_history(run, LEASE_LAPSED_MESSAGE, now, kind="lapsed")
                run.lapses += 1
                run.consecutive_lapses += 1
            run.state = "running"
            run.attempt += 1
            run.token += 1
            run.lease_expires_at = expires_at
            run.worker = request.worker
            run.started_at = now
            run.updated_at = started[run.run_id]
            claimed.append(
                ClaimedRun(
                    run_id=run.run_id,
                    job_id=run.job_id,
                    payload=json.loads(run.payload_json or "null"),
                    attempt=run.attempt,
                    max_attempts=run.max_attempts,
                    token=run.token,
                    key=run.key,
                    lease_expires_at=expires_at,
                    created_at=run.created_at,
                    lease=lease,
                    snoozes=run.snoozes,
                    priority=run.priority,
                    trace_context=run.trace_context,
                    tenant=run.tenant,
                    lapses=run.lapses,
                    consecutive_lapses=run.consecutive_lapses,
                    retaken=retaken,
                    handler_version=run.handler_version,
                    run_at=run.run_at,
                )
            )
        walked = request.fairness is not None or request.partition is not None
        more_due = walked and request.job_id in self._fair_cursors
        return ClaimBatch(claimed, buried, rate_wait=rate_wait, more_due=more_due)

    def _probe(
        self, request: ClaimRequest, live: dict[str, _Run], now: datetime
    ) -> tuple[float | None, tuple[int, list[_Run], list[_Run], int]]:
        """:func:`_scan` of a claim, its lapsed probe from this store's lapsed floor (J19 for
        J6; a partitioned claim's from the start): (the probe's window, the scan)."""
        window = None if request.partition else self.lapsed_floors.window(request.job_id, now)
        after = None if window is None else now - timedelta(seconds=window)
        excluded = frozenset(request.exclude_keys)
        scan = _scan(
            live.values(), now, excluded, self._fenced, request.max_lapses, lapsed_after=after
        )
        return window, scan

    def _record_lapsed_probe(
        self, request: ClaimRequest, now: datetime, window: float | None, found: int, handled: int
    ) -> None:
        """J19 for J6: the lapsed floor after an unpartitioned claim's probe from ``window``
        found ``found`` lapsed runs and retook or buried ``handled`` of them (the PostgreSQL
        claim's probe stops at ``limit + max_running``: kernel lapsed_probe_complete)."""
        limit = request.limit + (request.max_running or 0)
        complete = lapsed_probe_complete(found=found, handled=handled, limit=limit, paused=False)
        self.lapsed_floors.record(request.job_id, now, window, complete=complete)

    def _choose_floored(
        self,
        request: ClaimRequest,
        live: Iterable[_Run],
        held: int,
        candidates: list[_Run],
        now: datetime,
    ) -> tuple[list[_Run], float | None, datetime]:
        """J19: :meth:`_choose_whole` from this store's claim floors (a priority walk: neither
        fair nor aged), the floors then moved to what it took."""
        if request.fairness is not None or request.aging is not None:
            return self._choose_whole(request, live, held, candidates, now)
        floors = self.claim_floors.floors(request.job_id, now)
        if floors:
            candidates = [
                run
                for run in candidates
                if run.state == "running"
                or not below_floor(floors, run.priority, run.run_at, run.seq)
            ]
        chosen, rate_wait, started_at = self._choose_whole(request, live, held, candidates, now)
        taken = [(run.priority, run.run_at, run.seq) for run in chosen if run.state == "waiting"]
        self.claim_floors.record(request.job_id, now, floors, taken)
        return chosen, rate_wait, started_at

    def _choose_whole(
        self,
        request: ClaimRequest,
        live: Iterable[_Run],
        held: int,
        candidates: list[_Run],
        now: datetime,
    ) -> tuple[list[_Run], float | None, datetime]:
        """The runs an unpartitioned claim takes (J3, F1, F2, F3): (chosen, its rate_wait, their
        start time: the rate's, else now)."""
        limit = request.limit
        # J3: max_running counts every running run, whichever worker holds it, live lease or
        # lapsed (a lapsed one keeps its slot until a claim retakes it): so the bound never
        # depends on when a lapsed holder's heartbeat is refused. Due runs take only free slots;
        # retaking a lapsed run moves its slot.
        cap = request.max_running
        room = limit if cap is None else max(min(limit, cap - held), 0)
        # F2: a fair claim shares the room it may find (before the rate's cut) across tenants.
        rank: dict[str, int] | None = None
        if request.fairness is not None:
            rank = self._fair_ranks(request, live, candidates, now, room)
        started_at, rate_room = self._rate_window(request, now)
        if rate_room is not None:
            room, limit = min(room, rate_room), min(limit, rate_room)
        aged = None if request.aging is None else (request.aging, now)
        chosen = _choose(candidates, room, limit, rank, aged)
        rate_wait = self._record_starts(request, started_at, len(chosen))
        return chosen, rate_wait, started_at if rate_room is not None else now

    def _end_lapsed(
        self, lapsed: list[_Run], max_lapses: int | None, now: datetime
    ) -> list[BuriedRun]:
        """The lapsed runs a claim ends instead of retaking (J6, J15, K2): cancelled when a
        cancel was requested, else dead (a crash loop, or the final attempt); the buried ones."""
        buried: list[BuriedRun] = []
        for run in lapsed:
            crash_loop = _crash_loops(run, max_lapses)
            run.lapses += 1  # J15: every lapse a claim meets
            run.consecutive_lapses += 1
            if run.cancel_requested_at is not None:
                # K2: a cancel-requested run is never retaken, whatever attempts it has left.
                self._append_history(run, CANCEL_LAPSED_MESSAGE, now, kind="cancelled")
                self._finish(run, "cancelled", now)
                continue
            if crash_loop:
                assert max_lapses is not None  # noqa: S101 - _crash_loops checked it
                # J15: a crash loop ends here, whatever attempts the run has left.
                self._append_history(run, crash_loop_message(max_lapses), now, kind="lapsed")
            else:
                self._append_history(run, LEASE_LAPSED_FINAL_MESSAGE, now, kind="lapsed")
            self._finish(run, "dead", now)
            buried.append(
                BuriedRun(run.run_id, run.job_id, run.attempt, run.key, crash_loop=crash_loop)
            )
        return buried

    def _rate_window(self, request: ClaimRequest, now: datetime) -> tuple[datetime, int | None]:
        """F3: the claim's start time (never before the job's last recorded one) and the
        starts its rate window still allows (None: no rate limit), the window trimmed."""
        rate, starts = request.rate_limit, self._starts.setdefault(request.job_id, [])
        started_at = max(now, starts[-1][0]) if starts else now
        if rate is None:
            return started_at, None
        since = started_at - timedelta(seconds=rate.period)
        starts[:] = [(at, n) for at, n in starts if at > since]
        return started_at, rate.limit - sum(n for _, n in starts)

    def _record_starts(self, request: ClaimRequest, started_at: datetime, n: int) -> float | None:
        """F3: record this claim's ``n`` starts; when the window is full, seconds until its
        oldest start leaves it (the claim's ``rate_wait``), else None."""
        rate = request.rate_limit
        if rate is None:
            return None
        starts = self._starts[request.job_id]
        starts.append((started_at, n))
        if sum(count for _, count in starts) < rate.limit:
            return None
        oldest = min(at for at, count in starts if count > 0)
        return (oldest + timedelta(seconds=rate.period) - started_at).total_seconds()

    def _fair_ranks(
        self,
        request: ClaimRequest,
        live: Iterable[_Run],
        candidates: list[_Run],
        now: datetime,
        room: int,
    ) -> dict[str, int]:
        """F2, the PostgreSQL backend's CLAIM_FAIR: the tenants with waiting runs from the one
        after this job's cursor (wrapping round, at most ``max_tenants``; untenanted runs one
        more tenant), each one's due runs counted (:func:`counted_for_shares`, up to the
        limit), the room shared out
        (:func:`fair_shares`), each tenant's oldest due runs taken: run id -> its rank in its
        tenant's share (1, 2, ...)."""
        fairness = request.fairness
        assert fairness is not None  # noqa: S101 - only called for fair claims
        waiting = [run for run in live if run.state == "waiting"]
        named = sorted({run.tenant for run in waiting if run.tenant is not None})
        after = self._fair_cursors.pop(request.job_id, None)
        onward = [tenant for tenant in named if after is None or tenant > after]
        wrapped = [tenant for tenant in named if after is not None and tenant <= after]
        walked = (onward + wrapped)[: fairness.max_tenants]
        if len(walked) == fairness.max_tenants:
            self._fair_cursors[request.job_id] = walked[-1]
        visited: list[str | None] = [*walked]
        due_of: dict[str | None, int] = {}
        for run in waiting:
            if run.run_at <= now:
                due_of[run.tenant] = due_of.get(run.tenant, 0) + 1
        if due_of.get(None):
            visited.append(None)
        weights = [fairness.weight_of(tenant) for tenant in visited]
        counts = counted_for_shares(
            [
                (min(due_of.get(tenant, 0), request.limit), request.limit, weight)
                for tenant, weight in zip(visited, weights, strict=True)
            ],
            room,
        )
        fair = fair_shares(list(zip(counts, weights, strict=True)), room)
        shares = dict(zip(visited, fair, strict=True))
        takeable: dict[str | None, list[_Run]] = {}
        for run in candidates:
            if run.state == "waiting" and shares.get(run.tenant, 0) > 0:
                takeable.setdefault(run.tenant, []).append(run)
        rank: dict[str, int] = {}
        for tenant, runs in takeable.items():
            oldest = heapq.nsmallest(shares[tenant], runs, key=lambda run: (run.run_at, run.seq))
            for place, run in enumerate(oldest, start=1):
                rank[run.run_id] = place
        return rank

    # --- what the workflow store reaches (one rule each, here) ----------------------------------

    @property
    def stored_runs(self) -> dict[str, _Run]:
        """Every stored run by id, live or (J16) in history (the workflow store and the admin
        port read and link them)."""
        return {**self._history, **self._runs} if self._history else self._runs

    async def require_support(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """J18: what each job's completed runs leave in history (its :class:`Retention`)."""
        self._keeps.update((job.id, history_keep(job.retention)) for job in definitions)

    def _to_history(self, run: _Run) -> None:
        """J16: ``run`` ended: it leaves the live runs for history, slim (J18): a completed
        run keeps its payload only when its job asks or it stored workflow steps, and leaves
        no row at all under ``Retention(completed=timedelta(0))``."""
        self._runs.pop(run.run_id, None)
        run.last_worker = run.worker
        keep = self._keeps.get(run.job_id, KEEP_ROW)
        if run.state == "completed":
            if keep == KEEP_NONE:
                return
            if keep != KEEP_PAYLOAD and not self._workflows.has_steps(run.run_id):
                run.payload_json = None
                run.trace_context = None
        self._history[run.run_id] = run

    def back_from_history(self, run: _Run) -> None:
        """J16, J8: a dead run an operator retries moves back to the live runs."""
        if self._history.pop(run.run_id, None) is not None:
            run.last_worker = None  # a live run's record shows no finished attempt
            self._runs[run.run_id] = run

    def current_run(self, claimed: ClaimedRun) -> _Run | None:
        """The stored run while ``claimed``'s token is current (J5), else None."""
        return self._current(claimed)

    def to_waiting(self, run: _Run, run_at: datetime, now: datetime) -> None:
        self._to_waiting(run, run_at, now)

    def make_due(self, run: _Run) -> None:
        """A waiting run is due now (its event came, or its children ended: D4, D5)."""
        now = self._clock.now()
        run.run_at = min(run.run_at, now)
        run.updated_at = now

    def rerun(self, run: _Run) -> None:
        """D6: a dead run waits again with one more attempt, a waiting one is due now (its
        ``run_at`` now, as RERUN_FROM_STEP sets it, even when it was due earlier)."""
        now = self._clock.now()
        run.consecutive_lapses = 0  # J15: an operator's rerun starts a new streak
        if run.state == "dead":
            run.max_attempts = run.attempt + 1
            run.finished_at = None
            self.back_from_history(run)
            self._live.setdefault(run.job_id, {})[run.run_id] = run
            self._to_waiting(run, now, now)
        else:
            run.run_at = now
            run.updated_at = now
        self.wake()

    def _current(self, claimed: ClaimedRun) -> _Run | None:
        """The stored run while ``claimed``'s token is current (J5), else None."""
        run = self._runs.get(claimed.run_id)
        if run is None or run.state != "running" or run.token != claimed.token:
            return None
        return run

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> HeartbeatBatch:
        now = self._clock.now()
        alive: list[bool] = []
        cancel_requested: list[str] = []
        for claimed in runs:
            run = self._current(claimed)
            # A lapsed lease is never revived: a claim may retake the run at any moment.
            if run is None or run.lease_expires_at is None or run.lease_expires_at <= now:
                alive.append(False)
                continue
            # J18: updated_at stays the attempt's start (a lapse's history entry reads it).
            run.lease_expires_at = now + timedelta(seconds=claimed.lease)
            alive.append(True)
            if run.cancel_requested_at is not None:
                cancel_requested.append(run.run_id)
        return HeartbeatBatch(alive, cancel_requested)

    # --- the fenced transaction (J13, J14) ----------------------------------------------------

    async def _fence(self, run: ClaimedRun) -> FenceAnswer:
        tx = required_transaction("a run's fence")
        holder = self._fenced.get(run.run_id)
        stored = self._current(run)
        # A row another open transaction locked: PostgreSQL would wait for it to end, and the
        # run is then completed or retaken by then; either way this claim is not current.
        if stored is None or (holder is not None and holder is not tx):
            return "stale"
        if stored.cancel_requested_at is not None:
            return "cancel-requested"
        if holder is None:
            self._fenced[run.run_id] = tx

            def release() -> None:
                if self._fenced.get(run.run_id) is tx:
                    del self._fenced[run.run_id]

            tx.on_end(release)
        return "held"

    async def _settle_joined(self, settlement: Settlement) -> SettleOutcome:
        tx = required_transaction("a settle within the handler's transaction")
        if self._fenced.get(settlement.run.run_id) is not tx:
            # Only a fenced run's settle is held back to the commit; anything else is stale.
            return "stale" if self._current(settlement.run) is None else self._unfenced(settlement)
        # The run is fenced: nothing else changes it before the commit, so the settle is decided
        # now and applied as the transaction commits (as its UPDATE would become visible).
        answer = settlement.landed(settlement.state)
        tx.on_commit(lambda: self._apply_committed(settlement))
        return answer

    def _unfenced(self, settlement: Settlement) -> SettleOutcome:
        raise ConfigurationError(
            f"run {settlement.run.run_id!r} was settled within a transaction that did not fence"
            " it first.",
            fix="call fence(run) first in the same transaction (the runtime does).",
        )

    def _apply_committed(self, settlement: Settlement) -> None:
        outcome = self._settle_one(settlement, self._clock.now())
        if settlement.makes_due(outcome, self._clock.now()):
            self.wake()

    async def _record_progress(self, run: ClaimedRun, progress_json: str) -> bool:
        tx = required_transaction("a run's progress")
        holder = self._fenced.get(run.run_id)
        if self._current(run) is None or (holder is not None and holder is not tx):
            return False  # stale, or locked by another transaction (see _fence)
        progress = json.loads(progress_json)

        def apply() -> None:
            # As the UPDATE becomes visible at the commit: only while the claim still holds.
            stored = self._current(run)
            if stored is not None:
                stored.progress = progress

        tx.on_commit(apply)
        return True

    async def claim_state(self, run: ClaimedRun) -> str | None:
        stored = self._runs.get(run.run_id)
        if stored is None:
            # J16: an ended run is in history, which keeps no claim token: its end is the
            # answer when it ended at this claim's attempt (CLAIM_STATE_EITHER's rule).
            ended = self._history.get(run.run_id)
            return None if ended is None or ended.attempt != run.attempt else ended.state
        if stored.token != run.token:
            return None
        return stored.state

    async def _settle_if_tokens_current(
        self, settlements: Sequence[SettleRequest]
    ) -> list[SettleOutcome]:
        now = self._clock.now()
        return [self._settle_one(settlement, now) for settlement in settlements]

    def _settle_one(self, settlement: SettleRequest, now: datetime) -> SettleOutcome:
        """Apply one settlement as built (the kernel decided everything); the one rule of the
        store's own is K2's: once a cancel was requested, anything but a completion ends the
        run cancelled."""
        run = self._current(settlement.run)
        if run is None:
            return "stale"
        _end_wait(run, settlement)
        if isinstance(settlement, Suspend):
            run.consecutive_lapses = 0  # J15: the handler reached a suspend
            problem = unstorable_step(settlement.step)
            if problem is not None:
                # J23: where PostgreSQL would refuse the suspension, the run alone fails.
                refusal = settle_refusal(settlement, ValueError(problem))
                self.report_error(refusal)
                return self._apply(run, refused(settlement, refusal), now)
            if run.cancel_requested_at is None:
                return self._workflows.suspend(run, settlement, now)
            self._finish(run, "cancelled", now)
            return "cancelled"
        return self._apply(run, settlement, now)

    def _apply(self, run: _Run, settlement: Settlement, now: datetime) -> SettleOutcome:
        state = settlement.state
        if not settlement.keeps_lapses:
            run.consecutive_lapses = 0  # J15: an end the handler reached ends the streak
        if state != "completed" and run.cancel_requested_at is not None:
            state = "cancelled"  # K2: whatever else raced the request, the run ends here
        entry = settlement.entry
        if entry is not None:
            self._append_history(run, entry.error, now, kind=entry.kind)
        if state == "waiting":
            assert settlement.run_at is not None  # noqa: S101 - a waiting settlement has its time
            # J7, K4: a release or a snooze never spent its attempt; the next claim takes the
            # same number again. A snooze is counted (the executor bounds the count).
            if not settlement.spends_attempt:
                run.attempt -= 1
            run.snoozes += settlement.snoozes_added
            self._to_waiting(run, settlement.run_at, now)
            run.wait_for = settlement.wait_for  # D10: a parked run waits for "#diverged"
        else:
            self._finish(run, state, now)
        return settlement.landed(state)

    def _append_history(self, run: _Run, error: str, now: datetime, *, kind: HistoryKind) -> None:
        """The entry of ``run``'s attempt that just ended (failed, lapsed, released with an
        error...), before any claim changes the run: J18, its start (a running run's
        ``updated_at``, the start its claim recorded, which nothing else writes while it runs)
        and its worker, as PostgreSQL's ``{began}`` and ``claimed_by``."""
        run.history.append(
            {
                "attempt": run.attempt,
                "at": now.isoformat(),
                "error": error,
                "kind": kind,
                "started": run.updated_at.isoformat(),
                "worker": run.worker,
            }
        )
        run.last_error = error

    def _to_waiting(self, run: _Run, run_at: datetime, now: datetime) -> None:
        run.state = "waiting"
        run.run_at = run_at
        run.lease_expires_at = None
        run.worker = None
        run.updated_at = now
        self._waiting[run.job_id] = self._waiting.get(run.job_id, 0) + 1

    def _finish(self, run: _Run, state: RunState, now: datetime) -> None:
        """Move ``run`` to terminal ``state``; terminal runs leave the live set for good."""
        if run.state == "waiting":
            self._waiting[run.job_id] -= 1
        run.state = state
        run.finished_at = now
        run.updated_at = now
        run.lease_expires_at = None
        worker, run.worker = run.worker, None
        self._live[run.job_id].pop(run.run_id, None)
        if run.dedupe_key is not None and self._dedupe.get((run.job_id, run.dedupe_key)) == (
            run.run_id
        ):
            del self._dedupe[(run.job_id, run.dedupe_key)]
        self._workflows.ended(run)
        if self.live_only:
            run.worker = worker
            self._to_history(run)
            run.worker = None

    # --- schedules (J9; the rules are in kernel/_plans/scheduled_runs.py) -----------------------

    async def install_schedules(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """One state per scheduled job; an unchanged trigger keeps its ``next_at`` (J9)."""
        for job_id, trigger, next_at in schedule_states(
            installable(definitions), self._clock.now()
        ):
            stored = self._schedules.get(job_id)
            if stored is None or stored[0] != trigger:
                self._schedules[job_id] = (trigger, next_at)

    async def tick_schedules(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire ONE run per due schedule through the insert path, uncapped (J9, see
        :mod:`~ship_sqla.kernel._plans.scheduled_runs`), and advance it."""
        now = self._clock.now()
        created = 0
        for job, schedule in scheduled_only(definitions):
            stored = self._schedules.get(job.id)
            if stored is None or stored[0] != schedule.trigger:
                continue
            runs, next_at = fire_due(job, schedule, stored[1], now)
            if not runs:
                continue
            self._schedules[job.id] = (stored[0], next_at)
            results = self._insert_all(job.id, runs, capped=False)
            created += sum(not result.deduplicated for result in results)
        return created

    def next_at(self, job_id: str) -> datetime | None:
        """The stored next occurrence of ``job_id``'s schedule (None: not scheduled)."""
        stored = self._schedules.get(job_id)
        return stored[1] if stored is not None else None

    # --- J10's queue gauges -------------------------------------------------------------------

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """J10's queue gauges (:meth:`InMemoryRunAdmin.queue_depths`)."""
        return await self._admin.queue_depths(job_ids)

    async def parked_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """D10's gauge (the run administration's ``parked_counts``)."""
        return await self._admin.parked_counts(job_ids)

    async def version_counts(
        self, job_ids: Sequence[str] | None = None, *, limit: int = MAX_VERSION_ROWS
    ) -> list[VersionCount]:
        """D9's counts (:meth:`InMemoryRunAdmin.version_counts`)."""
        return await self._admin.version_counts(job_ids, limit=limit)

    async def storage_health(self) -> StorageHealth:
        """J22: runs kept in this process have no tables, vacuum or snapshots to report:
        :data:`~ship_sqla.kernel._health.UNKNOWN_HEALTH` (``status`` ``"unknown"``, never an
        alarm)."""
        return UNKNOWN_HEALTH

    # --- inspection (the model for property tests; no operator verbs here) --------------------

    def runs(self, job_id: str | None = None) -> list[RunRecord]:
        """A snapshot of every stored run (of ``job_id`` when given), in creation order."""
        return [
            run.record()
            for run in self.stored_runs.values()
            if job_id is None or run.job_id == job_id
        ]

    def waiting_count(self, job_id: str) -> int:
        """Runs of ``job_id`` in state waiting, due or delayed: what J2 compares to the limit."""
        return self._waiting.get(job_id, 0)


def _finished_order(run: _Run) -> tuple[datetime, str]:
    assert run.finished_at is not None  # noqa: S101 - terminal runs are finished
    return run.finished_at, run.run_id


class InMemoryRunAdmin:
    """:class:`~ship_sqla.kernel.RunAdmin` over one :class:`InMemoryJobBackend`'s runs. It
    checks no permission (J8 is :class:`~ship_sqla.kernel.JobOperations`' gate)."""

    __slots__ = ("_backend",)

    def __init__(self, backend: InMemoryJobBackend) -> None:
        self._backend = backend

    async def get_run(self, run_id: str) -> RunRecord | None:
        run = self._backend.stored_runs.get(run_id)
        return run.record() if run is not None else None

    async def list_dead(self, query: DeadQuery) -> list[RunRecord]:
        """Dead runs (of ``query.job_id``), newest first by ``(finished_at, run_id)``, after
        ``query.after``."""
        dead = [
            run
            for run in self._backend.stored_runs.values()
            if run.state == "dead"
            and (query.job_id is None or run.job_id == query.job_id)
            and (query.tenant is None or run.tenant == query.tenant)
        ]
        after = query.after
        if after is not None:
            dead = [run for run in dead if _finished_order(run) < after]
        return [run.record() for run in heapq.nlargest(query.limit, dead, key=_finished_order)]

    async def retry_dead(self, run_id: str) -> RunRecord | None:
        """A dead run gets one more attempt and waits, due now (J8). None when the run is not
        dead, or when its dedupe key is now held by another non-terminal run (J1)."""
        backend = self._backend
        run = backend.stored_runs.get(run_id)
        if run is None or run.state != "dead":
            return None
        if run.dedupe_key is not None and (run.job_id, run.dedupe_key) in backend._dedupe:  # noqa: SLF001
            return None
        now = backend.clock.now()
        run.max_attempts = run.attempt + 1
        run.consecutive_lapses = 0  # J15: a retried run starts a new streak
        run.finished_at = None
        backend.back_from_history(run)
        backend._live.setdefault(run.job_id, {})[run.run_id] = run  # noqa: SLF001
        if run.dedupe_key is not None:
            backend._dedupe[(run.job_id, run.dedupe_key)] = run.run_id  # noqa: SLF001
        backend._to_waiting(run, now, now)  # noqa: SLF001
        backend.wake()  # J3: a retry wakes the local loop
        return run.record()

    async def discard(self, run_id: str) -> RunRecord | None:
        """A waiting or dead run becomes discarded (J8). None otherwise."""
        backend = self._backend
        run = backend.stored_runs.get(run_id)
        if run is None or run.state not in ("waiting", "dead"):
            return None
        now = backend.clock.now()
        if run.state == "dead":
            run.state = "discarded"
            run.finished_at = now
            run.updated_at = now
        else:
            backend._finish(run, "discarded", now)  # noqa: SLF001
        return run.record()

    async def cancel(self, run_id: str) -> RunRecord | None:
        """K2: a waiting run becomes cancelled; a running one is marked cancel-requested (the
        first request's time is kept) and this backend's watchers are told. None when the run
        is terminal or unknown: nothing changed."""
        backend = self._backend
        run = backend._runs.get(run_id)  # noqa: SLF001
        if run is None or run.state not in ("waiting", "running"):
            return None
        now = backend.clock.now()
        if run.state == "waiting":
            backend._finish(run, "cancelled", now)  # noqa: SLF001
            return run.record()
        if run.cancel_requested_at is None:
            run.cancel_requested_at = now  # J18: updated_at stays the attempt's start
        backend._cancel_requested(run.run_id)  # noqa: SLF001
        return run.record()

    async def retry_dead_batch(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`retry_dead` of each, in order (no statements to save here)."""
        return [run_id for run_id in run_ids if await self.retry_dead(run_id) is not None]

    async def discard_batch(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`discard` of each, in order."""
        return [run_id for run_id in run_ids if await self.discard(run_id) is not None]

    async def cancel_batch(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`cancel` of each, in order."""
        return [run_id for run_id in run_ids if await self.cancel(run_id) is not None]

    async def job_known(self, job_id: str) -> bool:
        """Whether this backend holds any trace of ``job_id``: a run in any state, its
        schedule, its pause, or its rate limit's recent starts (issue 25)."""
        backend = self._backend
        return bool(
            job_id in backend._paused  # noqa: SLF001
            or job_id in backend._schedules  # noqa: SLF001
            or job_id in backend._starts  # noqa: SLF001
            or backend._live.get(job_id)  # noqa: SLF001
            or any(run.job_id == job_id for run in backend.stored_runs.values())
        )

    # --- D10: parked runs ------------------------------------------------------------------

    def _parked(self, job_id: str | None) -> list[_Run]:
        return sorted(
            (
                run
                for run in self._backend._runs.values()  # noqa: SLF001
                if run.wait_for == DIVERGED
                and run.state == "waiting"
                and (job_id is None or run.job_id == job_id)
            ),
            key=lambda run: (run.job_id, run.run_id),
        )

    async def list_parked(
        self, *, job_id: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[RunRecord]:
        """D10: one keyset page of parked runs, as LIST_PARKED."""
        runs = [r for r in self._parked(job_id) if after is None or (r.job_id, r.run_id) > after]
        return [run.record() for run in runs[:limit]]

    async def parked_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """D10: parked runs per job of ``job_ids``, as PARKED_COUNTS."""
        counts: dict[str, int] = {}
        wanted = frozenset(job_ids)
        for run in self._parked(None):
            if run.job_id in wanted:
                counts[run.job_id] = counts.get(run.job_id, 0) + 1
        return counts

    async def unpark(self, run_id: str) -> RunRecord | None:
        """D10: the parked run ``run_id`` is due now (None: it is not parked)."""
        run = self._backend._runs.get(run_id)  # noqa: SLF001
        if run is None or run.wait_for != DIVERGED or run.state != "waiting":
            return None
        self._make_due(run)
        self._backend.wake()
        return run.record()

    async def move_version(self, run_id: str, version: int) -> RunRecord | None:
        """D10: the parked run ``run_id`` moved to handler ``version`` and due now (None: it is
        not parked)."""
        run = self._backend._runs.get(run_id)  # noqa: SLF001
        if run is None or run.wait_for != DIVERGED or run.state != "waiting":
            return None
        run.handler_version = version
        self._make_due(run)
        self._backend.wake()
        return run.record()

    def _make_due(self, run: _Run) -> None:
        now = self._backend.clock.now()
        run.wait_for = None
        run.run_at = now
        run.updated_at = now

    async def claim_build_unpark(self, job_id: str, build_id: str) -> bool:
        """D10: True when ``build_id`` is not already the job's last unparking build."""
        builds = self._backend._unparked_by  # noqa: SLF001
        if builds.get(job_id) == build_id:
            return False
        builds[job_id] = build_id
        return True

    async def unpark_batch(self, job_id: str, *, limit: int) -> int:
        """D10: at most ``limit`` parked runs of ``job_id`` due now, as UNPARK_BATCH."""
        batch = self._parked(job_id)[:limit]
        for run in batch:
            self._make_due(run)
        if batch:
            self._backend.wake()
        return len(batch)

    async def pause(self, job_id: str) -> bool:
        """K3: claims of ``job_id`` take nothing until :meth:`resume`; False if already paused."""
        paused = self._backend._paused  # noqa: SLF001
        if job_id in paused:
            return False
        paused[job_id] = self._backend.clock.now()
        return True

    async def resume(self, job_id: str) -> bool:
        """K3: ``job_id``'s runs are claimable again; wakes the local loop. False if it was not
        paused."""
        if self._backend._paused.pop(job_id, None) is None:  # noqa: SLF001
            return False
        self._backend.wake()
        return True

    async def paused(self, *, limit: int) -> list[PausedJob]:
        """The paused jobs by job id, at most ``limit``."""
        paused = self._backend._paused  # noqa: SLF001
        return [PausedJob(job_id, paused[job_id]) for job_id in sorted(paused)[:limit]]

    async def delete_finished(
        self, job_id: str, state: RunState, *, older_than: timedelta, limit: int
    ) -> int:
        """Delete at most ``limit`` runs of ``job_id`` in terminal ``state`` finished at least
        ``older_than`` ago, oldest first; the number deleted."""
        backend = self._backend
        cutoff = backend.clock.now() - older_than
        doomed = heapq.nsmallest(
            limit,
            (
                run
                for run in backend._runs.values()  # noqa: SLF001
                if run.job_id == job_id
                and run.state == state
                and run.finished_at is not None
                and run.finished_at <= cutoff
            ),
            key=_finished_order,
        )
        for run in doomed:
            del backend._runs[run.run_id]  # noqa: SLF001
        return len(doomed)

    async def partition_waits(
        self, limits: Sequence[PartitionLimits], *, max_partitions: int, cap: int
    ) -> list[PartitionWait]:
        """F8/F9 seen: the PostgreSQL backend's PARTITION_WAITS over the model's runs: per job,
        the partitions with waiting runs (tenant order, at most ``max_partitions``; the
        untenanted runs one more when any is due), each measured and judged by the kernel."""
        backend = self._backend
        now = backend.clock.now()
        found: list[PartitionWait] = []
        for job in limits:
            runs = list(backend._live.get(job.job_id, {}).values())  # noqa: SLF001
            of = _partition_of(job.by)
            waiting = [run for run in runs if run.state == "waiting"]
            named = sorted({part for run in waiting if (part := of(run)) is not None})
            parts: list[str | None] = [*named[:max_partitions]]
            if any(of(run) is None and run.run_at <= now for run in waiting):
                parts.append(None)
            for part in parts:
                due = sum(1 for run in waiting if of(run) == part and run.run_at <= now)
                running = min(
                    sum(1 for run in runs if run.state == "running" and of(run) == part),
                    job.max_running or 0,
                )
                starts = backend._partition_starts.get((job.job_id, part), [])  # noqa: SLF001
                started, oldest = window_measure(starts, now, job.rate_period or 0.0)
                wait = judge(
                    job,
                    part,
                    due=min(due, cap),
                    running=running,
                    started=started if job.rate_limit is not None else 0,
                    oldest_start=oldest,
                    cap=cap,
                )
                if wait is not None:
                    found.append(wait)
        return found

    async def demand(
        self, job_ids: Sequence[str] | None, *, cap: int, max_jobs: int
    ) -> list[JobDemand]:
        """F5: the PostgreSQL backend's DEMAND, over the model's runs."""
        now = self._backend.clock.now()
        counts: dict[str, list[int]] = {job_id: [0, 0, 0] for job_id in job_ids or ()}
        oldest: dict[str, datetime] = {}
        for run in self._backend._runs.values():  # noqa: SLF001
            if run.state not in ("waiting", "running"):
                continue
            if job_ids is not None and run.job_id not in counts:
                continue
            row = counts.setdefault(run.job_id, [0, 0, 0])
            if run.state == "running":
                row[2] += 1
            elif run.run_at <= now:
                row[0] += 1
                first = oldest.get(run.job_id)
                if first is None or run.run_at < first:
                    oldest[run.job_id] = run.run_at
            else:
                row[1] += 1
        chosen = sorted(counts, key=lambda job_id: job_id.encode())
        if job_ids is None:
            chosen = chosen[:max_jobs]
        return [
            JobDemand(
                job_id,
                min(counts[job_id][0], cap),
                min(counts[job_id][1], cap),
                min(counts[job_id][2], cap),
                (now - oldest[job_id]).total_seconds() if job_id in oldest else None,
                cap,
            )
            for job_id in chosen
        ]

    async def dead_by_job(self, *, cap: int, max_jobs: int) -> list[JobFailures]:
        """The PostgreSQL backend's DEAD_BY_JOB, over the model's runs (history included)."""
        dead: dict[str, int] = {}
        newest: dict[str, tuple[datetime, datetime | None]] = {}
        for run in self._backend.stored_runs.values():
            if run.state != "dead":
                continue
            dead[run.job_id] = dead.get(run.job_id, 0) + 1
            seen = newest.get(run.job_id)
            if seen is None or run.created_at > seen[0]:
                newest[run.job_id] = (run.created_at, run.finished_at)
        chosen = sorted(dead, key=lambda job_id: job_id.encode())[:max_jobs]
        return [
            JobFailures(job_id, min(dead[job_id], cap), dead[job_id] >= cap, newest[job_id][1])
            for job_id in chosen
        ]

    async def state_counts(self, *, limit: int) -> list[StateCount]:
        """Runs per (job, state), ordered by job then state, at most ``limit`` groups."""
        now = self._backend.clock.now()
        counts: dict[tuple[str, RunState], int] = {}
        oldest: dict[str, datetime] = {}
        for run in self._backend.stored_runs.values():
            group = (run.job_id, run.state)
            counts[group] = counts.get(group, 0) + 1
            if run.state == "waiting" and run.run_at <= now:
                first = oldest.get(run.job_id)
                if first is None or run.run_at < first:
                    oldest[run.job_id] = run.run_at
        return [
            StateCount(
                job_id,
                state,
                runs,
                (now - oldest[job_id]).total_seconds()
                if state == "waiting" and job_id in oldest
                else None,
            )
            for (job_id, state), runs in sorted(counts.items())[:limit]
        ]

    async def version_counts(
        self, job_ids: Sequence[str] | None = None, *, limit: int = MAX_VERSION_ROWS
    ) -> list[VersionCount]:
        """D9: live runs per (job, handler version, state), as VERSION_COUNTS counts them."""
        wanted = None if job_ids is None else frozenset(job_ids)
        counts: dict[tuple[str, int, str], int] = {}
        for run in self._backend._runs.values():  # noqa: SLF001
            version = run.handler_version
            if version is None or run.state not in ("waiting", "running"):
                continue
            if wanted is None or run.job_id in wanted:
                key = (run.job_id, version, run.state)
                counts[key] = counts.get(key, 0) + 1
        return [
            VersionCount(job_id, version, cast("LiveState", state), runs)
            for (job_id, version, state), runs in sorted(counts.items())[:limit]
        ]

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """J10's queue gauges: waiting runs per job and the age of the oldest due one."""
        now = self._backend.clock.now()
        depths = dict.fromkeys(job_ids, 0)
        oldest: dict[str, datetime] = {}
        for run in self._backend._runs.values():  # noqa: SLF001
            if run.state != "waiting" or run.job_id not in depths:
                continue
            depths[run.job_id] += 1
            if run.run_at <= now and (run.job_id not in oldest or run.run_at < oldest[run.job_id]):
                oldest[run.job_id] = run.run_at
        return {
            job_id: QueueDepth(
                depth, (now - oldest[job_id]).total_seconds() if job_id in oldest else 0.0
            )
            for job_id, depth in depths.items()
        }

    # --- the dashboard's reads (RunBrowser, S2) -----------------------------------------------

    async def list_runs(self, query: RunQuery, *, max_jobs: int) -> list[BrowsedRun]:
        """Runs in ``query.state`` in the state's order (see
        :class:`~ship_sqla.kernel._browse.RunQuery`): waiting in claim order, running by
        ``(lease_expires_at, run_id)``, completed newest finished first by ``(finished_at,
        run_id)`` (J18), the other finished states newest first by ``(created_at, run_id)``;
        across jobs, of the first ``max_jobs`` job ids with runs in the state."""
        matching = [run for run in self._backend.stored_runs.values() if run.state == query.state]
        if query.job_id is not None:
            matching = [run for run in matching if run.job_id == query.job_id]
        else:
            jobs = set(sorted({run.job_id for run in matching})[:max_jobs])
            matching = [run for run in matching if run.job_id in jobs]
        order = run_order(query.state)
        picked = [
            run
            for run in matching
            if (query.tenant is None or run.tenant == query.tenant)
            and _in_time(_order_time(run, order), query.time_from, query.time_to)
        ]
        after = query.after
        if order == "claim":
            if isinstance(after, ClaimPosition):
                start = (-after.priority, after.run_at, after.seq)
                picked = [run for run in picked if _claim_order(run) > start]
            page = heapq.nsmallest(query.limit, picked, key=_claim_order)
        elif order == "lease":
            if isinstance(after, LeasePosition):
                past = (after.lease_expires_at, after.run_id)
                picked = [run for run in picked if _lease_order(run) > past]
            page = heapq.nsmallest(query.limit, picked, key=_lease_order)
        else:
            if isinstance(after, CreatedPosition | FinishedPosition):
                before = (
                    (after.created_at, after.run_id)
                    if isinstance(after, CreatedPosition)
                    else (after.finished_at, after.run_id)
                )
                picked = [run for run in picked if _newest_key(run, order) < before]
            page = heapq.nlargest(query.limit, picked, key=lambda run: _newest_key(run, order))
        return [BrowsedRun(run.record(), run.seq) for run in page]

    async def throughput(
        self, *, bucket_seconds: int, buckets: int, cap: int, max_jobs: int
    ) -> list[ThroughputBucket]:
        """Runs completed and dead per bucket ending now, each job's count capped at ``cap``."""
        now = self._backend.clock.now()
        width = timedelta(seconds=bucket_seconds)
        starts = [now - (buckets - i) * width for i in range(buckets)]
        counts: dict[tuple[int, str], list[int]] = {}
        finished = [
            run
            for run in self._backend.stored_runs.values()
            if run.finished_at is not None and run.state in TERMINAL_STATES
        ]
        jobs = set(sorted({run.job_id for run in finished})[:max_jobs])
        for run in finished:
            assert run.finished_at is not None  # noqa: S101 - filtered above
            if run.job_id not in jobs or not starts[0] <= run.finished_at < now:
                continue
            index = min(int((run.finished_at - starts[0]) / width), buckets - 1)
            seen = counts.setdefault((index, run.job_id), [0, 0, 0])
            if seen[0] >= cap:
                continue
            seen[0] += 1
            seen[1] += run.state == "completed"
            seen[2] += run.state == "dead"
        result = []
        for index, start in enumerate(starts):
            groups = [c for (i, _), c in counts.items() if i == index]
            result.append(
                ThroughputBucket(
                    start,
                    sum(c[1] for c in groups),
                    sum(c[2] for c in groups),
                    any(c[0] >= cap for c in groups),
                )
            )
        return result

    async def consumer_progress(
        self, *, limit: int, after: tuple[str, str] | None = None
    ) -> list[ConsumerKeyProgress]:
        """Each (consumer, key)'s newest run with progress, and its live run (C3)."""
        newest: dict[tuple[str, str], _Run] = {}
        live: dict[tuple[str, str], _Run] = {}
        for run in self._backend.stored_runs.values():
            if run.key is None:
                continue
            pair = (run.job_id, run.key)
            if after is not None and pair <= after:
                continue
            if run.progress is not None and (pair not in newest or newest[pair].seq < run.seq):
                newest[pair] = run
            if run.dedupe_key == run.key and run.state in ("waiting", "running"):
                live[pair] = run
        result = []
        for pair in sorted(newest)[:limit]:
            run, now_live = newest[pair], live.get(pair)
            assert run.progress is not None  # noqa: S101 - selected above
            result.append(
                ConsumerKeyProgress(
                    job_id=pair[0],
                    key=pair[1],
                    run_id=run.run_id,
                    state=run.state,
                    progress=dict(run.progress),
                    live_run_id=None if now_live is None else now_live.run_id,
                    live_state=None if now_live is None else now_live.state,
                )
            )
        return result

    async def schedule_states(self, *, limit: int) -> list[ScheduleState]:
        """The scheduled jobs' stored (trigger, next occurrence), by job id."""
        stored = self._backend._schedules  # noqa: SLF001
        return [
            ScheduleState(job_id, stored[job_id][0], stored[job_id][1])
            for job_id in sorted(stored)[:limit]
        ]
