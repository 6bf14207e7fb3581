"""The runtime's side of the worker registry (F6) and of the one sampler per fleet (F5), on the
in-memory backend: registry failures never stop a runtime (J11), and without a registry every
runtime runs unregistered and samples its own queues, as before the registry existed. The
port's contract on every backend is tests/conformance/test_job_workers_conformance.py."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from job_helpers import ErrorLog, settle_loop
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.jobs import EnqueueRequest, WorkerRecord
from ship_sqla.kernel import InMemoryJobBackend, InMemoryWorkerRegistry, WorkerEntry
from ship_sqla.kernel._metrics import job_metrics_for
from ship_sqla.kernel._workers import WORKER_HEARTBEAT_INTERVAL
from ship_sqla.testing import FrozenClock


async def _noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("registered.job", _noop, payload=dict)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def errors() -> ErrorLog:
    return ErrorLog()


@pytest.fixture
def backend(clock: FrozenClock, errors: ErrorLog) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=clock, on_error=errors)


class FlakyRegistry:
    """The in-memory registry, whose ``heartbeat`` (or any method named in ``failing``) raises
    while ``down``; and whose ``probe`` answers ``missing`` (None: the registry is there)."""

    def __init__(
        self, inner: InMemoryWorkerRegistry, *, failing: tuple[str, ...] = ("heartbeat",)
    ) -> None:
        self.inner = inner
        self.failing = failing
        self.down = False
        # True: a failing call is made, then raises (its answer is lost after it took effect).
        self.lost = False
        self.missing: str | None = None
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self.down and name in self.failing:
                if self.lost:
                    await method(*args, **kwargs)
                raise ConnectionRefusedError(f"{name}: connection refused")
            return await method(*args, **kwargs)

        return call

    async def probe(self) -> str | None:
        self.calls.append("probe")
        return self.missing


def with_registry(backend: InMemoryJobBackend, registry: Any) -> SpyBackend:
    spy = SpyBackend(backend)
    spy.workers = registry  # type: ignore[attr-defined] - the spy's registry, for this test
    return spy


async def listed(registry: Any) -> list[WorkerRecord]:
    return await registry.list_workers(limit=10)  # type: ignore[no-any-return]


async def test_f6_j11_registry_failures_are_reported_and_never_stop_the_runtime(
    backend: InMemoryJobBackend, clock: FrozenClock, errors: ErrorLog
) -> None:
    """F6, J11: a registry that cannot be reached is reported to on_error and retried after the
    error backoff; the runtime claims and completes runs meanwhile, registers once the registry
    answers again, and a failed deregistration is reported too (the entry is pruned later)."""
    registry = FlakyRegistry(backend.workers, failing=("heartbeat", "deregister"))
    registry.down = True
    spy = with_registry(backend, registry)
    ran = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        ran.set()

    job = define_job("registered.flaky", handler, payload=dict)
    runtime = await start_job_runtime([job], backend=spy, worker_id="w-flaky")
    await errors.wait_count(1)
    assert isinstance(errors.errors[0], ConnectionRefusedError)
    await spy.enqueue(job, {})
    with anyio.fail_after(5):
        await ran.wait()
    assert await listed(backend.workers) == []
    registry.down = False
    with anyio.fail_after(5):
        while not await listed(backend.workers):
            clock.advance(0.5)  # the error backoff, at most a second: not a whole interval
            await settle_loop()
    registry.down = True
    await runtime.stop()
    assert isinstance(errors.errors[-1], ConnectionRefusedError)
    assert "deregister" in str(errors.errors[-1])
    assert [r.worker_id for r in await listed(backend.workers)] == ["w-flaky"]


async def test_f6_without_a_registry_the_runtime_logs_once_and_runs_unregistered(
    backend: InMemoryJobBackend, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    """F6: when the registry says it cannot be kept (the PostgreSQL table is absent), the
    runtime logs why once, with the fix, writes nothing to it ever, and still runs its jobs."""
    registry = FlakyRegistry(backend.workers)
    registry.missing = "the worker registry table ship_job_workers does not exist. Fix: migrate."
    spy = with_registry(backend, registry)
    ran = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        ran.set()

    job = define_job("registered.unregistered", handler, payload=dict)
    with caplog.at_level(logging.WARNING, logger="ship_sqla.jobs"):
        async with await start_job_runtime([job], backend=spy, worker_id="w-none"):
            await spy.enqueue(job, {})
            with anyio.fail_after(5):
                await ran.wait()
            for _ in range(3):
                clock.advance(WORKER_HEARTBEAT_INTERVAL)
                await settle_loop()
    assert registry.calls == ["probe"]
    [record] = [r for r in caplog.records if "unregistered" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "w-none" in record.getMessage()
    assert "ship_job_workers does not exist. Fix: migrate." in record.getMessage()


class Sampled:
    def __init__(self, backend: Any) -> None:
        reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[reader])
        job_metrics_for(self.provider)  # the runtime's instruments, made before the collection
        reader.get_metrics_data()
        self.spy = backend if isinstance(backend, SpyBackend) else SpyBackend(backend)

    def sampled(self) -> list[list[str]]:
        return [call.args[0] for call in self.spy.calls.get("queue_depths", [])]


async def test_f5_without_a_registry_every_runtime_samples_its_own_jobs(
    backend: InMemoryJobBackend, clock: FrozenClock
) -> None:
    """F5: one sampler per fleet needs the registry; without one (here: it is missing) each
    runtime samples its own jobs' queues every interval, as before the registry existed."""
    registry = FlakyRegistry(backend.workers)
    registry.missing = "no registry here."
    other = define_job("registered.other", _noop, payload=dict)
    a = Sampled(with_registry(backend, registry))
    b = Sampled(with_registry(backend, registry))
    ra = await start_job_runtime(
        [JOB], backend=a.spy, meter_provider=a.provider, queue_sample_interval=5
    )
    rb = await start_job_runtime(
        [other], backend=b.spy, meter_provider=b.provider, queue_sample_interval=5
    )
    try:
        for _ in range(3):
            await settle_loop()
            clock.advance(5)
        await a.spy.wait_calls("queue_depths", 2)
        await b.spy.wait_calls("queue_depths", 2)
        assert {tuple(jobs) for jobs in a.sampled()} == {(JOB.id,)}
        assert {tuple(jobs) for jobs in b.sampled()} == {(other.id,)}
    finally:
        await ra.stop()
        await rb.stop()


