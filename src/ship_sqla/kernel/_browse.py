"""What the dashboard reads beyond the J8 port (S2): runs by state and filter, throughput over
time, the schedules' state. Both job backends' admin ports implement :class:`RunBrowser`; the
operator surface (:class:`~ship_sqla.kernel.JobOperations`) gates it and pages it.

Every read is bounded whatever the table size: a page of runs reads at most ``limit`` index
entries past its cursor for one job, or per job for every job (at most ``max_jobs`` of them,
found by a loose index scan); throughput counts at most ``cap`` finished runs per job and
bucket. No read counts an unbounded set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from datetime import datetime

    from ship_sqla.kernel._ports import RunRecord, RunState

__all__ = [
    "MAX_BROWSE_JOBS",
    "MAX_THROUGHPUT_BUCKETS",
    "MAX_THROUGHPUT_CAP",
    "RunBrowser",
    "RunQuery",
    "ScheduleState",
    "ThroughputBucket",
]

MAX_BROWSE_JOBS: Final = 200
"""Jobs a page of runs across every job merges (one index range each)."""
MAX_THROUGHPUT_BUCKETS: Final = 120
MAX_THROUGHPUT_CAP: Final = 100_000
"""Finished runs counted per job and bucket at most (the count's cost)."""


@attrs.frozen
class RunQuery:
    """A page of runs in ``state``, newest first by ``(created_at, run_id)``: of ``job_id``
    (None: every job), of ``tenant`` (None: any), created in ``[created_from, created_to)``
    when given, strictly after ``after`` (the last item of the page before), at most
    ``limit``."""

    state: RunState
    limit: int
    job_id: str | None = None
    tenant: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    after: tuple[datetime, str] | None = None


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


@runtime_checkable
class RunBrowser(Protocol):
    """The dashboard's reads (S2); it checks no permission (the operator surface does)."""

    async def list_runs(self, query: RunQuery, *, max_jobs: int) -> list[RunRecord]:
        """At most ``query.limit`` runs (see :class:`RunQuery`); across jobs, of at most
        ``max_jobs`` jobs with runs in the state (in job id order)."""
        ...

    async def throughput(
        self, *, bucket_seconds: int, buckets: int, cap: int, max_jobs: int
    ) -> list[ThroughputBucket]:
        """``buckets`` buckets of ``bucket_seconds`` ending now, oldest first."""
        ...

    async def schedule_states(self, *, limit: int) -> list[ScheduleState]:
        """At most ``limit`` scheduled jobs' states, by job id."""
        ...
