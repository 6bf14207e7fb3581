"""Transactional handlers (SPEC §8 J13, J14) on every backend: the handler's writes, the runs it
enqueues, the inbox mark and the completion commit together or not at all.

Each test runs the real runtime on the backend (through the recording spy) and stops it, so
every executing attempt has committed or rolled back before anything is read. On PostgreSQL the
effects table has no unique constraint (tests/support/transactional_kit.py).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from job_helpers import ErrorLog, advance_until_awaited, claim_request, record_of
from spy_backend import SpyBackend
from transactional_kit import kit_for

from ship_sqla import JobContext, define_job, start_job_runtime
from ship_sqla.errors import JobLeaseStaleError, Snooze
from ship_sqla.jobs import Concurrency, Inbox, RetryPolicy
from ship_sqla.kernel._runtime.fused import FusedAttempt
from ship_sqla.kernel._runtime.state import InFlight
from ship_sqla.kernel._transactional import SettlesApart

LEASE = 30.0


async def _serve(backend: SpyBackend, jobs: list[Any], until: Any, *, limit: float = 10) -> None:
    """Run a runtime on ``backend`` until ``until()`` (awaited on every recorded call) holds,
    then stop it (its drain lets every attempt commit or roll back)."""
    async with await start_job_runtime(jobs, backend=backend, worker_id="w1"):
        with anyio.fail_after(limit):
            while not await until():
                await backend._changed.wait()


def _calls(spy: SpyBackend, name: str, count: int) -> Any:
    async def until() -> bool:
        return len(spy.calls.get(name, ())) >= count

    return until


async def test_j13_writes_enqueues_and_completion_commit_together(clock, job_backend_factory):
    """J13, J1, U1: the handler's effect, the run it enqueues and the run's completion commit
    in one transaction: the run is completed, one effect row, the follow-up run waiting."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    kit = await kit_for(backend, clock)
    follow_ups: list[str | None] = []

    async def follow_up(ctx, payload):
        pass

    after = define_job("j13.after", follow_up, payload=dict)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect(payload["order"])
        result = await backend.enqueue(after, {"order": payload["order"]})
        follow_ups.append(result.run_id)

    job = define_job("j13.order", handler, payload=dict, transaction=kit.uow)
    result = await backend.enqueue(job, {"order": "o-1"})
    await _serve(backend, [job], _calls(backend, "settle_within", 1))
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert await kit.effects() == ["o-1"]
    assert (await record_of(backend, follow_ups[0])).state == "waiting"
    # The completion was the transaction's: the completer sent none.
    assert backend.settled("complete") == []
    assert errors.errors == []


async def test_j13_a_raising_handler_rolls_everything_back_then_k4_settles(
    clock, job_backend_factory
):
    """J13, K4: a handler that raises after writing and enqueueing leaves no effect and no
    enqueued run; the attempt then settles as K4 says (retrying, its error in the history);
    the next attempt commits once."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)
    enqueued: list[str | None] = []

    async def follow_up(ctx, payload):
        pass

    after = define_job("j13.after2", follow_up, payload=dict)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect(f"attempt-{ctx.attempt}")
        enqueued.append((await backend.enqueue(after, {"n": ctx.attempt})).run_id)
        if ctx.attempt == 1:
            raise RuntimeError("boom after the writes")

    job = define_job(
        "j13.raise",
        handler,
        payload=dict,
        transaction=kit.uow,
        retry=RetryPolicy(attempts=3, base_delay=1.0, jitter="none"),
    )
    result = await backend.enqueue(job, {})

    async with await start_job_runtime([job], backend=backend, worker_id="w1"):
        await backend.wait_settled("fail", 1)
        # Time moves in steps until the second attempt is claimed (moved only when a call was
        # recorded, it could stop just before the runtime parked its poll: a lost wake-up),
        # then stands still while it runs: moved on meanwhile, it outran the attempt's own
        # database work on a loaded machine and lapsed its lease before the handler started.
        # At most 10 s in all (the retry is due 1 s after the failure, the poll is 1 s): the
        # second claim's own statement can take long enough under load for unbounded steps to
        # carry time past its 30 s lease before the handler starts (seen once at load ~10).
        await advance_until_awaited(
            clock, lambda: _claimed(backend, attempt=2), step=0.5, most=10.0
        )
        await backend.wait_calls("settle_within", 1)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert "boom after the writes" in record.history[0]["error"]
    assert await kit.effects() == ["attempt-2"]
    assert (await backend.admin.get_run(enqueued[0])) is None
    assert (await record_of(backend, enqueued[1])).state == "waiting"


async def _claimed(backend: SpyBackend, *, attempt: int) -> None:
    """Until a claim answered a run at ``attempt``."""

    def claimed() -> bool:
        answers = backend.answered("claim")
        return any(run.attempt == attempt for call in answers for run in call.result)

    await backend.wait_for(claimed)


async def test_j13_k4_snooze_after_rollback_spends_no_attempt(clock, job_backend_factory):
    """J13, K4: a Snooze raised after a write rolls the write back and snoozes the run, its
    attempt unspent."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect("snoozing")
        raise Snooze(60)

    job = define_job("j13.snooze", handler, payload=dict, transaction=kit.uow)
    result = await backend.enqueue(job, {})

    async def snoozed() -> bool:
        return bool(backend.settled("snooze"))

    await _serve(backend, [job], snoozed)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.snoozes) == ("waiting", 0, 1)
    assert await kit.effects() == []


