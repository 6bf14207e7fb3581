"""The seam between the job runtime and where runs are stored (ADR-0015 ``JobBackend``).

The runtime never sees SQL: it calls these methods. Two implementations pass one conformance
suite: :class:`ship_sqla.kernel.InMemoryJobBackend` (the reference, and the model for property
tests) and the PostgreSQL backend from :func:`ship_sqla.create_job_backend`.

Run lifecycle::

    waiting --claim--> running --complete--> completed
       ^                 |  \\--fail (attempts left)--> waiting (run_at = retry time)
       |                 |   \\--fail (last attempt) / lease lapsed on last attempt--> dead
       |                 \\--release (JOB_LOCK_HELD: attempt not consumed)--> waiting
       \\--------- operator retry (dead -> waiting, one more attempt)
    waiting / dead --operator discard--> discarded

``completed``, ``dead`` and ``discarded`` are terminal: no claim ever returns them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from ship_sqla.kernel._errors import ShipError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime, timedelta

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._metrics import JobMetrics
    from ship_sqla.kernel._plans.prepare import PreparedRun

__all__ = [
    "LEASE_LAPSED",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "TERMINAL_STATES",
    "BuriedRun",
    "ClaimBatch",
    "ClaimRequest",
    "ClaimedRun",
    "Complete",
    "DeadQuery",
    "EnqueueRequest",
    "EnqueueResult",
    "Fail",
    "JobBackend",
    "JobLeaseLapsedError",
    "JobLeaseLapsedFinalError",
    "JobLeaseStaleError",
    "Lock",
    "LockProvider",
    "QueueDepth",
    "QueueDepthSource",
    "Release",
    "RenewableLock",
    "RunAdmin",
    "RunRecord",
    "RunState",
    "RunStore",
    "ScheduleStore",
    "SettleOutcome",
    "Settlement",
    "StateCount",
]

RunState = Literal["waiting", "running", "completed", "dead", "discarded"]
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "dead", "discarded"})

LEASE_LAPSED_FINAL_ATTEMPT = "SHIP_SQLA_JOB_LEASE_LAPSED_FINAL_ATTEMPT"
"""The error recorded on a run dead-lettered because its lease lapsed on its final attempt (J6)."""
LEASE_LAPSED = "SHIP_SQLA_JOB_LEASE_LAPSED"
"""The error recorded for an attempt whose lease lapsed before it settled (J6): in the history of
a run retaken after the lapse, and on a run the runtime did not start because its lease had
lapsed before its handler could begin."""

LEASE_LAPSED_FINAL_MESSAGE = (
    f"{LEASE_LAPSED_FINAL_ATTEMPT}: the run's lease lapsed on its final attempt (its worker died"
    " or stopped heartbeating); it was dead-lettered instead of being run again."
)
"""The history entry (and ``last_error``) of a run a claim dead-lettered (J6), on every backend."""
LEASE_LAPSED_MESSAGE = (
    f"{LEASE_LAPSED}: the attempt's lease lapsed before it settled (its worker died or stopped"
    " heartbeating); the run was retaken as a new attempt."
)
"""The history entry (and ``last_error``) of the lapsed attempt of a run a claim retook (J6)."""


class JobLeaseStaleError(ShipError, RuntimeError):
    """A settle (complete/fail/release/heartbeat) carried a fencing token that is no longer
    current: the lease lapsed and another worker may hold the run. Nothing was changed (J5)."""

    code = "SHIP_SQLA_JOB_LEASE_STALE"


class JobLeaseLapsedError(ShipError, RuntimeError):
    """A claimed run's lease lapsed before this process could start its handler (its loop was
    blocked, or the claim's answer came back too late): the run was not executed here and was
    handed back (J6). Nothing ran; the run is retaken."""

    code = LEASE_LAPSED


class JobLeaseLapsedFinalError(JobLeaseLapsedError):
    """A claim dead-lettered a run whose lease lapsed on its final attempt (J6): its worker died
    or stopped heartbeating, and no attempt is left. Counted in ``ship.job.dead_letter.count``
    (J10); the run's history records the lapsed attempt."""

    code = LEASE_LAPSED_FINAL_ATTEMPT


