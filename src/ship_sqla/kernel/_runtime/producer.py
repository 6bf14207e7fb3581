"""The producer: the runtime's loop. It waits for work, ticks the schedules, and claims runs for
the jobs with room, handing each claimed run to the executor.

One pass visits every job once, from a rotating start, so one busy job cannot starve the others
of process slots; each job with room gets one ``RunStore.claim`` (:class:`ClaimRequest`). Between
passes the loop waits for a local wake (an enqueue or retry committed in this process), the poll
interval (J3), or, when a pass was cut short by this process's own capacity, a slot freeing up.

Every timed wait of the loop ends at a deadline on the runtime's clock counted from the pass's
start (the poll interval, the next schedule tick, a rate window), not from the moment the wait
begins: time that passed while the pass claimed is not waited for twice, and a deadline already
passed starts the next pass at once. (With a frozen test clock that a test moved while the pass's
claim was on the wire, the claim saw the old ``now``; a wait counted from after the pass would
park the loop until the clock moved again.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._ports import MAX_CLAIM_BATCH, ClaimRequest
from ship_sqla.kernel._runtime.state import InFlight, crash_loop_error, lapsed_final_error
from ship_sqla.kernel._settlement import released
from ship_sqla.kernel._waiting import first_done, sleep_until, wait_event, wait_event_until

logger = logging.getLogger("ship_sqla.jobs")

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._metrics import JobMetrics
    from ship_sqla.kernel._ports import BuriedRun, ClaimedRun, JobBackend
    from ship_sqla.kernel._runtime.completer import Completer
    from ship_sqla.kernel._runtime.state import InFlightRuns
    from ship_sqla.kernel._runtime.wiring import Plumbing, RuntimeEvents

__all__ = ["SCHEDULE_TICK_INTERVAL", "Producer"]

SCHEDULE_TICK_INTERVAL = 1.0
"""Seconds of the runtime's clock between schedule ticks (J9); also caps the loop's idle wait
while scheduled jobs are registered, so a due occurrence is fired within about a second."""


class Producer:
    """The claim loop (:meth:`run` until :meth:`close`).

    Invariants:

    - The loop never claims more runs than free slots: a slot is held from claim until the run's
      task ends, and ``max_in_flight`` slots exist. It never claims more runs of a job than the
      job's ``concurrency.max`` minus this process's running and unsettled runs of it; the
      backend caps the rest across processes (J3); a cap per partition (F9) is the backend's
      alone, per partition, so it bounds no claim here. One claim of a capped job takes at most
      half its cap (rounded up): the runs of one half settle while the other half is claimed
      and runs, where a claim of the whole cap would wait for every settle of the last one.
    - The loop stops claiming while ``2 * max_in_flight`` runs wait for their batched settle
      (backpressure when the backend is slow); below that, claiming overlaps settling.
    - A single-runner job is claimed one run per pass, never for a key this process runs (J4).
    - A run this process must not execute (claimed while stopping, or beyond the limit asked) is
      released at once, its attempt unspent; one a claim dead-lettered because its lease lapsed
      on its final attempt, or at its ``retry.max_lapses``-th lapse in a row, is reported
      (``JobLeaseLapsedFinalError``, ``JobCrashLoopError``) and counted in
      ``ship.job.dead_letter.count`` (J6, J10, J15). Every lapse the claim reports (a run it
      retook or buried) is counted in ``ship.job.lapses`` (J15).
    - Nothing escapes the loop: every error it absorbs goes to ``report_error`` and the loop
      backs off (the one error backoff, at most a second) and goes on (J11).
    """

    def __init__(
        self,
        store: JobBackend,
        jobs: Sequence[JobDefinition[Any]],
        shared: Plumbing,
        events: RuntimeEvents,
        *,
        runs: InFlightRuns,
        completer: Completer,
        start_run: Callable[[JobDefinition[Any], ClaimedRun, float], None],
        worker_id: str,
        max_in_flight: int,
        poll_interval: float,
        metrics: JobMetrics | None,
    ) -> None:
        self._store = store
        self._events = events
        self._jobs = tuple(jobs)
        self._worker_id = worker_id
        self._clock = shared.clock
        self._runs = runs
        self._completer = completer
        self._max_in_flight = max_in_flight
        self._poll_interval = poll_interval
        # One batch on the wire and one filling: claiming overlaps the settle round trip, and a
        # slow backend still bounds what this process holds.
        self._max_unflushed = 2 * max_in_flight
        # J9: the loop ticks these jobs' schedules (start_job_runtime installed them).
        self._scheduled = tuple(job for job in self._jobs if job.schedule is not None)
        self._last_tick: float | None = None
        self._metrics = metrics
        self._report_error = shared.report_error
        self._start_run = start_run
        self._error_backoff = shared.error_backoff
        self._rotation = 0
        # F2/F8/F9: the last claim's tenant walk stopped at max_tenants (ClaimBatch.more_due).
        self._walk_stopped = False
        self._kick = asyncio.Event()
        self._want_capacity = False
        # True while the loop waits because this process's own caps are full.
        self._parked_full = False
        # Counts slot and settle releases, so the loop can tell one happened mid-pass.
        self._freed = 0
        self._closing = False
        # F3: the earliest monotonic time a rate-limited job's window frees (None: none waits).
        self._rate_due: float | None = None
        # J3: the runtime clock's monotonic when the current pass began (its waits count from it).
        self._pass_started = 0.0

    def close(self) -> None:
        """Stop claiming: the pass under way ends, and :meth:`run` returns."""
        self._closing = True
        self._kick.set()

    def capacity_freed(self) -> None:
        """A slot freed or a settle was answered: wake the loop if it waits for room."""
        self._freed += 1
        if self._want_capacity:
            self._kick.set()

    def own_room_freed(self) -> None:
        """Settles were given up: this process's caps have room again, but the backend's
        ``concurrency.max`` count has not (those runs stay running there until their leases
        lapse), so the loop is woken only when it waits for this process's own room."""
        if self._parked_full:
            self._kick.set()

    def _rate_wake_at(self, at: float) -> None:
        """F3: wait no later than ``at`` (monotonic) before the next pass."""
        if self._rate_due is None or at < self._rate_due:
            self._rate_due = at

    def has_capacity(self) -> bool:
        return (
            self._runs.executing < self._max_in_flight
            and self._completer.unflushed < self._max_unflushed
        )

    async def run(self) -> None:
        failures = 0
        while not self._closing:
            self._pass_started = self._clock.monotonic()
            try:
                await self._tick_if_due()
                freed_before_pass = self._freed
                more, blocked = await self._claim_pass()
                if self._close_requested():
                    break
                failures = 0
                if more and self.has_capacity():
                    # Likely more due work: claim again once the runs just started got the loop.
                    await asyncio.sleep(0)
                    continue
                # Unanswered settles still count against concurrency.max in the backend: a
                # claim cut short by them is worth retrying as soon as they land.
                await self._wait(
                    want_capacity=more or blocked or self._completer.unflushed > 0,
                    freed_before_pass=freed_before_pass,
                )
            except Exception as exc:  # noqa: BLE001 - J11: the loop absorbs, reports, backs off
                self._report_error(exc)
                failures += 1
                self._kick.clear()
                if self._close_requested():
                    break
                await wait_event(self._kick, self._clock, self._error_backoff(failures))

    def _close_requested(self) -> bool:
        # A call, not an attribute test, so type checkers do not assume the flag cannot change
        # across the awaits above it.
        return self._closing

    async def _tick_if_due(self) -> None:
        """J9: fire due schedule occurrences, at most once per SCHEDULE_TICK_INTERVAL of the
        runtime's clock. A failed tick is reported (J11); the next pass tries again."""
        if not self._scheduled:
            return
        now = self._clock.monotonic()
        if self._last_tick is not None and now - self._last_tick < SCHEDULE_TICK_INTERVAL:
            return
        self._last_tick = now
        try:
            await self._store.tick_schedules(self._scheduled)
        except Exception as exc:  # noqa: BLE001 - J11: reported; the next tick retries
            self._report_error(exc)

    async def _wait(self, *, want_capacity: bool, freed_before_pass: int) -> None:
        """Until new work may be claimable: a local wake or the poll interval (J3), or, when a
        pass was limited by this process's capacity, a slot freeing up (also one that freed
        while the pass was still claiming: that wake must not be lost). The timed ends are
        deadlines counted from the pass's start (:meth:`_tick_deadline`, :meth:`_poll_deadline`):
        one already passed returns at once."""
        self._want_capacity = want_capacity or not self.has_capacity()
        try:
            if self._kick.is_set() or (self._want_capacity and self._freed != freed_before_pass):
                return
            if not self.has_capacity():
                self._parked_full = True
                tick = self._tick_deadline()
                if tick is None:
                    await self._kick.wait()
                else:
                    await wait_event_until(self._kick, self._clock, tick)
                return
            deadline = self._poll_deadline()
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                # Due already (the pass outlasted the interval, or a frozen clock was moved
                # during it): claim again once the runs just started got the loop.
                await asyncio.sleep(0)
                return
            # The store's wait counts its timeout from when its task starts; the loop's own
            # deadline ends the wait on time whatever the clock did meanwhile.
            await first_done(
                self._store.wait_for_work(remaining),
                self._kick.wait(),
                sleep_until(self._clock, deadline),
            )
        finally:
            self._want_capacity = self._parked_full = False
            self._kick.clear()

    def _tick_deadline(self) -> float | None:
        """J9: when the next schedule tick is due (None: no scheduled job)."""
        if not self._scheduled:
            return None
        last = self._pass_started if self._last_tick is None else self._last_tick
        return last + SCHEDULE_TICK_INTERVAL

    def _poll_deadline(self) -> float:
        """J3, J9, F3: when the next pass is due without a wake: the poll interval after this
        pass's start, or sooner the next schedule tick or the first rate window to free."""
        deadline = self._pass_started + self._poll_interval
        tick = self._tick_deadline()
        if tick is not None:
            deadline = min(deadline, tick)
        if self._rate_due is not None:
            deadline = min(deadline, self._rate_due)
            self._rate_due = None
        return deadline

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
            if not self.has_capacity():
                return more, True
            job = jobs[(start + index) % count]
            limit, exclude = self._room_for(job)
            if limit <= 0:
                blocked = True
                continue
            self._walk_stopped = False
            started = await self._claim_and_start(job, limit, exclude)
            if started is None:
                return False, False
            if started == limit or (started and self._walk_stopped):
                # A full claim, or a short one whose tenant walk stopped at max_tenants
                # (F2/F8/F9): the tenants past it may hold due runs.
                more = True
        return more, blocked

    def _room_for(self, job: JobDefinition[Any]) -> tuple[int, tuple[str, ...]]:
        """How many runs of ``job`` one claim may take now (at most MAX_CLAIM_BATCH), and the
        keys it must skip (J4)."""
        concurrency = job.concurrency
        # Runs whose settle is not answered yet still hold a lease in the backend's count of
        # concurrency.max: asking for their room would come back short, which reads as "no
        # more due work" and parks the loop until the poll interval. Half the cap at most per
        # claim double-buffers it: one half settles while the next is claimed.
        limit = min(self._max_in_flight - self._runs.executing, MAX_CLAIM_BATCH)
        # F9: a partitioned cap is per partition, not the job's: the backend holds each
        # partition to it, and this process's runs of the job are bounded by its slots only.
        if concurrency.max is not None and concurrency.partition is None:
            limit = min(
                limit,
                (concurrency.max + 1) // 2,
                concurrency.max
                - self._runs.executing_of(job.id)
                - self._completer.unflushed_of(job.id),
            )
        if not concurrency.single_runner:
            return limit, ()
        return min(limit, 1), self._runs.keys_of(job.id)

    async def _claim_and_start(
        self, job: JobDefinition[Any], limit: int, exclude: tuple[str, ...]
    ) -> int | None:
        """One claim of ``job``: report what it buried, start what it claimed. The number of
        runs started; None when the runtime is stopping (the runs were handed back)."""
        sent = self._clock.monotonic()
        claimed = await self._store.claim(
            ClaimRequest(
                job_id=job.id,
                worker=self._worker_id,
                limit=limit,
                max_running=job.concurrency.max,
                lease=job.concurrency.lease,
                exclude_keys=exclude,
                rate_limit=job.rate_limit,
                fairness=job.fairness,
                partition=job.partition,
                max_lapses=job.retry.max_lapses,
                aging=job.aging,
            )
        )
        if claimed.rate_wait is not None:
            # F3: the job's rate window is full; claim it again when the window frees.
            self._rate_wake_at(sent + max(claimed.rate_wait, 0.0))
            # Seen (F3, F8): a throttled claim is routine, so debug level only.
            logger.debug(
                "job %r: claim throttled by its rate limit%s (%d started); the window frees"
                " in %.3f s",
                job.id,
                " (a partition's)" if job.partition is not None else "",
                len(claimed),
                max(claimed.rate_wait, 0.0),
            )
        self._walk_stopped = claimed.more_due
        for buried in claimed.buried:
            self._buried(job, buried)
        if self._metrics is not None:
            for run in claimed:
                if run.retaken:  # J15: its previous holder's lease lapsed
                    self._metrics.record_lapse(run.job_id, run.key)
        runs: Sequence[ClaimedRun] = claimed
        if self._closing or len(runs) > limit:
            self._refuse(job, runs, limit, sent)
            if self._closing:
                return None
            runs = runs[:limit]
        for run in runs:
            self._start_run(job, run, sent)
        return len(runs)

    def _buried(self, job: JobDefinition[Any], buried: BuriedRun) -> None:
        """J6, J10, J15: the claim dead-lettered a run whose lease lapsed on its final attempt,
        or at its ``retry.max_lapses``-th lapse in a row (its worker died): counted as a lapse
        and a dead letter, and reported, like any other dead letter."""
        if self._metrics is not None:
            self._metrics.record_lapse(buried.job_id, buried.key)
            self._metrics.record_dead_letter(buried.job_id, buried.key)
        self._events.buried(job.id, buried)
        max_lapses = job.retry.max_lapses
        if buried.crash_loop and max_lapses is not None:
            self._report_error(crash_loop_error(job.id, buried, max_lapses))
        else:
            self._report_error(lapsed_final_error(job.id, buried))

    def _refuse(
        self, job: JobDefinition[Any], runs: Sequence[ClaimedRun], limit: int, sent: float
    ) -> None:
        """Give back runs this process must not execute: claimed while stopping, or beyond the
        limit it asked for (a backend bug, reported). Their attempts stay unspent."""
        extra = runs if self._closing else runs[limit:]
        if not self._closing:
            self._report_error(
                RuntimeError(
                    f"backend.claim returned {len(runs)} runs of job {job.id!r} for limit"
                    f" {limit}; the {len(extra)} extra runs were released. A RunStore must never"
                    " return more runs than the limit."
                )
            )
        now = self._clock.monotonic()
        run_at = self._clock.now()
        for run in extra:
            # Never started, so never registered: no heartbeat keeps it; its release is retried
            # while the lease the claim began may still be held.
            entry = InFlight(job, run, now, claim_sent=sent)
            self._completer.add(entry, released(run, run_at, reason="refused"))
