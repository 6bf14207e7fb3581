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

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs

from ship_sqla.kernel._errors import ShipError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._jobs import JobDefinition

__all__ = [
    "LEASE_LAPSED",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "TERMINAL_STATES",
    "BuriedRun",
    "ClaimBatch",
    "ClaimedRun",
    "EnqueueRequest",
    "EnqueueResult",
    "JobBackend",
    "JobLeaseLapsedError",
    "JobLeaseLapsedFinalError",
    "JobLeaseStaleError",
    "Lock",
    "LockProvider",
    "QueueDepth",
    "QueueDepthSource",
    "RenewableLock",
    "RunRecord",
    "RunState",
    "SettleOutcome",
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
    """One run to enqueue, for ``enqueue_many``. ``payload`` is the job's typed payload. A
    backend passes every request through :func:`ship_sqla.kernel._plans.prepare.prepare_run` (codec,
    JSON, NUL, size, ``run_at``, run id and dedupe key checks) before writing anything."""

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
    """A backend that can count its queues (J10's ``ship.job.queue.depth`` and
    ``ship.job.queue.oldest_waiting_age``). Both backends are; a worker runtime with metrics
    samples it every ``DEPTH_SAMPLE_INTERVAL`` seconds."""

    async def queue_depths(self, job_ids: Sequence[str]) -> dict[str, QueueDepth]:
        """Every job of ``job_ids``, also those with an empty queue (depth 0)."""
        ...


@runtime_checkable
class JobBackend(Protocol):
    """Stores runs and hands them out. Every method is safe to call from many processes."""

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
        """Insert one run (J1 dedupe, J2 queue-full). Joins the active unit of work (U1/U2);
        a committed enqueue wakes the local loop after commit (J3)."""
        ...

    async def enqueue_many(
        self,
        job: JobDefinition[Any],
        requests: Sequence[EnqueueRequest],
        *,
        scope: Any = None,  # noqa: ANN401
    ) -> list[EnqueueResult]:
        """Insert many runs of one job in one statement; results in request order."""
        ...

    async def claim(
        self,
        job: JobDefinition[Any],
        *,
        worker: str,
        limit: int,
        exclude_keys: Sequence[str] = (),
    ) -> list[ClaimedRun]:
        """Claim up to ``limit`` due runs, honouring ``concurrency.max`` across processes (J3):
        a job never has more than ``concurrency.max`` running runs, whatever their leases.

        Lapsed leases are retaken (J6), the lapsed attempt recorded in the run's history
        (``LEASE_LAPSED_MESSAGE``); one that lapsed on its final attempt is dead-lettered
        instead (``LEASE_LAPSED_FINAL_MESSAGE``). Answer a :class:`ClaimBatch` whose ``buried``
        lists those dead-lettered runs, so the runtime reports and counts them (a plain list
        is read as "none buried").
        """
        ...

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> list[bool]:
        """Extend each run's lease by its job's ``concurrency.lease``; False where the token is
        stale or the lease has lapsed (a lapsed lease is never revived: its holder must stop,
        because a claim may retake the run at any moment)."""
        ...

    async def complete(self, runs: Sequence[ClaimedRun]) -> list[SettleOutcome]:
        """Mark runs completed, each only while its token is current ("stale" otherwise)."""
        ...

    async def fail(
        self, run: ClaimedRun, error: str, *, retry_at: datetime | None
    ) -> SettleOutcome:
        """Record a failed attempt in the run's history. ``retry_at`` None or attempts spent:
        "dead"; otherwise "retrying" (waiting again at ``retry_at``). Fenced on the token."""
        ...

    async def release(
        self, run: ClaimedRun, *, run_at: datetime, error: str | None = None
    ) -> SettleOutcome:
        """Return a claimed run to waiting at ``run_at`` without consuming its attempt
        (JOB_LOCK_HELD, J7; a drain cancellation, J12). ``error``, when given, is appended to the
        run's history and becomes ``last_error`` (a cancelled attempt keeps its history).
        Fenced on the token: "released", or "stale" with nothing changed."""
        ...

    async def wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109 - the poll interval
        """Return when a local enqueue/retry committed, or after ``timeout`` seconds (J3)."""
        ...
