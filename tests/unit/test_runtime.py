"""The job runtime on the in-memory backend: registry, context, heartbeats, settles, errors.

Backend-agnostic end-to-end behaviour lives in tests/conformance; these tests drive the runtime
through the recording spy (tests/support/spy_backend.py) to reach the paths a healthy backend
never takes.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import (
    ErrorLog,
    advance_until,
    advance_until_awaited,
    all_in_state,
    claim_request,
    record_of,
    settle_loop,
)
from spy_backend import SpyBackend

from ship_sqla import JobContext, define_job, start_job_runtime
from ship_sqla.errors import (
    ConfigurationError,
    DuplicateJobError,
    JobCancelledError,
    JobLeaseStaleError,
    UnknownJobError,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest, JobRegistry, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend, InMemoryLockProvider
from ship_sqla.kernel._plans.backoff import ERROR_BACKOFF
from ship_sqla.kernel._ports import HeartbeatBatch, JobLeaseLapsedError
from ship_sqla.kernel._runtime.state import InFlight
from ship_sqla.kernel._tenancy import tenant_ambient
from ship_sqla.testing import FrozenClock

LEASE = 30.0


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def errors() -> ErrorLog:
    return ErrorLog()


@pytest.fixture
def backend(clock, errors) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=clock, on_error=errors)


async def _noop(ctx, payload):
    return None


# --- registry -----------------------------------------------------------------------------------


def test_registry_refuses_a_duplicate_id():
    registry = JobRegistry([define_job("a", _noop)])
    with pytest.raises(DuplicateJobError, match="'a' is already registered") as caught:
        registry.register(define_job("a", _noop))
    assert caught.value.code == "SHIP_SQLA_JOB_DUPLICATE"
    with pytest.raises(DuplicateJobError):
        JobRegistry([define_job("b", _noop), define_job("b", _noop)])


def test_registry_lookup_by_id():
    first = define_job("a", _noop)
    registry = JobRegistry([first])

    @registry.job("b", payload=dict, concurrency=Concurrency(max=2))
    async def second(ctx, payload):
        return None

    assert registry.get("a") is first
    assert registry.get("b") is second
    assert second.concurrency.max == 2
    assert registry.find("zzz") is None
    assert registry.ids == ("a", "b")
    assert "a" in registry
    assert len(registry) == 2
    assert [d.id for d in registry] == ["a", "b"]
    with pytest.raises(UnknownJobError, match=r"no job 'zzz' is registered \(registered: a, b\)"):
        registry.get("zzz")


def test_registry_refuses_non_definitions():
    with pytest.raises(ConfigurationError, match="JobDefinition"):
        JobRegistry().register(_noop)  # type: ignore[arg-type]


# --- starting -----------------------------------------------------------------------------------


async def test_start_validates_its_options(backend):
    job = define_job("a", _noop)
    with pytest.raises(ConfigurationError, match="unknown runtime mode"):
        await start_job_runtime([job], backend=backend, mode="workers")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        await start_job_runtime([job], backend=backend, drain_timeout=-1)
    with pytest.raises(ConfigurationError, match="queue_sample_interval"):
        await start_job_runtime([job], backend=backend, queue_sample_interval=0)
    with pytest.raises(ConfigurationError, match="poll_interval"):
        await start_job_runtime([job], backend=backend, poll_interval=0)
    with pytest.raises(ConfigurationError, match=r"max_in_flight must be at least 1, got 0\."):
        await start_job_runtime([job], backend=backend, max_in_flight=0)
    with pytest.raises(ConfigurationError, match="JobBackend protocol"):
        await start_job_runtime([job], backend=object())  # type: ignore[arg-type]
    with pytest.raises(DuplicateJobError):
        await start_job_runtime([job, define_job("a", _noop)], backend=backend)


async def test_j3_j4_each_runtime_holds_its_own_knobs(clock):
    """J3, J4: how a worker runs is start_job_runtime's, not the backend's: two runtimes on one
    backend poll, cap and lock as each was told; one given no lock_provider takes the backend's
    default_lock_provider (in memory: none). The backend takes none of these knobs."""
    backend = InMemoryJobBackend(clock=clock)
    locks = InMemoryLockProvider(clock)
    job = define_job("knobs", _noop)
    tuned = await start_job_runtime(
        job, backend=backend, poll_interval=0.05, max_in_flight=3, lock_provider=locks
    )
    plain = await start_job_runtime(job, backend=backend)
    try:
        assert (tuned.poll_interval, tuned.max_in_flight, tuned.lock_provider) == (0.05, 3, locks)
        assert backend.default_lock_provider is None
        assert (plain.poll_interval, plain.max_in_flight, plain.lock_provider) == (1.0, 100, None)
    finally:
        await tuned.stop()
        await plain.stop()
    for knob in ("poll_interval", "max_in_flight", "lock_provider", "meter_provider"):
        with pytest.raises(TypeError, match=knob):
            InMemoryJobBackend(clock=clock, **{knob: None})


async def test_enqueue_only_mode_never_claims(backend):
    """mode="enqueue-only" runs no loop: enqueued runs stay waiting."""
    job = define_job("a", _noop, payload=dict)
    async with await start_job_runtime(job, backend=backend, mode="enqueue-only") as runtime:
        result = await runtime.enqueue("a", {"x": 1})
        await runtime.enqueue_many(job, [EnqueueRequest({"x": 2})])
        await settle_loop()
        with pytest.raises(UnknownJobError):
            await runtime.enqueue("nope", {})
    assert (await backend.queue_depths(["a"]))["a"].depth == 2
    assert (await record_of(backend, result.run_id)).state == "waiting"
    assert not runtime.running


async def test_context_describes_the_run(backend):
    seen: list[JobContext] = []
    done = anyio.Event()

    async def handler(ctx, payload):
        seen.append(ctx)
        done.set()

    job = define_job(
        "ctx",
        handler,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda p: p["k"]),
        retry=RetryPolicy(attempts=4),
    )
    result = await backend.enqueue(job, {"k": "acct-1"})
    async with await start_job_runtime(job, backend=backend, worker_id="w-1"):
        with anyio.fail_after(5):
            await done.wait()
    [ctx] = seen
    assert ctx.run_id == result.run_id
    assert ctx.job_id == "ctx"
    assert ctx.attempt == 1
    assert ctx.max_attempts == 4
    assert not ctx.is_final_attempt
    assert ctx.token >= 1
    assert ctx.key == "acct-1"
    assert ctx.worker_id == "w-1"
    assert not ctx.cancelled
    assert ctx.cancel_reason is None
    assert "ctx" in repr(ctx)


async def test_stop_is_idempotent_and_concurrent_stops_share_it(backend):
    runtime = await start_job_runtime([define_job("a", _noop)], backend=backend)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.stop)
        tg.start_soon(runtime.stop)
    await runtime.stop()
    assert not runtime.running
    assert runtime.in_flight == 0


async def test_a_finished_run_leaves_no_reference_cycle(backend):
    """A settled run's objects (its entry, context, claim, settlement, task) are freed when it
    ends, not left for the cyclic garbage collector: with the collector off, none of them is
    still in the heap after the runtime stopped. (Cyclic garbage of every run made the
    collector's full passes a quarter of a noop run's CPU, and paused the loop.)"""
    finished = anyio.Event()
    done = 0

    async def handler(ctx, payload):
        nonlocal done
        done += 1
        if done == 20:
            finished.set()

    job = define_job("acyclic", handler, payload=dict)
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(20)])
    gc.collect()
    gc.disable()
    try:
        async with await start_job_runtime(job, backend=backend):
            with anyio.fail_after(10):
                await finished.wait()
        left = [o for o in gc.get_objects() if isinstance(o, InFlight | JobContext)]
    finally:
        gc.enable()
    assert left == []


# --- limits ---------------------------------------------------------------------------------------


async def test_job_concurrency_max_caps_this_process(clock, backend):
    """J3: never more running handlers of a job than its concurrency.max."""
    running = 0
    peak = 0
    finished = anyio.Event()
    done = 0

    async def handler(ctx, payload):
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await settle_loop(5)
        running -= 1
        done += 1
        if done == 9:
            finished.set()

    job = define_job("capped", handler, payload=dict, concurrency=Concurrency(max=2))
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(9)])
    async with await start_job_runtime(job, backend=backend):
        with anyio.fail_after(10):
            await finished.wait()
    assert peak == 2


async def test_single_runner_keys_never_run_twice_at_once_in_one_process(backend):
    """J4: a single-runner job claims one run per pass and skips keys this process runs."""
    active: dict[str, int] = {}
    overlap = False
    order: list[str] = []
    gate = anyio.Event()
    finished = anyio.Event()

    async def handler(ctx, payload):
        nonlocal overlap
        key = payload["k"]
        active[key] = active.get(key, 0) + 1
        overlap = overlap or active[key] > 1
        order.append(f"{key}{payload['n']}")
        if payload["n"] == 0 and key == "a":
            await gate.wait()
        active[key] -= 1
        if len(order) == 4:
            finished.set()

    job = define_job(
        "single",
        handler,
        payload=dict,
        concurrency=Concurrency(max=10, single_runner=True, key=lambda p: p["k"]),
    )
    for key, n in (("a", 0), ("a", 1), ("b", 0), ("b", 1)):
        await backend.enqueue(job, {"k": key, "n": n})
    async with await start_job_runtime(job, backend=backend):
        with anyio.fail_after(5):
            while len(order) < 3:
                await settle_loop(1)
        # b ran both of its runs while a0 blocks; a1 waits for a0.
        assert order == ["a0", "b0", "b1"]
        gate.set()
        with anyio.fail_after(5):
            await finished.wait()
    assert order == ["a0", "b0", "b1", "a1"]
    assert not overlap


async def test_jobs_share_slots_fairly(clock):
    """The loop visits jobs from a rotating start: a busy job cannot starve another of the
    process's only slot."""
    backend = InMemoryJobBackend(clock=clock)
    order: list[str] = []
    finished = anyio.Event()

    async def handler(ctx, payload):
        order.append(ctx.job_id)
        if len(order) == 6:
            finished.set()

    busy = define_job("busy", handler, payload=dict)
    quiet = define_job("quiet", handler, payload=dict)
    await backend.enqueue_many(busy, [EnqueueRequest({}) for _ in range(5)])
    await backend.enqueue(quiet, {})
    async with await start_job_runtime([busy, quiet], backend=backend, max_in_flight=1):
        with anyio.fail_after(5):
            await finished.wait()
    assert "quiet" in order[:2]


