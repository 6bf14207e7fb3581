"""Cancel (K2) and pause / resume (K3) on every backend: the storage ports, the operator gate
and the runtime. Waits are on events with ``anyio.fail_after``; time moves only through the
FrozenClock.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import ErrorLog, claim_request, record_of, settle_loop
from spy_backend import SpyBackend

from ship_sqla import create_job_operations, define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError, JobOperationRefusedError, PermissionDeniedError
from ship_sqla.jobs import (
    Concurrency,
    EnqueueRequest,
    PausedJob,
    PauseResult,
    RetryPolicy,
    Schedule,
)
from ship_sqla.kernel import cancelled, completed, failed, released
from ship_sqla.kernel._ports import CANCEL_LAPSED_MESSAGE, CANCELLED_MESSAGE
from ship_sqla.kernel._tenancy import tenant_ambient
from ship_sqla.operators import InMemoryAuditLog

LEASE = 30.0


def allow(permission: str, operation: str) -> bool:
    return True


async def noop(ctx: Any, payload: Any) -> None:
    return None


def job_named(job_id: str, **options: Any) -> Any:
    options.setdefault("concurrency", Concurrency(max=5, lease=LEASE))
    return define_job(job_id, noop, payload=dict, **options)


def kinds(record: Any) -> list[str]:
    return [entry.get("kind") for entry in record.history]


# --- cancel: the storage port and the operator gate (K2) ---------------------------------------


async def test_k2_cancelling_a_waiting_run_makes_it_cancelled_at_once(clock, job_backend_factory):
    """K2: a waiting run (due or delayed) is cancelled at once: terminal, finished now, never
    claimed; its dedupe key is free again (J1 looks only at live runs)."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = job_named("k2.waiting")
    due = await backend.enqueue(job, {"n": 1}, dedupe_key="d")
    later = await backend.enqueue(job, {"n": 2}, run_at=clock.now() + timedelta(hours=1))
    for result in (due, later):
        assert result.run_id is not None
        cancelled = await ops.cancel(result.run_id)
        assert cancelled.outcome == "cancelled"
        assert cancelled.changed
        assert cancelled.record.state == "cancelled"
        assert cancelled.record.finished_at == clock.now()
        assert cancelled.record.cancel_requested_at is None
        assert cancelled.record.attempt == 0
    clock.advance(7200)
    assert await backend.claim(claim_request(job, worker="w", limit=5)) == []
    again = await backend.enqueue(job, {"n": 3}, dedupe_key="d")
    assert again.accepted
    assert not again.deduplicated