async def test_j13_inbox_duplicate_completes_without_calling_the_handler(
    clock, job_backend_factory
):
    """J13, I1, I2: two runs with one inbox key: the first runs the handler and marks the key
    in its transaction; the second completes as a duplicate, the handler not called (its
    history says so); one effect row."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)
    calls: list[str] = []

    async def handler(ctx, payload, repositories):
        calls.append(ctx.run_id)
        await repositories.add_effect(payload["order"])

    job = define_job(
        "j13.inbox",
        handler,
        payload=dict,
        transaction=kit.uow,
        inbox=Inbox(kit.inbox, key=lambda p: p["order"]),
        concurrency=Concurrency(max=1),
    )
    first = await backend.enqueue(job, {"order": "o-7"})
    second = await backend.enqueue(job, {"order": "o-7"})
    await _serve(backend, [job], _calls(backend, "settle_within", 2))
    assert len(calls) == 1
    assert (await record_of(backend, first.run_id)).state == "completed"
    dup = await record_of(backend, second.run_id)
    assert dup.state == "completed"
    assert dup.history[-1]["kind"] == "duplicate"
    assert [outcome for call in backend.answered("settle_within") for outcome in [call.result]] == [
        "completed",
        "duplicate",
    ]
    assert await kit.effects() == ["o-7"]


async def test_j13_inbox_fingerprint_mismatch_is_terminal(clock, job_backend_factory):
    """J13, I2: a second payload under a marked key (another fingerprint) dead-letters its run
    with SHIP_SQLA_JOB_INBOX_MISMATCH, the handler not called."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)
    calls: list[dict[str, Any]] = []

    async def handler(ctx, payload, repositories):
        calls.append(payload)
        await repositories.add_effect(payload["order"])

    job = define_job(
        "j13.mismatch",
        handler,
        payload=dict,
        transaction=kit.uow,
        inbox=Inbox(kit.inbox, key=lambda p: p["order"]),
        concurrency=Concurrency(max=1),
    )
    await backend.enqueue(job, {"order": "o-8", "amount": 1})
    second = await backend.enqueue(job, {"order": "o-8", "amount": 2})

    async def dead() -> bool:
        return bool(backend.settled("fail"))

    await _serve(backend, [job], dead)
    record = await record_of(backend, second.run_id)
    assert record.state == "dead"
    assert "SHIP_SQLA_JOB_INBOX_MISMATCH" in record.history[-1]["error"]
    assert len(calls) == 1
    assert await kit.effects() == ["o-8"]