@attrs.frozen
class EnqueueRequest:
    """One run to enqueue, for ``enqueue_many``. ``payload`` is the job's typed payload. The
    enqueue front passes every request through
    :func:`ship_sqla.kernel._plans.prepare.prepare_runs` (codec, JSON, NUL, size, ``run_at``, run
    id and dedupe key checks; ids and ``max_attempts``) before a store sees any."""

    payload: Any
    dedupe_key: str | None = None
    run_at: datetime | None = None
    run_id: str | None = None
    """A caller-chosen durable id (schedules use ``<job_id>/<occurrence>``); generated if None."""


@attrs.frozen
class EnqueueResult:
    """What enqueue did. Exactly one of: a new run, a deduplicated existing run, a rejection."""

    run_id: str | None
    deduplicated: bool = False
    rejected: Literal["queue-full"] | None = None

    @property
    def accepted(self) -> bool:
        return self.rejected is None


@attrs.frozen
class ClaimedRun:
    """A run handed to a worker. ``token`` fences every later settle of this claim (J5)."""

    run_id: str
    job_id: str
    payload: Any
    attempt: int
    max_attempts: int
    token: int
    key: str | None
    lease_expires_at: datetime
    created_at: datetime
    lease: float
    """The lease this claim was granted, in seconds: every heartbeat of the run extends it by as
    much (the store keeps no per-job memory of leases)."""


@attrs.frozen
class BuriedRun:
    """A run a claim dead-lettered instead of returning it: its lease lapsed on its final
    attempt ``attempt`` (J6). The runtime reports it (:class:`JobLeaseLapsedFinalError`) and
    counts it as a dead letter (J10)."""

    run_id: str
    job_id: str
    attempt: int
    key: str | None


class ClaimBatch(list[ClaimedRun]):
    """What ``claim`` answers: the claimed runs, in claim order (it IS that list, so callers
    that only want the runs use it as one), plus ``buried``, the runs the same claim
    dead-lettered (J6), which the runtime reports and counts (J10)."""

    __slots__ = ("buried",)

    def __init__(
        self, claimed: Iterable[ClaimedRun] = (), buried: Iterable[BuriedRun] = ()
    ) -> None:
        super().__init__(claimed)
        self.buried: tuple[BuriedRun, ...] = tuple(buried)

    def __repr__(self) -> str:
        return f"ClaimBatch({list(self)!r}, buried={self.buried!r})"


def buried_of(claimed: Sequence[ClaimedRun]) -> tuple[BuriedRun, ...]:
    """The runs a claim dead-lettered: ``claimed.buried`` for a :class:`ClaimBatch`, nothing for a
    plain list (a backend written before claims reported them)."""
    return claimed.buried if isinstance(claimed, ClaimBatch) else ()


SettleOutcome = Literal["completed", "retrying", "dead", "released", "stale"]


@attrs.frozen
class RunRecord:
    """A run as operators see it, with its history of failed attempts.

    ``history`` holds one JSON object per failed or cancelled attempt, oldest first:
    ``{"attempt": int, "at": ISO-8601 text, "error": str}``.
    """

    run_id: str
    job_id: str
    state: RunState
    payload: Any
    attempt: int
    max_attempts: int
    key: str | None
    dedupe_key: str | None
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    lease_expires_at: datetime | None
    last_error: str | None
    history: tuple[Any, ...] = ()


@runtime_checkable
class Lock(Protocol):
    """A held lock. ``lost`` becomes true when the lease ended before ``release`` (L2)."""

    @property
    def lost(self) -> bool: ...

    async def release(self) -> None: ...


@runtime_checkable
class RenewableLock(Lock, Protocol):
    """A lock whose lease can be extended. The runtime extends a single-runner lock at every
    heartbeat of its run, so a run longer than ``concurrency.lease`` keeps its exclusion; a lock
    without ``extend`` holds only for the lease it was acquired with."""

    async def extend(self, lease: float) -> bool:
        """Restart the lease at ``lease`` seconds from now; False (nothing held) once ``lost``."""
        ...


