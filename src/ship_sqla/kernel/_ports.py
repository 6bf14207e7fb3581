"""The seam between the job runtime and where runs are stored (ADR-0015 ``JobBackend``).

The runtime never sees SQL: it calls these methods. Two implementations pass one conformance
suite: :class:`ship_sqla.kernel.InMemoryJobBackend` (the reference, and the model for property
tests) and the PostgreSQL backend from :func:`ship_sqla.create_job_backend`.

Run lifecycle::

    waiting --claim--> running --complete--> completed
       ^                 |  \\--fail (attempts left)--> waiting (run_at = retry time)
       |                 |   \\--fail (last attempt, or terminal) / lapsed on last attempt--> dead
       |                 |\\--snooze (attempt not consumed, one more snooze, K4)--> waiting
       |                 \\--release (JOB_LOCK_HELD: attempt not consumed)--> waiting
       \\--------- operator retry (dead -> waiting, one more attempt)
    waiting / dead --operator discard--> discarded
    waiting --operator cancel--> cancelled
    running --operator cancel--> running, cancel requested --the holder's cancellation (or any
        settlement but a complete), or a claim after its lease lapsed--> cancelled (K2)

``completed``, ``dead``, ``discarded`` and ``cancelled`` are terminal: no claim ever returns them
again.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Final,
    Literal,
    Protocol,
    get_args,
    runtime_checkable,
)

import attrs

from ship_sqla.kernel._attempts import attempt_records
from ship_sqla.kernel._browse import RunBrowser
from ship_sqla.kernel._errors import ConfigurationError, StaleLeaseError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import datetime, timedelta

    from ship_sqla.kernel._attempts import AttemptRecord
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._jobs import Fairness, JobDefinition, PartitionBy, RateLimit
    from ship_sqla.kernel._metrics import JobOutcome
    from ship_sqla.kernel._partition_waits import PartitionLimits, PartitionWait
    from ship_sqla.kernel._plans.prepare import PreparedRun
    from ship_sqla.kernel._priority import Aging
    from ship_sqla.kernel._settlement import Settlement, SettleRequest
    from ship_sqla.kernel._workers import WorkerRegistry
    from ship_sqla.kernel._workflows import NewStep, Workflows

__all__ = [
    "FAILURE_KINDS",
    "FINISHED_STATES",
    "LEASE_LAPSED",
    "LEASE_LAPSED_CRASH_LOOP",
    "LEASE_LAPSED_FINAL_ATTEMPT",
    "MAX_CLAIM_BATCH",
    "RUN_CANCELLED",
    "RUN_STATES",
    "TERMINAL_STATES",
    "BuriedRun",
    "CancelRequestSource",
    "ClaimBatch",
    "ClaimRequest",
    "ClaimedRun",
    "DeadQuery",
    "EnqueueRequest",
    "EnqueueResult",
    "FailureKind",
    "HeartbeatBatch",
    "HistoryKind",
    "JobBackend",
    "JobCrashLoopError",
    "JobDemand",
    "JobFailures",
    "JobLeaseLapsedError",
    "JobLeaseLapsedFinalError",
    "JobLeaseStaleError",
    "Lock",
    "LockProvider",
    "PausedJob",
    "QueueDepth",
    "QueueDepthSource",
    "RenewableLock",
    "RunAdmin",
    "RunRecord",
    "RunState",
    "RunStore",
    "ScheduleStore",
    "SettleOutcome",
    "StateCount",
    "Suspend",
    "WakeSource",
    "crash_loop_message",
]

RunState = Literal["waiting", "running", "completed", "dead", "discarded", "cancelled"]
RUN_STATES: Final[tuple[RunState, ...]] = get_args(RunState)
"""Every run state, in lifecycle order: the runs table's CHECK constraint, the operator
surface's filters and the stats' columns all read this one tuple."""
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "dead", "discarded", "cancelled"})
FINISHED_STATES: Final[tuple[RunState, ...]] = tuple(
    state for state in RUN_STATES if state in TERMINAL_STATES
)
"""The terminal states in lifecycle order (a stable order for SQL text and page filters)."""

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
LEASE_LAPSED_CRASH_LOOP = "SHIP_SQLA_JOB_CRASH_LOOP"
"""The error recorded on a run dead-lettered because its lease lapsed ``retry.max_lapses`` times
in a row (J15): a crash loop."""


def crash_loop_message(max_lapses: int) -> str:
    """The history entry (and ``last_error``) of a run a claim dead-lettered at its
    ``max_lapses``-th consecutive lapse (J15), on every backend."""
    return (
        f"{LEASE_LAPSED_CRASH_LOOP}: the run's lease lapsed {max_lapses} times in a row (each"
        " time its worker died, was killed or stopped heartbeating while it ran: a crash loop),"
        f" reaching retry.max_lapses ({max_lapses}); it was dead-lettered instead of being run"
        " again, whatever attempts it had left. Find what kills the process (an OOM kill, a"
        " crash in native code, os._exit, a handler blocking the event loop for longer than"
        " concurrency.lease), fix it, then retry the run; raise retry.max_lapses if such"
        " lapses are expected."
    )


RUN_CANCELLED = "SHIP_SQLA_JOB_RUN_CANCELLED"
"""The error recorded on a run an operator cancelled while it ran (K2)."""
CANCELLED_MESSAGE = (
    f"{RUN_CANCELLED}: an operator cancelled the run while it was running; its handler was"
    " cancelled and the run ended cancelled (not a failure: it is not retried)."
)
"""The history entry (and ``last_error``) of a cancelled attempt whose handler stopped (K2)."""
CANCEL_LAPSED_MESSAGE = (
    f"{RUN_CANCELLED}: an operator cancelled the run while it was running, and its lease lapsed"
    " before its holder settled it (its worker died or stopped heartbeating); the claim ended it"
    " cancelled instead of retaking it."
)
"""The history entry (and ``last_error``) of a cancel-requested run whose lease lapsed: a claim
ends it cancelled, never retakes it (K2), on every backend."""


class JobLeaseStaleError(StaleLeaseError, RuntimeError):
    """A settle (complete/fail/release/heartbeat) carried a fencing token that is no longer
    current: the lease lapsed and another worker may hold the run. Nothing was changed (J5)."""

    code = "SHIP_SQLA_JOB_LEASE_STALE"


class JobLeaseLapsedError(StaleLeaseError, RuntimeError):
    """A claimed run's lease lapsed before this process could start its handler (its loop was
    blocked, or the claim's answer came back too late): the run was not executed here and was
    handed back (J6). Nothing ran; the run is retaken."""

    code = LEASE_LAPSED


class JobCrashLoopError(JobLeaseLapsedError):
    """A claim dead-lettered a run whose lease lapsed ``retry.max_lapses`` times in a row (J15):
    its handler killed its worker (or the worker died) each time it ran, whatever attempts were
    left. Counted in ``ship.job.dead_letter.count`` (J10); the run's history records each lapse
    and ``lapses`` / ``consecutive_lapses`` count them."""

    code = LEASE_LAPSED_CRASH_LOOP


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
    priority: int | None = None
    """The run's priority (K6: higher first, -10 to 10); None: the job definition's."""
    partition_key: str | None = None
    """F8/F9: the run's partition key, for a job whose limits are per key; None: the job's
    ``partition_key`` function of the payload, if any, else no key."""


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
    snoozes: int = 0
    """How many times the run snoozed before this claim (K4): the executor compares it with the
    job's ``retry.max_snoozes`` before it asks for another snooze."""
    priority: int = 0
    """The run's priority (K6)."""
    trace_context: Mapping[str, str] | None = None
    """The W3C trace context its enqueue stored (``traceparent``, ``tracestate``; K7): the
    parent of every attempt's span. None when no span was current at the enqueue."""
    tenant: str | None = None
    """The tenant the run was enqueued for (F2), None for none: the handler runs in it."""
    lapses: int = 0
    """J15: how many claims found the run's lease lapsed (this claim included when it
    retook the run: :attr:`retaken`)."""
    consecutive_lapses: int = 0
    """J15: the lapses since the run's handler last settled it (a release does not reset it)."""
    retaken: bool = False
    """J6, J15: this claim retook the run from a holder whose lease lapsed (one more lapse)."""
    handler_version: int | None = None
    """D9: the handler version the run was enqueued under (None: an unversioned job's run, or
    one stored before versions existed); only that version's handler executes it."""
    run_at: datetime | None = None
    """When the run was due at this claim (#36's queue wait: the claim, ``lease_expires_at``
    minus ``lease``, less this); None where the backend does not say."""


