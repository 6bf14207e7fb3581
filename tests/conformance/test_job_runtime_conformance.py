"""The job runtime end to end, on every backend: the loop, retries, locks, drain, recovery.

Waits are on events with ``anyio.fail_after``; time moves only through the FrozenClock.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import anyio
import pytest
from global_meter import global_meter
from job_helpers import ErrorLog, advance_until, advance_until_awaited, claim_request, record_of
from jobs_conformance_support import single_runner_locks
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import JobCancelledError
from ship_sqla.jobs import Concurrency, EnqueueRequest, RetryPolicy
from ship_sqla.kernel._ports import LEASE_LAPSED_FINAL_MESSAGE, JobLeaseLapsedFinalError

LEASE = 30.0


async def test_runtime_completes_every_enqueued_run(clock, job_backend_factory):
    """J3 end to end: N enqueued runs are each executed once and completed; completions are
    batched (fewer complete calls than runs)."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    seen: list[int] = []
    all_seen = anyio.Event()
    total = 60

    async def handler(ctx, payload):
        assert ctx.attempt == 1
        assert ctx.token >= 1
        seen.append(payload["n"])
        if len(seen) == total:
            all_seen.set()

    job = define_job("conf.e2e", handler, payload=dict, concurrency=Concurrency(max=25))
    results = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(total)])
    async with await start_job_runtime([job], backend=backend, worker_id="w1"):
        with anyio.fail_after(20):
            await all_seen.wait()
    assert sorted(seen) == list(range(total))
    for result in results:
        assert (await record_of(backend, result.run_id)).state == "completed"
    completed = [settlement.run for settlement, _ in backend.settled("complete")]
    assert len(completed) == total
    assert len(backend.settle_batches("complete")) < total
    assert errors.errors == []


async def test_runtime_wakes_on_enqueue_after_start(clock, job_backend_factory):
    """J3: an enqueue made while the loop waits wakes it at once (frozen time never polls)."""
    backend = job_backend_factory(clock)
    ran = anyio.Event()

    async def handler(ctx, payload):
        ran.set()

    job = define_job("conf.wake", handler, payload=dict)
    async with await start_job_runtime([job], backend=backend, poll_interval=3600.0):
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        await backend.enqueue(job, {})
        with anyio.fail_after(10):
            await ran.wait()


async def test_runtime_retries_then_dead_letters(clock, job_backend_factory):
    """J7 through the runtime: a failing handler is retried after the declared backoff, its
    failures land in history, and the run is dead after retry.attempts."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    attempts: list[int] = []

    async def handler(ctx, payload):
        attempts.append(ctx.attempt)
        raise ValueError(f"boom on attempt {ctx.attempt}")

    job = define_job(
        "conf.fails",
        handler,
        payload=dict,
        # A long lease: time is pumped forward while the database answers.
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=10, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        await backend.wait_settled("fail", 1)
        fail, outcome = backend.settled("fail")[0]
        assert outcome == "retrying"
        assert fail.run_at == clock.now() + timedelta(seconds=10)
        await advance_until_awaited(
            clock, lambda: backend.wait_settled("fail", 3, limit=30), step=1.0
        )
    assert attempts == [1, 2, 3]
    assert [outcome for _, outcome in backend.settled("fail")] == ["retrying", "retrying", "dead"]
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert len(record.history) == 3
    assert "ValueError: boom on attempt 3" in record.last_error
    assert errors.errors == []


async def test_undecodable_payload_is_dead_lettered_not_retried(clock, job_backend_factory):
    """A stored payload the job's codec refuses is dead-lettered at once with a clear error."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    ran = False

    async def handler(ctx, payload):
        nonlocal ran
        ran = True

    loose = define_job("conf.decode", handler, payload=dict)
    strict = define_job("conf.decode", handler, payload=list, retry=RetryPolicy(attempts=5))
    result = await backend.enqueue(loose, {"not": "a list"})
    spy = SpyBackend(backend)
    async with await start_job_runtime([strict], backend=spy):
        await spy.wait_settled("fail", 1)
    assert not ran
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert "SHIP_SQLA_JOB_PAYLOAD_INVALID" in record.last_error
    assert errors.errors == []


