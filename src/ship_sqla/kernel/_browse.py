"""What the dashboard reads beyond the J8 port (S2): runs by state and filter, throughput over
time, the schedules' state. Both job backends' admin ports implement :class:`RunBrowser`; the
operator surface (:class:`~ship_sqla.jobs.JobOperations`) gates it and pages it.

A page of runs is in its state's own order, the order of the index the state already keeps
(:func:`run_order`), so browsing costs the hot path no index of its own:

- ``waiting``: claim order (``"claim"``), the order a claim takes them (K6): highest priority
  first, then ``run_at``, then creation order (``seq``); position :class:`ClaimPosition`;
- ``running``: soonest lease to lapse first (``"lease"``): ``lease_expires_at``, then run id
  (lapsed leases, the runs a claim will retake, come first); position :class:`LeasePosition`;
- ``completed``: newest finished first (``"finished"``): ``finished_at``, then run id,
  descending; position :class:`FinishedPosition` (J18: history keeps completed runs, nearly
  every row, in the index its dead-letter pages read by finish time, and in no creation-order
  index);
- dead, discarded, cancelled: newest first (``"created"``): ``created_at``, then run id,
  descending; position :class:`CreatedPosition`.

A time range (``time_from`` / ``time_to``) on the order's own time (creation; finish for
completed runs) bounds only the finished states' order; on a live state it could only be
filtered, reading past every other waiting or running run of the job, so the operator surface
refuses it there. A tenant filter reads past the job's
other tenants' runs in the state (no index holds the tenant in these orders).

Every read is bounded whatever the table size: a page of runs reads at most ``limit`` index
entries past its cursor for one job (waiting: per priority level, at most 21 levels), or that
per job for every job (at most ``max_jobs`` of them, found by a loose index scan); throughput
counts at most ``cap`` finished runs per job and bucket. No read counts an unbounded set.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from ship_sqla.kernel._errors import InvalidCursorError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ship_sqla.kernel._cursor import CursorValue
    from ship_sqla.kernel._ports import RunRecord, RunState

__all__ = [
    "MAX_BROWSE_JOBS",
    "MAX_CONSUMER_KEYS",
    "MAX_THROUGHPUT_BUCKETS",
    "MAX_THROUGHPUT_CAP",
    "BrowsedRun",
    "ClaimPosition",
    "ConsumerKeyProgress",
    "CreatedPosition",
    "DeadError",
    "DeadErrorReader",
    "FinishedPosition",
    "LeasePosition",
    "RunBrowser",
    "RunOrder",
    "RunPosition",
    "RunQuery",
    "ScheduleState",
    "ThroughputBucket",
    "position_cursor_values",
    "position_from_cursor_values",
    "position_of",
    "run_order",
]

MAX_BROWSE_JOBS: Final = 200
"""Jobs a page of runs across every job merges (one index range each)."""
MAX_CONSUMER_KEYS: Final = 1_000
"""Consumer keys one read of their progress returns at most (one index probe each, C3)."""
MAX_THROUGHPUT_BUCKETS: Final = 120
MAX_THROUGHPUT_CAP: Final = 100_000
"""Finished runs counted per job and bucket at most (the count's cost)."""

RunOrder: TypeAlias = Literal["claim", "lease", "created", "finished"]
"""How a page of runs of one state is ordered (see the module's docstring)."""


def run_order(state: RunState) -> RunOrder:
    """The order of a page of runs in ``state``: ``"claim"`` for waiting, ``"lease"`` for
    running, ``"finished"`` (newest finished first) for completed, ``"created"`` (newest
    created first) for the other finished states."""
    if state == "waiting":
        return "claim"
    if state == "running":
        return "lease"
    if state == "completed":
        return "finished"
    return "created"


@attrs.frozen
class ClaimPosition:
    """A waiting run's place in claim order: ``priority`` descending, then ``run_at``, then
    ``seq`` (creation order, unique) ascending."""

    priority: int
    run_at: datetime
    seq: int


@attrs.frozen
class LeasePosition:
    """A running run's place: ``lease_expires_at``, then ``run_id``, ascending."""

    lease_expires_at: datetime
    run_id: str


@attrs.frozen
class CreatedPosition:
    """A finished run's place: ``created_at``, then ``run_id``, descending (newest first)."""

    created_at: datetime
    run_id: str


@attrs.frozen
class FinishedPosition:
    """A completed run's place: ``finished_at``, then ``run_id``, descending (newest finished
    first, J18)."""

    finished_at: datetime
    run_id: str


RunPosition: TypeAlias = ClaimPosition | LeasePosition | CreatedPosition | FinishedPosition
"""Where a page of runs stopped: its last run's place in its state's order (:func:`run_order`)."""

_POSITIONS: Final[dict[RunOrder, type[RunPosition]]] = {
    "claim": ClaimPosition,
    "lease": LeasePosition,
    "created": CreatedPosition,
    "finished": FinishedPosition,
}


@attrs.frozen
class RunQuery:
    """A page of runs in ``state``, in the state's order (:func:`run_order`): of ``job_id``
    (None: every job), of ``tenant`` (None: any), strictly after ``after`` (the position of the
    last item of the page before, of the state's kind), at most ``limit``. ``time_from`` /
    ``time_to`` (``[time_from, time_to)`` on the order's own time: ``created_at`` in the
    ``"created"`` order, ``finished_at`` in the ``"finished"`` one) apply to the finished states
    only: the operator surface never sends them for a live state."""

    state: RunState
    limit: int
    job_id: str | None = None
    tenant: str | None = None
    time_from: datetime | None = None
    time_to: datetime | None = None
    after: RunPosition | None = None

    def __attrs_post_init__(self) -> None:
        # A backend reads only the position of its state's kind: any other is a wiring mistake
        # (the operator surface checks a cursor's kind before it builds the query).
        if self.after is not None and not isinstance(self.after, _POSITIONS[run_order(self.state)]):
            raise ValueError(f"a page of {self.state} runs cannot start after {self.after!r}")


@attrs.frozen
class BrowsedRun:
    """A run of a page and its creation order (``seq``: the claim order's tie-break, which a
    :class:`~ship_sqla.jobs.RunRecord` does not carry)."""

    record: RunRecord
    seq: int


def position_of(run: BrowsedRun) -> RunPosition:
    """``run``'s place in its state's order: the cursor after it."""
    record = run.record
    order = run_order(record.state)
    if order == "claim":
        return ClaimPosition(record.priority, record.run_at, run.seq)
    if order == "lease":
        if record.lease_expires_at is None:  # every claim sets it; nothing running clears it
            raise ValueError(f"running run {record.run_id!r} has no lease_expires_at")
        return LeasePosition(record.lease_expires_at, record.run_id)
    if order == "finished":
        if record.finished_at is None:  # every end sets it
            raise ValueError(f"completed run {record.run_id!r} has no finished_at")
        return FinishedPosition(record.finished_at, record.run_id)
    return CreatedPosition(record.created_at, record.run_id)


def position_cursor_values(position: RunPosition) -> tuple[CursorValue, ...]:
    """``position`` as a cursor's values, led by its kind."""
    match position:
        case ClaimPosition(priority, run_at, seq):
            return ("claim", priority, run_at, seq)
        case LeasePosition(lease_expires_at, run_id):
            return ("lease", lease_expires_at, run_id)
        case CreatedPosition(created_at, run_id):
            return ("created", created_at, run_id)
        case FinishedPosition(finished_at, run_id):
            return ("finished", finished_at, run_id)


def position_from_cursor_values(values: tuple[CursorValue, ...], state: RunState) -> RunPosition:
    """The position a ``list_runs`` cursor's values hold, which must be of ``state``'s kind.

    Raises :class:`~ship_sqla.errors.InvalidCursorError` for a position of another kind or
    a cursor from before positions had kinds (a bare ``(created_at, run_id)``).
    """
    expected = run_order(state)
    match values:
        case ("claim", int() as priority, datetime() as run_at, int() as seq) if (
            expected == "claim" and _aware(run_at)
        ):
            return ClaimPosition(priority, run_at, seq)
        case ("lease", datetime() as lease_expires_at, str() as run_id) if (
            expected == "lease" and _aware(lease_expires_at)
        ):
            return LeasePosition(lease_expires_at, run_id)
        case ("created", datetime() as created_at, str() as run_id) if (
            expected == "created" and _aware(created_at)
        ):
            return CreatedPosition(created_at, run_id)
        case ("finished", datetime() as finished_at, str() as run_id) if (
            expected == "finished" and _aware(finished_at)
        ):
            return FinishedPosition(finished_at, run_id)
        case (str() as kind, *_) if kind in _POSITIONS and kind != expected:
            raise InvalidCursorError(
                f"the list_runs cursor holds a {kind!r} position, but a page of {state} runs"
                f" is in {expected!r} order.",
                fix="pass a cursor only to the same call with the same state, or restart"
                " paging from the first page (cursor=None).",
            )
        case (datetime(), str()):
            raise InvalidCursorError(
                "the list_runs cursor is from an older ship_sqla (a bare (created_at, run_id)"
                f" position); pages of {state} runs are now in {expected!r} order.",
                fix="restart paging from the first page (cursor=None).",
            )
    raise InvalidCursorError(  # signed by us: only a format change gets here
        f"the list_runs cursor is signed but does not hold a {expected!r} position.",
        fix="restart paging from the first page (cursor=None).",
    )


def _aware(value: datetime) -> bool:
    return value.tzinfo is not None


@attrs.frozen
class ThroughputBucket:
    """Runs that finished ``completed`` / ``dead`` in ``[start, start + bucket)``, over every
    job; ``capped`` when a job's count reached the cap (the true number may be higher)."""

    start: datetime
    completed: int
    dead: int
    capped: bool = False


@attrs.frozen
class ScheduleState:
    """A scheduled job's stored state (J9): its trigger text, its next occurrence and when the
    row last changed (installed, or advanced by the tick that fired the last occurrence)."""

    job_id: str
    trigger: str | None
    next_at: datetime | None
    updated_at: datetime | None = None


@attrs.frozen
class ConsumerKeyProgress:
    """One consumer key's last committed batch (C3), as the runs table holds it: ``job_id`` is
    the consumer's id (its per-key job), ``run_id`` / ``state`` / ``progress`` the key's newest
    run that recorded progress (:attr:`RunRecord.progress <ship_sqla.kernel.RunRecord.progress>`),
    and ``live_run_id`` / ``live_state`` the key's waiting or running run, if any (often a newer
    one, before its first batch)."""

    job_id: str
    key: str
    run_id: str
    state: RunState
    progress: Mapping[str, Any]
    live_run_id: str | None = None
    live_state: RunState | None = None


@attrs.frozen
class DeadError:
    """What the error groups read of one dead run (issue 36 item 6): its id, job, last error
    and finish time."""

    run_id: str
    job_id: str
    last_error: str | None
    finished_at: datetime | None


@runtime_checkable
class DeadErrorReader(Protocol):
    """A browser that reads a job's newest dead runs' errors in one narrow statement
    (PostgreSQL: DEAD_ERRORS); without it the error groups read the runs pages."""

    async def newest_dead_errors(self, job_id: str, *, limit: int) -> list[DeadError]:
        """The job's newest ``limit`` dead runs, newest created first (the runs pages' order)."""
        ...


@runtime_checkable
class RunBrowser(Protocol):
    """The dashboard's reads (S2); it checks no permission (the operator surface does)."""

    async def list_runs(self, query: RunQuery, *, max_jobs: int) -> list[BrowsedRun]:
        """At most ``query.limit`` runs in the state's order (see :class:`RunQuery`); across
        jobs, of at most ``max_jobs`` jobs with runs in the state (in job id order)."""
        ...

    async def throughput(
        self, *, bucket_seconds: int, buckets: int, cap: int, max_jobs: int
    ) -> list[ThroughputBucket]:
        """``buckets`` buckets of ``bucket_seconds`` ending now, oldest first."""
        ...

    async def schedule_states(self, *, limit: int) -> list[ScheduleState]:
        """At most ``limit`` scheduled jobs' states, by job id."""
        ...

    async def consumer_progress(
        self, *, limit: int, after: tuple[str, str] | None = None
    ) -> list[ConsumerKeyProgress]:
        """C3: at most ``limit`` consumer keys with recorded progress, by (consumer id, key),
        after the pair ``after`` (None: from the first)."""
        ...