# --- heartbeats and leases ----------------------------------------------------------------------


async def test_heartbeat_every_third_of_the_lease_for_all_runs_in_one_call(clock, backend):
    """J5: in-flight runs are heartbeated every lease/3, batched into one backend call."""
    spy = SpyBackend(backend)
    gate = anyio.Event()
    started = 0
    all_started = anyio.Event()

    async def handler(ctx, payload):
        nonlocal started
        started += 1
        if started == 3:
            all_started.set()
        await gate.wait()

    job = define_job("beat", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
    async with await start_job_runtime(job, backend=spy):
        try:
            with anyio.fail_after(5):
                await all_started.wait()
            await advance_until_awaited(clock, lambda: spy.wait_calls("heartbeat", 1), step=1.0)
            beat = spy.calls["heartbeat"][0]
            ((runs,), alive) = (beat.args, beat.result)
            assert len(runs) == 3
            assert alive == [True, True, True]
            assert clock.monotonic() == pytest.approx(LEASE / 3)
        finally:
            gate.set()


async def test_lost_lease_cancels_the_handler_and_is_reported(clock, backend, errors):
    """J5: a heartbeat answered False cancels that handler (ctx.cancelled, task cancelled),
    reports SHIP_SQLA_JOB_LEASE_STALE, and settles nothing for the run."""
    spy = SpyBackend(backend)
    spy.answers["heartbeat"] = lambda runs: HeartbeatBatch([False] * len(runs))
    started = anyio.Event()
    cancelled = anyio.Event()
    contexts: list[JobContext] = []

    async def handler(ctx, payload):
        contexts.append(ctx)
        started.set()
        try:
            await anyio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = define_job("lost", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy) as runtime:
        with anyio.fail_after(5):
            await started.wait()
        await advance_until(clock, cancelled, step=1.0)
        await settle_loop()
        assert runtime.in_flight == 0
    [ctx] = contexts
    assert ctx.cancelled
    assert ctx.cancel_reason == "lease-lost"
    assert errors.codes() == [JobLeaseStaleError.code]
    assert "heartbeat was refused" in str(errors.errors[0])
    assert spy.settled("complete") == []
    assert spy.settled("fail") == []
    assert spy.settled("release") == []
    assert "settle" not in spy.calls


async def test_failed_heartbeat_is_reported_and_cancels_nothing(clock, backend, errors):
    """J11: a heartbeat call that raises goes to on_error; the handler keeps running and the
    next round heartbeats again."""
    spy = SpyBackend(backend)
    spy.raise_once["heartbeat"] = ConnectionError("connection reset")
    gate = anyio.Event()
    started = anyio.Event()
    contexts: list[JobContext] = []

    async def handler(ctx, payload):
        contexts.append(ctx)
        started.set()
        await gate.wait()

    job = define_job("flaky", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy):
        try:
            with anyio.fail_after(5):
                await started.wait()
            await advance_until_awaited(clock, lambda: spy.wait_calls("heartbeat", 2), step=1.0)
            assert spy.calls["heartbeat"][1].result == [True]
            assert not contexts[0].cancelled
        finally:
            gate.set()
    assert [type(e) for e in errors.errors] == [ConnectionError]
    assert [outcome for _, outcome in spy.settle_batches("complete")[0]] == ["completed"]


async def test_stale_completion_is_reported(clock, backend, errors):
    """J5: a completion answered "stale" reports SHIP_SQLA_JOB_LEASE_STALE to on_error."""
    spy = SpyBackend(backend)
    spy.answers["settle"] = lambda settlements: ["stale"] * len(settlements)
    job = define_job("stale", _noop, payload=dict)
    await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy):
        await errors.wait_count(1)
    assert errors.codes() == [JobLeaseStaleError.code]
    assert "complete was refused" in str(errors.errors[0])