async def test_j5_heartbeats_keep_a_long_run_leased(clock, job_backend_factory):
    """J5: the runtime heartbeats every third of the lease, so a run longer than its lease is
    never retaken by another worker."""
    backend = SpyBackend(job_backend_factory(clock))
    started = anyio.Event()
    release = anyio.Event()

    async def handler(ctx, payload):
        started.set()
        await release.wait()

    job = define_job("conf.long", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend):
        try:
            with anyio.fail_after(10):
                await started.wait()
            for beats in range(1, 7):
                # Time stops as soon as the heartbeat is sent, however long its answer takes.
                await advance_until_awaited(
                    clock, partial(backend.wait_started, "heartbeat", beats, limit=30), step=1.0
                )
                await backend.wait_calls("heartbeat", beats)
                assert backend.calls["heartbeat"][-1].result == [True]
            # Two full leases have passed: without heartbeats the run would be up for grabs.
            assert await backend.inner.claim(claim_request(job, worker="other", limit=1)) == []
            record = await record_of(backend, result.run_id)
            assert record.lease_expires_at > clock.now()
        finally:
            # Never leave the handler blocked: stop() would wait out the drain in frozen time.
            release.set()
        await backend.wait_settled("complete", 1)
    assert (await record_of(backend, result.run_id)).state == "completed"


async def test_j7_lock_held_elsewhere_returns_the_run_without_an_attempt(
    clock, job_backend_factory
):
    """J4/J7: when the (job id, key) lock is held elsewhere, the run goes back to waiting one
    jittered backoff step later without consuming an attempt; once free, it runs."""
    errors = ErrorLog()
    inner = job_backend_factory(clock, on_error=errors)
    backend = SpyBackend(inner)
    locks = single_runner_locks(inner, clock)
    ran = anyio.Event()

    async def handler(ctx, payload):
        assert ctx.attempt == 1
        ran.set()

    job = define_job(
        "conf.single",
        handler,
        payload=dict,
        # A long lease: time is pumped forward while the lock and the database answer, and
        # this test is about the lock, not about leases.
        concurrency=Concurrency(single_runner=True, key=lambda p: p["account"], lease=600),
        retry=RetryPolicy(attempts=1, backoff="fixed", base_delay=4, jitter="none"),
    )
    elsewhere = await locks.acquire("conf.single/acme", 600)
    assert elsewhere is not None
    try:
        result = await backend.enqueue(job, {"account": "acme"})
        async with await start_job_runtime([job], backend=backend, lock_provider=locks):
            await backend.wait_settled("release", 1)
            release, outcome = backend.settled("release")[0]
            assert outcome == "released"
            assert release.entry is None
            assert release.run_at == clock.now() + timedelta(seconds=4)
            record = await record_of(backend, result.run_id)
            assert record.state == "waiting"
            assert record.attempt == 0
            assert not ran.is_set()
            await elsewhere.release()
            elsewhere = None
            await advance_until(clock, ran, step=1.0)
            await backend.wait_settled("complete", 1)
    finally:
        if elsewhere is not None:
            await elsewhere.release()
    record = await record_of(backend, result.run_id)
    assert record.state == "completed"
    assert record.attempt == 1
    assert errors.errors == []


async def test_j12_drain_lets_running_handlers_finish(clock, job_backend_factory):
    """J12: stop stops claiming and waits for in-flight handlers within the drain timeout."""
    backend = SpyBackend(job_backend_factory(clock))
    started = anyio.Event()
    proceed = anyio.Event()

    async def handler(ctx, payload):
        started.set()
        await proceed.wait()

    job = define_job("conf.drain_ok", handler, payload=dict)
    result = await backend.enqueue(job, {})
    runtime = await start_job_runtime([job], backend=backend, drain_timeout=30)
    with anyio.fail_after(10):
        await started.wait()
    stopped = anyio.Event()

    async def stop():
        await runtime.stop()
        stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert not stopped.is_set()
        await backend.enqueue(job, {"late": True})
        proceed.set()
        with anyio.fail_after(10):
            await stopped.wait()
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert len([run for call in backend.calls["claim"] for run in call.result]) == 1


