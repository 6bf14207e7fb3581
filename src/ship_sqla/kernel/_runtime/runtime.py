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
  lapsing lease when the backend said its token is stale or a settle kept failing for as long
  as the lease could still be held (J5, J6). A settle that fails is retried after the error
  backoff: completions until they land, fail / release while the lease may still be held.
- A handler never starts once its run's lease may have lapsed (the runtime's bound: when the
  claim, or the last answered heartbeat, was sent, plus ``concurrency.lease``): such a run is
  reported (``JobLeaseLapsedError``) and handed back unexecuted, since another worker may be
  running it already (J6).
- A run a claim dead-lettered because its lease lapsed on its final attempt is reported
  (``JobLeaseLapsedFinalError``) and counted in ``ship.job.dead_letter.count`` (J6, J10).
- Nothing escapes the loop: every error it absorbs goes to ``backend.report_error`` and the loop
  backs off and goes on (J11). The error backoff never exceeds ``MAX_ERROR_BACKOFF`` (1 s), so
  after an outage the loop is back within about a second of the database's return.
- ``stop`` stops claiming, lets running handlers finish until the drain deadline, then cancels
  the rest; a cancelled run is released with the cancellation in its history and its attempt
  unspent, so another worker retakes it (J12).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import secrets
import socket
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Self

from ship_sqla.kernel._durations import (
    MAX_DRAIN_TIMEOUT,
    MAX_SAMPLE_INTERVAL,
    require_duration,
)
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._jobs import InvalidPayloadError, JobDefinition
from ship_sqla.kernel._metrics import JobMetrics, job_metrics_for
from ship_sqla.kernel._plans.retry import lock_held_delay, retry_at
from ship_sqla.kernel._ports import (
    BuriedRun,
    ClaimedRun,
    EnqueueRequest,
    EnqueueResult,
    JobBackend,
    QueueDepthSource,
    SettleOutcome,
    buried_of,
)
from ship_sqla.kernel._registry import JobRegistry
from ship_sqla.kernel._runtime.completer import Completer
from ship_sqla.kernel._runtime.depth import DEPTH_SAMPLE_INTERVAL, DepthSampler
from ship_sqla.kernel._runtime.heartbeat import Heartbeater
from ship_sqla.kernel._runtime.state import (
    InFlight,
    JobCancelledError,
    describe_failure,
    lapsed_before_start_error,
    lapsed_final_error,
    stale_error,
)
from ship_sqla.kernel._waiting import first_done, wait_event

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence
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

MAX_ERROR_BACKOFF = 1.0
"""Seconds: the longest the loop, the completer, the heartbeater or a fail / release retry waits
after consecutive failures. Low on purpose: a backoff that kept doubling through a database
outage brought the worker back long after the server (30 s, when this was the cap); a failed
attempt against a server that is down costs one refused connection a second per task."""