async def test_stale_failure_is_reported_once(clock, backend, errors):
    """J5: a failure answered "stale" is reported once; nothing else is settled."""
    spy = SpyBackend(backend)
    spy.answers["settle"] = lambda settlements: ["stale"] * len(settlements)

    async def handler(ctx, payload):
        raise RuntimeError("boom")

    job = define_job("stale-fail", handler, payload=dict)
    await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy):
        await errors.wait_count(1)
        await settle_loop()
    assert errors.codes() == [JobLeaseStaleError.code]
    assert "fail was refused" in str(errors.errors[0])


async def test_completion_failure_is_reported_and_retried(clock, backend, errors):
    """J11: a complete call that raises goes to on_error, and the batch is retried after a
    bounded backoff until it lands."""
    spy = SpyBackend(backend)
    spy.raise_once["settle"] = ConnectionError("server closed the connection")
    job = define_job("retry-complete", _noop, payload=dict)
    result = await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy):
        await errors.wait_count(1)
        await advance_until_awaited(clock, lambda: spy.wait_calls("settle", 2), step=0.5)
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert [type(e) for e in errors.errors] == [ConnectionError]


async def test_j5_a_completion_whose_answer_was_lost_is_not_reported_stale_on_its_retry(
    clock, backend, errors
):
    """J5, J11: a complete that landed but whose answer was lost (the connection dropped after
    the commit) is retried; the retry finds the run already completed under this very claim,
    so it is no stale claim: nothing but the connection error is reported (a stale report is
    never a false alarm)."""
    spy = SpyBackend(backend)
    lost = ConnectionError("server closed the connection after the commit")
    landed: list[Any] = []

    async def lands_then_loses_the_answer(settlements: list[Any]) -> Any:
        outcomes = await backend.settle(settlements)
        if not landed:
            landed.append(outcomes)
            raise lost
        return outcomes

    spy.answers["settle"] = lands_then_loses_the_answer
    job = define_job("lost-answer", _noop, payload=dict)
    result = await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy):
        await errors.wait_count(1)
        await advance_until_awaited(clock, lambda: spy.wait_calls("settle", 2), step=0.5)
        await settle_loop()
    assert landed == [["completed"]]
    assert [call.result for call in spy.calls["settle"]] == [lost, ["stale"]]
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert errors.errors == [lost]


async def test_handler_failure_schedules_the_retry_with_the_policy(clock, backend):
    """J7: a failure is recorded with its traceback and retried at now + retry_delay."""
    spy = SpyBackend(backend)

    async def handler(ctx, payload):
        message = "card declined"
        raise ValueError(message)

    job = define_job(
        "fails",
        handler,
        payload=dict,
        retry=RetryPolicy(attempts=2, backoff="fixed", base_delay=7, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy):
        await spy.wait_settled("fail", 1)
    [(fail, outcome)] = spy.settled("fail")
    assert fail.entry is not None
    error = fail.entry.error
    assert outcome == "retrying"
    assert fail.run_at == clock.now() + timedelta(seconds=7)
    assert error.startswith("ValueError: card declined")
    assert "Traceback (most recent call last):" in error
    assert "in handler" in error
    assert (await record_of(backend, result.run_id)).run_at == clock.now() + timedelta(seconds=7)


async def test_codec_errors_of_any_kind_dead_letter(backend):
    """A codec that raises something other than InvalidPayloadError still dead-letters the run,
    with the job named in the error."""

    class Broken:
        def encode(self, value):
            return value

        def decode(self, data):
            raise KeyError(data)

    job = define_job("broken", _noop, payload=Broken())
    spy = SpyBackend(backend)
    result = await backend.enqueue(job, {"a": 1})
    async with await start_job_runtime(job, backend=spy):
        await spy.wait_settled("fail", 1)
    record = await record_of(backend, result.run_id)
    assert record.state == "dead"
    assert "SHIP_SQLA_JOB_PAYLOAD_INVALID" in record.last_error
    assert "'broken'" in record.last_error


# --- locks ----------------------------------------------------------------------------------------


async def test_single_runner_lock_is_held_for_the_run_and_extended(clock, errors):
    """J4/L1: the (job id, key) lock is held while the handler runs, extended at every
    heartbeat past its first lease, and released after the run."""
    locks = InMemoryLockProvider(clock)
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    spy = SpyBackend(backend)
    gate = anyio.Event()
    started = anyio.Event()

    async def handler(ctx, payload):
        started.set()
        await gate.wait()

    job = define_job(
        "locked",
        handler,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda p: p["k"], lease=LEASE),
    )
    await backend.enqueue(job, {"k": "x"})
    async with await start_job_runtime(job, backend=spy, lock_provider=locks):
        try:
            with anyio.fail_after(5):
                await started.wait()
            assert locks.holder("locked/x") is not None
            await advance_until_awaited(clock, lambda: spy.wait_calls("heartbeat", 4), step=1.0)
            assert clock.monotonic() > LEASE
            assert locks.holder("locked/x") is not None
        finally:
            gate.set()
    assert locks.holder("locked/x") is None
    assert errors.errors == []