@attrs.frozen
class BuriedRun:
    """A run a claim dead-lettered instead of returning it: its lease lapsed on its final
    attempt ``attempt`` (J6), or, ``crash_loop``, at its ``retry.max_lapses``-th lapse in a row
    (J15). The runtime reports it (:class:`JobLeaseLapsedFinalError`,
    :class:`JobCrashLoopError`) and counts it as a dead letter (J10) and a lapse (J15)."""

    run_id: str
    job_id: str
    attempt: int
    key: str | None
    crash_loop: bool = False
    """J15: dead at ``retry.max_lapses`` consecutive lapses (else: the final attempt lapsed)."""


class ClaimBatch(list[ClaimedRun]):
    """What ``claim`` answers: the claimed runs, in claim order (it IS that list, so callers
    that only want the runs use it as one), plus ``buried``, the runs the same claim
    dead-lettered (J6), which the runtime reports and counts (J10)."""

    __slots__ = ("buried", "more_due", "rate_wait")

    def __init__(
        self,
        claimed: Iterable[ClaimedRun] = (),
        buried: Iterable[BuriedRun] = (),
        *,
        rate_wait: float | None = None,
        more_due: bool = False,
    ) -> None:
        super().__init__(claimed)
        self.buried: tuple[BuriedRun, ...] = tuple(buried)
        self.rate_wait = rate_wait
        """F3: the claim left the job's rate window full: seconds until another run may start
        (the runtime claims the job again then, not at its next poll). None otherwise."""
        self.more_due = more_due
        """F2/F8/F9: the claim's tenant walk stopped at its ``max_tenants``, so tenants past
        it were not visited and may have due runs though this claim came back short (the
        runtime claims again at once when it started something, not at its next poll)."""

    def __repr__(self) -> str:
        return f"ClaimBatch({list(self)!r}, buried={self.buried!r}, rate_wait={self.rate_wait!r})"


