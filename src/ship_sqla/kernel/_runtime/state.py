"""The runtime's record of the runs this process claimed: one :class:`InFlight` per run, from its
claim until its settle was answered (or given up), and :class:`InFlightRuns`, the process's
slots and single-runner keys; plus the errors the runtime reports about them."""

from __future__ import annotations

import math
import traceback
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._errors import JobAttemptError
from ship_sqla.kernel._job_context import Cancellation, CancelReason
from ship_sqla.kernel._ports import (
    BuriedRun,
    ClaimedRun,
    JobCrashLoopError,
    JobLeaseLapsedError,
    JobLeaseLapsedFinalError,
    JobLeaseStaleError,
    Lock,
)

if TYPE_CHECKING:
    import asyncio

    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._settlement import SettleRequest

__all__ = [
    "InFlight",
    "InFlightRuns",
    "JobCancelledError",
    "crash_loop_error",
    "describe_failure",
    "lapsed_before_start_error",
    "lapsed_final_error",
    "stale_error",
]


class JobCancelledError(JobAttemptError, RuntimeError):
    """A run was cancelled by the runtime (drain deadline, lost single-runner lock) and returned
    to waiting without consuming its attempt; the text is recorded in the run's history (J12)."""

    code = "SHIP_SQLA_JOB_CANCELLED"


