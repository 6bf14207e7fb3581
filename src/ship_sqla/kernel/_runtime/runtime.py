"""The job runtime: :func:`start_job_runtime` and the :class:`JobRuntime` it returns.

The runtime executes the registered jobs' runs from a :class:`JobBackend`. It never sees SQL: it
talks only to its backend's one contract (:class:`~ship_sqla.kernel.JobBackend`: claim,
heartbeat, settle, wait_for_work; install_schedules, tick_schedules; queue_depths; the wake and
cancel requests; its ``workers`` and ``workflows``), and probes it for nothing. Data
flows in one direction, one part per file of this folder:

- ``producer``: the loop. It waits for work, ticks the schedules and claims runs for the jobs
  with room, handing each claimed run to the executor;
- ``executor``: the execution of one run, in its own task (decode, single-runner lock, lease
  check, handler, cancellation), ending in a settlement handed to the completer;
- ``completer``: every settle (complete, fail, release) batched into ``RunStore.settle`` calls,
  retried through outages, each answer (and every stale one) read in one place;
- ``heartbeat``: the heartbeater, extending every unsettled run's lease (and lock) on the side;
- ``depth``: the queue-gauge sampler (J10), one per fleet (F5);
- ``registration``: the runtime's entry in the backend's worker registry (F6), and whether it
  holds the fleet's queue-sampler lease (F5);
- ``state``: the per-run record (``InFlight``) and the process's slots (``InFlightRuns``).

This module wires them and owns the lifecycle. ``stop`` stops claiming, lets running handlers
finish until the drain deadline, then cancels the rest; a cancelled run is released with the
cancellation in its history and its attempt unspent, so another worker retakes it (J12). Every
run the loop claims is settled exactly once (complete, fail, release), or left to its lapsing
lease when the backend said its token is stale or a settle kept failing for as long as its rule
allowed (J5, J6).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any, Final, Literal, Self

from ship_sqla.kernel._durations import (
    MAX_DRAIN_TIMEOUT,
    MAX_POLL_INTERVAL,
    MAX_SAMPLE_INTERVAL,
    require_duration,
)
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._jobs import JobDefinition
from ship_sqla.kernel._keys import require_text
from ship_sqla.kernel._lifespan import enter_lifespan, require_lifespan
from ship_sqla.kernel._metrics import job_metrics_for
from ship_sqla.kernel._parking import ParkedRuns, unpark_for_build
from ship_sqla.kernel._plans.backoff import error_backoff
from ship_sqla.kernel._ports import JobBackend
from ship_sqla.kernel._registry import JobRegistry
from ship_sqla.kernel._runtime.completer import Completer
from ship_sqla.kernel._runtime.depth import DEPTH_SAMPLE_INTERVAL, DepthSampler
from ship_sqla.kernel._runtime.executor import Executor
from ship_sqla.kernel._runtime.heartbeat import Heartbeater
from ship_sqla.kernel._runtime.producer import Producer
from ship_sqla.kernel._runtime.registration import Registration
from ship_sqla.kernel._runtime.run_log import RunLog
from ship_sqla.kernel._runtime.state import InFlight, InFlightRuns
from ship_sqla.kernel._runtime.stats import StatsRecorder
from ship_sqla.kernel._runtime.wiring import Plumbing
from ship_sqla.kernel._versions import (
    VersionCountSource,
    served_by_jobs,
    served_entries,
    warn_stranded,
)
from ship_sqla.kernel._waiting import first_done, sleep_until, wait_event
from ship_sqla.kernel._workers import WorkerEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager
    from datetime import datetime
    from types import TracebackType

    from opentelemetry.metrics import MeterProvider

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._lifespan import Lifespan
    from ship_sqla.kernel._metrics import JobMetrics, JobOutcome
    from ship_sqla.kernel._ports import BuriedRun, EnqueueRequest, EnqueueResult, LockProvider
    from ship_sqla.kernel._stats import JobStatsStore

__all__ = ["JobRuntime", "RuntimeMode", "start_job_runtime"]

logger = logging.getLogger("ship_sqla.jobs")

RuntimeMode = Literal["worker", "enqueue-only"]

_JOB_BACKEND_MEMBERS: Final = tuple(
    sorted(name for name in dir(JobBackend) if not name.startswith("_"))
)
"""What a backend must have (the JobBackend contract's members), for the refusal's message."""


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

    In ``"worker"`` mode it runs the producer (the claim loop), the heartbeater and the
    completer as tasks of the event loop it was started in, and one executor task per claimed
    run; in ``"enqueue-only"`` mode it only enqueues. Its knobs (``poll_interval``,
    ``max_in_flight``, ``lock_provider``, ``metrics``) are its own, not the backend's (J3):
    two runtimes on one backend may run differently.
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
        poll_interval: float = 1.0,
        max_in_flight: int = 100,
        lock_provider: LockProvider | None = None,
        metrics: JobMetrics | None = None,
        queue_sample_interval: float | None = DEPTH_SAMPLE_INTERVAL,
        summary_interval: float | None = None,
        stats: JobStatsStore | None = None,
    ) -> None:
        self.registry = registry
        self._lifespan: AbstractAsyncContextManager[Any] | None = None
        self.backend = backend
        self.mode: RuntimeMode = mode
        self.worker_id = worker_id
        self.drain_timeout = drain_timeout
        self.clock = clock
        # J3, J4: how it runs (see start_job_runtime), readable by whoever started it.
        self.poll_interval, self.max_in_flight = poll_interval, max_in_flight
        self.lock_provider, self.metrics = lock_provider, metrics
        jobs = tuple(registry)
        self._runs = InFlightRuns()
        # S3: the log line of every outcome, written in one place (run_log), and the summary.
        self._run_log = RunLog(worker_id)
        self._summary_interval = summary_interval
        self._summary_stop = asyncio.Event()
        self._summary_task: asyncio.Task[None] | None = None
        self._stopping, self._listening = False, False
        self._stop_task: asyncio.Task[None] | None = None
        self._drain_shortened = asyncio.Event()
        self._unwatch_cancels: Callable[[], None] | None = None
        self._job_ids, self._job_versions = tuple(job.id for job in jobs), served_entries(jobs)
        self._retentions = tuple(job.retention for job in jobs)  # J17: the history's
        self._tasks: list[asyncio.Task[None]] = []
        self._events = events = _Events(self._runs, self._run_log, metrics, clock)
        # The one error backoff of every loop here (J11): 0.1 s doubling to 1 s, equal jitter.
        shared = Plumbing(clock, backend.report_error, error_backoff(poll_interval).delay)
        self._completer = Completer(backend, shared, events)
        self._executor = Executor(
            self._runs,
            shared,
            events,
            self._completer.add,
            self._completer.landed,
            worker_id=worker_id,
            locks=lock_provider,
            metrics=metrics,
            backend=backend,
        )
        self._producer = Producer(
            backend,
            jobs,
            shared,
            events,
            runs=self._runs,
            completer=self._completer,
            start_run=self._executor.start,
            worker_id=worker_id,
            max_in_flight=max_in_flight,
            poll_interval=poll_interval,
            metrics=metrics,
        )
        tick = min((job.concurrency.heartbeat_interval for job in jobs), default=1.0)
        events.producer = self._producer
        self._heartbeater = Heartbeater(
            backend, shared, self._runs.entries, tick=tick, on_lost=self._executor.cancel
        )
        self._host, self._pid = socket.gethostname(), os.getpid()
        self._started_at: datetime = clock.now()
        self._sampler, self._registration = self._fleet_parts(shared, queue_sample_interval, stats)
        self._registration_task: asyncio.Task[None] | None = None
        # The runtime lives on the loop it was built in (start_job_runtime is async).
        self._loop = asyncio.get_running_loop()

    def _fleet_parts(
        self, shared: Plumbing, queue_sample_interval: float | None, stats: JobStatsStore | None
    ) -> tuple[DepthSampler | None, Registration | None]:
        """F6: the runtime's entry in the backend's worker registry (worker mode only); J10's
        queue gauges, sampled only once someone collects them (DepthSampler), with a registry by
        the one runtime of the fleet that holds the sampler lease (F5). #36: a worker's history
        recorder (its finishes, flushed every interval), whose store the sampler also feeds."""
        self._stats_store = stats
        self._stats_task: asyncio.Task[None] | None = None
        self._stats = self._events.stats = (
            StatsRecorder(stats, shared) if stats is not None and self.mode == "worker" else None
        )
        if self.mode != "worker":
            return None, None
        workers = self.backend.workers
        sampler = (
            DepthSampler(
                self.backend,
                self.metrics,
                self._job_ids,
                shared,
                interval=queue_sample_interval,
                jobs=self._sampled_jobs,
                served=self._served_versions,
                retentions=self._retentions,
                stats=stats,
            )
            if self.metrics is not None and queue_sample_interval is not None
            else None
        )
        registration = Registration(
            workers,
            shared,
            worker_id=self.worker_id,
            entry=self._worker_entry,
            wants_sampler=self._samples_queues,
            on_sampler=sampler.sample_soon if sampler is not None else None,
        )
        return sampler, registration

    # --- public surface -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True from start until :meth:`stop` was called."""
        return not self._stopping

    @property
    def in_flight(self) -> int:
        """Runs claimed by this runtime and not settled yet."""
        return len(self._runs.entries)

    @property
    def executing(self) -> int:
        """Runs holding a slot (their task has not ended)."""
        return self._runs.executing

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
        priority: int | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope; Any keeps the kernel ORM-free
        partition_key: str | None = None,
    ) -> EnqueueResult:
        """Enqueue through the backend; ``job`` is a definition or a registered job id;
        ``priority`` (K6): None for the job's; ``partition_key`` (F8/F9)."""
        return await self.backend.enqueue(
            self._definition(job),
            payload,
            dedupe_key=dedupe_key,
            run_at=run_at,
            run_id=run_id,
            priority=priority,
            scope=scope,
            partition_key=partition_key,
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
        runtime's), cancel the rest, flush the settles, and return (J12).

        Idempotent; concurrent callers all wait for the same stop. A call during the drain with
        a shorter ``drain_timeout`` than it has left moves its deadline closer (``stop(0)``:
        cancel now, a worker's second Ctrl-C); a longer one never extends it. A handler that
        swallows its cancellation delays the return until it ends.
        """
        if drain_timeout is not None:
            drain_timeout = require_duration(
                drain_timeout, "drain_timeout", maximum=MAX_DRAIN_TIMEOUT, allow_zero=True
            )
        if self._stop_task is None:
            timeout = self.drain_timeout if drain_timeout is None else drain_timeout
            self._stop_task = asyncio.get_running_loop().create_task(self._stop(timeout))
        elif drain_timeout is not None:
            self._shorten_drain(drain_timeout)
        await asyncio.shield(self._stop_task)

    def _shorten_drain(self, drain_timeout: float) -> None:
        """A later ``stop`` with a shorter ``drain_timeout`` than the drain has left moves its
        deadline closer (a worker's second Ctrl-C: ``stop(0)`` cancels the runs at once); a
        longer one never extends it."""
        deadline = self.clock.monotonic() + drain_timeout
        current = self._events.drain_deadline
        if current is not None and deadline < current:
            self._events.drain_deadline = deadline
            self._drain_shortened.set()

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

    async def _enter_lifespan(self, lifespan: Lifespan | None) -> None:
        """A worker enters the application's lifespan before its first claim: its value is
        every handler's ``ctx.resources``; :meth:`_stop` exits it after the drain. An
        enqueue-only runtime runs no handler and enters none."""
        if lifespan is None or self.mode != "worker":
            return
        self._lifespan, self._executor.resources = await enter_lifespan(lifespan, "the job runtime")

    def _start(self) -> None:
        if self.mode != "worker":
            return
        loop = self._loop
        # K2: told at once of a cancel request; the heartbeat's answer is the fallback.
        self._unwatch_cancels = self.backend.watch_cancel_requests(self._cancel_requested)
        # K1: another process's committed enqueue of these jobs ends the wait at once.
        self.backend.start_listening(self._job_ids)
        self._listening = True
        self._tasks = [
            loop.create_task(self._producer.run(), name=f"ship_sqla.jobs.loop[{self.worker_id}]"),
            loop.create_task(self._completer.run(), name="ship_sqla.jobs.completer"),
            loop.create_task(self._heartbeater.run(), name="ship_sqla.jobs.heartbeat"),
        ]
        if self._sampler is not None:
            self._tasks.append(
                loop.create_task(self._sampler.run(), name="ship_sqla.jobs.queue_depths")
            )
        if self._stats is not None:
            self._stats_task = loop.create_task(self._stats.run(), name="ship_sqla.jobs.stats")
        if self._summary_interval is not None:
            self._summary_task = loop.create_task(
                self._log_summaries(self._summary_interval), name="ship_sqla.jobs.summary"
            )
        if self._registration is not None:
            self._registration_task = loop.create_task(
                self._registration.run(), name=f"ship_sqla.jobs.registration[{self.worker_id}]"
            )
        logger.debug("job runtime %s started for %d jobs", self.worker_id, len(self.registry))

    async def _stop(self, drain_timeout: float) -> None:
        try:
            await self._drain_and_stop(drain_timeout)
        finally:
            # After the drain, whatever it met: no handler runs any more when the application's
            # resources close (an error of the lifespan's exit is raised from stop()).
            lifespan, self._lifespan = self._lifespan, None
            if lifespan is not None:
                await lifespan.__aexit__(None, None, None)

    async def _drain_and_stop(self, drain_timeout: float) -> None:
        self._stopping = True
        self._events.drain_deadline = self.clock.monotonic() + drain_timeout
        # F6: a draining worker claims nothing (the producer closes here) and says so at once.
        self._producer.close()
        if self._registration is not None:
            self._registration.drain()
        if not self._tasks:
            return
        self._run_log.draining(self.in_flight, drain_timeout)
        self._tell_draining()
        producer_task, completer_task, heartbeat_task = self._tasks[:3]
        await producer_task
        # Runs whose claim was answered as the producer closed hear it too.
        self._tell_draining()
        drained = self._events.drained
        if self._runs.executing and not await self._drained_by_deadline():
            for entry in list(self._runs.entries.values()):
                if entry.task is not None and not entry.task.done():
                    entry.interrupt("drain")
            # Cancelled handlers now only hand their runs over: no backend call of their own.
            await drained.wait()
        # Heartbeats go on until the last settle is answered: a slow flush must not lapse.
        self._completer.close()
        await completer_task
        self._heartbeater.close()
        await heartbeat_task
        if self._unwatch_cancels is not None:
            self._unwatch_cancels()
        if self._listening:
            self._listening = False
            await self.backend.stop_listening(self._job_ids)
        await self._stop_side_tasks()
        self._run_log.stopped()

    def _tell_draining(self) -> None:
        """J12: every handler's ``ctx.draining`` turns true as the drain begins, so a handler
        that loops (a consumer, C2) ends its unit in hand before the deadline cancels it."""
        for entry in self._runs.entries.values():
            entry.draining = True

    async def _drained_by_deadline(self) -> bool:
        """Whether every executing run ended before the drain's deadline, which a later
        ``stop`` may move closer (:meth:`_shorten_drain`)."""
        drained, shortened = self._events.drained, self._drain_shortened
        while not drained.is_set():
            deadline = self._events.drain_deadline
            assert deadline is not None  # noqa: S101 - set by _stop before this wait
            shortened.clear()
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return False
            # Its deadline, not ``remaining``: the sleep's task starts a loop turn later.
            waits = (drained.wait(), shortened.wait(), sleep_until(self.clock, deadline))
            if await first_done(*waits) == 2 and not drained.is_set():  # noqa: PLR2004 - the sleep
                return False
        return True

    async def _stop_side_tasks(self) -> None:
        """The history's last flush (#36: every settle was answered), the queue sampler, the
        registry entry (deregistered, F6) and the summary (S3)."""
        if self._stats is not None and self._stats_task is not None:
            self._stats.close()
            await self._stats_task
            await self._stats.flush()
        if self._sampler is not None:
            self._sampler.close()
            await self._tasks[3]
        if self._registration is not None and self._registration_task is not None:
            self._registration.close()
            await self._registration_task
        if self._summary_task is not None:
            self._summary_stop.set()
            await self._summary_task

    def _worker_entry(self) -> WorkerEntry:
        """F6: what this runtime reports of itself at each registry heartbeat."""
        return WorkerEntry(
            worker_id=self.worker_id,
            host=self._host,
            pid=self._pid,
            started_at=self._started_at,
            job_ids=self._job_ids,
            in_flight=self.in_flight,
            draining=self._stopping,
            job_versions=self._job_versions,
        )

    def _samples_queues(self) -> bool:
        """F5: whether this runtime competes for the fleet's sampler lease: it has a sampler
        whose gauges a reader collects, and it is not stopping."""
        return (
            self._sampler is not None
            and self.metrics is not None
            and (self.metrics.gauges_collected or self._stats_store is not None)
            and not self._stopping
        )

    def _sampled_jobs(self) -> Sequence[str]:
        """F5: the jobs the sampler samples now (see :class:`Registration`)."""
        registration = self._registration
        return self._job_ids if registration is None else registration.sampled_jobs(self._job_ids)

    def _served_versions(self) -> Mapping[str, frozenset[int]]:
        """D9: the handler versions served per job (see :class:`Registration`)."""
        registration = self._registration
        own = served_by_jobs(self.registry)
        return own if registration is None else registration.served_versions(own)

    def _cancel_requested(self, run_id: str) -> None:
        """K2: an operator asked to cancel ``run_id``; cancel its handler if this process runs
        it. Safe to call from any thread (a listener's callback): it hops onto the runtime's
        loop."""
        try:
            self._loop.call_soon_threadsafe(self._cancel_if_running_here, run_id)
        except RuntimeError:
            return  # the loop is closed: nothing runs here any more

    def _cancel_if_running_here(self, run_id: str) -> None:
        entry = self._runs.entries.get(run_id)
        if entry is not None and not entry.handler_done:
            self._executor.cancel(entry, "cancelled")

    async def _log_summaries(self, interval: float) -> None:
        """S3: every ``interval`` seconds one INFO line (runs/s, failures, in flight), and a
        last one for the time since the previous when the runtime stops."""
        clock = self.clock
        since = clock.monotonic()
        stopped = False
        while not stopped:
            stopped = await wait_event(self._summary_stop, clock, interval)
            now = clock.monotonic()
            self._run_log.summary(now - since, self.in_flight)
            since = now


class _Events:
    """The runtime's :class:`~ship_sqla.kernel._runtime.wiring.RuntimeEvents` (what its parts
    tell it), kept off :class:`JobRuntime`'s public surface; it also holds the stop's state the
    parts read (J12)."""

    __slots__ = (
        "clock",
        "drain_deadline",
        "drained",
        "metrics",
        "producer",
        "run_log",
        "runs",
        "stats",
    )

    def __init__(
        self, runs: InFlightRuns, run_log: RunLog, metrics: JobMetrics | None, clock: Clock
    ) -> None:
        self.runs = runs
        self.run_log = run_log
        self.metrics = metrics
        self.clock = clock
        self.producer: Producer | None = None
        self.stats: StatsRecorder | None = None
        self.drained = asyncio.Event()
        self.drain_deadline: float | None = None
        """While stopping: when settle retries give up (the runtime's monotonic clock)."""

    def outcome(self, entry: InFlight, outcome: JobOutcome) -> None:
        """The one outcome hook: S3's log line (run_log) and J10's metrics (the attempt's
        outcome and duration from its claim; free without metrics) and #36's history fold."""
        self.run_log.outcome(entry, outcome)
        metrics, stats = self.metrics, self.stats
        if metrics is None and stats is None:
            return
        run = entry.run
        seconds = self.clock.monotonic() - entry.claimed_at
        if stats is not None:
            stats.record(entry, outcome, seconds)
        if metrics is None:
            return
        metrics.record_run(run.job_id, run.key, outcome, seconds)
        if outcome == "dead":
            metrics.record_dead_letter(run.job_id, run.key)

    def settled(self, entry: InFlight) -> None:
        self.runs.settled(entry)

    def flushed(self) -> None:
        if self.producer is not None:
            self.producer.capacity_freed()

    def given_up(self) -> None:
        if self.producer is not None:
            self.producer.own_room_freed()

    def task_ended(self) -> None:
        """An executor task ended: its slot is free (and the drain may be over, J12)."""
        if self.drain_deadline is not None and self.runs.executing == 0:
            self.drained.set()
        self.flushed()

    def buried(self, job_id: str, buried: BuriedRun) -> None:
        self.run_log.buried(job_id, buried)
        if self.stats is not None:  # #36: a dead run, its lapsed attempt's time unknown
            self.stats.record_dead(job_id)


def _require_job_backend(backend: object, mode: str) -> None:
    """A known ``mode``; a backend implements the whole JobBackend contract, or the refusal
    names what it lacks."""
    if mode not in ("worker", "enqueue-only"):
        raise ConfigurationError(
            f"unknown runtime mode {mode!r}.", fix="use mode='worker' or mode='enqueue-only'."
        )
    if not isinstance(backend, JobBackend):
        missing = sorted(name for name in _JOB_BACKEND_MEMBERS if not hasattr(backend, name))
        raise ConfigurationError(
            f"backend {backend!r} does not implement the JobBackend protocol (missing:"
            f" {', '.join(missing) or 'nothing by name; check the members are callable'}).",
            fix="pass create_job_backend(...) or InMemoryJobBackend(...), or implement the"
            " whole JobBackend contract (subclass ship_sqla.kernel.JobBackendBase).",
        )


def _sample_interval(seconds: float | None, name: str) -> float | None:
    return None if seconds is None else require_duration(seconds, name, maximum=MAX_SAMPLE_INTERVAL)


def _checked_knobs(
    drain_timeout: float,
    poll_interval: float,
    queue_sample_interval: float | None,
    summary_interval: float | None,
    max_in_flight: int,
) -> tuple[float, float, float | None, float | None]:
    """start_job_runtime's durations, checked (a bad one raises ConfigurationError)."""
    drain_timeout = require_duration(
        drain_timeout, "drain_timeout", maximum=MAX_DRAIN_TIMEOUT, allow_zero=True
    )
    queue_sample_interval = _sample_interval(queue_sample_interval, "queue_sample_interval")
    summary_interval = _sample_interval(summary_interval, "summary_interval")
    poll_interval = require_duration(poll_interval, "poll_interval", maximum=MAX_POLL_INTERVAL)
    if max_in_flight < 1:
        raise ConfigurationError(f"max_in_flight must be at least 1, got {max_in_flight!r}.")
    return drain_timeout, poll_interval, queue_sample_interval, summary_interval


async def start_job_runtime(
    registry_or_definitions: JobRegistry | JobDefinition[Any] | Iterable[JobDefinition[Any]],
    *,
    backend: JobBackend,
    mode: RuntimeMode = "worker",
    worker_id: str | None = None,
    drain_timeout: float = 30.0,
    clock: Clock | None = None,
    poll_interval: float = 1.0,
    max_in_flight: int = 100,
    meter_provider: MeterProvider | None = None,
    lock_provider: LockProvider | None = None,
    queue_sample_interval: float | None = DEPTH_SAMPLE_INTERVAL,
    summary_interval: float | None = None,
    lifespan: Lifespan | None = None,
    build_id: str | None = None,
    stats: JobStatsStore | None = None,
) -> JobRuntime:
    """Start executing the registered jobs' runs from ``backend`` (``mode="worker"``), or only
    enqueue through it (``mode="enqueue-only"``).

    It runs until ``await runtime.stop()`` (or an ``async with``'s exit); ``clock``: the backend's.

    How it runs is its own (J3), not the backend's: ``poll_interval`` (seconds, at most an
    hour) is the longest the loop waits for work when no wake arrives (a local enqueue, retry
    or settle, or another process's announcement, K1, ends the wait at once);
    ``max_in_flight`` (at least 1) caps the runs it executes at once. ``lock_provider`` is where
    a single-runner job's (job id, key) lock is taken (J4); None: the backend's
    ``default_lock_provider``. ``meter_provider`` is where J10's instruments record
    (``runtime.metrics``); None: OpenTelemetry's global provider. A bad ``poll_interval`` or
    ``max_in_flight`` raises :class:`ConfigurationError` here, before anything starts.

    A worker samples the queue gauges every ``queue_sample_interval`` seconds (None: never)
    once a metric reader has collected them, so a process without an SDK never pays for a
    sample. ``drain_timeout`` (seconds, 0: cancel at once) bounds how long
    :meth:`JobRuntime.stop` lets handlers finish (J12). A worker first asks the backend whether
    it can serve every job (``require_support``; the PostgreSQL backend: a fair job needs its
    runs table's tenant index, F2), which raises :class:`ConfigurationError` before anything is
    claimed, then installs the scheduled jobs' schedules (J9).

    A worker logs each attempt's outcome on the ``ship_sqla.jobs`` logger (S3, never payloads,
    ``kernel/_runtime/run_log.py``); ``summary_interval`` (seconds; None: none) adds one INFO
    summary line (runs/s, failures, in flight) that often.

    ``lifespan`` (or the registry's): the handlers' resources (``ctx.resources``), entered by a
    worker before its first claim and exited after its drain (``kernel/_lifespan.py``).

    ``build_id`` (default ``SHIP_SQLA_BUILD_ID``): a new build's first worker unparks its jobs'
    parked runs once, in bounded batches (D10, ``kernel/_parking.py``).

    ``stats`` (``create_job_stats``): #36's history, flushed by each worker every interval of
    the store's, the backlog and retention by the fleet's sampler (``kernel/_runtime/stats.py``).
    """
    _require_job_backend(backend, mode)
    drain_timeout, poll_interval, queue_sample_interval, summary_interval = _checked_knobs(
        drain_timeout, poll_interval, queue_sample_interval, summary_interval, max_in_flight
    )
    registry = _as_registry(registry_or_definitions)
    lifespan = _lifespan_of(registry, lifespan)
    if mode == "worker":
        await _prepare_worker(backend, registry, _build_id(build_id))
        warn_connection_budget(registry, max_in_flight)
    runtime = JobRuntime(
        registry,
        backend=backend,
        mode=mode,
        worker_id=worker_id if worker_id is not None else _default_worker_id(),
        drain_timeout=drain_timeout,
        clock=clock if clock is not None else backend.clock,
        poll_interval=poll_interval,
        max_in_flight=max_in_flight,
        lock_provider=lock_provider if lock_provider is not None else backend.default_lock_provider,
        metrics=job_metrics_for(meter_provider),
        queue_sample_interval=queue_sample_interval,
        summary_interval=summary_interval,
        stats=stats,
    )
    await runtime._enter_lifespan(lifespan)  # noqa: SLF001 - the factory owns the start
    runtime._start()  # noqa: SLF001 - the factory owns the runtime's start
    return runtime


async def _prepare_worker(backend: JobBackend, registry: JobRegistry, build_id: str | None) -> None:
    """A worker's start checks (the backend serves every job, its tables exist), then its
    schedules (J9), then a new build's unpark of parked runs (D10): before the lifespan is
    entered, so a refusal opens nothing."""
    await backend.require_support(registry)
    scheduled = [job for job in registry if job.schedule is not None]
    if scheduled:
        await backend.install_schedules(scheduled)
    admin = backend.admin
    if isinstance(admin, VersionCountSource):
        await warn_stranded(admin, registry, backend.report_error)
    if build_id is not None and isinstance(admin, ParkedRuns):
        job_ids = [job.id for job in registry]
        await unpark_for_build(admin, job_ids, build_id, backend.report_error)


def _build_id(given: str | None) -> str | None:
    """D10: the worker's build id: ``given``, else ``SHIP_SQLA_BUILD_ID``, else None."""
    if given is not None:
        require_text(given, "build_id", max_chars=200)
        return given
    return os.environ.get("SHIP_SQLA_BUILD_ID") or None


def warn_connection_budget(definitions: Iterable[JobDefinition[Any]], max_in_flight: int) -> None:
    """J13: warn, naming the jobs, when the transactional jobs sharing one unit of work could
    hold more connections at once (each holds one for its whole handler) than that unit of
    work's pool has, leaving none for the runtime's own claims and settles. None is refused:
    the pool's timeout then bounds a wait, and the figures may be deliberate."""
    by_uow: dict[int, tuple[Any, list[JobDefinition[Any]]]] = {}
    for job in definitions:
        if job.transaction is not None:
            by_uow.setdefault(id(job.transaction), (job.transaction, []))[1].append(job)
    for uow, jobs in by_uow.values():
        capacity = getattr(uow, "connection_capacity", None)
        if not isinstance(capacity, int):
            continue
        demand = min(
            max_in_flight,
            sum(max_in_flight if j.concurrency.max is None else j.concurrency.max for j in jobs),
        )
        if demand >= capacity:
            logger.warning(
                "ship_sqla: transactional jobs %s may run %d handlers at once, each holding a"
                " connection of their unit of work's pool for its whole transaction, and that"
                " pool has %d connections in all (its size plus overflow); the runtime's own"
                " claims and settles need one too. Raise the engine's pool_size/max_overflow,"
                " or lower the jobs' Concurrency(max=...) or the worker's max_in_flight.",
                ", ".join(sorted(j.id for j in jobs)),
                demand,
                capacity,
            )


def _lifespan_of(registry: JobRegistry, lifespan: Lifespan | None) -> Lifespan | None:
    """The runtime's lifespan: the one given, or the registry's; both is ambiguous."""
    if lifespan is None:
        return registry.lifespan
    require_lifespan(lifespan, "start_job_runtime")
    if registry.lifespan is not None and registry.lifespan is not lifespan:
        raise ConfigurationError(
            "start_job_runtime was given a lifespan, and its registry has another one.",
            fix="give the lifespan once: to JobRegistry(..., lifespan=) or to"
            " start_job_runtime(..., lifespan=).",
        )
    return lifespan