async def test_k2_cancelling_a_running_run_records_the_request_and_its_cancel_ends_it(
    clock, job_backend_factory
):
    """K2: a running run's cancel is recorded (state still running, the first request's time
    kept by a repeat); the holder's heartbeat still holds the lease and answers
    cancel-requested; the holder's Cancel ends the run cancelled with the attempt counted and
    the cancellation in its history; it is never claimed again."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = job_named("k2.running", retry=RetryPolicy(attempts=3))
    await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="w"))
    requested_at = clock.now()
    first = await ops.cancel(run.run_id)
    assert (first.outcome, first.record.state) == ("requested", "running")
    assert first.record.cancel_requested_at == requested_at
    clock.advance(1)
    second = await ops.cancel(run.run_id)
    assert second.outcome == "requested"
    assert second.record.cancel_requested_at == requested_at
    beat = await backend.heartbeat([run])
    assert beat == [True]
    assert beat.cancel_requested == {run.run_id}
    assert await backend.settle([cancelled(run, CANCELLED_MESSAGE)]) == ["cancelled"]
    record = await record_of(backend, run.run_id)
    assert (record.state, record.attempt) == ("cancelled", 1)
    assert record.finished_at == clock.now()
    assert kinds(record) == ["cancelled"]
    assert record.last_error == CANCELLED_MESSAGE
    clock.advance(3600)
    assert await backend.claim(claim_request(job, worker="w")) == []
    assert (await ops.cancel(run.run_id)).outcome == "finished"


async def test_k2_only_a_complete_of_a_cancel_requested_run_does_not_end_it_cancelled(
    clock, job_backend_factory
):
    """K2: once a cancel was requested, a failure (attempts left, retry due now) or a release
    that raced the request still ends the run cancelled, never waiting or dead, with its own
    history entry and its attempt counted; a completion that got there first completes it (its
    work was done)."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = job_named("k2.raced", retry=RetryPolicy(attempts=5))
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
    failing, releasing, completing = await backend.claim(claim_request(job, worker="w", limit=3))
    for run in (failing, releasing, completing):
        assert (await ops.cancel(run.run_id)).outcome == "requested"
    now = clock.now()
    outcomes = await backend.settle(
        [
            failed(failing, "ValueError: boom", retry_at=now),
            released(releasing, now, reason="lock-held", error="released by a drain"),
            completed(completing),
        ]
    )
    assert outcomes == ["cancelled", "cancelled", "completed"]
    was_failing = await record_of(backend, failing.run_id)
    assert (was_failing.state, was_failing.attempt, kinds(was_failing)) == (
        "cancelled",
        1,
        ["failure"],
    )
    was_released = await record_of(backend, releasing.run_id)
    assert (was_released.state, was_released.attempt, kinds(was_released)) == (
        "cancelled",
        1,
        ["released"],
    )
    assert (await record_of(backend, completing.run_id)).state == "completed"
    assert await backend.claim(claim_request(job, worker="w", limit=3)) == []


async def test_k2_a_cancel_requested_run_whose_lease_lapsed_is_cancelled_never_retaken(
    clock, job_backend_factory
):
    """K2, J3, J6: a cancel-requested run whose lease lapsed (its holder died) is cancelled by
    the next claim, attempts left or not: never retaken, not reported as a dead letter
    (``buried`` is empty), its slot free for the job's next run in the same claim; the dead
    holder's heartbeat is refused."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = job_named(
        "k2.lapsed", concurrency=Concurrency(max=1, lease=10), retry=RetryPolicy(attempts=3)
    )
    first = await backend.enqueue(job, {"n": 1})
    [held] = await backend.claim(claim_request(job, worker="dead"))
    second = await backend.enqueue(job, {"n": 2})
    assert (await ops.cancel(held.run_id)).outcome == "requested"
    clock.advance(11)
    batch = await backend.claim(claim_request(job, worker="alive"))
    assert [run.run_id for run in batch] == [second.run_id]
    assert batch.buried == ()
    record = await record_of(backend, first.run_id)
    assert (record.state, record.attempt) == ("cancelled", 1)
    assert record.history[-1]["error"] == CANCEL_LAPSED_MESSAGE
    assert kinds(record) == ["cancelled"]
    assert await backend.heartbeat([held]) == [False]


async def test_k2_cancelling_a_finished_run_changes_nothing_and_says_so(clock, job_backend_factory):
    """K2 (SPEC §10, fenced on the live states): cancelling a completed, dead, discarded or
    cancelled run changes nothing (the record is the same before and after) and answers
    ``"finished"``; an unknown run is refused."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = job_named("k2.finished", retry=RetryPolicy(attempts=1))
    ids = [
        r.run_id
        for r in await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(4)])
    ]
    done, dead, discarded, cancelled = ids
    claimed = {
        run.run_id: run for run in await backend.claim(claim_request(job, worker="w", limit=2))
    }
    assert await backend.settle(
        [completed(claimed[done]), failed(claimed[dead], "boom", retry_at=None)]
    ) == ["completed", "dead"]
    await ops.discard(discarded)
    await ops.cancel(cancelled)
    clock.advance(5)
    for run_id, state in zip(ids, ("completed", "dead", "discarded", "cancelled"), strict=True):
        before = await record_of(backend, run_id)
        assert before.state == state
        result = await ops.cancel(run_id)
        assert (result.outcome, result.changed) == ("finished", False)
        assert result.record == before
        assert await record_of(backend, run_id) == before
    with pytest.raises(JobOperationRefusedError, match="no such run"):
        await ops.cancel("no-such-run")