async def test_j13_a_transactional_handler_cannot_make_workflow_calls(clock, job_backend_factory):
    """J13: a workflow call inside a transactional handler is a typed misuse error (its writes
    rolled back, the attempt failed)."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect("before the step")

        async def nothing() -> int:
            return 1

        await ctx.step("not allowed", nothing)

    job = define_job(
        "j13.misuse", handler, payload=dict, transaction=kit.uow, retry=RetryPolicy(attempts=1)
    )
    result = await backend.enqueue(job, {})

    async def failed() -> bool:
        return bool(backend.settled("fail"))

    await _serve(backend, [job], failed)
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert "SHIP_SQLA_JOB_TRANSACTIONAL_MISUSE" in record.history[-1]["error"]
    assert await kit.effects() == []


async def test_j13_a_workflow_completes_its_run_in_its_last_transaction(clock, job_backend_factory):
    """J13, D2: ``ctx.transaction(..., completes_run=True)``: the step's result, its writes and
    the run's completion commit together (the completer sends no completion); a step after it
    is a misuse error."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)
    misuse: list[BaseException] = []

    async def handler(ctx, payload):
        async def write(repositories):
            await repositories.add_effect("wf")
            return {"ok": True}

        got = await ctx.transaction("finish", kit.uow, write, completes_run=True)
        assert got == {"ok": True}
        try:
            await ctx.step("after", lambda: None)
        except Exception as exc:
            misuse.append(exc)

    job = define_job("j13.wf", handler, payload=dict)
    result = await backend.enqueue(job, {})
    await _serve(backend, [job], _calls(backend, "settle_within", 1))
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert await kit.effects() == ["wf"]
    [step] = await backend.workflows.list_steps(result.run_id)
    assert (step.name, step.state) == ("finish", "done")
    assert backend.settled("complete") == []
    assert [getattr(e, "code", None) for e in misuse] == ["SHIP_SQLA_JOB_TRANSACTIONAL_MISUSE"]


# --- J14 on every backend: a stale holder and a cancel, driven one attempt at a time ------------


async def _attempt(backend: Any, job: Any, run: Any) -> FusedAttempt:
    """One transactional attempt of ``run`` outside a runtime (what the executor does)."""
    entry = InFlight(job, run, backend.clock.monotonic())
    ctx = JobContext(run, entry, worker_id="w")
    attempt = FusedAttempt(entry, ctx, job.decode(run.payload), backend, backend.clock)
    await attempt.run()
    return attempt


async def test_j14_a_stale_holder_changes_nothing(clock, job_backend_factory):
    """J14, J5, J6: a holder whose lease lapsed and whose run another claim retook runs its
    handler's transaction: the fence refuses it (JobLeaseStaleError), nothing is written, and
    the current holder's transaction commits once."""
    backend = job_backend_factory(clock)
    kit = await kit_for(backend, clock)
    ran: list[int] = []

    async def handler(ctx, payload, repositories):
        ran.append(ctx.token)
        await repositories.add_effect(f"token-{ctx.token}")

    job = define_job(
        "j14.stale",
        handler,
        payload=dict,
        transaction=kit.uow,
        concurrency=Concurrency(lease=LEASE),
    )
    result = await backend.enqueue(job, {})
    [stale] = await backend.claim(claim_request(job, worker="A"))
    clock.advance(LEASE + 1)
    [current] = await backend.claim(claim_request(job, worker="B"))
    with pytest.raises(JobLeaseStaleError):
        await _attempt(backend, job, stale)
    assert ran == []
    assert await kit.effects() == []
    done = await _attempt(backend, job, current)
    assert done.landed is not None
    assert await kit.effects() == [f"token-{current.token}"]
    assert (await record_of(backend, result.run_id)).state == "completed"
    # The stale holder retried after the commit changes nothing either.
    with pytest.raises(JobLeaseStaleError):
        await _attempt(backend, job, stale)
    assert await kit.effects() == [f"token-{current.token}"]


async def test_j14_a_cancel_committed_before_the_fence_ends_the_run_cancelled(
    clock, job_backend_factory
):
    """J14, K2: an operator's cancel committed before the transaction's fence: the transaction
    rolls back before the handler runs, and the settlement it asks for is a cancellation."""
    backend = job_backend_factory(clock)
    kit = await kit_for(backend, clock)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect("never")

    job = define_job("j14.cancel", handler, payload=dict, transaction=kit.uow)
    result = await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="A"))
    await backend.admin.cancel(result.run_id)
    with pytest.raises(SettlesApart) as apart:
        await _attempt(backend, job, run)
    [outcome] = await backend.settle([apart.value.settlement])
    assert outcome == "cancelled"
    assert (await record_of(backend, result.run_id)).state == "cancelled"
    assert await kit.effects() == []