class _LosingLock:
    lost = False

    async def extend(self, _lease):
        self.lost = True
        return False

    async def release(self):
        return None


class _LosingLocks:
    async def acquire(self, _key, _lease):
        return _LosingLock()


async def test_lost_lock_cancels_and_releases_the_run(clock, errors):
    """L2/J12: when the single-runner lock cannot be extended the handler is cancelled, the run
    is released (attempt unspent, cancellation in history) and the loss is reported."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    spy = SpyBackend(backend)
    started = anyio.Event()
    contexts: list[JobContext] = []

    async def handler(ctx, payload):
        contexts.append(ctx)
        started.set()
        await anyio.Event().wait()

    job = define_job(
        "losing",
        handler,
        payload=dict,
        concurrency=Concurrency(single_runner=True, lease=LEASE),
        retry=RetryPolicy(backoff="fixed", base_delay=3, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy, lock_provider=_LosingLocks()):
        with anyio.fail_after(5):
            await started.wait()
        await advance_until_awaited(clock, lambda: spy.wait_settled("release", 1), step=1.0)
    assert contexts[0].cancel_reason == "lock-lost"
    record = await record_of(backend, result.run_id)
    assert record.state == "waiting"
    assert record.attempt == 0
    assert JobCancelledError.code in record.last_error
    assert errors.codes() == [JobCancelledError.code]


# --- drain ----------------------------------------------------------------------------------------


async def test_drain_cancellation_wins_over_an_exception_raised_from_it(clock, backend):
    """J12: a handler that turns its drain cancellation into another exception is still
    released as cancelled, not failed (no attempt spent)."""
    started = anyio.Event()

    async def handler(ctx, payload):
        started.set()
        try:
            await anyio.Event().wait()
        except asyncio.CancelledError:
            message = "cleanup went wrong"
            raise RuntimeError(message) from None

    job = define_job("converts", handler, payload=dict, retry=RetryPolicy(attempts=1))
    result = await backend.enqueue(job, {})
    runtime = await start_job_runtime(job, backend=backend)
    with anyio.fail_after(5):
        await started.wait()
    await runtime.stop(drain_timeout=0)
    record = await record_of(backend, result.run_id)
    assert record.state == "waiting"
    assert record.attempt == 0
    assert JobCancelledError.code in record.last_error


async def test_stop_with_zero_drain_cancels_at_once(clock, backend):
    """J12: drain_timeout=0 cancels in-flight handlers immediately; finished runs complete."""
    started = anyio.Event()

    async def handler(ctx, payload):
        if payload["block"]:
            started.set()
            await anyio.Event().wait()

    job = define_job("mixed", handler, payload=dict)
    quick = await backend.enqueue(job, {"block": False})
    slow = await backend.enqueue(job, {"block": True})
    runtime = await start_job_runtime(job, backend=backend)
    with anyio.fail_after(5):
        await started.wait()
    await runtime.stop(drain_timeout=0)
    assert (await record_of(backend, quick.run_id)).state == "completed"
    assert (await record_of(backend, slow.run_id)).state == "waiting"
    with pytest.raises(ConfigurationError):
        await runtime.stop(drain_timeout=-1)


async def test_a_slow_completion_backend_stops_claiming(clock):
    """Backpressure: while 2 * max_in_flight finished runs wait for their completion, the loop
    claims nothing more; once completions land, it carries on."""
    backend = InMemoryJobBackend(clock=clock)
    spy = SpyBackend(backend)
    gate = spy.gate("settle")
    job = define_job("slow", _noop, payload=dict)
    results = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(10)])
    async with await start_job_runtime(job, backend=spy, max_in_flight=2) as runtime:
        try:
            await settle_loop(100)
            claimed = sum(len(call.result) for call in spy.calls["claim"])
            assert claimed == 4
            assert runtime.executing == 0
        finally:
            gate.set()
        with anyio.fail_after(5):
            while not await all_in_state(backend, [r.run_id for r in results], "completed"):
                await settle_loop(1)


async def test_runtime_records_job_metrics(clock):
    """J10: the runtime records each attempt's outcome (ship.job.runs, ship.job.run.duration),
    dead letters and single-runner lock waits through the meter_provider it was given."""
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - this test only
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    backend = InMemoryJobBackend(clock=clock)
    spy = SpyBackend(backend)

    async def handler(ctx, payload):
        if payload["fail"]:
            message = "boom"
            raise RuntimeError(message)

    job = define_job(
        "metered",
        handler,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda p: p["k"]),
        retry=RetryPolicy(attempts=1),
    )
    await backend.enqueue(job, {"k": "a", "fail": False})
    await backend.enqueue(job, {"k": "b", "fail": True})
    async with await start_job_runtime(
        job, backend=spy, meter_provider=provider, lock_provider=InMemoryLockProvider(clock)
    ):
        await spy.wait_settled("fail", 1)
        await spy.wait_settled("complete", 1)
    data = reader.get_metrics_data()
    found = {
        metric.name: metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    runs = {
        (p.attributes["ship.job.key"], p.attributes["ship.job.outcome"]): p.value
        for p in found["ship.job.runs"].data.data_points
    }
    assert runs == {("a", "completed"): 1, ("b", "dead"): 1}
    [dead] = found["ship.job.dead_letter.count"].data.data_points
    assert dead.value == 1
    assert dead.attributes["ship.job.key"] == "b"
    assert sum(p.count for p in found["ship.job.lock.wait"].data.data_points) == 2
    assert sum(p.count for p in found["ship.job.run.duration"].data.data_points) == 2


async def test_claims_leave_the_room_of_unanswered_completions(clock):
    """J3: runs whose completion is not answered yet still count against concurrency.max in
    the backend, so the runtime does not ask for their room: such a claim comes back short,
    which reads as "no more due work" and used to park the loop until the poll interval when
    the completion landed mid-claim (a 20x throughput cliff with max_in_flight above 1000).
    A claim of a capped job takes at most half the cap, so the next half is claimed while the
    first one's completions are on the wire."""
    backend = InMemoryJobBackend(clock=clock)
    spy = SpyBackend(backend)
    gate = spy.gate("settle")
    job = define_job("roomy", _noop, payload=dict, concurrency=Concurrency(max=4))
    results = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(8)])
    async with await start_job_runtime(job, backend=spy, max_in_flight=4) as runtime:
        try:
            await settle_loop(100)
            assert runtime.executing == 0
            # Four handlers ended, their completions wait at the gate: two claims of half the
            # cap each, and none may ask for the room of the unanswered ones meanwhile.
            assert [call.args[0].limit for call in spy.calls["claim"]] == [2, 2]
        finally:
            gate.set()
        with anyio.fail_after(5):
            while not await all_in_state(backend, [r.run_id for r in results], "completed"):
                await settle_loop(1)
    assert [call.args[0].limit for call in spy.calls["claim"]][:4] == [2, 2, 2, 2]