FIRST_ERROR_BACKOFF = 0.1
"""Seconds (or the poll interval, when shorter) after the first of consecutive failures."""

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
            close_deadline=lambda: self._drain_deadline,
        )
        tick = min((job.concurrency.heartbeat_interval for job in self._jobs), default=1.0)
        self._heartbeater = Heartbeater(
            backend,
            clock,
            self._entries,
            tick=tick,
            on_lost=self._lost,
            error_backoff=self._error_backoff,
        )
        # While stopping: settle retries give up at the drain deadline (runtime's monotonic clock).
        self._drain_deadline: float | None = None
        # J10's queue gauges, sampled only once someone collects them (DepthSampler).
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
        if drain_timeout is not None:
            drain_timeout = require_duration(
                drain_timeout, "drain_timeout", maximum=MAX_DRAIN_TIMEOUT, allow_zero=True
            )
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
        self._drain_deadline = self.clock.monotonic() + drain_timeout
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
        """Seconds to wait after ``failures`` consecutive failures: from FIRST_ERROR_BACKOFF
        (or the poll interval, when shorter) doubling up to MAX_ERROR_BACKOFF, equal jitter so a
        fleet that failed together does not retry in lockstep."""
        first = min(FIRST_ERROR_BACKOFF, self.backend.poll_interval)
        delay = min(first * 2.0 ** min(failures - 1, 32), MAX_ERROR_BACKOFF)
        return delay / 2 + random.uniform(0.0, delay / 2)  # noqa: S311 - jitter, not a secret

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
            started = await self._claim_and_start(job, limit, exclude)
            if started is None:
                return False, False
            if started == limit:
                more = True
        return more, blocked

    async def _claim_and_start(
        self, job: JobDefinition[Any], limit: int, exclude: tuple[str, ...]
    ) -> int | None:
        """One claim of ``job``: report what it buried, start what it claimed. The number of
        runs started; None when the runtime is stopping (the runs were handed back)."""
        sent = self.clock.monotonic()
        runs = await self.backend.claim(
            job, worker=self.worker_id, limit=limit, exclude_keys=exclude
        )
        for buried in buried_of(runs):
            self._buried(job, buried)
        if self._stopping or len(runs) > limit:
            await self._refuse(job, runs, limit, sent)
            if self._stopping:
                return None
            runs = runs[:limit]
        for run in runs:
            self._start_run(job, run, sent)
        return len(runs)

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

    def _buried(self, job: JobDefinition[Any], buried: BuriedRun) -> None:
        """J6, J10: the claim dead-lettered a run whose lease lapsed on its final attempt (its
        worker died): counted as a dead letter and reported, like any other dead letter."""
        if self.metrics is not None:
            self.metrics.record_dead_letter(buried.job_id, buried.key)
        self.backend.report_error(lapsed_final_error(job.id, buried))

    async def _refuse(
        self, job: JobDefinition[Any], runs: list[ClaimedRun], limit: int, sent: float
    ) -> None:
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
        deadline = sent + job.concurrency.lease
        for run in extra:
            await self._settle_release(
                run, now, error=None, during="release after claim", deadline=deadline
            )

    def _start_run(self, job: JobDefinition[Any], run: ClaimedRun, sent: float) -> None:
        entry = InFlight(job, run, self.worker_id, self.clock.monotonic(), claim_sent=sent)
        earlier = self._entries.get(run.run_id)
        if earlier is not None:
            # This process retook its own run (the earlier claim's lease lapsed while its
            # heartbeats failed, in an outage say): the earlier claim is stale, and its handler
            # must stop rather than run beside the new one.
            self._lost(earlier, "lease-lost", during="continuing (this process claimed it anew)")
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
            if not await self._ready_to_start(entry):
                return
            # Nothing awaits between the lease check and the handler's first step.
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

    async def _ready_to_start(self, entry: InFlight) -> bool:
        """Take the single-runner lock (J4), then check the run is still this process's to
        start: not cancelled meanwhile, lease not lapsed (J6). False: settled or handed back."""
        if (
            self._locks is not None
            and entry.job.concurrency.single_runner
            and not await self._acquire_lock(entry)
        ):
            return False
        if entry.reason is not None:
            await self._after_cancel(entry, started=False)
            return False
        if entry.lease_lapsed(self.clock.monotonic()):
            await self._hand_back_lapsed(entry)
            return False
        return True

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
        # Only this claim's entry: a newer claim of the same run may have replaced it.
        if self._entries.get(entry.run.run_id) is entry:
            del self._entries[entry.run.run_id]

    def _record(self, entry: InFlight, outcome: JobOutcome) -> None:
        """J10: one attempt's outcome and duration (from its claim). Free without metrics."""
        metrics = self.metrics
        if metrics is None:
            return
        run = entry.run
        metrics.record_run(run.job_id, run.key, outcome, self.clock.monotonic() - entry.claimed_at)
        if outcome == "dead":
            metrics.record_dead_letter(run.job_id, run.key)

    def _lost(self, entry: InFlight, reason: CancelReason, *, during: str = "heartbeat") -> None:
        """The heartbeater found the lease stale or lapsed, or the single-runner lock gone (or
        this process claimed the run anew). Reported once."""
        if reason == "lease-lost":
            if entry.lost:
                return
            entry.mark_lost()
            self._record(entry, "stale")
            self.backend.report_error(stale_error(entry.run, during))
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
                run, run_at, error=None, during="release (lock held)", entry=entry
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
        outcome = await self._settle_release(
            run, run_at, error=error, during="release (cancelled)", entry=entry
        )
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
        outcome = await self._retrying(
            lambda: self.backend.fail(entry.run, error, retry_at=when),
            deadline=lambda: entry.lease_deadline,
            window=entry.job.concurrency.lease,
        )
        if outcome is not None:
            if outcome == "stale" and not entry.lost:
                entry.mark_lost()
                self.backend.report_error(stale_error(entry.run, "fail"))
            if outcome in ("retrying", "dead", "stale"):
                self._record(entry, outcome)
        self._settled(entry)

    async def _settle_release(
        self,
        run: ClaimedRun,
        run_at: datetime,
        *,
        error: str | None,
        during: str,
        entry: InFlight | None = None,
        deadline: float | None = None,
    ) -> SettleOutcome | None:
        """Release ``run`` (its ``entry``, or for a run never started its lease ``deadline``),
        retried like a failure (:meth:`_retrying`). A stale answer is reported unless the
        entry's loss was reported already."""

        def lease_deadline() -> float:
            if entry is not None:
                return entry.lease_deadline
            assert deadline is not None  # noqa: S101 - callers pass one of the two
            return deadline

        outcome = await self._retrying(
            lambda: self.backend.release(run, run_at=run_at, error=error),
            deadline=lease_deadline,
            window=entry.job.concurrency.lease if entry is not None else math.inf,
        )
        if outcome == "stale" and (entry is None or not entry.lost):
            if entry is not None:
                entry.mark_lost()
            self.backend.report_error(stale_error(run, during))
        return outcome

    async def _retrying(
        self,
        settle: Callable[[], Awaitable[SettleOutcome]],
        *,
        deadline: Callable[[], float],
        window: float,
    ) -> SettleOutcome | None:
        """Run a fenced settle (fail / release), retrying after the error backoff while the
        run's lease may still be held (``deadline()``, which answered heartbeats move on), for
        at most ``window`` seconds after the first failure (so a settle that can never land,
        while heartbeats still do, does not keep its run here forever) and, when stopping,
        until the drain deadline. Every failure goes to report_error (J11). None: given up,
        the lapsing lease brings the run back (J6). Retrying is safe because the settle is
        fenced on the token: once another worker retook the run it answers "stale" and
        changes nothing."""
        failures = 0
        cutoff = math.inf
        while True:
            try:
                return await settle()
            except Exception as exc:  # noqa: BLE001 - J11: reported; retried or left to the lease
                self.backend.report_error(exc)
            failures += 1
            delay = self._error_backoff(failures)
            now = self.clock.monotonic()
            if failures == 1:
                cutoff = now + window
            limit = min(deadline(), cutoff)
            if self._drain_deadline is not None:
                limit = min(limit, self._drain_deadline)
            if now + delay >= limit:
                return None
            await self.clock.sleep(delay)

    async def _hand_back_lapsed(self, entry: InFlight) -> None:
        """J6: the run's lease may have lapsed before its handler could start (the loop was
        blocked, or the claim answered late): another worker may be running it already, so
        it is not started here. Reported, then released (attempt unspent) unless it was
        retaken meanwhile, in which case the release changes nothing."""
        run = entry.run
        late = self.clock.monotonic() - entry.lease_deadline
        # Lost: no heartbeat keeps it, and a "stale" answer is expected, not reported again.
        entry.mark_lost()
        self.backend.report_error(lapsed_before_start_error(run, late))
        await self._settle_release(
            run, self.clock.now(), error=None, during="release (lapsed)", entry=entry
        )
        self._settled(entry)


def _metrics_of(backend: JobBackend) -> JobMetrics:
    """The backend's ``metrics`` (both backends have one), else OpenTelemetry's global
    provider's: metrics are on by default, and a no-op until the application installs an SDK."""
    metrics = getattr(backend, "metrics", None)
    return metrics if isinstance(metrics, JobMetrics) else job_metrics_for(None)


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
    (J10: run outcomes and durations, dead letters, lock waits, queue gauges) defaults to the
    backend's ``metrics`` (its ``meter_provider``'s, or OpenTelemetry's global provider's), else
    the global provider's: installing an SDK is all it takes. A worker samples the queue gauges
    every ``queue_sample_interval`` seconds (None: never) once a metric reader has collected
    them, so a process without an SDK never pays for a sample. ``drain_timeout`` (seconds, 0:
    cancel at once) bounds how long :meth:`JobRuntime.stop` lets handlers finish (J12).
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
    drain_timeout = require_duration(
        drain_timeout, "drain_timeout", maximum=MAX_DRAIN_TIMEOUT, allow_zero=True
    )
    if queue_sample_interval is not None:
        queue_sample_interval = require_duration(
            queue_sample_interval, "queue_sample_interval", maximum=MAX_SAMPLE_INTERVAL
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