class HeartbeatBatch(list[bool]):
    """What ``heartbeat`` answers: per run, in order, whether its lease is still the holder's
    (True: extended; False: its token is stale or its lease lapsed, and the holder must stop; it
    IS that list), plus ``cancel_requested``, the ids of the held runs an operator asked to
    cancel (K2): their holder cancels the handler and settles them cancelled."""

    __slots__ = ("cancel_requested",)

    def __init__(self, held: Iterable[bool] = (), cancel_requested: Iterable[str] = ()) -> None:
        super().__init__(held)
        self.cancel_requested: frozenset[str] = frozenset(cancel_requested)

    def __repr__(self) -> str:
        return f"HeartbeatBatch({list(self)!r}, cancel_requested={set(self.cancel_requested)!r})"


SettleOutcome = Literal[
    "completed",
    "duplicate",
    "retrying",
    "dead",
    "released",
    "cancelled",
    "snoozed",
    "suspended",
    "parked",
    "stale",
    "refused",
]
"""A store's answer to one settlement: its own ``answer`` as built, ``"cancelled"`` (K2),
``"stale"`` (J5), or ``"refused"``: the database refused to store it (a value it cannot hold),
and the run was failed for good instead, the refusal in its history (J23)."""

FailureKind = Literal["failure", "terminal", "retry-after", "timeout"]
"""How a failed attempt ended (K4, K5), the ``kind`` of its history entry: ``"failure"`` (an
exception: the policy's backoff), ``"terminal"`` (``TerminalError`` or a type the policy names
non-retryable: dead now), ``"retry-after"`` (``RetryAfter``: the named delay, an attempt spent),
``"timeout"`` (the job's ``timeout`` passed: ``SHIP_SQLA_JOB_TIMEOUT``, the policy's backoff)."""
FAILURE_KINDS: frozenset[str] = frozenset(get_args(FailureKind))