class InFlight(Cancellation):
    """One claimed run this process has not settled yet.

    The entry is its run's :class:`Cancellation` (so a run costs one object plus its context and
    its task). It never refers to the run's :class:`JobContext` (which refers to it): the
    executor makes the context for the handler's call only, so nothing of a finished run is
    left in a reference cycle, and its objects are freed as it ends instead of by the cyclic
    garbage collector (whose full passes over them cost about a quarter of a noop run's CPU
    and paused the loop for 100 ms and more). ``in_handler`` is true exactly while the handler
    coroutine is being awaited: the runtime cancels the task only then, so a cancellation
    never lands in a settle call. ``settlement`` is what the executor asked the completer to
    do with the run, once it did.
    """

    __slots__ = (
        "beat_due",
        "beat_pending",
        "claimed_at",
        "handler_done",
        "in_handler",
        "job",
        "lease_deadline",
        "lock",
        "lost",
        "run",
        "settle_failed_at",
        "settlement",
        "task",
    )

    def __init__(
        self,
        job: JobDefinition[Any],
        run: ClaimedRun,
        now: float,
        *,
        claim_sent: float | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.run = run
        self.task: asyncio.Task[None] | None = None
        self.lock: Lock | None = None
        self.in_handler = False
        # True once the handler ended (returned, raised or was cancelled): the run's settle is
        # then under way, and a refused heartbeat may only mean that settle landed first.
        self.handler_done = False
        # True once this claim's loss was reported (a stale answer, a refused heartbeat, a lapse
        # before start, or this process claiming the run anew): nothing reports it again.
        self.lost = False
        self.claimed_at = now
        self.beat_due = now + job.concurrency.heartbeat_interval
        # When the lease ends at the latest, on the runtime's monotonic clock: the lease began
        # in the backend after the claim (or the last heartbeat that extended it) was sent, so
        # "sent + lease" never lies past the real end, whatever the two machines' clocks say.
        self.lease_deadline = (now if claim_sent is None else claim_sent) + run.lease
        self.settlement: SettleRequest | None = None
        # When the first try of this run's settle failed: a fail / release is retried for one
        # lease from then; any kind is heartbeated again from then (``next_beat``).
        self.settle_failed_at: float | None = None
        # ``fenced`` (J13) and ``draining`` (J12) are the Cancellation's: the handler's
        # context sets the first around a fenced transaction, the runtime the second.
        # Set while a heartbeat call naming this run is on its way (J13: the fence waits for it).
        self.beat_pending: asyncio.Event | None = None

    def interrupt(self, reason: CancelReason) -> None:
        """Cancel the run for ``reason``, and its handler's task if the handler is running."""
        self.cancel(reason)
        if self.in_handler and self.task is not None:
            self.task.cancel()

    def mark_lost(self) -> None:
        self.lost = True
        self.beat_due = math.inf

    @property
    def next_beat(self) -> float:
        """When this run is next heartbeated (the runtime's monotonic clock). Every
        ``beat_due`` until its settlement is handed over, and again once a settle call of it
        failed (an outage: the completer retries, and the lease must hold meanwhile). While
        its settle is on its way a heartbeat would race it (SPEC §10: one answered after the
        settle landed reads as a lost lease), so none is sent unless the settle is still
        unanswered in the lease's last third (a slow database): keeping the lease then beats
        that race, whose refusal is not reported (the handler is done)."""
        if self.fenced:
            return math.inf
        if self.settlement is None or self.settle_failed_at is not None:
            return self.beat_due
        return max(self.beat_due, self.lease_deadline - self.job.concurrency.heartbeat_interval)

    @property
    def next_lock_extension(self) -> float:
        """When a fenced run's single-runner lock is next extended apart (J4, J13): no
        heartbeat of the run is sent while it is fenced, and a heartbeat is what extends its
        lock otherwise. Never for a run not fenced, without a lock, or lost."""
        if self.fenced and self.lock is not None and not self.lost:
            return self.beat_due
        return math.inf

    def lease_lapsed(self, now: float) -> bool:
        """True once the lease may have ended (``now``: the runtime's monotonic clock)."""
        return now >= self.lease_deadline


class InFlightRuns:
    """The runs this process claimed and has not settled (``entries``, heartbeated), and the
    slots of those whose task has not ended (``executing``, per job, and the single-runner keys
    they run, J4).

    Invariants: a run id maps to its newest claim only (an older claim of the same run, retaken
    by this process, is stale and never settled through this map); a slot is taken when the run
    is claimed and given back exactly once, when its task ends.
    """

    __slots__ = ("_executing_by_job", "_keys_by_job", "entries", "executing")

    def __init__(self) -> None:
        self.entries: dict[str, InFlight] = {}
        self.executing = 0
        self._executing_by_job: dict[str, int] = {}
        self._keys_by_job: dict[str, dict[str, int]] = {}

    def executing_of(self, job_id: str) -> int:
        return self._executing_by_job.get(job_id, 0)

    def keys_of(self, job_id: str) -> tuple[str, ...]:
        """The single-runner keys of ``job_id`` this process runs now (J4)."""
        keys = self._keys_by_job.get(job_id)
        return tuple(keys) if keys else ()

    def claimed(self, entry: InFlight) -> InFlight | None:
        """Record a new claim and take its slot; the entry of an earlier claim of the same run
        that it supersedes, if any."""
        run_id = entry.run.run_id
        earlier = self.entries.get(run_id)
        self.entries[run_id] = entry
        job = entry.job
        self.executing += 1
        self._executing_by_job[job.id] = self._executing_by_job.get(job.id, 0) + 1
        key = entry.run.key
        if job.concurrency.single_runner and key is not None:
            keys = self._keys_by_job.setdefault(job.id, {})
            keys[key] = keys.get(key, 0) + 1
        return earlier

    def ended(self, entry: InFlight) -> None:
        """The run's task ended: give its slot and key back."""
        job = entry.job
        self.executing -= 1
        self._executing_by_job[job.id] -= 1
        key = entry.run.key
        if job.concurrency.single_runner and key is not None:
            keys = self._keys_by_job[job.id]
            keys[key] -= 1
            if not keys[key]:
                del keys[key]

    def settled(self, entry: InFlight) -> None:
        """The run needs no more heartbeats: its settle was answered, given up, or not needed."""
        # Only this claim's entry: a newer claim of the same run may have replaced it.
        if self.entries.get(entry.run.run_id) is entry:
            del self.entries[entry.run.run_id]


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


def crash_loop_error(job_id: str, buried: BuriedRun, max_lapses: int) -> JobCrashLoopError:
    return JobCrashLoopError(
        f"job {job_id!r} run {buried.run_id!r}: its lease lapsed {max_lapses} times in a row"
        f" (attempt {buried.attempt} the last), each time its worker died, was killed or stopped"
        " heartbeating while it ran: a crash loop. The claim dead-lettered the run at"
        f" retry.max_lapses ({max_lapses}); its history records each lapsed attempt.",
        fix="find what kills the process while this run runs (an OOM kill, a crash in native"
        " code, os._exit or sys.exit in the handler or a library, a handler blocking the event"
        " loop for longer than concurrency.lease), fix it, then retry the run (ship-sqla jobs"
        " retry RUN_ID, or JobOperations.retry); raise retry.max_lapses if such lapses are"
        " expected.",
    )


def describe_failure(exc: BaseException) -> str:
    """The text recorded in a run's history: the exception first, then where it was raised."""
    summary = "".join(traceback.format_exception_only(exc)).strip()
    where = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    return f"{summary}\n\nTraceback (most recent call last):\n{where}" if where else summary