async def test_j12_drain_deadline_cancels_and_the_run_is_retaken(clock, job_backend_factory):
    """J12: past the drain deadline the handler is cancelled (ctx.cancelled, task cancelled);
    the run goes back to waiting with the cancellation in its history and its attempt unspent,
    and the next runtime retakes it."""
    errors = ErrorLog()
    backend = job_backend_factory(clock, on_error=errors)
    started = anyio.Event()
    contexts = []
    block = True

    async def handler(ctx, payload):
        contexts.append(ctx)
        started.set()
        if block:
            await anyio.Event().wait()

    # A long lease: time is pumped forward while the database answers (this test is not about
    # leases; with attempts=1 a lapse would dead-letter the run).
    job = define_job(
        "conf.drain",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=1),
    )
    result = await backend.enqueue(job, {})
    runtime = await start_job_runtime([job], backend=backend, worker_id="first")
    with anyio.fail_after(10):
        await started.wait()
    stopped = anyio.Event()

    async def stop():
        await runtime.stop(drain_timeout=5)
        stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop)
        await advance_until(clock, stopped, step=1.0)
    [first] = contexts
    assert first.cancelled
    assert first.cancel_reason == "drain"
    record = await record_of(backend, result.run_id)
    assert record.state == "waiting"
    assert record.attempt == 0
    assert len(record.history) == 1
    assert JobCancelledError.code in record.history[0]["error"]
    assert record.history[0]["attempt"] == 1

    block = False
    spy = SpyBackend(backend)
    async with await start_job_runtime([job], backend=spy, worker_id="second"):
        await advance_until_awaited(clock, lambda: spy.wait_settled("complete", 1), step=1.0)
    record = await record_of(backend, result.run_id)
    assert record.state == "completed"
    assert record.attempt == 1
    assert contexts[1].attempt == 1
    assert errors.errors == []


async def test_j11_claim_failure_is_reported_and_the_loop_recovers(clock, job_backend_factory):
    """J11: a claim that raises goes to on_error, nothing escapes the loop, and after a bounded
    backoff the loop claims again and runs the work."""
    errors = ErrorLog()
    backend = SpyBackend(job_backend_factory(clock, on_error=errors))
    backend.raise_once["claim"] = ConnectionError("database restarted")
    ran = anyio.Event()

    async def handler(ctx, payload):
        ran.set()

    job = define_job("conf.recover", handler, payload=dict, concurrency=Concurrency(lease=600))
    await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend) as runtime:
        reported = await errors.wait_for(lambda e: isinstance(e, ConnectionError))
        assert str(reported) == "database restarted"
        assert runtime.running
        await advance_until(clock, ran, step=0.5)
    assert len(backend.calls["claim"]) >= 2


@pytest.mark.parametrize("max_in_flight", [1, 3])
async def test_runtime_never_exceeds_max_in_flight(clock, job_backend_factory, max_in_flight):
    """J3: the loop never claims more runs than free slots (process-wide max_in_flight)."""
    backend = job_backend_factory(clock)
    running = 0
    peak = 0
    done = 0
    finished = anyio.Event()
    total = 12

    async def handler(ctx, payload):
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        running -= 1
        done += 1
        if done == total:
            finished.set()

    job = define_job("conf.slots", handler, payload=dict, concurrency=Concurrency(max=50))
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(total)])
    async with await start_job_runtime([job], backend=backend, max_in_flight=max_in_flight):
        with anyio.fail_after(20):
            await finished.wait()
    assert peak == max_in_flight