@runtime_checkable
class LockProvider(Protocol):
    """Cross-process mutual exclusion with a lease (L1, L2)."""

    async def acquire(self, key: str, lease: float) -> Lock | None:
        """The lock, or None when another holder has it. ``lease`` is in seconds."""
        ...


@attrs.frozen
class QueueDepth:
    """One job's queue as the J10 gauges report it: ``depth`` runs waiting (due or delayed,
    not claimed), and ``oldest_due_age`` seconds since the oldest due one became due (0 when
    none is due)."""

    depth: int
    oldest_due_age: float


@runtime_checkable
class QueueDepthSource(Protocol):
    """What J10's queue gauges (``ship.job.queue.depth``, ``ship.job.queue.oldest_waiting_age``)
    are sampled from; every :class:`RunAdmin` is one."""

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """Every job of ``job_ids``, also those with an empty queue (depth 0)."""
        ...


@attrs.frozen
class ClaimRequest:
    """One claim, as the runtime asks it: up to ``limit`` due runs of ``job_id`` for ``worker``,
    never more than ``max_running`` (the job's ``concurrency.max``) running runs of the job at
    once across every process, each leased for ``lease`` seconds, none whose single-runner key is
    in ``exclude_keys`` (J3, J4)."""

    job_id: str
    worker: str
    limit: int
    max_running: int
    lease: float
    exclude_keys: tuple[str, ...] = ()


@attrs.frozen
class Complete:
    """Settle ``run`` as completed."""

    run: ClaimedRun


@attrs.frozen
class Fail:
    """Record a failed attempt of ``run`` in its history (``error``): waiting again at
    ``retry_at``, or dead when ``retry_at`` is None or the attempts are spent (J7)."""

    run: ClaimedRun
    error: str
    retry_at: datetime | None


@attrs.frozen
class Release:
    """Return ``run`` to waiting at ``run_at`` without spending its attempt (JOB_LOCK_HELD, J7;
    a drain or a lapse, J12); ``error``, when given, is appended to the history."""

    run: ClaimedRun
    run_at: datetime
    error: str | None = None


Settlement: TypeAlias = Complete | Fail | Release
"""What a worker asks a store to do with a claimed run. Every settlement is fenced on the run's
token (J5): a stale one changes nothing and is answered ``"stale"``."""


@runtime_checkable
class RunStore(Protocol):
    """Storage of runs: the port the runtime and the enqueue front use. It receives prepared
    values (:class:`~ship_sqla.kernel._plans.prepare.PreparedRun`, :class:`ClaimRequest`,
    :class:`Settlement`) and computes no rule of its own beyond what it stores. Every method is
    safe to call from many processes."""

    async def insert(
        self,
        job: JobDefinition[Any],
        runs: Sequence[PreparedRun],
        *,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
    ) -> list[EnqueueResult]:
        """Store prepared runs of ``job``, results in order: J1 dedupe (by run id, then dedupe
        key among the job's live runs), J2 queue-full (a hard cap). Joins the active unit of
        work (U1/U2); a committed due run wakes the local loop after commit (J3)."""
        ...

    async def claim(self, request: ClaimRequest) -> ClaimBatch:
        """Claim up to ``request.limit`` due runs (J3): a job never has more than
        ``request.max_running`` running runs, whatever their leases. Lapsed leases are retaken
        (J6), the lapsed attempt recorded in the history (``LEASE_LAPSED_MESSAGE``); one that
        lapsed on its final attempt is dead-lettered instead (``LEASE_LAPSED_FINAL_MESSAGE``)
        and listed in the batch's ``buried``."""
        ...

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> list[bool]:
        """Extend each run's lease by ``run.lease`` seconds; False where the token is stale or
        the lease has lapsed (a lapsed lease is never revived, J5)."""
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> list[SettleOutcome]:
        """Apply many settlements, of any kinds, in one round trip where the store can; one
        outcome per settlement, in order: ``"completed"``, ``"retrying"``, ``"dead"``,
        ``"released"``, or ``"stale"`` (its token was not current: nothing changed, J5)."""
        ...

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109 - the poll interval
        """Return when a local enqueue/retry committed, or after ``timeout`` seconds (J3)."""
        ...

    def wake(self) -> None:
        """Wake this process's waiters now (an operator retry or a local settle made a run due)."""
        ...


