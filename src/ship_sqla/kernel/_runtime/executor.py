"""The executor: the execution of one claimed run, in its own task, from the claim's hand-over
to the :class:`~ship_sqla.kernel._settlement.Settlement` its end calls for (built here, by the
settlement module's named constructors, and nowhere else).

One run's path: decode the stored payload with the job's codec (a payload that cannot decode is
dead-lettered: it never will); take the (job id, key) lock of a single-runner job (J4; held
elsewhere: released one jittered backoff step later, attempt unspent, J7); check the run is still
this process's to start (not cancelled meanwhile, lease not lapsed, J6); run the handler, under
the job's ``timeout`` when it has one (K5); turn how it ended into a settlement (returned:
``completed``; raised: what the retry plan's :func:`~ship_sqla.kernel._plans.retry.plan_raised`
calls for, K4: ``failed`` of its kind at the plan's time, or dead now, or ``snoozed``; timed
out: ``failed`` of kind ``"timeout"``, however the handler ended; cancelled by the runtime:
``released`` with the cancellation in the history, attempt unspent, J12; cancelled by an
operator: ``cancelled``, K2) and hand it to ``settle`` (the completer).
The task never waits for the settle to land: it frees its slot, key and lock and ends.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ship_sqla.kernel._errors import InvalidPayloadError
from ship_sqla.kernel._evolution import WorkflowDivergedError
from ship_sqla.kernel._job_context import NO_RESOURCES, JobContext
from ship_sqla.kernel._jobs import VERSION_RECHECK, JobVersionUnavailableError
from ship_sqla.kernel._outcomes import JobTimeoutError, JobTimeoutIgnoredError
from ship_sqla.kernel._plans.retry import lock_held_delay, plan_raised
from ship_sqla.kernel._ports import CANCELLED_MESSAGE, JobLeaseStaleError
from ship_sqla.kernel._runtime.fused import FusedAttempt
from ship_sqla.kernel._runtime.state import (
    InFlight,
    JobCancelledError,
    describe_failure,
    lapsed_before_start_error,
    stale_error,
)
from ship_sqla.kernel._settlement import (
    Settlement,
    cancelled,
    completed,
    failed,
    parked,
    released,
    snoozed,
)
from ship_sqla.kernel._tenancy import enter_tenant
from ship_sqla.kernel._tracing import end_run_span, run_span, traces
from ship_sqla.kernel._transactional import SettlesApart
from ship_sqla.kernel._workflows import WorkflowMisuseError, WorkflowSuspended

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from ship_sqla.kernel._job_context import CancelReason
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._metrics import JobMetrics
    from ship_sqla.kernel._ports import ClaimedRun, JobBackend, LockProvider, SettleOutcome
    from ship_sqla.kernel._runtime.state import InFlightRuns
    from ship_sqla.kernel._runtime.wiring import Plumbing, RuntimeEvents
    from ship_sqla.kernel._settlement import SettleRequest

__all__ = ["Executor", "raised_settlement"]


_CANCEL_MESSAGES: dict[CancelReason, str] = {
    "drain": "the runtime's drain deadline passed while the run was executing",
    "lock-lost": "the run's single-runner lock ended before the run did",
    "lease-lost": "the run's lease was lost",
}


def raised_settlement(
    job: JobDefinition[Any], run: ClaimedRun, error: BaseException, now: datetime
) -> Settlement:
    """The settlement of ``run``'s attempt whose handler raised ``error`` at ``now`` (or timed
    out: a :class:`JobTimeoutError`), as the retry plan classifies it (K4, K5,
    :func:`~ship_sqla.kernel._plans.retry.plan_raised`): snoozed, or failed of the plan's kind
    at its time (None: dead now)."""
    plan = plan_raised(
        job.retry,
        error,
        attempt=run.attempt,
        max_attempts=run.max_attempts,
        snoozes=run.snoozes,
        now=now,
    )
    if plan.kind == "snooze":
        assert plan.at is not None  # noqa: S101 - a snooze always has its time
        # The snooze's own text, no traceback: snoozes are expected, and each is an entry.
        return snoozed(run, plan.at, str(plan.error))
    return failed(run, describe_failure(plan.error), plan.at, plan.kind)


class Executor:
    """Executes claimed runs, one task per run (:meth:`start`), and cancels them (:meth:`cancel`).

    Invariants: a handler never starts once its run's lease may have lapsed (the runtime's
    bound: when the claim, or the last answered heartbeat, was sent, plus the lease), since
    another worker may be running it already: such a run is reported (``JobLeaseLapsedError``)
    and handed back unexecuted (J6); a single-runner handler never runs without its (job id,
    key) lock when there is a lock provider (J4); the runtime cancels a task only while its
    handler is being awaited, so a cancellation never lands anywhere else; every run is handed
    to ``settle`` exactly once, or to ``runs.settled`` when its claim was lost (another worker
    may hold it: nothing is left to settle); the task raises nothing but a cancellation from
    outside the runtime (event loop shutdown).
    """

    def __init__(
        self,
        runs: InFlightRuns,
        shared: Plumbing,
        events: RuntimeEvents,
        settle: Callable[[InFlight, SettleRequest], None],
        landed: Callable[[InFlight, Settlement, SettleOutcome], None],
        *,
        worker_id: str,
        locks: LockProvider | None,
        metrics: JobMetrics | None,
        backend: JobBackend,
    ) -> None:
        self._runs = runs
        # What the runtime's lifespan yielded (set before the first claim), handed to every
        # handler's context: ctx.resources.
        self.resources: object = NO_RESOURCES
        self._workflows = backend.workflows
        self._backend = backend
        self._clock = shared.clock
        self._worker_id = worker_id
        self._locks = locks
        self._metrics = metrics
        self._report_error = shared.report_error
        self._settle = settle
        self._landed = landed
        self._events = events
        # The runtime lives on the loop it was built in (start_job_runtime is async).
        self._loop = asyncio.get_running_loop()

    def start(self, job: JobDefinition[Any], run: ClaimedRun, claim_sent: float) -> None:
        """Take a slot for ``run`` (claimed by a call sent at ``claim_sent``, the runtime's
        monotonic clock) and start its task."""
        entry = InFlight(job, run, self._clock.monotonic(), claim_sent=claim_sent)
        earlier = self._runs.claimed(entry)
        if earlier is not None and earlier.settlement is None:
            # This process retook its own run (the earlier claim's lease lapsed while its
            # heartbeats failed, in an outage say): the earlier claim is stale, and its handler
            # must stop rather than run beside the new one. An earlier claim whose handler is
            # done is no such sign: its settle may have landed already (a workflow suspend made
            # the run due again before the rest of its settle batch was answered, D3); if it did
            # not, its settle answers stale and is reported then.
            self.cancel(earlier, "lease-lost", during="continuing (this process claimed it anew)")
        # K7: the span's machinery only where there is a trace to continue or an SDK to see it.
        task = self._traced(entry) if traces(run) else self._execute(entry)
        entry.task = self._loop.create_task(task)

    def cancel(self, entry: InFlight, reason: CancelReason, *, during: str = "heartbeat") -> None:
        """Cancel ``entry``'s run: its lease was lost (a refused heartbeat, or this process
        claimed the run anew), or its single-runner lock could not be extended (both reported
        once), or an operator cancelled it (``"cancelled"``, K2: not an error, not reported)."""
        if reason == "lease-lost":
            if entry.lost:
                return
            entry.mark_lost()
            self._events.outcome(entry, "stale")
            self._report_error(stale_error(entry.run, during))
        elif entry.reason is not None:
            return
        elif reason == "lock-lost":
            self._report_error(
                JobCancelledError(
                    f"job {entry.run.job_id!r} run {entry.run.run_id!r}: its single-runner lock"
                    " could not be extended; the run is cancelled and returned to waiting.",
                    fix="keep heartbeats on time (do not block the event loop), or check the"
                    " lock provider's connection.",
                )
            )
        entry.interrupt(reason)

    async def _traced(self, entry: InFlight) -> None:
        """The run's task: :meth:`_execute` inside the attempt's span, a child of the trace
        context the run's enqueue stored, in every attempt (K7)."""
        with run_span(entry.job.id, entry.run) as span:
            await self._execute(entry)
            end_run_span(span, entry.settlement)

    async def _execute(self, entry: InFlight) -> None:
        """The run's only task: every outcome is handed to ``settle`` or reported here. It runs
        in the run's tenant (F2: the handler's enqueues and units of work default to it)."""
        job = entry.job
        run = entry.run
        if run.tenant is not None:
            enter_tenant(run.tenant)
        try:
            if run.handler_version != job.version:
                # D9: the run is pinned to the version it was enqueued under.
                pinned = job.at_version(run.handler_version)
                if pinned is None:
                    self._hand_back_version(entry)
                    return
                entry.job = job = pinned
            try:
                # The payload was encoded by the kernel when the run was prepared; decoding it
                # is the job definition's codec's, here, where the handler needs it.
                payload = job.decode(run.payload)
            except Exception as exc:  # noqa: BLE001 - a payload that cannot decode never will
                self._dead_letter_undecodable(entry, exc)
                return
            if not await self._ready_to_start(entry):
                return
            # Nothing awaits between the lease check and the handler's first step (calling a
            # coroutine does not yield to the loop).
            await self._run_handler(entry, payload)
        finally:
            await self._end(entry)

    async def _run_handler(self, entry: InFlight, payload: Any) -> None:  # noqa: ANN401
        """The handler, under the job's ``timeout`` (K5), and the settlement its end calls for."""
        # The handler's context lives in this call only: the entry never refers to it (see
        # InFlight), so a finished run leaves no reference cycle behind.
        ctx: JobContext[Any] = JobContext(
            entry.run, entry, worker_id=self._worker_id, resources=self.resources
        )
        if self._workflows is not None:
            # binds the backend too
            ctx.bind_workflows(
                self._workflows,
                self._backend,
                self._clock,
                determinism=entry.job.determinism,
            )
        else:
            ctx.bind_backend(self._backend)
        # J13: a transactional job's attempt: the fence, the handler and the completion in one
        # transaction (FusedAttempt marks the context: no workflow calls).
        fused = (
            None
            if entry.job.transaction is None
            else FusedAttempt(entry, ctx, payload, self._backend, self._clock)
        )
        entry.in_handler = True
        timer = self._start_timeout(entry)
        try:
            if fused is None:
                await entry.job.handler(ctx, payload)
                ctx.workflow_returned(entry.job.handler)  # D7: no stored steps left unreplayed
            else:
                await fused.run()
        except asyncio.CancelledError:
            entry.in_handler = False
            entry.handler_done = True
            if not entry.cancelled:
                raise
            await self._cancelled_in_handler(entry, ctx, fused)
            return
        except (Exception, WorkflowSuspended) as exc:  # noqa: BLE001 - the run's outcome
            entry.in_handler = False
            entry.handler_done = True
            entry.fenced = False
            if not await self._ended_in_transaction(entry, ctx, fused, exc):
                self._raised(entry, exc)
            return
        finally:
            # Set after handler_done (no await in between): a heartbeat refused meanwhile is
            # never read as a lost lease (see Cancellation.fenced).
            entry.fenced = False
            if timer is not None:
                timer.cancel()
        entry.in_handler = False
        entry.handler_done = True
        # completion_sent: only a workflow's completing transaction (J13) sets it.
        if ctx.completion_sent is None or not await self._completion_swallowed(entry, ctx):
            self._returned(entry, ctx.completed_in_transaction if fused is None else fused.landed)

    async def _completion_swallowed(self, entry: InFlight, ctx: JobContext[Any]) -> bool:
        """A workflow whose completing transaction (completes_run=True, J13) raised and whose
        handler returned anyway: the run's row says whether that transaction committed; when
        it did not, the attempt failed (its last step's writes are not there), and is never
        completed by the completer. False: nothing of the kind happened."""
        sent = ctx.completion_sent
        if sent is None or ctx.completed_in_transaction is not None:
            return False
        if not await self._committed_after_all(entry, sent, None):
            self._fail(
                entry,
                WorkflowMisuseError(
                    f"run {entry.run.run_id!r}: its completing transaction"
                    " (ctx.transaction(..., completes_run=True)) failed, and the handler returned"
                    " anyway; the run was not completed.",
                    fix="let the completing transaction's exception propagate out of the"
                    " handler; the attempt is retried as its retry policy says.",
                ),
            )
        return True

    async def _cancelled_in_handler(
        self, entry: InFlight, ctx: JobContext[Any], fused: FusedAttempt | None
    ) -> None:
        """Our own cancellation (lease lost, lock lost, drain, timeout, an operator's cancel)
        ended the handler: consumed here, so the lock release after it is not cancelled as
        well; one that landed in a COMMIT leaves it unknown (J13): the run's row says."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        sent = ctx.completion_sent if fused is None else fused.landed
        if not await self._committed_after_all(entry, sent, None):
            self._after_cancel(entry)

    def _returned(
        self, entry: InFlight, committed: tuple[Settlement, SettleOutcome] | None
    ) -> None:
        """The handler returned: the settlement its end calls for (``committed``: the
        completion its transaction committed, J13, only read)."""
        if committed is not None:
            # J13: the completion committed with the handler's writes: nothing left to settle,
            # whatever cancel or timeout came after it.
            self._landed(entry, *committed)
        elif entry.lost:
            self._runs.settled(entry)
        elif entry.reason == "timeout":
            # K5: past its timeout the attempt failed, even if the handler swallowed the
            # cancellation and returned: it may have stopped its work half-way.
            self._fail(entry, self._timeout_error(entry))
        elif entry.reason == "cancelled":
            # K2: likewise an operator's cancel: a handler that swallowed it and returned may
            # have stopped half-way; the run ends cancelled.
            self._after_cancel(entry)
        else:
            self._settle(entry, completed(entry.run))

    async def _ended_in_transaction(
        self,
        entry: InFlight,
        ctx: JobContext[Any],
        fused: FusedAttempt | None,
        exc: BaseException,
    ) -> bool:
        """The handler's transaction (J13) raised ``exc``: True when that decided the run's end
        here (settled apart, stale, or committed after all); False: a K4 outcome, as any
        raise."""
        if isinstance(exc, SettlesApart):
            if entry.cancelled:
                self._after_cancel(entry)
            else:
                self._settle(entry, exc.settlement)
            return True
        if isinstance(exc, JobLeaseStaleError) and fused is not None and fused.stale:
            # J14: the fence or the completion found the claim gone; everything rolled back.
            if not entry.lost:
                entry.mark_lost()
                self._events.outcome(entry, "stale")
                self._report_error(exc)
            self._runs.settled(entry)
            return True
        # A workflow's completing transaction (completes_run=True) sent the completion too:
        # either it committed and the handler raised after it, or its COMMIT failed.
        sent = ctx.completion_sent if fused is None else fused.landed
        return await self._committed_after_all(entry, sent, exc)

    async def _committed_after_all(
        self,
        entry: InFlight,
        sent: tuple[Settlement, SettleOutcome] | None,
        exc: BaseException | None,
    ) -> bool:
        """The transaction ended in ``exc`` (or a cancellation) after its completion was sent
        (J13), so the COMMIT's answer is unknown (the connection lost during it): the run's row
        says whether it committed; True when it did (settled here, ``exc`` reported). When the
        row cannot be read the run is left to its lease. Correctness does not depend on this
        read: a K4 settle of a committed run would answer stale and change nothing."""
        if sent is None:
            return False
        try:
            state = await self._backend.claim_state(entry.run)
        except Exception as read_error:  # noqa: BLE001 - J11: the lease decides then
            self._report_error(read_error)
            if exc is not None:
                self._report_error(exc)
            entry.mark_lost()
            self._runs.settled(entry)
            return True
        if state != sent[0].state:
            return False
        if exc is not None:
            self._report_error(exc)
        self._landed(entry, *sent)
        return True

    def _raised(self, entry: InFlight, exc: BaseException) -> None:
        """The handler raised ``exc``: a cancel that raced it wins (K2, J12, K5); a workflow's
        sleep or wait suspends the run (D3: back to waiting, its attempt unspent); anything
        else is a failed attempt (K4)."""
        if entry.cancelled:
            self._after_cancel(entry)
        elif isinstance(exc, WorkflowSuspended):
            self._settle(entry, exc.settlement)
        elif isinstance(exc, WorkflowDivergedError) and entry.job.on_divergence == "park":
            self._park(entry, exc)
        else:
            self._fail(entry, exc)

    def _park(self, entry: InFlight, exc: WorkflowDivergedError) -> None:
        """D10: the handler diverged from the run's history before the diverging step ran:
        the run parks (waiting, due never, attempt unspent, slot and lease released), the
        divergence in its history (its text, then a JSON line of it, which the dashboard shows
        side by side), reported (J11), logged at ERROR and counted."""
        divergence = exc.divergence
        self._report_error(exc)
        if self._metrics is not None:
            self._metrics.record_divergence(entry.run.job_id)
        text = f"{describe_failure(exc)}\n{json.dumps(divergence.to_json(), sort_keys=True)}"
        self._settle(entry, parked(entry.run, text))

    def _start_timeout(self, entry: InFlight) -> asyncio.Task[None] | None:
        """The timer of the job's ``timeout`` (K5), started as the handler starts; None without
        one. The caller cancels it once the handler ended."""
        timeout = entry.job.timeout
        if timeout is None:
            return None
        return self._loop.create_task(
            self._time_out(entry, timeout), name=f"ship_sqla.jobs.timeout[{entry.run.run_id}]"
        )

    async def _time_out(self, entry: InFlight, after: float) -> None:
        """K5: at the timeout, cancel the handler (unless something else cancels it already).
        Its run keeps its lease: it stays in the heartbeated entries until its settle, which
        waits for the handler to really stop. A handler still running a heartbeat interval
        later ignored its cancellation; that is reported once, so it is visible."""
        await self._clock.sleep(after)
        if not entry.in_handler or entry.reason is not None:
            return
        entry.interrupt("timeout")
        grace = entry.job.concurrency.heartbeat_interval
        await self._clock.sleep(grace)
        if entry.in_handler:
            run = entry.run
            self._report_error(
                JobTimeoutIgnoredError(
                    f"job {run.job_id!r} run {run.run_id!r} (attempt {run.attempt}): its handler"
                    f" was cancelled at its timeout of {after:g} s and is still running"
                    f" {grace:g} s later. The run keeps its lease (heartbeats continue) until"
                    " the handler stops; then the attempt settles as a timeout.",
                    fix="let asyncio.CancelledError propagate out of the handler (do not"
                    " swallow it), and run blocking calls that cannot be cancelled in a thread"
                    " with a timeout of their own.",
                )
            )

    def _timeout_error(self, entry: InFlight) -> JobTimeoutError:
        run = entry.run
        return JobTimeoutError(
            f"attempt {run.attempt} of job {run.job_id!r} run {run.run_id!r} ran past the job's"
            f" timeout of {entry.job.timeout:g} s; its handler was cancelled.",
            fix="raise the job's timeout=, or make the handler finish (or checkpoint and"
            " snooze) sooner. List JobTimeoutError in retry.non_retryable to dead-letter a"
            " timed-out run at once.",
        )

    async def _ready_to_start(self, entry: InFlight) -> bool:
        """Take the single-runner lock (J4), then check the run is still this process's to
        start: not cancelled meanwhile, lease not lapsed (J6). False: handed back."""
        if (
            self._locks is not None
            and entry.job.concurrency.single_runner
            and not await self._acquire_lock(entry, self._locks)
        ):
            return False
        if entry.reason is not None:
            self._after_cancel(entry, started=False)
            return False
        if entry.lease_lapsed(self._clock.monotonic()):
            self._hand_back_lapsed(entry)
            return False
        return True

    async def _acquire_lock(self, entry: InFlight, locks: LockProvider) -> bool:
        """Take the (job id, key) lock (J4). When it is held elsewhere the run goes back to
        waiting one jittered backoff step later without consuming its attempt (J7)."""
        job = entry.job
        run = entry.run
        asked_at = self._clock.monotonic()
        try:
            lock = await locks.acquire(f"{job.id}/{run.key}", job.concurrency.lease)
        except Exception as exc:  # noqa: BLE001 - J11: without the lock the run must not execute
            self._report_error(exc)
            lock = None
        if self._metrics is not None:
            self._metrics.record_lock_wait(job.id, run.key, self._clock.monotonic() - asked_at)
        if lock is None:
            run_at = self._clock.now() + timedelta(seconds=lock_held_delay(job.retry))
            self._settle(entry, released(run, run_at, reason="lock-held"))
            return False
        entry.lock = lock
        return True

    def _after_cancel(self, entry: InFlight, *, started: bool = True) -> None:
        reason = entry.reason
        assert reason is not None  # noqa: S101 - only called for cancelled runs
        if reason == "lease-lost":
            # Another worker may hold the run now: there is nothing left for this one to settle.
            self._runs.settled(entry)
            return
        if reason == "timeout":
            # K5: the attempt failed; the retry policy decides what follows.
            self._fail(entry, self._timeout_error(entry))
            return
        run = entry.run
        if reason == "cancelled":
            # K2: an operator's cancel ends the run, started or not: no retry, no dead letter.
            self._settle(entry, cancelled(run, CANCELLED_MESSAGE))
            return
        # A handler that never started leaves no history: there was no attempt to record.
        error = (
            None
            if not started
            else str(
                JobCancelledError(
                    f"attempt {run.attempt} of job {run.job_id!r} run {run.run_id!r} was cancelled:"
                    f" {_CANCEL_MESSAGES[reason]}. It was returned to waiting without consuming"
                    " the attempt.",
                    fix="nothing: the run is retaken. If drains often cut runs short, raise"
                    " drain_timeout or make the handler finish (or checkpoint) sooner.",
                )
            )
        )
        run_at = self._clock.now()
        if reason == "lock-lost":
            run_at += timedelta(seconds=lock_held_delay(entry.job.retry))
        handed_back = released(
            run, run_at, reason="cancelled" if started else "unstarted", error=error
        )
        self._settle(entry, handed_back)

    def _fail(self, entry: InFlight, exc: BaseException) -> None:
        """The attempt raised ``exc`` (or timed out): the settlement the retry plan calls for
        (K4, K5)."""
        self._settle(entry, raised_settlement(entry.job, entry.run, exc, self._clock.now()))

    def _dead_letter_undecodable(self, entry: InFlight, exc: BaseException) -> None:
        if not isinstance(exc, InvalidPayloadError):
            exc = InvalidPayloadError(
                f"the stored payload could not be decoded for job {entry.job.id!r}: {exc!r}",
                fix="a payload that does not decode never will: fix the codec or the payload"
                " type, then retry the dead run.",
            )
        self._settle(entry, failed(entry.run, describe_failure(exc), None, "terminal"))

    def _hand_back_version(self, entry: InFlight) -> None:
        """D9: this process has no handler for the version the run was enqueued under: the run
        goes back to waiting unexecuted, its attempt unspent, due again after VERSION_RECHECK
        seconds (a worker that registers the version claims it then); reported and recorded in
        its history. Nothing of the handler ran, no lock was taken."""
        run = entry.run
        served = sorted(entry.job.served_versions)
        error = JobVersionUnavailableError(
            f"job {run.job_id!r} run {run.run_id!r} was enqueued under handler version"
            f" {run.handler_version}, which this worker ({self._worker_id}) does not register"
            f" (it serves {served or 'no versions'}); the run was handed back, its attempt"
            f" unspent, and is due again in {VERSION_RECHECK:g} s.",
            fix=f"keep version {run.handler_version}'s handler in define_job(...,"
            f" previous={{{run.handler_version}: handler}}) until no live run needs it"
            " (ship-sqla workflows versions), or run a worker that registers it.",
        )
        self._report_error(error)
        at = self._clock.now() + timedelta(seconds=VERSION_RECHECK)
        self._settle(entry, released(run, at, reason="version", error=describe_failure(error)))

    def _hand_back_lapsed(self, entry: InFlight) -> None:
        """J6: the run's lease may have lapsed before its handler could start (the loop was
        blocked, or the claim answered late): another worker may be running it already, so
        it is not started here. Reported, then released (attempt unspent) unless it was
        retaken meanwhile, in which case the fenced release changes nothing."""
        late = self._clock.monotonic() - entry.lease_deadline
        # Lost: no heartbeat keeps it, and a "stale" answer is expected, not reported again.
        entry.mark_lost()
        self._report_error(lapsed_before_start_error(entry.run, late))
        self._settle(entry, released(entry.run, self._clock.now(), reason="lapsed"))

    async def _end(self, entry: InFlight) -> None:
        """Free the run's slot, key and lock. Runs when the task ends, whatever happened."""
        lock, entry.lock = entry.lock, None
        if lock is not None:
            try:
                await lock.release()
            except Exception as exc:  # noqa: BLE001 - J11; the lock's lease frees it anyway
                self._report_error(exc)
        self._runs.ended(entry)
        self._events.task_ended()