async def test_j6_j10_a_run_buried_by_a_claim_is_reported_and_counted(clock, job_backend_factory):
    """J6, J10: a run whose lease lapsed on its final attempt (its worker died) and that a
    claim of the runtime dead-lettered is visible like any dead letter: counted in
    ship.job.dead_letter.count, reported to on_error as JobLeaseLapsedFinalError naming the run
    and job, and its history records the lapsed attempt. Its handler never runs again."""
    ran = []

    async def handler(ctx, payload):
        ran.append(ctx.run_id)

    job = define_job(
        "conf.buried",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=1),
    )
    with global_meter() as meter:
        meter.install()
        errors = ErrorLog()
        backend = job_backend_factory(clock, on_error=errors)
        result = await backend.enqueue(job, {})
        [ghost] = await backend.claim(claim_request(job, worker="dead-worker"))  # and then it died
        clock.advance(LEASE + 1)
        async with await start_job_runtime([job], backend=backend):
            await errors.wait_count(1)
        found = meter.collect()
    [error] = errors.errors
    assert isinstance(error, JobLeaseLapsedFinalError)
    assert error.code == "SHIP_SQLA_JOB_LEASE_LAPSED_FINAL_ATTEMPT"
    assert result.run_id in str(error)
    assert job.id in str(error)
    assert ran == []
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert [(entry["attempt"], entry["error"]) for entry in record.history] == [
        (ghost.attempt, LEASE_LAPSED_FINAL_MESSAGE)
    ]
    [dead] = found["ship.job.dead_letter.count"].data.data_points
    assert (dead.value, dict(dead.attributes)) == (1, {"ship.job.id": job.id})


async def test_j10_metrics_are_on_by_default_through_the_global_provider(
    clock, job_backend_factory
):
    """J10: a runtime started with no meter_provider records through OpenTelemetry's global
    provider, so installing the SDK is all it takes, even after the backend was built and the
    process's default instruments were made (the API's proxy forwards to it); the queue gauges
    are sampled once a reader collected them."""
    from ship_sqla.kernel._runtime.depth import DEPTH_SAMPLE_INTERVAL  # noqa: PLC0415

    async def handler(ctx, payload):
        if payload["fail"]:
            message = "boom"
            raise RuntimeError(message)

    job = define_job(
        "conf.metered",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=600),
        retry=RetryPolicy(attempts=1),
    )
    with global_meter() as meter:
        backend = SpyBackend(job_backend_factory(clock))
        meter.install()  # after the backend exists
        await backend.enqueue_many(job, [EnqueueRequest({"fail": f}) for f in (False, True)])
        await backend.enqueue(job, {"fail": False}, run_at=clock.now() + timedelta(hours=1))
        async with await start_job_runtime([job], backend=backend):
            await backend.wait_settled("fail", 1)
            await backend.wait_settled("complete", 1)
            assert "ship.job.queue.depth" not in meter.collect()  # the first collection

            class _Sampled:
                def is_set(self) -> bool:
                    gauge = meter.collect().get("ship.job.queue.depth")
                    return gauge is not None and bool(gauge.data.data_points)

            # At most two sample intervals: the run due in an hour must stay waiting.
            await advance_until(
                clock, _Sampled(), step=DEPTH_SAMPLE_INTERVAL / 5, most=2 * DEPTH_SAMPLE_INTERVAL
            )
            found = meter.collect()
    runs = {
        p.attributes["ship.job.outcome"]: p.value for p in found["ship.job.runs"].data.data_points
    }
    assert runs == {"completed": 1, "dead": 1}
    [dead] = found["ship.job.dead_letter.count"].data.data_points
    assert dead.value == 1
    assert sum(p.count for p in found["ship.job.run.duration"].data.data_points) == 2
    [depth] = found["ship.job.queue.depth"].data.data_points
    assert (depth.value, dict(depth.attributes)) == (1, {"ship.job.id": job.id})