class RecordingAdmin:
    """An admin port that records what it is asked (to prove refusals ask nothing)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.asked.append(name)
        return getattr(self.inner, name)


class Administered:
    """A backend's parts the operator surface gates, with a spy in place of its admin port."""

    def __init__(self, admin: Any, backend: Any) -> None:
        self.admin = admin
        self.workers = backend.workers
        self.workflows = backend.workflows


async def test_k2_s1_cancel_matching_walks_live_runs_in_bounded_pages_by_filter(
    clock, job_backend_factory
):
    """K2, S1 (issue 33): cancel_matching cancels every live run of the filter (job, tenant,
    state, created before) in pages of batch_size, across pages, both states (waiting first);
    a run outside the filter is never touched; max_batches stops early with complete=False
    and a second call finishes; one audit entry per call with its exact count. Bad input is
    refused before anything changes."""
    backend = job_backend_factory(clock)
    log = InMemoryAuditLog(clock)
    ops = create_job_operations(backend, authorizer=allow, audit=log)
    job, other = job_named("k2.many"), job_named("k2.other")
    with tenant_ambient("t1"):
        old = [await backend.enqueue(job, {"n": n}) for n in range(5)]
        clock.advance(60)
        cutoff = clock.now()
        young = await backend.enqueue(job, {"n": 9})
        kept = await backend.enqueue(other, {"n": 11})
    with tenant_ambient("t2"):
        elsewhere = await backend.enqueue(job, {"n": 10})
    [running] = await backend.claim(claim_request(job, worker="w"))
    assert running.run_id == old[0].run_id

    first = await ops.cancel_matching(
        job_id=job.id, tenant="t1", created_before=cutoff, batch_size=2, max_batches=2
    )
    assert not first.complete
    assert len(first.changed) == 4  # two full pages of the waiting old runs: there may be more
    rest = await ops.cancel_matching(
        job_id=job.id, tenant="t1", created_before=cutoff, batch_size=2
    )
    assert rest.complete
    assert sorted(first.changed + rest.changed) == sorted(r.run_id for r in old)
    states = {r.run_id: (await record_of(backend, r.run_id)).state for r in old}
    assert states.pop(running.run_id) == "running"  # requested: its holder cancels it
    assert set(states.values()) == {"cancelled"}
    assert (await record_of(backend, running.run_id)).cancel_requested_at is not None
    for untouched in (young, elsewhere, kept):
        assert (await record_of(backend, untouched.run_id)).state == "waiting"

    only_running = await ops.cancel_matching(state="running")
    assert only_running.changed == (running.run_id,)
    assert [(e.operation, e.count) for e in log.entries] == [
        ("jobs.cancel_matching", 4),
        ("jobs.cancel_matching", 1),  # the young waiting run skipped; the running one requested
        ("jobs.cancel_matching", 1),  # asked again (harmless: its first request's time is kept)
    ]
    for bad in (
        {"state": "dead"},
        {"batch_size": 0},
        {"max_batches": 10_000},
        {"tenant": ""},
        {"created_before": cutoff.replace(tzinfo=None)},
    ):
        with pytest.raises((ConfigurationError, ValueError)):
            await ops.cancel_matching(**bad)
    assert len(log.entries) == 3