async def test_f5_a_runtime_that_samples_nothing_never_takes_the_lease(
    backend: InMemoryJobBackend, clock: FrozenClock
) -> None:
    """F5: a runtime whose gauges nobody collects (no SDK), or with queue_sample_interval=None,
    registers but never takes the sampler lease, so it cannot keep the fleet from sampling."""
    uncollected = MeterProvider()  # an SDK whose gauges no reader collects
    quiet = await start_job_runtime(
        [JOB], backend=backend, worker_id="w-quiet", meter_provider=uncollected
    )
    off = await start_job_runtime(
        [JOB], backend=backend, worker_id="w-off", queue_sample_interval=None
    )
    try:
        for _ in range(3):
            await settle_loop()
            clock.advance(WORKER_HEARTBEAT_INTERVAL)
        await settle_loop()
        records = await listed(backend.workers)
        assert [(r.worker_id, r.sampler) for r in records] == [
            ("w-off", False),
            ("w-quiet", False),
        ]
    finally:
        await off.stop()
        await quiet.stop()
    sampling = Sampled(backend)
    async with await start_job_runtime(
        [JOB], backend=sampling.spy, worker_id="w-on", meter_provider=sampling.provider
    ):
        await settle_loop()
        assert [r.sampler for r in await listed(backend.workers)] == [True]


async def test_f6_the_entry_reports_runs_in_flight(
    backend: InMemoryJobBackend, clock: FrozenClock
) -> None:
    """F6: each heartbeat reports the runs the runtime holds (claimed, not settled)."""
    proceed = anyio.Event()
    started = anyio.Event()

    async def block(ctx: Any, payload: Any) -> None:
        started.set()
        await proceed.wait()

    job = define_job("registered.block", block, payload=dict)
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
    async with await start_job_runtime([job], backend=backend, worker_id="w-busy"):
        with anyio.fail_after(5):
            await started.wait()
        await settle_loop()
        clock.advance(WORKER_HEARTBEAT_INTERVAL)
        await settle_loop()
        [record] = await listed(backend.workers)
        assert record.in_flight == 3
        proceed.set()


def test_a_worker_entry_is_a_plain_value() -> None:
    """F6: what a runtime reports is a frozen value (the stores keep it as given)."""
    entry = WorkerEntry("w", "h", 1, FrozenClock().now(), ("a",), 0, False)
    with pytest.raises(AttributeError):
        entry.in_flight = 2  # type: ignore[misc]


@pytest.mark.parametrize("failing", ["release_sampler", "hold_sampler"])
async def test_f5_a_drain_hands_the_lease_back_after_a_failed_call(
    backend: InMemoryJobBackend, clock: FrozenClock, errors: ErrorLog, failing: str
) -> None:
    """F5, J11: a draining runtime hands its sampler lease back even when the registry failed it
    on the way: a release that failed is retried at the next beat (after the error backoff), and
    a hold whose answer was lost (here: the registry raised) counts as held, so the drain
    releases it rather than leave the fleet without a sampler until the lease lapses."""
    registry = FlakyRegistry(backend.workers, failing=(failing,))
    sampling = Sampled(with_registry(backend, registry))
    proceed = anyio.Event()
    started = anyio.Event()

    async def block(ctx: Any, payload: Any) -> None:
        started.set()
        await proceed.wait()

    job = define_job(f"registered.drain.{failing}", block, payload=dict)
    # hold_sampler: the first grant's answer is lost (the registry holds the lease, the runtime
    # was told nothing) and the drain begins before the next beat.
    registry.down = registry.lost = failing == "hold_sampler"
    runtime = await start_job_runtime(
        [job], backend=sampling.spy, worker_id="w-drain", meter_provider=sampling.provider
    )
    try:
        await settle_loop()
        assert [r.sampler for r in await listed(backend.workers)] == [True]
        if failing == "hold_sampler":
            await errors.wait_count(1)
            registry.down = registry.lost = False
        await sampling.spy.enqueue(job, {})
        with anyio.fail_after(5):
            await started.wait()
        registry.down = failing == "release_sampler"
        async with anyio.create_task_group() as group:
            group.start_soon(runtime.stop, 3600)
            if failing == "release_sampler":
                await errors.wait_count(1)
                assert [r.sampler for r in await listed(backend.workers)] == [True]
                registry.down = False
            for _ in range(4):  # the error backoff, at most a second: never the lease
                await settle_loop()
                if [r.sampler for r in await listed(backend.workers)] == [False]:
                    break
                clock.advance(0.5)
            else:
                pytest.fail("the draining runtime kept the sampler lease")
            [record] = await listed(backend.workers)
            assert record.draining
            proceed.set()
    finally:
        proceed.set()
        await runtime.stop()
