"""The job runtime: claims runs from a :class:`JobBackend` and executes their handlers.

Data flows loop (claim) -> one task per run (lock, handler, fail/release) -> completer (batched
complete), with the heartbeater extending every unsettled run's lease on the side. The runtime
never sees SQL; it only calls the backend Protocol.

Invariants (each enforced where it is written):

- The loop never claims more runs than free slots: a slot is held from claim until the run's task
  ends, and ``max_in_flight`` slots exist. It never claims more runs of a job than the job's
  ``concurrency.max`` minus this process's running runs of it; the backend caps the rest.
- The loop stops claiming while ``2 * max_in_flight`` successful runs wait for their batched
  completion (backpressure when the backend is slow); below that, claiming overlaps completing.
- A single-runner job is claimed one run per pass, never for a key this process runs (J4), and
  never executes without its (job id, key) lock when the backend has a lock provider (J7).
- Every run the loop claims is settled exactly once (complete, fail, release), or left to its
  lapsing lease when the backend said its token is stale or a settle call failed (J5, J6).
- Nothing escapes the loop: every error it absorbs goes to ``backend.report_error`` and the loop
  backs off (bounded) and goes on (J11).
- ``stop`` stops claiming, lets running handlers finish until the drain deadline, then cancels
  the rest; a cancelled run is released with the cancellation in its history and its attempt
  unspent, so another worker retakes it (J12).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Self

from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._job_backend import (
    ClaimedRun,
    EnqueueRequest,
    EnqueueResult,
    JobBackend,
    QueueDepthSource,
    SettleOutcome,
)
from ship_sqla.kernel._jobs import InvalidPayloadError, JobDefinition
from ship_sqla.kernel._metrics import JobMetrics
from ship_sqla.kernel._registry import JobRegistry
from ship_sqla.kernel._retry import lock_held_delay, retry_at
from ship_sqla.kernel._runtime_completer import Completer
from ship_sqla.kernel._runtime_depth import DEPTH_SAMPLE_INTERVAL, DepthSampler
from ship_sqla.kernel._runtime_heartbeat import Heartbeater
from ship_sqla.kernel._runtime_state import (
    InFlight,
    JobCancelledError,
    describe_failure,
    stale_error,
)
from ship_sqla.kernel._waiting import first_done, wait_event

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from types import TracebackType

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._job_context import CancelReason
    from ship_sqla.kernel._metrics import JobOutcome

__all__ = ["JobRuntime", "RuntimeMode", "start_job_runtime"]

logger = logging.getLogger("ship_sqla.jobs")

RuntimeMode = Literal["worker", "enqueue-only"]

SCHEDULE_TICK_INTERVAL = 1.0
"""Seconds of the runtime's clock between schedule ticks (J9); also caps the loop's idle wait
while scheduled jobs are registered, so a due occurrence is fired within about a second."""

MAX_ERROR_BACKOFF = 30.0
"""Seconds: the longest the loop (or the completer) waits after consecutive failures."""

_DRAIN_MESSAGES: dict[CancelReason, str] = {
    "drain": "the runtime's drain deadline passed while the run was executing",
    "lock-lost": "the run's single-runner lock ended before the run did",
    "lease-lost": "the run's lease was lost",
}


def _as_registry(
    jobs: JobRegistry | JobDefinition[Any] | Iterable[JobDefinition[Any]],
) -> JobRegistry:
    if isinstance(jobs, JobRegistry):
        return jobs
    if isinstance(jobs, JobDefinition):
        return JobRegistry([jobs])
    return JobRegistry(jobs)


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class JobRuntime:
    """A started runtime. Stop it with :meth:`stop`, or use it as an async context manager.

    In ``"worker"`` mode it runs the claim loop, the heartbeater and the completer as tasks of
    the event loop it was started in; in ``"enqueue-only"`` mode it only enqueues.
    """

    def __init__(
        self,
        registry: JobRegistry,
        *,
        backend: JobBackend,
        mode: RuntimeMode,
        worker_id: str,
        drain_timeout: float,
        clock: Clock,
        metrics: JobMetrics | None = None,
        queue_sample_interval: float | None = DEPTH_SAMPLE_INTERVAL,
    ) -> None:
        self.registry = registry
        self.backend = backend
        self.mode: RuntimeMode = mode
        self.worker_id = worker_id
        self.drain_timeout = drain_timeout
        self.clock = clock
        self.metrics = metrics
        self._jobs: tuple[JobDefinition[Any], ...] = tuple(registry)
        # J9: in worker mode the loop ticks these jobs' schedules (start_job_runtime checked that
        # the backend has schedule/tick and installed them).
        self._scheduled = tuple(job for job in self._jobs if job.schedule is not None)
        self._last_tick: float | None = None
        self._max_in_flight = backend.max_in_flight
        # One batch on the wire and one filling: claiming overlaps the completion round trip,
        # and a slow backend still bounds what this process holds.
        self._max_unflushed = 2 * self._max_in_flight
        self._locks = backend.lock_provider
        self._entries: dict[str, InFlight] = {}
        self._executing = 0
        self._executing_by_job: dict[str, int] = {}
        self._keys_by_job: dict[str, dict[str, int]] = {}
        self._rotation = 0
        self._kick = asyncio.Event()
        self._want_capacity = False
        # Counts slot and completion releases, so the loop can tell one happened mid-pass.
        self._freed = 0
        self._stopping = False
        self._drained = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # The runtime lives on the loop it was built in (start_job_runtime is async).
        self._loop = asyncio.get_running_loop()
        self._completer = Completer(
            backend,
            clock,
            on_settled=self._settled,
            on_outcome=self._record,
            on_flushed=self._capacity_freed,
            error_backoff=self._error_backoff,
        )
        tick = min((job.concurrency.heartbeat_interval for job in self._jobs), default=1.0)
        self._heartbeater = Heartbeater(
            backend, clock, self._entries, tick=tick, on_lost=self._lost
        )
        # J10's queue gauges, sampled only where someone collects them.
        self._sampler = (
            DepthSampler(
                backend,
                metrics,
                [job.id for job in self._jobs],
                clock=clock,
                report_error=backend.report_error,
                interval=queue_sample_interval,
            )
            if metrics is not None
            and queue_sample_interval is not None
            and mode == "worker"
            and isinstance(backend, QueueDepthSource)
            else None
        )
        self._sampler_task: asyncio.Task[None] | None = None

    # --- public surface -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True from start until :meth:`stop` was called."""
        return not self._stopping

    @property
    def in_flight(self) -> int:
        """Runs claimed by this runtime and not settled yet."""
        return len(self._entries)

    @property
    def executing(self) -> int:
        """Runs holding a slot (their task has not ended)."""
        return self._executing

    def _definition(self, job: JobDefinition[Any] | str) -> JobDefinition[Any]:
        return self.registry.get(job) if isinstance(job, str) else job

    async def enqueue(
        self,
        job: JobDefinition[Any] | str,
        payload: Any,  # noqa: ANN401 - the job's typed payload
        *,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        run_id: str | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
    ) -> EnqueueResult:
        """Enqueue through the backend; ``job`` is a definition or a registered job id."""
        return await self.backend.enqueue(
            self._definition(job),
            payload,
            dedupe_key=dedupe_key,
            run_at=run_at,
            run_id=run_id,
            scope=scope,
        )

    async def enqueue_many(
        self,
        job: JobDefinition[Any] | str,
        requests: Sequence[EnqueueRequest],
        *,
        scope: Any = None,  # noqa: ANN401
    ) -> list[EnqueueResult]:
        return await self.backend.enqueue_many(self._definition(job), requests, scope=scope)

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop claiming, let running handlers finish for ``drain_timeout`` seconds (default: the
        runtime's), cancel the rest, flush completions, and return (J12).

        Idempotent; concurrent callers all wait for the same stop. A handler that swallows its
        cancellation delays the return until it ends.
        """
        if drain_timeout is not None and drain_timeout < 0:
            raise ConfigurationError(f"drain_timeout must be >= 0, got {drain_timeout!r}.")
        if self._stop_task is None:
            timeout = self.drain_timeout if drain_timeout is None else drain_timeout
            self._stop_task = asyncio.get_running_loop().create_task(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"JobRuntime({self.worker_id!r}, mode={self.mode!r}, {state},"
            f" in_flight={self.in_flight})"
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def _start(self) -> None:
        if self.mode != "worker":
            return
        loop = self._loop
        self._tasks = [
            loop.create_task(self._run_loop(), name=f"ship_sqla.jobs.loop[{self.worker_id}]"),
            loop.create_task(self._completer.run(), name="ship_sqla.jobs.completer"),
            loop.create_task(self._heartbeater.run(), name="ship_sqla.jobs.heartbeat"),
        ]
        if self._sampler is not None:
            self._sampler_task = loop.create_task(
                self._sampler.run(), name="ship_sqla.jobs.queue_depths"
            )
        logger.debug("job runtime %s started for %d jobs", self.worker_id, len(self._jobs))

    async def _stop(self, drain_timeout: float) -> None:
        self._stopping = True
        self._kick.set()
        if not self._tasks:
            return
        loop_task, completer_task, heartbeat_task = self._tasks
        await loop_task
        if self._executing and not await wait_event(self._drained, self.clock, drain_timeout):
            for entry in list(self._entries.values()):
                if entry.task is not None and not entry.task.done():
                    entry.interrupt("drain")
            # Cancelled handlers now only release their runs: bounded by one backend call each.
            await self._drained.wait()
        # Heartbeats go on until the last completion is answered: a slow flush must not lapse.
        self._completer.close()
        await completer_task
        self._heartbeater.close()
        await heartbeat_task
        if self._sampler is not None and self._sampler_task is not None:
            self._sampler.close()
            await self._sampler_task
        logger.debug("job runtime %s stopped", self.worker_id)

    def _error_backoff(self, failures: int) -> float:
        ceiling = max(MAX_ERROR_BACKOFF, self.backend.poll_interval)
        return min(self.backend.poll_interval * 2.0 ** min(failures - 1, 32), ceiling)

    # --- the loop -------------------------------------------------------------------------------

    async def _run_loop(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                await self._tick_if_due()
                freed_before_pass = self._freed
                more, blocked = await self._claim_pass()
                if self._stop_requested():
                    break
                failures = 0
                if more and self._has_capacity():
                    # Likely more due work: claim again once the runs just started got the loop.
                    await asyncio.sleep(0)
                    continue
                # Unflushed completions still count against concurrency.max in the backend: a
                # claim cut short by them is worth retrying as soon as they land.
                await self._wait(
                    want_capacity=more or blocked or self._completer.unflushed > 0,
                    freed_before_pass=freed_before_pass,
                )
            except Exception as exc:  # noqa: BLE001 - J11: the loop absorbs, reports, backs off
                self.backend.report_error(exc)
                failures += 1
                self._kick.clear()
                if self._stop_requested():
                    break
                await wait_event(self._kick, self.clock, self._error_backoff(failures))

    async def _tick_if_due(self) -> None:
        """J9: fire due schedule occurrences, at most once per SCHEDULE_TICK_INTERVAL of the
        runtime's clock. A failed tick is reported (J11); the next pass tries again."""
        if not self._scheduled:
            return
        now = self.clock.monotonic()
        if self._last_tick is not None and now - self._last_tick < SCHEDULE_TICK_INTERVAL:
            return
        self._last_tick = now
        try:
            await self.backend.tick(self._scheduled)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next tick retries
            self.backend.report_error(exc)

    def _stop_requested(self) -> bool:
        # A call, not an attribute test, so type checkers do not assume the flag cannot change
        # across the awaits above it.
        return self._stopping

    def _has_capacity(self) -> bool:
        return (
            self._executing < self._max_in_flight
            and self._completer.unflushed < self._max_unflushed
        )

    async def _wait(self, *, want_capacity: bool, freed_before_pass: int) -> None:
        """Until new work may be claimable: a local wake or the poll interval (J3), or, when a
        pass was limited by this process's capacity, a slot freeing up (also one that freed
        while the pass was still claiming: that wake must not be lost)."""
        self._want_capacity = want_capacity or not self._has_capacity()
        try:
            if self._kick.is_set() or (self._want_capacity and self._freed != freed_before_pass):
                return
            if not self._has_capacity():
                if self._scheduled:
                    await wait_event(self._kick, self.clock, SCHEDULE_TICK_INTERVAL)
                else:
                    await self._kick.wait()
                return
            timeout = self.backend.poll_interval
            if self._scheduled:
                timeout = min(timeout, SCHEDULE_TICK_INTERVAL)
            await first_done(self.backend.wait_for_work(timeout), self._kick.wait())
        finally:
            self._want_capacity = False
            self._kick.clear()

    def _capacity_freed(self) -> None:
        self._freed += 1
        if self._want_capacity:
            self._kick.set()

    async def _claim_pass(self) -> tuple[bool, bool]:
        """One claim per job with room. Returns (a job gave all it was asked, a job had no room).

        Jobs are visited from a rotating start so one busy job cannot starve the others of
        process slots.
        """
        jobs = self._jobs
        count = len(jobs)
        more = blocked = False
        if count == 0:
            return more, blocked
        start = self._rotation
        self._rotation = (start + 1) % count
        for index in range(count):
            if not self._has_capacity():
                return more, True
            job = jobs[(start + index) % count]
            limit, exclude = self._room_for(job)
            if limit <= 0:
                blocked = True
                continue
            runs = await self.backend.claim(
                job, worker=self.worker_id, limit=limit, exclude_keys=exclude
            )
            if not runs:
                continue
            if self._stopping or len(runs) > limit:
                await self._refuse(job, runs, limit)
                if self._stopping:
                    return False, False
                runs = runs[:limit]
            for run in runs:
                self._start_run(job, run)
            if len(runs) == limit:
                more = True
        return more, blocked

    def _room_for(self, job: JobDefinition[Any]) -> tuple[int, tuple[str, ...]]:
        """How many runs of ``job`` one claim may take now, and the keys it must skip (J4)."""
        concurrency = job.concurrency
        # Runs whose completion is not answered yet still hold a lease in the backend's count of
        # concurrency.max: asking for their room would come back short, which reads as "no
        # more due work" and parks the loop until the poll interval.
        limit = min(
            self._max_in_flight - self._executing,
            concurrency.max
            - self._executing_by_job.get(job.id, 0)
            - self._completer.unflushed_of(job.id),
        )
        if not concurrency.single_runner:
            return limit, ()
        keys = self._keys_by_job.get(job.id)
        return min(limit, 1), tuple(keys) if keys else ()

    async def _refuse(self, job: JobDefinition[Any], runs: list[ClaimedRun], limit: int) -> None:
        """Give back runs this process must not execute: claimed while stopping, or beyond the
        limit it asked for (a backend bug, reported). Their attempts stay unspent."""
        extra = runs if self._stopping else runs[limit:]
        if not self._stopping:
            self.backend.report_error(
                RuntimeError(
                    f"backend.claim returned {len(runs)} runs of job {job.id!r} for limit"
                    f" {limit}; the {len(extra)} extra runs were released. A JobBackend must never"
                    " return more runs than the limit."
                )
            )
        now = self.clock.now()
        for run in extra:
            await self._settle_release(run, now, error=None, during="release after claim")

    def _start_run(self, job: JobDefinition[Any], run: ClaimedRun) -> None:
        entry = InFlight(job, run, self.worker_id, self.clock.monotonic())
        self._entries[run.run_id] = entry
        self._executing += 1
        self._executing_by_job[job.id] = self._executing_by_job.get(job.id, 0) + 1
        if job.concurrency.single_runner and run.key is not None:
            keys = self._keys_by_job.setdefault(job.id, {})
            keys[run.key] = keys.get(run.key, 0) + 1
        entry.task = self._loop.create_task(self._execute(entry))

    # --- one run --------------------------------------------------------------------------------

    async def _execute(self, entry: InFlight) -> None:
        """The run's only task. Raises nothing but a cancellation that came from outside the
        runtime (event loop shutdown): every outcome is settled or reported here."""
        job = entry.job
        run = entry.run
        try:
            try:
                payload = job.decode(run.payload)
            except Exception as exc:  # noqa: BLE001 - a payload that cannot decode never will
                await self._dead_letter_undecodable(entry, exc)
                return
            if (
                self._locks is not None
                and job.concurrency.single_runner
                and not await self._acquire_lock(entry)
            ):
                return
            if entry.reason is not None:
                await self._after_cancel(entry, started=False)
                return
            entry.in_handler = True
            try:
                await job.handler(entry.ctx, payload)
            except asyncio.CancelledError:
                entry.in_handler = False
                entry.handler_done = True
                if not entry.cancelled:
                    raise
                # Our own cancellation (lease lost, lock lost, drain): consumed here, so the
                # settle below is not cancelled as well.
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                await self._after_cancel(entry)
                return
            except Exception as exc:  # noqa: BLE001 - a handler failure is the run's outcome
                entry.in_handler = False
                entry.handler_done = True
                if entry.cancelled:
                    await self._after_cancel(entry)
                else:
                    await self._fail(entry, exc)
                return
            entry.in_handler = False
            entry.handler_done = True
            if entry.lost:
                self._settled(entry)
            else:
                self._completer.add(entry)
        finally:
            await self._end_task(entry)

    async def _end_task(self, entry: InFlight) -> None:
        """Free the run's slot, key and lock. Runs when the task ends, whatever happened."""
        lock, entry.lock = entry.lock, None
        if lock is not None:
            try:
                await lock.release()
            except Exception as exc:  # noqa: BLE001 - J11; the lock's lease frees it anyway
                self.backend.report_error(exc)
        job = entry.job
        self._executing -= 1
        self._executing_by_job[job.id] -= 1
        key = entry.run.key
        if job.concurrency.single_runner and key is not None:
            keys = self._keys_by_job[job.id]
            keys[key] -= 1
            if not keys[key]:
                del keys[key]
        if self._stopping and self._executing == 0:
            self._drained.set()
        self._capacity_freed()

    def _settled(self, entry: InFlight) -> None:
        self._entries.pop(entry.run.run_id, None)

    def _record(self, entry: InFlight, outcome: JobOutcome) -> None:
        """J10: one attempt's outcome and duration (from its claim). Free without metrics."""
        metrics = self.metrics
        if metrics is None:
            return
        run = entry.run
        metrics.record_run(run.job_id, run.key, outcome, self.clock.monotonic() - entry.claimed_at)
        if outcome == "dead":
            metrics.record_dead_letter(run.job_id, run.key)

    def _lost(self, entry: InFlight, reason: CancelReason) -> None:
        """The heartbeater found the lease stale or the single-runner lock gone. Reported once."""
        if reason == "lease-lost":
            if entry.lost:
                return
            entry.mark_lost()
            self._record(entry, "stale")
            self.backend.report_error(stale_error(entry.run, "heartbeat"))
        elif entry.reason is not None:
            return
        else:
            self.backend.report_error(
                JobCancelledError(
                    f"job {entry.run.job_id!r} run {entry.run.run_id!r}: its single-runner lock"
                    " could not be extended; the run is cancelled and returned to waiting.",
                    fix="keep heartbeats on time (do not block the event loop), or check the"
                    " lock provider's connection.",
                )
            )
        entry.interrupt(reason)

    async def _acquire_lock(self, entry: InFlight) -> bool:
        """Take the (job id, key) lock (J4). When it is held elsewhere the run goes back to
        waiting one jittered backoff step later without consuming its attempt (J7)."""
        assert self._locks is not None  # noqa: S101 - checked by the caller
        job = entry.job
        run = entry.run
        asked_at = self.clock.monotonic()
        try:
            lock = await self._locks.acquire(f"{job.id}/{run.key}", job.concurrency.lease)
        except Exception as exc:  # noqa: BLE001 - J11: without the lock the run must not execute
            self.backend.report_error(exc)
            lock = None
        if self.metrics is not None:
            self.metrics.record_lock_wait(job.id, run.key, self.clock.monotonic() - asked_at)
        if lock is None:
            run_at = self.clock.now() + timedelta(seconds=lock_held_delay(job.retry))
            outcome = await self._settle_release(
                run, run_at, error=None, during="release (lock held)"
            )
            if outcome is not None:
                self._record(entry, "lock_held" if outcome == "released" else "stale")
            self._settled(entry)
            return False
        entry.lock = lock
        return True

    async def _after_cancel(self, entry: InFlight, *, started: bool = True) -> None:
        reason = entry.reason
        assert reason is not None  # noqa: S101 - only called for cancelled runs
        if reason == "lease-lost":
            # Another worker may hold the run now: there is nothing left for this one to settle.
            self._settled(entry)
            return
        run = entry.run
        # A handler that never started leaves no history: there was no attempt to record.
        error = (
            None
            if not started
            else str(
                JobCancelledError(
                    f"attempt {run.attempt} of job {run.job_id!r} run {run.run_id!r} was cancelled:"
                    f" {_DRAIN_MESSAGES[reason]}. It was returned to waiting without consuming the"
                    " attempt.",
                    fix="nothing: the run is retaken. If drains often cut runs short, raise"
                    " drain_timeout or make the handler finish (or checkpoint) sooner.",
                )
            )
        )
        run_at = self.clock.now()
        if reason == "lock-lost":
            run_at += timedelta(seconds=lock_held_delay(entry.job.retry))
        outcome = await self._settle_release(run, run_at, error=error, during="release (cancelled)")
        if started and outcome is not None:
            self._record(entry, "cancelled" if outcome == "released" else "stale")
        self._settled(entry)

    async def _fail(self, entry: InFlight, exc: BaseException) -> None:
        run = entry.run
        when = retry_at(entry.job.retry, run.attempt, run.max_attempts, self.clock.now())
        await self._settle_fail(entry, describe_failure(exc), when)

    async def _dead_letter_undecodable(self, entry: InFlight, exc: BaseException) -> None:
        if not isinstance(exc, InvalidPayloadError):
            exc = InvalidPayloadError(
                f"the stored payload could not be decoded for job {entry.job.id!r}: {exc!r}",
                fix="a payload that does not decode never will: fix the codec or the payload"
                " type, then retry the dead run.",
            )
        await self._settle_fail(entry, describe_failure(exc), None)

    async def _settle_fail(self, entry: InFlight, error: str, when: datetime | None) -> None:
        try:
            outcome = await self.backend.fail(entry.run, error, retry_at=when)
        except Exception as exc:  # noqa: BLE001 - J11; the lapsing lease brings the run back
            self.backend.report_error(exc)
        else:
            if outcome == "stale" and not entry.lost:
                entry.mark_lost()
                self.backend.report_error(stale_error(entry.run, "fail"))
            if outcome in ("retrying", "dead", "stale"):
                self._record(entry, outcome)
        self._settled(entry)

    async def _settle_release(
        self, run: ClaimedRun, run_at: datetime, *, error: str | None, during: str
    ) -> SettleOutcome | None:
        try:
            outcome = await self.backend.release(run, run_at=run_at, error=error)
        except Exception as exc:  # noqa: BLE001 - J11; the lapsing lease brings the run back
            self.backend.report_error(exc)
            return None
        if outcome == "stale":
            entry = self._entries.get(run.run_id)
            if entry is None or not entry.lost:
                if entry is not None:
                    entry.mark_lost()
                self.backend.report_error(stale_error(run, during))
        return outcome


def _metrics_of(backend: JobBackend) -> JobMetrics | None:
    metrics = getattr(backend, "metrics", None)
    return metrics if isinstance(metrics, JobMetrics) else None


async def start_job_runtime(
    registry_or_definitions: JobRegistry | JobDefinition[Any] | Iterable[JobDefinition[Any]],
    *,
    backend: JobBackend,
    mode: RuntimeMode = "worker",
    worker_id: str | None = None,
    drain_timeout: float = 30.0,
    clock: Clock | None = None,
    metrics: JobMetrics | None = None,
    queue_sample_interval: float | None = DEPTH_SAMPLE_INTERVAL,
) -> JobRuntime:
    """Start executing the registered jobs' runs from ``backend`` (``mode="worker"``), or only
    enqueue through it (``mode="enqueue-only"``).

    The runtime lives on the running event loop until ``await runtime.stop()``; it is also an
    async context manager that stops on exit. ``clock`` defaults to the backend's. ``metrics``
    (J10: run outcomes and durations, dead letters, lock waits) defaults to the backend's
    ``metrics`` attribute when it has one; without it nothing is recorded. With metrics, a
    worker samples the queue gauges every ``queue_sample_interval`` seconds (None: never).
    """
    if mode not in ("worker", "enqueue-only"):
        raise ConfigurationError(
            f"unknown runtime mode {mode!r}.", fix="use mode='worker' or mode='enqueue-only'."
        )
    if not isinstance(backend, JobBackend):
        raise ConfigurationError(
            f"backend {backend!r} does not implement the JobBackend protocol.",
            fix="pass create_job_backend(...) or InMemoryJobBackend(...).",
        )
    if drain_timeout < 0:
        raise ConfigurationError(f"drain_timeout must be >= 0, got {drain_timeout!r}.")
    if queue_sample_interval is not None and not queue_sample_interval > 0:
        raise ConfigurationError(
            f"queue_sample_interval must be positive or None, got {queue_sample_interval!r}.",
            fix="pass seconds between queue-gauge samples, or None to sample never.",
        )
    if backend.max_in_flight < 1:
        raise ConfigurationError(
            f"backend.max_in_flight must be at least 1, got {backend.max_in_flight!r}."
        )
    runtime = JobRuntime(
        _as_registry(registry_or_definitions),
        backend=backend,
        mode=mode,
        worker_id=worker_id if worker_id is not None else _default_worker_id(),
        drain_timeout=drain_timeout,
        clock=clock if clock is not None else backend.clock,
        metrics=metrics if metrics is not None else _metrics_of(backend),
        queue_sample_interval=queue_sample_interval,
    )
    scheduled = [job for job in runtime.registry if job.schedule is not None]
    if mode == "worker" and scheduled:
        if not all(callable(getattr(backend, name, None)) for name in ("schedule", "tick")):
            raise ConfigurationError(
                f"jobs {sorted(job.id for job in scheduled)} have schedules, but backend"
                f" {type(backend).__name__} has no schedule()/tick() methods (J9).",
                fix="use create_job_backend(...) or InMemoryJobBackend(...), or add"
                " `async schedule(definitions)` and `async tick(definitions) -> int` to the"
                " backend; or drop schedule= from these jobs.",
            )
        await backend.schedule(scheduled)  # type: ignore[attr-defined]
    runtime._start()  # noqa: SLF001 - the factory owns the runtime's start
    return runtime