async def test_k2_k3_operator_cancel_pause_resume_are_permissioned_and_check_input_first(
    clock, job_backend_factory
):
    """K2, K3 (J8's gate): without ``ship.jobs:manage`` cancel, pause, resume and paused raise
    PermissionDeniedError and change nothing; a bad job id or run id is refused before the
    store is asked anything."""
    backend = job_backend_factory(clock)
    job = job_named("k2.gate")
    result = await backend.enqueue(job, {})
    assert result.run_id is not None
    asked: list[tuple[str, str]] = []

    def deny(permission: str, operation: str) -> bool:
        asked.append((permission, operation))
        return False

    denied = create_job_operations(backend, authorizer=deny)
    with pytest.raises(PermissionDeniedError):
        await denied.cancel(result.run_id)
    with pytest.raises(PermissionDeniedError):
        await denied.pause(job.id)
    with pytest.raises(PermissionDeniedError):
        await denied.resume(job.id)
    with pytest.raises(PermissionDeniedError):
        await denied.paused()
    assert asked == [
        ("ship.jobs:manage", "cancel"),
        ("ship.jobs:manage", "pause"),
        ("ship.jobs:manage", "resume"),
        ("ship.jobs:manage", "paused"),
        ("ship.jobs:read", "paused"),
    ]
    assert (await record_of(backend, result.run_id)).state == "waiting"
    assert await backend.admin.paused(limit=10) == []
    admin = RecordingAdmin(backend.admin)
    ops = create_job_operations(Administered(admin, backend), authorizer=allow)
    for bad in ("", "has space", "a#paused", "x" * 129, 7):
        with pytest.raises(ConfigurationError):
            await ops.pause(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            await ops.resume(bad)  # type: ignore[arg-type]
    for bad_run in ("", None):
        with pytest.raises(ConfigurationError):
            await ops.cancel(bad_run)  # type: ignore[arg-type]
    assert admin.asked == []


# --- pause and resume: the storage port and the operator gate (K3) -----------------------------


async def test_k3_a_paused_job_is_never_claimed_its_runs_still_enqueue_resume_frees_them(
    clock, job_backend_factory
):
    """K3: once paused, no claim takes a run of the job (other jobs are claimed as before);
    enqueue still adds its runs; pausing twice or resuming a job that is not paused changes
    nothing and says so; ``paused`` lists the job with when it was paused; after resume the
    runs are claimable at once."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    paused_job, other_job = job_named("k3.paused"), job_named("k3.other")
    first = await backend.enqueue(paused_job, {"n": 1})
    await backend.enqueue(other_job, {"n": 1})
    assert await ops.pause(paused_job.id) == PauseResult(paused_job.id, "paused", known=True)
    paused_at = clock.now()
    clock.advance(1)
    again = await ops.pause(paused_job.id)
    assert again == PauseResult(paused_job.id, "already-paused", known=True)
    assert not again.changed
    assert await ops.paused() == [PausedJob(paused_job.id, paused_at)]
    later = await backend.enqueue(paused_job, {"n": 2})
    assert later.accepted
    assert await backend.claim(claim_request(paused_job, worker="w", limit=5)) == []
    assert len(await backend.claim(claim_request(other_job, worker="w", limit=5))) == 1
    assert await ops.resume(paused_job.id) is True
    assert await ops.resume(paused_job.id) is False
    assert await ops.paused() == []
    claimed = await backend.claim(claim_request(paused_job, worker="w", limit=5))
    assert sorted(run.run_id for run in claimed) == sorted([first.run_id, later.run_id])


async def test_k3_s1_pause_says_whether_the_database_knows_the_job_issue_25(
    clock, job_backend_factory
):
    """K3, S1, issue 25 (D7: ``pause("no.such.job")`` answered a bare True): pausing a job the
    database has no trace of is allowed, on purpose (ahead of its deploy, its runs are held
    from the first one), and the answer says plainly it is not known (``known=False``; the
    audit entry too). A job with a run in any state, a schedule, or a pause already is known;
    once paused, the unknown job is known too (its pause), and its first run waits."""
    backend = job_backend_factory(clock)
    audit = InMemoryAuditLog(clock)
    ops = create_job_operations(backend, authorizer=allow, audit=audit, actor="op")

    assert await backend.admin.job_known("no.such.job") is False
    ahead = await ops.pause("no.such.job")
    assert ahead == PauseResult("no.such.job", "paused", known=False)
    assert ahead.changed
    assert await backend.admin.job_known("no.such.job") is True  # its pause
    assert await ops.pause("no.such.job") == PauseResult(
        "no.such.job", "already-paused", known=True
    )
    assert [(e.operation, e.target, e.count, e.details) for e in audit.entries] == [
        ("jobs.pause", "no.such.job", 1, {"known": False}),
        ("jobs.pause", "no.such.job", 0, {"known": True}),
    ]
    late = job_named("no.such.job")  # deployed after the pause: its runs wait
    first = await backend.enqueue(late, {})
    assert await backend.claim(claim_request(late, worker="w")) == []
    assert await ops.resume("no.such.job") is True
    assert [run.run_id for run in await backend.claim(claim_request(late, worker="w"))] == [
        first.run_id
    ]

    finished = job_named("k3.known.finished")  # known by a run in a terminal state
    done = await backend.enqueue(finished, {})
    assert done.run_id is not None
    await ops.cancel(done.run_id)
    waiting = job_named("k3.known.waiting")
    await backend.enqueue(waiting, {})
    running = job_named("k3.known.running")
    await backend.enqueue(running, {})
    assert len(await backend.claim(claim_request(running, worker="w"))) == 1
    scheduled = define_job(
        "k3.known.scheduled", noop, payload=dict, schedule=Schedule(interval=timedelta(hours=1))
    )
    await backend.install_schedules([scheduled])
    for job_id in (finished.id, waiting.id, running.id, scheduled.id):
        assert await backend.admin.job_known(job_id) is True, job_id
        assert await ops.pause(job_id) == PauseResult(job_id, "paused", known=True), job_id
    assert await backend.admin.job_known("k3.never.seen") is False


async def test_k3_schedules_keep_adding_runs_while_their_job_is_paused(clock, job_backend_factory):
    """K3, J9: a paused job's schedule still fires its occurrence (the run waits); it runs once
    the job is resumed."""
    backend = job_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = define_job(
        "k3.scheduled", noop, payload=dict, schedule=Schedule(interval=timedelta(minutes=5))
    )
    await backend.install_schedules([job])
    assert await ops.pause(job.id)
    clock.advance(301)
    assert await backend.tick_schedules([job]) == 1
    assert await backend.claim(claim_request(job, worker="w")) == []
    assert await ops.resume(job.id)
    assert len(await backend.claim(claim_request(job, worker="w"))) == 1


async def test_k2_cleanup_deletes_cancelled_runs_past_their_retention(
    clock, inplace_backend_factory
):
    """K2, J8: cleanup applies ``Retention.cancelled`` (7 days by default) to cancelled runs.
    In the legacy in-place shape: with a history table (J16) a cancelled run is in history,
    which leaves by its partitions (J17)."""
    backend = inplace_backend_factory(clock)
    ops = create_job_operations(backend, authorizer=allow)
    job = job_named("k2.cleanup")
    result = await backend.enqueue(job, {})
    assert result.run_id is not None
    await ops.cancel(result.run_id)
    clock.advance(timedelta(days=6))
    assert await ops.cleanup([job]) == {job.id: 0}
    clock.advance(timedelta(days=1, seconds=1))
    assert await ops.cleanup([job]) == {job.id: 1}
    assert await backend.admin.get_run(result.run_id) is None


# --- the runtime (K2, K3) ---------------------------------------------------------------------


class Blocking:
    """A handler that runs until it is cancelled and records why."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = anyio.Event()
        self.starts = 0
        self.reason: str | None = None

    async def __call__(self, ctx: Any, payload: Any) -> None:  # noqa: ARG002 - a handler's
        self.starts += 1
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.reason = ctx.cancel_reason
            self.cancelled.set()


async def test_k2_the_runtime_cancels_a_running_handler_at_once_and_the_run_ends_cancelled(
    clock, job_backend_factory
):
    """K2: cancelling a running run through the operator surface cancels its handler at once,
    without waiting for a heartbeat (time does not move here): ``ctx.cancel_reason`` is
    ``"cancelled"``; the run ends cancelled after one attempt, not retried, not dead, and it
    is no error (on_error gets nothing)."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    ops = create_job_operations(backend.inner, authorizer=allow)
    handler = Blocking()
    job = define_job(
        "k2.runtime",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=3),
    )
    result = await backend.enqueue(job, {})
    assert result.run_id is not None
    async with await start_job_runtime([job], backend=backend):
        with anyio.fail_after(10):
            await handler.started.wait()
        assert (await ops.cancel(result.run_id)).outcome == "requested"
        with anyio.fail_after(10):
            await handler.cancelled.wait()
        await backend.wait_settled("cancel", 1)
        assert backend.calls.get("heartbeat", []) == []
    assert handler.reason == "cancelled"
    assert [outcome for _, outcome in backend.settled("cancel")] == ["cancelled"]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, kinds(record)) == ("cancelled", 1, ["cancelled"])
    assert handler.starts == 1
    assert errors.errors == []


class Deaf(SpyBackend):
    """A backend wrapper that tells its runtime of no cancel request (its watch never calls
    back, as when every notification is lost): only the heartbeat's answer can carry one."""

    def watch_cancel_requests(self, callback: Any) -> Any:  # noqa: ARG002 - deaf on purpose
        return lambda: None


async def test_k2_without_a_notification_the_next_heartbeat_carries_the_cancel(
    clock, job_backend_factory
):
    """K2 (SPEC §10): a runtime that hears no notification learns of the cancel from its next
    heartbeat, which still holds the lease and answers cancel-requested; the handler is
    cancelled and the run ends cancelled."""
    backend = Deaf(job_backend_factory(clock))
    ops = create_job_operations(backend.inner, authorizer=allow)
    handler = Blocking()
    job = define_job("k2.fallback", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    assert result.run_id is not None
    async with await start_job_runtime([job], backend=backend):
        with anyio.fail_after(10):
            await handler.started.wait()
        await ops.cancel(result.run_id)
        await settle_loop()
        assert not handler.cancelled.is_set()  # nobody told it yet
        clock.advance(LEASE / 3)  # the next heartbeat is due; time stops there
        await backend.wait_calls("heartbeat", 1)
        with anyio.fail_after(10):
            await handler.cancelled.wait()
        await backend.wait_settled("cancel", 1)
    [beat] = backend.answered("heartbeat")
    assert beat.result.cancel_requested == {result.run_id}
    assert handler.reason == "cancelled"
    assert (await record_of(backend, result.run_id)).state == "cancelled"


async def test_k3_the_runtime_stops_claiming_a_paused_job_running_runs_finish_resume_wakes(
    clock, job_backend_factory
):
    """K3: while a job is paused the runtime claims none of its runs (its claims come back
    empty, enqueues still land); the run that was running finishes; resume makes the waiting
    run start at once, without a poll (time does not move)."""
    backend = SpyBackend(job_backend_factory(clock))
    ops = create_job_operations(backend.inner, authorizer=allow)
    gate = anyio.Event()
    started: list[int] = []
    first_started, second_started = anyio.Event(), anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        started.append(payload["n"])
        (first_started if payload["n"] == 1 else second_started).set()
        if payload["n"] == 1:
            await gate.wait()

    job = define_job("k3.runtime", handler, payload=dict, concurrency=Concurrency(max=5))
    first = await backend.enqueue(job, {"n": 1})
    async with await start_job_runtime([job], backend=backend, poll_interval=3600.0):
        with anyio.fail_after(10):
            await first_started.wait()
        assert await ops.pause(job.id)
        claims_before = len(backend.answered("claim"))
        second = await backend.enqueue(job, {"n": 2})  # wakes the loop: it claims, gets nothing
        await backend.wait_calls("claim", claims_before + 1)
        await settle_loop()
        assert started == [1]
        assert (await record_of(backend, second.run_id)).state == "waiting"
        gate.set()
        await backend.wait_settled("complete", 1)
        assert (await record_of(backend, first.run_id)).state == "completed"
        assert await ops.resume(job.id)
        with anyio.fail_after(10):
            await second_started.wait()
    assert started == [1, 2]
