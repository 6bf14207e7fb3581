"""The runtime's record of one claimed run, from claim until its settle landed (or failed)."""

from __future__ import annotations

import math
import traceback
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._errors import ShipError
from ship_sqla.kernel._job_context import Cancellation, CancelReason, JobContext
from ship_sqla.kernel._ports import (
    BuriedRun,
    ClaimedRun,
    JobLeaseLapsedError,
    JobLeaseLapsedFinalError,
    JobLeaseStaleError,
    Lock,
)

if TYPE_CHECKING:
    import asyncio

    from ship_sqla.kernel._jobs import JobDefinition

__all__ = [
    "InFlight",
    "JobCancelledError",
    "describe_failure",
    "lapsed_before_start_error",
    "lapsed_final_error",
    "stale_error",
]


class JobCancelledError(ShipError, RuntimeError):
    """A run was cancelled by the runtime (drain deadline, lost single-runner lock) and returned
    to waiting without consuming its attempt; the text is recorded in the run's history (J12)."""

    code = "SHIP_SQLA_JOB_CANCELLED"


class InFlight(Cancellation):
    """One claimed run this process has not settled yet.

    The entry is its run's :class:`Cancellation` (so a run costs one object plus its context and
    its task). ``in_handler`` is true exactly while the handler coroutine is being awaited: the
    runtime cancels the task only then, so a cancellation never lands in a settle call.
    """

    __slots__ = (
        "beat_due",
        "claimed_at",
        "ctx",
        "handler_done",
        "in_handler",
        "job",
        "lease_deadline",
        "lock",
        "lost",
        "run",
        "task",
    )

    def __init__(
        self,
        job: JobDefinition[Any],
        run: ClaimedRun,
        worker_id: str,
        now: float,
        *,
        claim_sent: float | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.run = run
        self.ctx = JobContext(run, self, worker_id=worker_id)
        self.task: asyncio.Task[None] | None = None
        self.lock: Lock | None = None
        self.in_handler = False
        # True once the handler ended (returned, raised or was cancelled): the run's settle is
        # then under way, and a refused heartbeat may only mean that settle landed first.
        self.handler_done = False
        # True once the backend said the token is stale; the stale report was made then.
        self.lost = False
        self.claimed_at = now
        self.beat_due = now + job.concurrency.heartbeat_interval
        # When the lease ends at the latest, on the runtime's monotonic clock: the lease began
        # in the backend after the claim (or the last heartbeat that extended it) was sent, so
        # "sent + lease" never lies past the real end, whatever the two machines' clocks say.
        self.lease_deadline = (now if claim_sent is None else claim_sent) + job.concurrency.lease

    def interrupt(self, reason: CancelReason) -> None:
        """Cancel the run for ``reason``, and its handler's task if the handler is running."""
        self.cancel(reason)
        if self.in_handler and self.task is not None:
            self.task.cancel()

    def mark_lost(self) -> None:
        self.lost = True
        self.beat_due = math.inf

    def lease_lapsed(self, now: float) -> bool:
        """True once the lease may have ended (``now``: the runtime's monotonic clock)."""
        return now >= self.lease_deadline


def stale_error(run: ClaimedRun, during: str) -> JobLeaseStaleError:
    return JobLeaseStaleError(
        f"job {run.job_id!r} run {run.run_id!r} (attempt {run.attempt}, claim token {run.token}):"
        f" {during} was refused because the claim is no longer current; its lease lapsed and"
        " another worker may have retaken the run. Nothing was changed.",
        fix="nothing to undo: the run's current holder settles it. If this repeats, raise the"
        " job's concurrency.lease or stop the handler from blocking the event loop (heartbeats"
        " must run every third of the lease). Effects the handler already made will repeat"
        " (at-least-once): make the handler idempotent or declare idempotency.",
    )


def lapsed_before_start_error(run: ClaimedRun, late: float) -> JobLeaseLapsedError:
    return JobLeaseLapsedError(
        f"job {run.job_id!r} run {run.run_id!r} (attempt {run.attempt}, claim token {run.token}):"
        f" its lease had lapsed ({late:.3f} s ago) before its handler could start, so it was not"
        " started here; it was handed back (attempt unspent) unless another worker had retaken"
        " it already.",
        fix="keep the event loop free (a handler or other code blocking it for about the lease"
        " stops heartbeats and starts), or raise the job's concurrency.lease.",
    )


def lapsed_final_error(job_id: str, buried: BuriedRun) -> JobLeaseLapsedFinalError:
    return JobLeaseLapsedFinalError(
        f"job {job_id!r} run {buried.run_id!r}: the lease of attempt {buried.attempt}, its final"
        " attempt, lapsed (its worker died, was killed, or stopped heartbeating), so the claim"
        " dead-lettered the run; its history records the lapsed attempt.",
        fix="find why the worker stopped (a crash or OOM kill, or a handler blocking the event"
        " loop for longer than concurrency.lease), then retry the run (ship-sqla jobs retry"
        " RUN_ID, or JobOperations.retry); raise retry.attempts or concurrency.lease if such"
        " lapses are expected.",
    )


def describe_failure(exc: BaseException) -> str:
    """The text recorded in a run's history: the exception first, then where it was raised."""
    summary = "".join(traceback.format_exception_only(exc)).strip()
    where = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    return f"{summary}\n\nTraceback (most recent call last):\n{where}" if where else summary