HistoryKind = Literal[
    FailureKind, "snooze", "released", "lapsed", "cancelled", "duplicate", "diverged"
]
"""The ``kind`` of a history entry (:class:`RunRecord`): a :data:`FailureKind`; ``"snooze"`` (a
snooze, no attempt spent); ``"released"`` (a release carrying an error: a drain or a lost
lock cancelled the attempt, J12); ``"lapsed"`` (the attempt's lease lapsed, J6);
``"cancelled"`` (an operator cancelled the run, K2); ``"duplicate"`` (a transactional job's
inbox key was completed before: the run completed without calling its handler, J13);
``"diverged"`` (its workflow handler diverged from its history and the run parked, D10: the
entry's error is the divergence's text, a JSON line of it last)."""


@attrs.frozen
class RunRecord:
    """A run as operators see it, with its history of failed attempts.

    ``history`` holds one JSON object per attempt that did not complete (failed, snoozed,
    released with an error, lapsed...), oldest first:
    ``{"attempt": int, "at": ISO-8601 text, "error": str, "kind": HistoryKind, "started":
    ISO-8601 text, "worker": str | None}`` (entries written before ``kind`` existed have no
    ``kind``; before J18's per-attempt times, no ``started`` nor ``worker``); :attr:`entries`
    reads them typed. ``snoozes`` counts the run's snoozes (K4);
    ``lapses`` the claims that found its lease lapsed (its worker died) and ``consecutive_lapses``
    those since its handler last settled it (J15).
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
    snoozes: int = 0
    cancel_requested_at: datetime | None = None
    """When an operator asked to cancel the run while it was running (K2); None otherwise (a
    waiting run is cancelled at once, without a request)."""
    priority: int = 0
    """The run's priority (K6: higher first)."""
    tenant: str | None = None
    """The tenant the run was enqueued for (F2), None for none."""
    parent_id: str | None = None
    """D5: the workflow run that spawned this one (None: none); its end wakes the parent."""
    wait_for: str | None = None
    """D4, D5: what a suspended workflow run waits for (an event's wait key, or
    ``"#children"``); None otherwise."""
    lapses: int = 0
    """J15: how many claims found the run's lease lapsed (retook or buried it)."""
    consecutive_lapses: int = 0
    """J15: the lapses since its handler last settled it (``RetryPolicy.max_lapses`` bounds it);
    a release (drain, hand-back, lock held) leaves it as it was, an operator's retry resets it."""
    progress: Mapping[str, Any] | None = None
    """C3: a consumer's per-key run's last committed batch, as its batch's transaction recorded
    it (:meth:`FencedRuns.record_progress`): ``{"lag": int | None, "last_batch_at": ISO-8601
    text, "batch_items": int, "batches": int, "items": int}`` (the counts are this run's); None
    for every other run, and for a consumer run before its first batch. Kept when the run
    ends."""
    handler_version: int | None = None
    """D9: the handler version the run was enqueued under (None: unversioned)."""
    started_at: datetime | None = None
    """J18: when the run's last attempt started (its claim), for run time and queue wait; known
    for a running run and for a run that ended with a history table (J16), else None (an
    earlier attempt's start is in its history entry: :attr:`entries`)."""
    worker: str | None = None
    """The worker that holds the run (running), or that ran its last attempt (a finished run
    in history, J18); None otherwise."""

    @property
    def entries(self) -> tuple[AttemptRecord, ...]:
        """:attr:`history` typed (J18): each entry's attempt, end, error, kind, start and
        worker, so an attempt's run time (:attr:`AttemptRecord.run_time`) and the first
        attempt's queue wait (its ``started`` minus ``run_at``, until a retry moves
        ``run_at``) are known; a key an older entry lacks reads None."""
        return attempt_records(self.history)


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


MAX_CLAIM_BATCH: Final = 1000
"""The most runs one claim asks for (J3): a runtime with more free slots claims again. The
PostgreSQL claim bounds its index scans by this constant instead of by the request's limit, so
its estimates are the same in every execution and PostgreSQL keeps one generic plan at any
backlog (a parameter LIMIT is costed at a tenth of the backlog in a generic plan, which made it
plan every claim afresh: about 1 ms each at 100,000 waiting runs)."""