async def test_a_cap_per_partition_bounds_no_claim_of_the_runtime(clock):
    """F9: Concurrency(max=2, partition="tenant") is at most 2 running runs per tenant, held by
    the backend; the runtime neither asks for half of it per claim nor leaves the room of the
    job's unanswered completions (a job-wide cap's rules, J3): one claim asks every free slot
    and takes 2 runs of each of 4 tenants while the first completions wait at the gate. With a
    job-wide cap of 2 it would take 1 run per claim (a partitioned drain at 0.6x before)."""
    backend = InMemoryJobBackend(clock=clock)
    spy = SpyBackend(backend)
    gate = spy.gate("settle")
    job = define_job(
        "roomy.parts",
        _noop,
        payload=dict,
        concurrency=Concurrency(max=2, partition="tenant"),
    )
    ids = []
    for tenant in ("a", "b", "c", "d"):
        with tenant_ambient(tenant):
            done = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
            ids += [result.run_id for result in done]
    async with await start_job_runtime(job, backend=spy, max_in_flight=16) as runtime:
        try:
            await settle_loop(100)
            assert runtime.executing == 0
            first = spy.calls["claim"][0].args[0]
            assert first.limit == 16
            assert first.max_running == 2
            # Each tenant's third run waits on its cap: 2 running (unsettled) of each tenant.
            states = [(await record_of(backend, run_id)).state for run_id in ids]
            assert states == ["running", "running", "waiting"] * 4
        finally:
            gate.set()
        with anyio.fail_after(5):
            while not await all_in_state(backend, ids, "completed"):
                await settle_loop(1)