async def test_j13_the_fence_waits_for_a_heartbeat_already_on_its_way(clock, job_backend_factory):
    """J13: a heartbeat naming the run that is on its way when the transaction opens is let
    through before the fence (else, reaching the row after the fence's lock, it would wait for
    the whole transaction and hold up the batch's other runs); from then on the run is fenced,
    so no heartbeat names it."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect("once")

    job = define_job("j13.beat", handler, payload=dict, transaction=kit.uow)
    await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="A"))
    entry = InFlight(job, run, clock.monotonic())
    beat = entry.beat_pending = anyio.Event()
    ctx = JobContext(run, entry, worker_id="w")
    attempt = FusedAttempt(entry, ctx, job.decode(run.payload), backend, clock)
    async with anyio.create_task_group() as group:
        group.start_soon(attempt.run)
        await backend.wait_started("fence", 0)
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        assert entry.fenced
        assert backend.started.get("fence", 0) == 0
        beat.set()
    assert backend.started["fence"] == 1
    assert attempt.landed is not None
    assert await kit.effects() == ["once"]


@pytest.mark.parametrize("fault", ["after", "before"])
async def test_j13_an_ambiguous_commit_is_resolved_by_reading_the_run(clock, fault):
    """J13: the COMMIT's answer lost (the in-memory unit of work's ``commit_fault``): "after"
    (it committed) is read back as completed, once, with nothing reported stale; "before" (it
    did not) settles as the failed attempt it was (K4) and the retry commits once."""
    from ship_sqla.kernel import InMemoryJobBackend  # noqa: PLC0415 - memory only

    errors = ErrorLog()
    backend = SpyBackend(InMemoryJobBackend(clock=clock, on_error=errors))
    kit = await kit_for(backend, clock)

    async def handler(ctx, payload, repositories):
        await repositories.add_effect(f"attempt-{ctx.attempt}")
        if ctx.attempt == 1:
            kit.uow.commit_fault = fault

    job = define_job(
        "j13.ambiguous",
        handler,
        payload=dict,
        transaction=kit.uow,
        retry=RetryPolicy(attempts=3, base_delay=1.0, jitter="none"),
    )
    result = await backend.enqueue(job, {})

    async def ended() -> bool:
        if backend.settled("fail"):
            clock.advance(1.0)
        record = await record_of(backend, result.run_id)
        return record.state == "completed"

    await _serve(backend, [job], ended)
    record = await record_of(backend, result.run_id)
    if fault == "after":
        assert (record.attempt, await kit.effects()) == (1, ["attempt-1"])
        assert backend.settled() == []
    else:
        assert (record.attempt, await kit.effects()) == (2, ["attempt-2"])
    assert [e for e in errors.errors if getattr(e, "code", "") == "SHIP_SQLA_JOB_LEASE_STALE"] == []


async def test_k2_j14_a_cancel_reaches_a_transactional_handler_inside_its_transaction(
    clock, job_backend_factory
):
    """K2, J14: an operator cancels a run whose transactional handler is inside its transaction
    (the fence held, its writes made): the cancel does not wait for the handler to end; the
    holder learns it at once, its handler is cancelled, everything it wrote rolls back, and the
    run ends cancelled."""
    backend = SpyBackend(job_backend_factory(clock))
    kit = await kit_for(backend, clock)
    entered = anyio.Event()

    async def handler(ctx, payload, repositories):
        await repositories.add_effect("never committed")
        entered.set()
        await anyio.Event().wait()  # works until it is cancelled

    job = define_job("j14.cancel-inside", handler, payload=dict, transaction=kit.uow)
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend, worker_id="w1"):
        with anyio.fail_after(10):
            await entered.wait()
            await backend.admin.cancel(result.run_id)
        await backend.wait_settled("cancel", 1)
    record = await record_of(backend, result.run_id)
    assert record.state == "cancelled"
    assert await kit.effects() == []