def _claim_limit(_request: object, _attribute: object, limit: int) -> None:
    if limit > MAX_CLAIM_BATCH:
        raise ConfigurationError(
            f"a claim's limit is {limit}, more than one claim takes ({MAX_CLAIM_BATCH},"
            " MAX_CLAIM_BATCH).",
            fix="ask for at most MAX_CLAIM_BATCH runs and claim again for the rest (the"
            " runtime does).",
        )


@attrs.frozen
class ClaimRequest:
    """One claim, as the runtime asks it: up to ``limit`` due runs of ``job_id`` for ``worker``,
    never more than ``max_running`` (the job's ``concurrency.max``; None: no cap) running runs of
    the job at once across every process, each leased for ``lease`` seconds, none whose
    single-runner key is in ``exclude_keys`` (J3, J4, F1), within ``rate_limit`` (F3)."""

    job_id: str
    worker: str
    limit: int = attrs.field(validator=_claim_limit)
    """At most :data:`MAX_CLAIM_BATCH` (a store answers at most that many)."""
    max_running: int | None
    lease: float
    exclude_keys: tuple[str, ...] = ()
    rate_limit: RateLimit | None = None
    """F3: the job's rate limit (at most ``limit`` starts per ``period`` across every process),
    or None."""
    fairness: Fairness | None = None
    """F2: share the claim across tenants (the job's ``Fairness``), or None."""
    partition: PartitionBy | None = None
    """F8/F9: ``max_running`` and ``rate_limit`` hold per partition (``"tenant"``: the tenant
    each run was enqueued for), not for the whole job; the claim shares its room across the
    partitions as a fair claim does (F2: by ``fairness``' weights, else equally)."""
    aging: Aging | None = None
    """F10: the job's priority aging (due runs by effective priority), or None."""
    max_lapses: int | None = None
    """J15: the job's ``retry.max_lapses``: a lapsed run whose lapse would be its ``max_lapses``-th
    in a row is dead-lettered (``crash_loop``), not retaken; None: no such bound."""


@attrs.frozen
class Suspend:
    """D3: a workflow run sleeps or waits: back to waiting WITHOUT spending its attempt (no
    history entry, no snooze counted), not claimable until its wake time, its event (D4) or
    its children's end (D5). ``step`` is the waiting step to store (a new one; one already
    stored is kept as it is, its wake time and the instant its wait began included). The store
    decides the run's ``run_at``: the sleep's wake time; for an event wait, now when a matching
    event committed since the wait began, else its timeout; for children, now when none is
    live, else a recheck (:data:`~ship_sqla.kernel._workflows.CHILDREN_RECHECK`)."""

    run: ClaimedRun
    step: NewStep
    wait: Literal["sleep", "event", "children"]

    answer: ClassVar[SettleOutcome] = "suspended"
    """What the store answers when the suspend lands, as a settlement's."""
    recorded: ClassVar[JobOutcome] = "suspended"
    """The ``ship.job.runs`` outcome of the attempt (J10), as a settlement's."""
    label: ClassVar[str] = "suspend"
    """How a stale report names it, as a settlement's."""