@runtime_checkable
class ScheduleStore(Protocol):
    """Storage of schedules (J9): one state row per scheduled job."""

    async def install_schedules(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """Upsert one state row per scheduled job; an unchanged trigger keeps its ``next_at``."""
        ...

    async def tick_schedules(self, definitions: Iterable[JobDefinition[Any]]) -> int:
        """Fire each due occurrence once (SKIP LOCKED; catch-up is ONE run); the runs created."""
        ...


@attrs.frozen
class DeadQuery:
    """A page of dead runs, newest first by ``(finished_at, run_id)``: of ``job_id`` (None:
    every job), at most ``limit``, strictly after ``after`` (the last item of the page before)."""

    limit: int
    job_id: str | None = None
    after: tuple[datetime, str] | None = None


@attrs.frozen
class StateCount:
    """One (job, state) group of the runs table, for stats: how many runs, and for waiting
    runs the age in seconds of the oldest due one (None when none is due)."""

    job_id: str
    state: RunState
    runs: int
    oldest_due_age: float | None


@runtime_checkable
class RunAdmin(QueueDepthSource, Protocol):
    """Administration of stored runs (J8): the port the operator surface
    (:class:`~ship_sqla.kernel.JobOperations`) gates. It checks no permission itself."""

    async def get_run(self, run_id: str) -> RunRecord | None: ...

    async def list_dead(self, query: DeadQuery) -> list[RunRecord]:
        """At most ``query.limit`` dead runs, newest first (see :class:`DeadQuery`)."""
        ...

    async def retry_dead(self, run_id: str) -> RunRecord | None:
        """A dead run waits again, due now, with exactly one more attempt; None (nothing
        changed) when the run is not dead or a newer live run holds its dedupe key (J1)."""
        ...

    async def discard(self, run_id: str) -> RunRecord | None:
        """A waiting or dead run becomes discarded; None (nothing changed) otherwise."""
        ...

    async def delete_finished(
        self, job_id: str, state: RunState, *, older_than: timedelta, limit: int
    ) -> int:
        """Delete at most ``limit`` runs of ``job_id`` in terminal ``state`` finished longer
        than ``older_than`` ago (one bounded statement); the number deleted."""
        ...

    async def state_counts(self, *, limit: int) -> list[StateCount]:
        """Runs per (job, state), at most ``limit`` groups ordered by job then state."""
        ...


@runtime_checkable
class JobBackend(RunStore, Protocol):
    """What :func:`~ship_sqla.kernel.start_job_runtime` runs on: a :class:`RunStore` with the
    options every backend shares (:class:`~ship_sqla.kernel._backend_base.JobBackendBase`)
    and the enqueue front built once above the seam on :meth:`RunStore.insert`. Both backends
    also implement :class:`ScheduleStore` and :class:`QueueDepthSource`, and carry their
    :class:`RunAdmin` apart, as ``backend.admin`` (the port the operator surface gates)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def lock_provider(self) -> LockProvider | None: ...

    @property
    def poll_interval(self) -> float:
        """Seconds between polls when no local wake arrives (J3)."""
        ...

    @property
    def max_in_flight(self) -> int:
        """Process-wide cap on runs executing at once in one runtime (J3)."""
        ...

    @property
    def metrics(self) -> JobMetrics:
        """J10's instruments (the global meter provider's unless the backend was given one)."""
        ...

    def report_error(self, error: BaseException) -> None:
        """Hand an error the loop absorbed to the application's ``on_error`` (J11); never raises."""
        ...

    async def enqueue(
        self,
        job: JobDefinition[Any],
        payload: Any,  # noqa: ANN401 - the job's typed payload
        *,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        run_id: str | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
    ) -> EnqueueResult:
        """Prepare one run and :meth:`~RunStore.insert` it."""
        ...

    async def enqueue_many(
        self,
        job: JobDefinition[Any],
        requests: Sequence[EnqueueRequest],
        *,
        scope: Any = None,  # noqa: ANN401
    ) -> list[EnqueueResult]:
        """Prepare many runs of one job (all or none) and :meth:`~RunStore.insert` them."""
        ...