async def test_worker_samples_the_queue_gauges(clock, errors):
    """J10: a worker runtime samples ship.job.queue.depth and ship.job.queue.oldest_waiting_age
    per registered job once a reader collected the gauges, then every DEPTH_SAMPLE_INTERVAL
    seconds; a failed sample goes to on_error (J11) and the next one recovers."""
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - this test only
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415

    from ship_sqla.kernel._runtime.depth import DEPTH_SAMPLE_INTERVAL  # noqa: PLC0415

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    spy = SpyBackend(backend)
    later = clock.now() + timedelta(hours=1)
    queued = define_job("gauged.queued", _noop, payload=dict)
    idle = define_job("gauged.idle", _noop, payload=dict)
    await backend.enqueue_many(queued, [EnqueueRequest({"n": n}, run_at=later) for n in range(2)])

    def gauges():
        found = {
            metric.name: {p.attributes["ship.job.id"]: p.value for p in metric.data.data_points}
            for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
        return found["ship.job.queue.depth"], found["ship.job.queue.oldest_waiting_age"]

    async with await start_job_runtime([queued, idle], backend=spy, meter_provider=provider):
        await settle_loop()
        reader.get_metrics_data()  # the first collection: from now on a sample is worth it
        clock.advance(DEPTH_SAMPLE_INTERVAL)
        await spy.wait_calls("queue_depths", 1)
        depth, age = gauges()
        assert depth == {"gauged.queued": 2, "gauged.idle": 0}
        assert age == {"gauged.queued": 0.0, "gauged.idle": 0.0}

        spy.raise_once["queue_depths"] = ConnectionError("database went away")
        await backend.enqueue(queued, {"n": 2}, run_at=later)
        await settle_loop()  # the sampler parks on the clock
        clock.advance(DEPTH_SAMPLE_INTERVAL)
        await spy.wait_calls("queue_depths", 2)
        assert errors.errors[-1].args == ("database went away",)
        assert gauges()[0]["gauged.queued"] == 2  # the last good sample stays

        await settle_loop()
        clock.advance(DEPTH_SAMPLE_INTERVAL)
        await spy.wait_calls("queue_depths", 3)
        assert gauges()[0]["gauged.queued"] == 3
    data = reader.get_metrics_data()  # None: nothing to report at all
    assert data is None or "ship.job.queue.depth" not in {
        metric.name
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.data.data_points
    }  # a stopped runtime's jobs stop being reported


async def test_no_collection_no_queue_sampling(clock, backend):
    """J10: metrics are on by default, but the queue gauges cost a query per sample (one index
    entry per waiting run), so nothing is sampled until a reader collected them: not with the
    default (no SDK installed), not with a provider whose reader never collects, and never with
    queue_sample_interval=None."""
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - this test only
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415

    from ship_sqla.kernel._metrics import job_metrics_for  # noqa: PLC0415

    spy = SpyBackend(backend)
    job = define_job("unmetered", _noop, payload=dict)
    async with await start_job_runtime(job, backend=spy) as runtime:
        assert runtime.metrics is job_metrics_for()  # the global provider's: on by default
        await settle_loop(20)
        clock.advance(3600)
        await settle_loop(20)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with await start_job_runtime(job, backend=spy, meter_provider=provider):
        await settle_loop(20)
        clock.advance(3600)
        await settle_loop(20)
    reader.get_metrics_data()
    async with await start_job_runtime(
        job, backend=spy, meter_provider=provider, queue_sample_interval=None
    ):
        await settle_loop(20)
        clock.advance(3600)
        await settle_loop(20)
    assert "queue_depths" not in spy.calls


async def test_queue_sample_interval_sets_the_sampling_period(clock, backend):
    """J10: queue_sample_interval is the period between two queue samples."""
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - this test only
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415

    from ship_sqla.kernel._metrics import job_metrics_for  # noqa: PLC0415

    spy = SpyBackend(backend)
    job = define_job("sampled", _noop, payload=dict)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    job_metrics_for(provider)  # the runtime's instruments, made before the collection below
    reader.get_metrics_data()
    async with await start_job_runtime(
        job, backend=spy, meter_provider=provider, queue_sample_interval=60
    ):
        await spy.wait_calls("queue_depths", 1)
        await settle_loop()
        clock.advance(59)
        await settle_loop()
        assert len(spy.calls["queue_depths"]) == 1
        clock.advance(1)
        await spy.wait_calls("queue_depths", 2)


async def test_no_heartbeat_races_a_settle_on_its_way(clock, errors):
    """J5 (SPEC §10): once a handler returned and its settle is on its way, the run is not
    heartbeated at its regular beat, so no heartbeat races the settle (one answered after the
    completion landed reads as a lost lease for a finished run: it did, about one restart in
    fourteen under load). Only a settle still unanswered in the lease's last third is
    heartbeated, to keep the lease; that heartbeat's refusal is not reported as a stale lease:
    the completion's own answer decides, and here it completes."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    spy = SpyBackend(backend)
    gate = spy.gate("settle")
    spy.answers["heartbeat"] = lambda runs: HeartbeatBatch([False] * len(runs))
    job = define_job("settling", _noop, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=spy) as runtime:
        await settle_loop(50)
        assert runtime.executing == 0
        assert runtime.in_flight == 1  # the completion waits at the gate
        clock.advance(LEASE / 3 + 1)  # past the regular beat
        await settle_loop()
        assert spy.started.get("heartbeat", 0) == 0
        clock.advance(LEASE / 3)  # the lease's last third, the settle still unanswered
        await spy.wait_calls("heartbeat", 1)
        await settle_loop()
        gate.set()
        with anyio.fail_after(5):
            while (await record_of(backend, result.run_id)).state != "completed":
                await settle_loop(1)
    assert errors.errors == []


# --- runs the loop must not execute -------------------------------------------------------------


async def test_j3_runs_beyond_the_claim_limit_are_released_unexecuted(clock, errors):
    """J3: a backend that answers more runs than a claim asked for (a bug) never makes the loop
    exceed its slots: the extra runs are released at once, attempts unspent and no handler
    started for them, the bug is reported, and every run still executes exactly once."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    spy = SpyBackend(backend)
    ran: list[str] = []
    gate = anyio.Event()
    first_ran = anyio.Event()
    all_ran = anyio.Event()

    async def handler(ctx, payload):
        ran.append(ctx.run_id)
        first_ran.set()
        await gate.wait()
        if len(ran) == 3:
            all_ran.set()

    async def greedy(request):
        return await backend.claim(claim_request(job, worker=request.worker, limit=3))

    job = define_job("greedy", handler, payload=dict)
    results = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
    spy.answers["claim"] = greedy
    async with await start_job_runtime(job, backend=spy, max_in_flight=1) as runtime:
        try:
            await spy.wait_settled("release", 2)
            with anyio.fail_after(5):
                await first_ran.wait()
            assert runtime.executing == 1
            assert [outcome for _, outcome in spy.settled("release")] == ["released", "released"]
            released = [release.run.run_id for release, _ in spy.settled("release")]
            for run_id in released:
                assert (await record_of(backend, run_id)).attempt == 0
            assert ran == [r.run_id for r in results if r.run_id not in released]
            del spy.answers["claim"]
        finally:
            # Never leave the handler blocked: stop() would wait out the drain in frozen time.
            gate.set()
        with anyio.fail_after(5):
            await all_ran.wait()
    assert sorted(ran) == sorted(r.run_id for r in results)
    [bug] = errors.errors
    assert "extra runs were released" in str(bug)


async def test_j12_runs_claimed_while_stopping_are_released_unexecuted(clock, errors):
    """J12: stop stops claiming: runs whose claim was answered after stop began are never
    started; they go back to waiting at once with their attempts unspent and no history."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    spy = SpyBackend(backend)
    gate = spy.gate("claim")
    ran: list[str] = []

    async def handler(ctx, payload):
        ran.append(ctx.run_id)

    job = define_job("late-claim", handler, payload=dict)
    results = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(2)])
    runtime = await start_job_runtime(job, backend=spy)
    await spy.wait_started("claim", 1)
    async with anyio.create_task_group() as group:
        group.start_soon(runtime.stop)
        await settle_loop()
        gate.set()
    assert ran == []
    assert [outcome for _, outcome in spy.settled("release")] == ["released", "released"]
    for result in results:
        record = await record_of(backend, result.run_id)
        assert (record.state, record.attempt, record.history) == ("waiting", 0, ())
    assert errors.errors == []


# --- fewer duplicates under faults --------------------------------------------------------------


async def test_j6_a_handler_never_starts_once_its_lease_lapsed(clock, errors):
    """J6: a run whose lease lapsed between its claim and the start of its handler (the loop
    was blocked past the lease) is never executed by this worker: another one may be running
    it already. It is reported (JobLeaseLapsedError) and handed back, attempt unspent."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    ran = []

    async def handler(ctx, payload):
        ran.append(ctx.run_id)

    stalled = []

    async def claim_then_stall(request):
        runs = await backend.claim(request)
        if runs and not stalled:
            stalled.append(runs)
            clock.advance(LEASE + 10)  # the loop is blocked before the runs' tasks start
        return runs

    job = define_job("late", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    stalling = SpyBackend(backend)
    stalling.answers["claim"] = claim_then_stall
    # The stall (40 s) is shorter than the poll interval: the loop's next pass comes from the
    # hand-back's settle, not from a poll deadline the stall passed (that pass would retake the
    # lapsed run before the hand-back, which is J6 too, but not the path under test).
    async with await start_job_runtime(job, backend=stalling, poll_interval=60.0):
        await errors.wait_count(1)
        with anyio.fail_after(5):
            while (await record_of(backend, result.run_id)).state != "completed":
                await settle_loop(1)
    [error] = errors.errors
    assert isinstance(error, JobLeaseLapsedError)
    assert error.code == "SHIP_SQLA_JOB_LEASE_LAPSED"
    assert result.run_id in str(error)
    # Handed back with its attempt unspent and no history (nothing ran), then claimed again
    # and executed: once.
    assert ran == [result.run_id]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.history) == ("completed", 1, ())


async def test_j6_a_run_retaken_meanwhile_is_not_started_nor_reported_stale(clock, errors):
    """J6, J5: when the lapsed run was retaken by another worker before this one could start
    it, the hand-back changes nothing (fenced) and only the lapse is reported."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    ran = []

    async def handler(ctx, payload):
        ran.append(ctx.worker_id)

    job = define_job("raced", handler, payload=dict, concurrency=Concurrency(lease=LEASE))

    lost = []

    async def claim_then_lose_it(request):
        runs = await backend.claim(request)
        if runs and not lost:
            clock.advance(LEASE + 1)
            lost.extend(await backend.claim(claim_request(job, worker="other", limit=5)))
        return runs

    result = await backend.enqueue(job, {})
    losing = SpyBackend(backend)
    losing.answers["claim"] = claim_then_lose_it
    async with await start_job_runtime(job, backend=losing):
        await errors.wait_count(1)
        await settle_loop()
    assert ran == []
    assert errors.codes() == ["SHIP_SQLA_JOB_LEASE_LAPSED"]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("running", 2)


async def test_j5_a_lapsed_lease_is_lost_once_the_database_is_back(clock, errors):
    """J5, J6: heartbeats refuse a lapsed lease even when no claim retook the run, so a worker
    whose heartbeats failed past the lease (an outage) cancels its handler ("lease-lost") once
    the database is back, instead of reviving the lease while a claim may retake the run; the
    run is retaken (here by the same worker, whose older claim is then stale too) with the
    lapsed attempt in its history, and runs to completion once more."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("heartbeat", "claim"))
    started = anyio.Event()
    cancelled = anyio.Event()
    contexts: list[JobContext] = []

    async def handler(ctx, payload):
        contexts.append(ctx)
        if ctx.attempt > 1:
            return
        started.set()
        try:
            await anyio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = define_job("lapsing", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    async with await start_job_runtime(job, backend=outage):
        with anyio.fail_after(5):
            await started.wait()
        outage.down = True
        await advance_until(clock, _after(clock, LEASE + 1), step=0.5)
        assert not cancelled.is_set()  # failed heartbeats cancel nothing
        outage.down = False
        await advance_until(clock, cancelled, step=0.25)
        with anyio.fail_after(5):
            while (await record_of(backend, result.run_id)).state != "completed":
                clock.advance(0.25)
                await settle_loop()
    assert [ctx.attempt for ctx in contexts] == [1, 2]
    assert contexts[0].cancel_reason == "lease-lost"
    assert JobLeaseStaleError.code in errors.codes()
    record = await record_of(backend, result.run_id)
    assert [entry["attempt"] for entry in record.history] == [1]
    assert record.history[0]["error"].startswith("SHIP_SQLA_JOB_LEASE_LAPSED")


def _after(clock, seconds):
    """An event set by advance_until's polling once ``seconds`` passed on ``clock``."""
    deadline = clock.monotonic() + seconds

    class _Passed:
        def is_set(self):
            return clock.monotonic() >= deadline

    return _Passed()


async def test_j11_fail_and_release_are_retried_through_a_short_outage(clock, errors):
    """J11, J6: a failure (and a release) that cannot reach the database is retried after the
    error backoff while the lease still holds, instead of leaving the run to its lapsing lease
    (which costs a retake, and on a final attempt a dead letter); each failed try is
    reported. The outcome lands once, when the database is back."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("settle",))
    locks = InMemoryLockProvider(clock)

    async def handler(ctx, payload):
        raise RuntimeError("boom")

    failing = define_job(
        "fails",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=3, backoff="fixed", base_delay=600, jitter="none"),
    )
    result = await backend.enqueue(failing, {})
    outage.down = True
    async with await start_job_runtime(failing, backend=outage):
        await advance_until_awaited(clock, lambda: outage.wait_calls("settle", 3), step=0.05)
        outage.down = False
        await advance_until_awaited(clock, lambda: outage.wait_calls("settle", 4), step=0.25)
        await settle_loop()
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, len(record.history)) == ("waiting", 1, 1)
    assert sum(isinstance(e, ConnectionRefusedError) for e in errors.errors) == 3

    keyed = define_job(
        "keyed",
        _noop,
        payload=dict,
        concurrency=Concurrency(lease=LEASE, single_runner=True),
    )
    held = await locks.acquire("keyed/", 3600)
    assert held is not None
    locked_backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(locked_backend, outage=("settle",))
    keyed_run = await locked_backend.enqueue(keyed, {})
    outage.down = True
    async with await start_job_runtime(keyed, backend=outage, lock_provider=locks):
        await advance_until_awaited(clock, lambda: outage.wait_calls("settle", 2), step=0.05)
        outage.down = False
        await advance_until_awaited(clock, lambda: outage.wait_calls("settle", 3), step=0.25)
        await settle_loop()
    record = await record_of(locked_backend, keyed_run.run_id)
    assert (record.state, record.attempt) == ("waiting", 0)  # JOB_LOCK_HELD: attempt unspent


async def test_j11_a_settle_retry_gives_up_when_the_lease_can_no_longer_hold(clock, errors):
    """J6, J11: a failure that keeps failing is retried only while the lease may still be held
    (heartbeats fail too in an outage); then the run is left to its lapsing lease, which
    brings it back (at least once), and the task ends."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("settle", "heartbeat"))

    async def handler(ctx, payload):
        raise RuntimeError("boom")

    job = define_job(
        "gives-up",
        handler,
        payload=dict,
        concurrency=Concurrency(lease=LEASE),
        retry=RetryPolicy(attempts=3),
    )
    result = await backend.enqueue(job, {})
    outage.down = True
    async with await start_job_runtime(job, backend=outage) as runtime:
        await outage.wait_calls("settle", 1)
        started = clock.monotonic()
        with anyio.fail_after(10):
            while runtime.in_flight:
                clock.advance(0.25)
                await settle_loop()
        assert clock.monotonic() - started <= LEASE + 1
        assert len(outage.calls["settle"]) > 5
        assert (await record_of(backend, result.run_id)).state == "running"  # to be retaken (J6)
        outage.down = False
        with anyio.fail_after(5):
            while (await record_of(backend, result.run_id)).attempt < 2 or runtime.in_flight:
                clock.advance(0.25)
                await settle_loop()
    record = await record_of(backend, result.run_id)
    assert record.state == "waiting"
    assert [entry["attempt"] for entry in record.history] == [1, 2]  # lapsed, then failed


async def test_j11_the_loop_is_back_within_a_second_of_the_database(clock, errors):
    """J11: however long the database was down, the loop's error backoff never grows past
    MAX_ERROR_BACKOFF (1 s): once the database is back, the next claim comes within about a
    second, and the work runs (a backoff that kept doubling came back 12-30 s late)."""
    MAX_ERROR_BACKOFF = ERROR_BACKOFF.max_delay  # noqa: N806 - the one error backoff's cap

    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("claim",))
    ran = anyio.Event()

    async def handler(ctx, payload):
        ran.set()

    job = define_job("resumes", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    outage.down = True
    async with await start_job_runtime(job, backend=outage, poll_interval=5.0):
        await outage.wait_calls("claim", 1)
        await advance_until(clock, _after(clock, 120), step=0.1)
        gaps = [b.at - a.at for a, b in itertools.pairwise(outage.calls["claim"])]
        assert max(gaps) <= MAX_ERROR_BACKOFF + 0.1
        assert min(gaps[:3]) < 0.25  # the first retries come quickly
        await backend.enqueue(job, {})
        outage.down = False
        back = clock.monotonic()
        await advance_until(clock, ran, step=0.1)
        assert clock.monotonic() - back <= MAX_ERROR_BACKOFF + 0.1


async def test_j11_completions_are_retried_through_an_outage_without_a_duplicate(clock, errors):
    """J11, J5: completions that fail while the database is down stay in memory and are
    retried (heartbeats keep the lease meanwhile, retried quickly too), so after an outage
    shorter than the lease each run completes once and no handler runs twice."""
    MAX_ERROR_BACKOFF = ERROR_BACKOFF.max_delay  # noqa: N806 - the one error backoff's cap

    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("settle", "heartbeat", "claim"))
    executions: list[str] = []

    async def handler(ctx, payload):
        executions.append(ctx.run_id)

    job = define_job("completes", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    results = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(5)])
    gate = anyio.Event()
    original_claim = backend.claim

    async def claim_then_fail_over(request):
        runs = await original_claim(request)
        if runs:
            outage.down = True  # the database goes away as the handlers finish
        gate.set()
        return runs

    outage.answers["claim"] = claim_then_fail_over
    async with await start_job_runtime(job, backend=outage):
        with anyio.fail_after(5):
            await gate.wait()
        await outage.wait_calls("settle", 1)
        await advance_until(clock, _after(clock, LEASE * 0.8), step=0.25)
        outage.down = False
        back = clock.monotonic()
        with anyio.fail_after(10):
            while not await all_in_state(backend, [r.run_id for r in results], "completed"):
                clock.advance(0.1)
                await settle_loop()
        assert clock.monotonic() - back <= MAX_ERROR_BACKOFF + 0.2
    assert sorted(executions) == sorted(r.run_id for r in results)
    assert JobLeaseStaleError.code not in errors.codes()