@runtime_checkable
class RunStore(Protocol):
    """Storage of runs: the port the runtime and the enqueue front use. It receives prepared
    values (:class:`~ship_sqla.kernel._plans.prepare.PreparedRun`, :class:`ClaimRequest`, a
    :class:`~ship_sqla.kernel._settlement.Settlement`) and computes no rule of its own beyond
    what it stores. Every method is safe to call from many processes."""

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
        and listed in the batch's ``buried``. Every lapse a claim meets adds one to the run's
        ``lapses`` and ``consecutive_lapses`` (J15); one that makes ``consecutive_lapses`` reach
        ``request.max_lapses`` dead-letters the run (:func:`crash_loop_message`, ``buried``
        with ``crash_loop``) whatever attempts it has left."""
        ...

    async def heartbeat(self, runs: Sequence[ClaimedRun]) -> HeartbeatBatch:
        """Extend each run's lease by ``run.lease`` seconds; False where the token is stale or
        the lease has lapsed (a lapsed lease is never revived, J5). The answer's
        ``cancel_requested`` names the held runs an operator asked to cancel (K2): a lease whose
        cancel was requested is still extended, so no claim retakes the run while its handler
        stops."""
        ...

    async def settle(self, settlements: Sequence[SettleRequest]) -> list[SettleOutcome]:
        """Apply many settlements, of any kinds, in one round trip where the store can; one
        outcome per settlement, in order: ``"completed"``, ``"retrying"``, ``"dead"``,
        ``"released"``, ``"snoozed"``, ``"suspended"`` (each settlement's own ``answer``),
        ``"cancelled"`` (a cancellation, or any settlement but a completion of a run whose
        cancel was requested, K2: :meth:`~ship_sqla.kernel._settlement.Settlement.landed`), or
        ``"stale"`` (its token was not current: nothing changed, J5). A store applies each
        settlement's fields and decides nothing else (retry or dead was decided when it was
        built)."""
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
    tenant: str | None = None
    """F2: only runs enqueued for this tenant (None: every run, tenanted or not)."""


@attrs.frozen
class StateCount:
    """One (job, state) group of the runs table, for stats: how many runs, and for waiting
    runs the age in seconds of the oldest due one (None when none is due)."""

    job_id: str
    state: RunState
    runs: int
    oldest_due_age: float | None


@attrs.frozen
class JobDemand:
    """One job's demand (F5), what an autoscaler scales on: ``due`` waiting runs whose
    ``run_at`` has come, ``delayed`` waiting runs not yet due, ``running`` runs (live or lapsed
    leases), each counted up to the query's ``cap`` (a count equal to ``cap`` means at least
    that many: :attr:`capped`), and ``oldest_due_age`` seconds since the oldest due run became
    due (exact whatever the cap; None when nothing is due)."""

    job_id: str
    due: int
    delayed: int
    running: int
    oldest_due_age: float | None
    cap: int

    @property
    def capped(self) -> bool:
        """True when a count reached ``cap`` (the true number may be higher)."""
        return self.cap in (self.due, self.delayed, self.running)


@attrs.frozen
class JobFailures:
    """One job's dead runs (the dashboard's overview, issue 36): ``dead`` counted up to the
    query's ``cap`` (``capped``: it reached the cap, so it is a floor, shown with a "+"), and
    ``last_dead_at``, the finish time of its newest dead run (None when unknown)."""

    job_id: str
    dead: int
    capped: bool
    last_dead_at: datetime | None


@attrs.frozen
class PausedJob:
    """A paused job (K3): no claim that starts after ``paused_at`` takes its runs."""

    job_id: str
    paused_at: datetime


@runtime_checkable
class RunAdmin(QueueDepthSource, RunBrowser, Protocol):
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

    async def partition_waits(
        self, limits: Sequence[PartitionLimits], *, max_partitions: int, cap: int
    ) -> list[PartitionWait]:
        """F8/F9 seen: per job of ``limits`` (its partitioned limits), the partitions whose due
        runs wait on a limit, and until when (:mod:`ship_sqla.kernel._partition_waits`), in
        ONE bounded statement: at most ``max_partitions`` partitions per job (tenant order,
        the untenanted runs one more), each's due runs counted up to ``cap``; ordered by job,
        then partition."""
        ...

    async def demand(
        self, job_ids: Sequence[str] | None, *, cap: int, max_jobs: int
    ) -> list[JobDemand]:
        """F5: per job, due / delayed / running counts (each up to ``cap``) and the oldest due
        run's age, in ONE bounded statement: the jobs of ``job_ids`` (also those with nothing to
        do), or with None every job that has waiting or running runs (at most ``max_jobs`` of
        them), ordered by job id (byte order)."""
        ...

    async def dead_by_job(self, *, cap: int, max_jobs: int) -> list[JobFailures]:
        """Every job with dead runs (at most ``max_jobs``, by job id in byte order), each with
        its dead runs counted up to ``cap``, in ONE bounded statement (a loose index scan over
        the jobs, at most ``cap`` index entries and one row per job)."""
        ...

    async def cancel(self, run_id: str) -> RunRecord | None:
        """K2, fenced on the live states: a waiting run becomes cancelled at once; a running
        run's cancel is recorded (``cancel_requested_at``, kept from the first request) and its
        holder told (the backend's :class:`CancelRequestSource` watchers, in every process it
        can reach); the run as it is after. None (nothing changed) when the run is terminal or
        does not exist."""
        ...

    async def retry_dead_batch(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`retry_dead` for a batch of at most 1,000 runs (issue 36 item 5), in one
        statement where the store has statements: the ids retried (dead, and no live run or
        earlier run of the batch holding its dedupe key, J1), in ``run_ids``' order."""
        ...

    async def discard_batch(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`discard` for a batch of at most 1,000 runs, in one statement where the store
        has statements: the ids discarded (they were waiting or dead), in ``run_ids``' order."""
        ...

    async def cancel_batch(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`cancel` (K2) for a batch of at most 1,000 runs, in one statement where the
        store has statements (a run whose row is held, J13, the single-run way after it): the
        ids cancelled or whose cancel was requested, in ``run_ids``' order."""
        ...

    async def job_known(self, job_id: str) -> bool:
        """Whether the store holds any trace of ``job_id`` (issue 25; what
        :meth:`~ship_sqla.kernel.JobOperations.pause` reports as ``known``): a run of it in any
        state (until cleanup deletes it), its schedule's state, its pause, or the gate state
        its capped or rate-limited claims or its capped enqueues keep. Bounded: a few index
        probes, whatever the number of runs."""
        ...

    async def pause(self, job_id: str) -> bool:
        """K3: no claim that starts after this call returned takes a run of ``job_id``, in any
        process; True when this call paused it, False when it was paused already (unchanged).
        A job the store has no trace of is paused too (ahead of its deploy): the operator
        surface asks :meth:`job_known` first and says so."""
        ...

    async def resume(self, job_id: str) -> bool:
        """K3: ``job_id``'s runs are claimable again at once, and the backend's workers it can
        reach are woken; True when it was paused, False when it was not (unchanged)."""
        ...

    async def paused(self, *, limit: int) -> list[PausedJob]:
        """The paused jobs, at most ``limit``, ordered by job id."""
        ...


@runtime_checkable
class WakeSource(Protocol):
    """A store whose ``wait_for_work`` other processes can end (K1): its committed enqueues of due
    runs are announced (in their transaction or right after it, K8), and while a runtime
    listens, an announcement of one of its jobs from any process wakes it at once (the
    PostgreSQL backend: LISTEN/NOTIFY, ``listen=``).
    Polling stays the fallback: a lost announcement or listener delays a run by at most one
    poll interval. A worker runtime calls :meth:`start_listening` when it starts and
    :meth:`stop_listening` when it has stopped; the in-memory backend needs neither (its only
    enqueuers are local, and they wake it at once)."""

    def start_listening(self, job_ids: Sequence[str]) -> None:
        """Start waking this process's waiters on announcements of ``job_ids`` (counted per
        call; never raises: a listener that cannot connect is reported and retried)."""
        ...

    async def stop_listening(self, job_ids: Sequence[str]) -> None:
        """Undo one :meth:`start_listening` of ``job_ids``; the last one releases the listener
        (its connection closed when this returns)."""
        ...

    def room_freed(self, job_ids: Iterable[str]) -> None:
        """F1: settles of runs of these jobs (each with a ``concurrency.max``) landed here, so
        their fleet cap has room again: wake the other processes' runtimes of them (at most
        once per job per 250 ms per backend; never raises, a failure is reported)."""
        ...


@runtime_checkable
class CancelRequestSource(Protocol):
    """A backend that tells its runtimes at once when an operator asked to cancel a running run
    (K2): both backends are. The heartbeat's answer (:class:`HeartbeatBatch`) is the fallback
    that needs nothing of this: a runtime on a backend without it learns at the next beat."""

    def watch_cancel_requests(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(run_id)`` for every cancel request this backend learns of (made
        through it, or, where it listens, through any process); returns the unsubscribe.
        ``callback`` must not raise and must not block."""
        ...


FenceAnswer = Literal["held", "stale", "cancel-requested"]
"""What the fence found (J13, J14): ``"held"`` (the run row is locked by this transaction to its
end, the claim current, no cancel requested), ``"stale"`` (another claim holds the run, or it
is no longer running: nothing may be written), ``"cancel-requested"`` (an operator's cancel
committed before the fence: the run ends cancelled, K2)."""


@runtime_checkable
class FencedRuns(Protocol):
    """The storage side of a transactional handler (J13, J14) and of a consumer's batch (C1,
    C3), implemented by every job backend. ``fence``, ``settle_within`` and
    ``record_progress`` join the active unit of work (the job's ``transaction``)."""

    async def fence(self, run: ClaimedRun) -> FenceAnswer:
        """Lock ``run``'s row until the active transaction ends and say whether the claim is
        current (:data:`FenceAnswer`). While the lock is held no claim retakes the run."""
        ...

    async def settle_within(self, settlement: Settlement) -> SettleOutcome:
        """Apply ``settlement`` (fenced on its claim's token, J5) inside the active transaction:
        it commits with the handler's writes or not at all. ``"stale"``: nothing changed."""
        ...

    async def claim_state(self, run: ClaimedRun) -> str | None:
        """The state of ``run`` while the row still carries this claim's token (an ended run
        moved to history, which keeps no token: ended at this claim's attempt), else None: how
        an ambiguous COMMIT (the connection lost during it), or a settle retried after its
        answer was lost, is resolved."""
        ...

    async def record_progress(self, run: ClaimedRun, progress: Mapping[str, Any]) -> bool:
        """C3: store ``progress`` (a JSON object) as ``run``'s, inside the active unit of work
        (a consumer's batch transaction: it commits with the batch or not at all), fenced on the
        claim's token (J5): False, nothing written, when the claim is no longer current."""
        ...


@runtime_checkable
class JobBackend(
    RunStore,
    ScheduleStore,
    QueueDepthSource,
    WakeSource,
    CancelRequestSource,
    FencedRuns,
    Protocol,
):
    """What :func:`~ship_sqla.kernel.start_job_runtime` runs on, ONE contract that every backend
    implements whole (both do, over :class:`~ship_sqla.kernel._backend_base.JobBackendBase`):
    the :class:`RunStore` with the enqueue front built once above the seam, schedules
    (:class:`ScheduleStore`), the queue gauges (:class:`QueueDepthSource`), the cross-process
    wake (:class:`WakeSource`; no-ops where nobody else can announce), cancel requests
    (:class:`CancelRequestSource`), :meth:`require_support`, and its parts as typed
    attributes: ``admin`` (the :class:`RunAdmin` the operator surface gates), ``workers`` (the
    worker registry, F6) and ``workflows`` (the workflow store, D1-D6; None where the backend
    was built without workflow tables). The runtime probes nothing."""

    @property
    def admin(self) -> RunAdmin: ...

    @property
    def workers(self) -> WorkerRegistry: ...

    @property
    def workflows(self) -> Workflows | None: ...

    async def require_support(self, definitions: Iterable[JobDefinition[Any]]) -> None:
        """Raise :class:`~ship_sqla.kernel.ConfigurationError` naming the first job of
        ``definitions`` this backend cannot serve (its storage lacks what the job's claims need;
        the PostgreSQL backend: a fair job without the tenant index, F2), and how to fix it;
        else return. A worker's start asks it before anything is claimed."""
        ...

    @property
    def clock(self) -> Clock: ...

    @property
    def default_lock_provider(self) -> LockProvider | None:
        """J4: the single-runner locks a runtime takes when ``start_job_runtime`` is given no
        ``lock_provider`` (PostgreSQL on an engine: advisory locks on it); None: none. How a
        runtime runs (``poll_interval``, ``max_in_flight``, metrics) is the runtime's, not the
        storage's (J3)."""
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
        priority: int | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
        partition_key: str | None = None,
    ) -> EnqueueResult:
        """Prepare one run and :meth:`~RunStore.insert` it (``priority``: K6; None, the job's;
        ``partition_key``: F8/F9)."""
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