async def test_j12_a_stop_during_an_outage_keeps_retrying_completions_until_the_drain_deadline(
    clock, errors
):
    """J12, J11: a completion that fails while the runtime stops is not given up at the first
    try: it is retried until the drain deadline (while the lease may still be held), so a short
    outage during a deploy re-runs nothing; past the deadline it is left to the lease (J6)."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("settle",))
    job = define_job("stopping", _noop, payload=dict, concurrency=Concurrency(lease=LEASE))
    first, second = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in (1, 2)])
    outage.down = True
    runtime = await start_job_runtime(job, backend=outage, drain_timeout=5)
    await outage.wait_calls("settle", 1)
    stopped = anyio.Event()

    async def stop() -> None:
        await runtime.stop()
        stopped.set()

    async with anyio.create_task_group() as group:
        group.start_soon(stop)
        await advance_until(clock, _after(clock, 2), step=0.1)
        assert not stopped.is_set()
        outage.down = False
        await advance_until(clock, stopped, step=0.1)
    assert (await record_of(backend, first.run_id)).state == "completed"
    assert (await record_of(backend, second.run_id)).state == "completed"

    late = await backend.enqueue(job, {"n": 3})
    outage.down = True
    runtime = await start_job_runtime(job, backend=outage, drain_timeout=1)
    await outage.wait_calls("settle", len(outage.calls["settle"]) + 1)
    async with anyio.create_task_group() as group:
        group.start_soon(runtime.stop)
        await advance_until(clock, _after(clock, 3), step=0.1)
    assert (await record_of(backend, late.run_id)).state == "running"  # left to its lease (J6)


async def test_j11_a_failure_that_never_lands_is_not_retried_forever(clock, errors):
    """J11, J6: a failure that keeps being refused by the database (a permanent error) while
    heartbeats still land is retried for at most one lease after its first try, then left to
    the lease: the run is not kept in this process forever by its own heartbeats."""
    backend = InMemoryJobBackend(clock=clock, on_error=errors)
    outage = SpyBackend(backend, outage=("settle",))

    async def handler(ctx, payload):
        raise RuntimeError("boom")

    job = define_job("never-lands", handler, payload=dict, concurrency=Concurrency(lease=LEASE))
    await backend.enqueue(job, {})
    outage.down = True
    async with await start_job_runtime(job, backend=outage) as runtime:
        await outage.wait_calls("settle", 1)
        first = clock.monotonic()
        with anyio.fail_after(10):
            while runtime.in_flight:
                clock.advance(0.25)
                await settle_loop()
        assert clock.monotonic() - first <= LEASE + 1
        outage.down = False
