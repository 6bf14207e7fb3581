"""The worker registry (F6) and the fleet's one queue-gauge sampler (F5) on every backend
(in-memory reference, PostgreSQL): the port's contract, then the runtime on it.

Waits are on the registry's answers with ``anyio.fail_after``; time moves only through the
FrozenClock (the registry's heartbeat, prune bound and sampler lease are all on it).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from job_helpers import ErrorLog, settle_loop
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from spy_backend import SpyBackend

from ship_sqla import create_job_operations, define_job, start_job_runtime
from ship_sqla.errors import BoundExceededError, PermissionDeniedError
from ship_sqla.jobs import EnqueueRequest, WorkerRecord
from ship_sqla.kernel import WorkerEntry
from ship_sqla.kernel._metrics import job_metrics_for
from ship_sqla.kernel._workers import (
    SAMPLER_LEASE,
    WORKER_HEARTBEAT_INTERVAL,
    WORKER_STALE_AFTER,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from ship_sqla.kernel import JobBackend
    from ship_sqla.testing import FrozenClock


async def _noop(ctx: Any, payload: Any) -> None:
    return None


BEAT = WORKER_HEARTBEAT_INTERVAL
STALE = timedelta(seconds=WORKER_STALE_AFTER)
MAIL = define_job("workers.mail", _noop, payload=dict)
PDF = define_job("workers.pdf", _noop, payload=dict)
SAMPLE_INTERVAL = 5.0


def entry(worker_id: str, clock: FrozenClock, **changes: Any) -> WorkerEntry:
    values: dict[str, Any] = {
        "worker_id": worker_id,
        "host": "host-1",
        "pid": 4242,
        "started_at": clock.now(),
        "job_ids": (MAIL.id,),
        "in_flight": 0,
        "draining": False,
    }
    values.update(changes)
    return WorkerEntry(**values)


async def listed(backend: Any) -> list[WorkerRecord]:
    return await backend.workers.list_workers(limit=100)  # type: ignore[no-any-return]


async def wait_listed(
    backend: Any, predicate: Callable[[list[WorkerRecord]], bool], *, limit: float = 10.0
) -> list[WorkerRecord]:
    """The registry's entries once ``predicate`` accepts them (the runtime beats on its own)."""
    with anyio.fail_after(limit):
        while True:
            records = await listed(backend)
            if predicate(records):
                return records
            await settle_loop(5)


async def advance_until_listed(
    clock: FrozenClock,
    backend: Any,
    predicate: Callable[[list[WorkerRecord]], bool],
    *,
    step: float = 1.0,
    limit: float = 20.0,
) -> list[list[WorkerRecord]]:
    """Move frozen time ``step`` seconds at a time until the registry's entries satisfy
    ``predicate`` (small steps: the test never depends on when a beat parked on the clock); every
    listing made on the way, the last one satisfying ``predicate``. On PostgreSQL a beat's
    statements take real time while the test moves the clock, so bounds are checked on the
    beats themselves (each entry's ``last_seen_at``, see :func:`beats`), never on how far the
    clock was moved; and each step waits for the tasks it woke to park again (see
    :func:`advance_parked`)."""
    history: list[list[WorkerRecord]] = []
    parked = clock.sleepers
    with anyio.fail_after(limit):
        while True:
            records = await listed(backend)
            history.append(records)
            if predicate(records):
                return history
            parked = await advance_parked(clock, step, max(parked, clock.sleepers))
            await settle_loop(5)


async def advance_parked(clock: FrozenClock, step: float, parked: int) -> int:
    """Move frozen time ``step`` seconds, then wait (at most a real second) until ``parked``
    tasks are parked on the clock again: the ones the step woke are done with their statements.
    Without it a loaded machine's slow beat lets frozen time run past a lease while that beat is
    still in flight, and another runtime takes the lease its holder never gave up (F5). The count
    to wait for next: ``parked``, or what was parked when the wait gave up (a task that ended)."""
    clock.advance(step)
    with anyio.move_on_after(1.0):
        while clock.sleepers < parked:
            await anyio.lowlevel.checkpoint()
        return parked
    return clock.sleepers


def beats(history: Sequence[Sequence[WorkerRecord]], worker_id: str) -> list[datetime]:
    """The heartbeats of ``worker_id`` the listings saw (its distinct ``last_seen_at``), in
    order: with 1 s steps and a beat every 10 s, every one of them."""
    seen: list[datetime] = []
    for records in history:
        for record in records:
            if record.worker_id == worker_id and (not seen or record.last_seen_at != seen[-1]):
                seen.append(record.last_seen_at)
    return seen


def ids(records: Sequence[WorkerRecord]) -> list[str]:
    return [record.worker_id for record in records]


def by_id(records: Sequence[WorkerRecord]) -> dict[str, WorkerRecord]:
    return {record.worker_id: record for record in records}


@pytest.fixture
def backend(job_backend_factory: Any, clock: FrozenClock) -> Any:
    return job_backend_factory(clock)


# --- the port ------------------------------------------------------------------------------------


async def test_f6_a_heartbeat_registers_then_refreshes_an_entry(
    backend: Any, clock: FrozenClock
) -> None:
    """F6: the first heartbeat registers the worker, each later one replaces what it reported
    and moves ``last_seen_at`` to the store's now; entries are listed by worker id (code point
    order), at most ``limit``; the registry is there (probe answers None)."""
    registry = backend.workers
    assert await registry.probe() is None
    started = clock.now()
    for worker_id in ("w-b", "w-a", "W-c", "w-é"):
        await registry.heartbeat(entry(worker_id, clock))
    assert ids(await listed(backend)) == ["W-c", "w-a", "w-b", "w-é"]
    assert ids(await registry.list_workers(limit=2)) == ["W-c", "w-a"]
    clock.advance(7)
    await registry.heartbeat(
        entry("w-a", clock, started_at=started, job_ids=(MAIL.id, PDF.id), in_flight=3)
    )
    records = by_id(await listed(backend))
    assert records["w-a"] == WorkerRecord(
        worker_id="w-a",
        host="host-1",
        pid=4242,
        started_at=started,
        last_seen_at=clock.now(),
        job_ids=(MAIL.id, PDF.id),
        in_flight=3,
        draining=False,
        sampler=False,
    )
    assert records["w-b"].last_seen_at == started
    await registry.heartbeat(entry("w-a", clock, started_at=started, draining=True))
    assert by_id(await listed(backend))["w-a"].draining


async def test_f6_deregister_removes_the_entry(backend: Any, clock: FrozenClock) -> None:
    """F6: a stopped worker's entry goes; deregistering it again says there was none."""
    registry = backend.workers
    await registry.heartbeat(entry("w-a", clock))
    await registry.heartbeat(entry("w-b", clock))
    assert await registry.deregister("w-a") is True
    assert await registry.deregister("w-a") is False
    assert ids(await listed(backend)) == ["w-b"]


async def test_f6_prune_deletes_only_stale_entries_oldest_first_in_bounded_batches(
    backend: Any, clock: FrozenClock
) -> None:
    """F6: entries not seen for ``stale_after`` seconds are deleted, at most ``limit`` per call,
    oldest first; a refreshed entry stays."""
    registry = backend.workers
    await registry.heartbeat(entry("w-old", clock))
    clock.advance(1)
    await registry.heartbeat(entry("w-older-than-bound", clock))
    await registry.heartbeat(entry("w-live", clock))
    clock.advance(20)
    await registry.heartbeat(entry("w-live", clock))
    assert await registry.prune(stale_after=30, limit=5) == 0
    clock.advance(10)
    assert await registry.prune(stale_after=30, limit=1) == 1
    assert ids(await listed(backend)) == ["w-live", "w-older-than-bound"]
    assert await registry.prune(stale_after=30, limit=5) == 1
    assert await registry.prune(stale_after=30, limit=5) == 0
    assert ids(await listed(backend)) == ["w-live"]


async def test_f5_one_entry_holds_the_sampler_lease_at_a_time(
    backend: Any, clock: FrozenClock
) -> None:
    """F5: the sampler lease has one holder: another entry is refused while it runs, the holder
    renews it, a heartbeat keeps it; it passes on once it lapses, is released, or its holder is
    deregistered; an unregistered worker never gets it."""
    registry = backend.workers
    await registry.heartbeat(entry("w-a", clock))
    await registry.heartbeat(entry("w-b", clock))
    assert await registry.hold_sampler("nobody", lease=30) is False
    assert await registry.hold_sampler("w-a", lease=30) is True
    assert await registry.hold_sampler("w-b", lease=30) is False
    clock.advance(20)
    await registry.heartbeat(entry("w-a", clock))
    assert await registry.hold_sampler("w-a", lease=30) is True  # renewed until t=50
    clock.advance(20)
    assert await registry.hold_sampler("w-b", lease=30) is False
    assert [r.sampler for r in await listed(backend)] == [True, False]
    clock.advance(10)  # t=50: lapsed
    assert [r.sampler for r in await listed(backend)] == [False, False]
    assert await registry.hold_sampler("w-b", lease=30) is True
    assert await registry.hold_sampler("w-a", lease=30) is False
    await registry.release_sampler("w-a")  # not the holder: nothing changes
    assert [r.sampler for r in await listed(backend)] == [False, True]
    await registry.release_sampler("w-b")
    assert await registry.hold_sampler("w-a", lease=30) is True
    assert await registry.deregister("w-a")
    assert await registry.hold_sampler("w-b", lease=30) is True


async def test_f5_racing_takers_get_one_sampler_lease(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """F5: many workers asking for the lease at once (on PostgreSQL, each through its own
    backend, so its own connections): exactly one is granted it."""
    backends = [job_backend_factory(clock) for _ in range(6)]
    for n, backend in enumerate(backends):
        await backend.workers.heartbeat(entry(f"w-{n}", clock))
    granted: list[bool] = [False] * len(backends)

    async def ask(n: int) -> None:
        granted[n] = await backends[n].workers.hold_sampler(f"w-{n}", lease=30)

    async with anyio.create_task_group() as group:
        for n in range(len(backends)):
            group.start_soon(ask, n)
    assert granted.count(True) == 1
    assert [r.sampler for r in await listed(backends[0])] == granted


async def test_f6_workers_through_the_operator_gate(backend: Any, clock: FrozenClock) -> None:
    """F6: ``JobOperations.workers`` lists the registry behind the one permission (J8); its
    limit is bounded (R1)."""
    await backend.workers.heartbeat(entry("w-a", clock))
    ops = create_job_operations(backend, authorizer=lambda _p, _o: True)
    assert ids(await ops.workers()) == ["w-a"]
    for limit in (0, 1001):
        with pytest.raises(BoundExceededError, match="workers limit"):
            await ops.workers(limit=limit)
    refused = create_job_operations(backend, authorizer=lambda _p, _o: False)
    with pytest.raises(PermissionDeniedError):
        await refused.workers()


# --- the runtime ---------------------------------------------------------------------------------


async def test_f6_runtimes_register_heartbeat_and_deregister(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """F6: each worker runtime registers at start (id, host, pid, start, its jobs, nothing in
    flight, not draining), heartbeats every WORKER_HEARTBEAT_INTERVAL seconds of its clock, and
    deregisters when it stops; an enqueue-only runtime never registers."""
    first, second = job_backend_factory(clock), job_backend_factory(clock)
    started = clock.now()
    mail = await start_job_runtime([MAIL], backend=first, worker_id="w-mail")
    pdf = await start_job_runtime([PDF, MAIL], backend=second, worker_id="w-pdf")
    producer = await start_job_runtime([PDF], backend=second, mode="enqueue-only")
    try:
        records = await wait_listed(first, lambda r: ids(r) == ["w-mail", "w-pdf"])
        assert by_id(records)["w-pdf"] == WorkerRecord(
            worker_id="w-pdf",
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=started,
            last_seen_at=started,
            job_ids=(PDF.id, MAIL.id),
            in_flight=0,
            draining=False,
            sampler=False,
        )
        history = await advance_until_listed(
            clock, first, lambda r: all(x.last_seen_at > started for x in r)
        )
        records = history[-1]
        # Once per interval, not more often: the first refresh is one interval after the start.
        assert all(x.last_seen_at - started >= timedelta(seconds=BEAT) for x in records)
        await pdf.stop()
        assert ids(await listed(first)) == ["w-mail"]
    finally:
        await producer.stop()
        await pdf.stop()
        await mail.stop()
    assert await listed(first) == []


async def test_f6_a_dead_workers_entry_is_pruned_by_a_live_ones_heartbeat(
    backend: Any, clock: FrozenClock
) -> None:
    """F6: a worker that died leaves its entry (it never deregistered); the heartbeat of a live
    worker prunes it once it has not been seen for WORKER_STALE_AFTER seconds, not before."""
    died = clock.now()
    await backend.workers.heartbeat(entry("w-dead", clock))  # its last beat before the kill
    async with await start_job_runtime([MAIL], backend=backend, worker_id="w-live"):
        await wait_listed(backend, lambda r: ids(r) == ["w-dead", "w-live"])

        def pruned(records: list[WorkerRecord]) -> bool:
            if clock.now() - died < STALE:
                assert ids(records) == ["w-dead", "w-live"], "pruned before the bound"
            return ids(records) == ["w-live"]

        history = await advance_until_listed(clock, backend, pruned, limit=30)
        # By the live worker's first heartbeat past the bound (or the one under way as the bound
        # passed: its prune runs after its upsert), not a later one.
        assert len([beat for beat in beats(history, "w-live") if beat - died >= STALE]) <= 1


async def test_f6_a_draining_worker_claims_nothing_and_says_so(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """F6: from the moment ``stop()`` is called the runtime claims nothing, however much is
    due, and its entry says it is draining with its runs in flight at once (not a heartbeat
    later); once drained it is deregistered, and the runs it left are still waiting."""
    backend = SpyBackend(job_backend_factory(clock))
    started = anyio.Event()
    proceed = anyio.Event()

    async def block(ctx: Any, payload: Any) -> None:
        started.set()
        await proceed.wait()

    job = define_job("workers.block", block, payload=dict)
    await backend.enqueue(job, {"n": 0})
    runtime = await start_job_runtime([job], backend=backend, worker_id="w-drain")
    with anyio.fail_after(10):
        await started.wait()
    await wait_listed(backend, lambda r: ids(r) == ["w-drain"])
    stopped = anyio.Event()

    async def stop() -> None:
        await runtime.stop(drain_timeout=3600)
        stopped.set()

    async with anyio.create_task_group() as group:
        group.start_soon(stop)
        await wait_listed(backend, lambda r: [(x.in_flight, x.draining) for x in r] == [(1, True)])
        claims = backend.started.get("claim", 0)
        late = await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(1, 4)])
        backend.wake()
        for _ in range(5):
            await settle_loop()
            clock.advance(runtime.poll_interval)
        assert backend.started.get("claim", 0) == claims
        assert not stopped.is_set()
        proceed.set()
        with anyio.fail_after(10):
            await stopped.wait()
    assert await listed(backend) == []
    for result in late:
        record = await backend.admin.get_run(result.run_id)
        assert record is not None
        assert record.state == "waiting"


# --- one sampler per fleet (F5) ------------------------------------------------------------------


class Sampling:
    """One runtime's metrics (its own provider and reader, collected once so it wants to sample)
    and the spy that records its queue samples."""

    def __init__(self, backend: JobBackend) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        # The instruments the runtime records through (one per provider): made now, so the
        # collection below observes their gauges.
        job_metrics_for(self.provider)
        self.reader.get_metrics_data()  # a reader collects: a sample is worth its query
        self.spy = SpyBackend(backend)

    def sampled(self) -> list[list[str]]:
        """The job ids of each queue sample this runtime took."""
        return [call.args[0] for call in self.spy.calls.get("queue_depths", [])]

    def gauged_jobs(self) -> set[str]:
        data = self.reader.get_metrics_data()
        if data is None:
            return set()
        return {
            str(point.attributes["ship.job.id"])
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "ship.job.queue.depth"
            for point in metric.data.data_points
        }

    async def start(self, jobs: list[Any], worker_id: str) -> Any:
        return await start_job_runtime(
            jobs,
            backend=self.spy,
            worker_id=worker_id,
            meter_provider=self.provider,
            queue_sample_interval=SAMPLE_INTERVAL,
        )


def sampler_of(records: Sequence[WorkerRecord]) -> list[str]:
    return [record.worker_id for record in records if record.sampler]


async def test_f5_one_runtime_of_the_fleet_samples_every_jobs_queue(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """F5: of two worker runtimes whose gauges are collected, one holds the sampler lease and
    samples the queues of every job the fleet runs (its own and the other's); the other samples
    nothing and reports no gauge. When the sampler stops, the other takes over at its next
    heartbeat and samples at once."""
    errors = ErrorLog()
    a = Sampling(job_backend_factory(clock, on_error=errors))
    b = Sampling(job_backend_factory(clock, on_error=errors))
    ra = await a.start([MAIL], "w-a")
    rb = await b.start([PDF], "w-b")
    try:
        records = await wait_listed(a.spy, lambda r: len(r) == 2 and len(sampler_of(r)) == 1)
        [holder_id] = sampler_of(records)
        holder, other = (a, b) if holder_id == "w-a" else (b, a)
        holder_runtime, other_runtime = (ra, rb) if holder is a else (rb, ra)
        with anyio.fail_after(10):
            while not holder.sampled():
                await settle_loop(5)
        # The holder learns which jobs its fleet runs at each heartbeat: from its next one on,
        # every sample covers both workers' jobs.
        await advance_until_listed(
            clock, a.spy, lambda _: holder.sampled()[-1] == [MAIL.id, PDF.id]
        )
        for _ in range(2):  # and the samples after it, a sample interval apart
            count = len(holder.sampled())
            await advance_until_listed(
                clock, a.spy, lambda _, count=count: len(holder.sampled()) > count
            )
        assert holder.sampled()[-1] == [MAIL.id, PDF.id]
        assert {tuple(jobs) for jobs in holder.sampled()} <= {
            (MAIL.id,) if holder is a else (PDF.id,),
            (MAIL.id, PDF.id),
        }
        assert other.sampled() == []
        assert holder.gauged_jobs() == {MAIL.id, PDF.id}
        assert other.gauged_jobs() == set()

        await holder_runtime.stop()
        assert holder.gauged_jobs() == set()  # a stopped sampler reports nothing
        other_id = other_runtime.worker_id
        before = by_id(await listed(other.spy))[other_id].last_seen_at
        history = await advance_until_listed(
            clock, other.spy, lambda r: sampler_of(r) == [other_id]
        )
        # Taken at the other's first heartbeat after the stop, not a lease later.
        assert len([beat for beat in beats(history, other_id) if beat > before]) <= 1
        await other.spy.wait_calls("queue_depths", 1)
        # Its first sample may still cover the stopped worker's jobs (the lease was handed back
        # when that one began draining, while its entry was still there), and covers its own.
        assert (PDF.id if other is b else MAIL.id) in other.sampled()[0]
    finally:
        await ra.stop()
        await rb.stop()
    assert errors.errors == []


async def test_f5_a_dead_samplers_lease_lapses_and_a_live_runtime_takes_over(
    backend: Any, clock: FrozenClock
) -> None:
    """F5: a sampler that died keeps the lease until it lapses (SAMPLER_LEASE after its last
    renewal); meanwhile the live runtime samples nothing; then its next heartbeat takes the
    lease and it samples, within SAMPLER_LEASE + WORKER_HEARTBEAT_INTERVAL of the death."""
    await backend.workers.heartbeat(entry("w-dead", clock, job_ids=(PDF.id,)))
    assert await backend.workers.hold_sampler("w-dead", lease=SAMPLER_LEASE)
    died = clock.now()
    lease = timedelta(seconds=SAMPLER_LEASE)
    live = Sampling(backend)
    async with await live.start([MAIL], "w-live"):
        await wait_listed(backend, lambda r: ids(r) == ["w-dead", "w-live"])

        def taken_over(records: list[WorkerRecord]) -> bool:
            if clock.now() - died < lease:
                assert live.sampled() == []
                assert sampler_of(records) == ["w-dead"]
            return sampler_of(records) == ["w-live"]

        history = await advance_until_listed(clock, backend, taken_over, limit=30)
        # At the live worker's first heartbeat once the lease lapsed (or the one under way as it
        # lapsed), not a later one.
        assert len([beat for beat in beats(history, "w-live") if beat - died >= lease]) <= 1
        await live.spy.wait_calls("queue_depths", 1)
        # Its own jobs (the dead worker's entry goes in the same beat, or the next one).
        assert MAIL.id in live.sampled()[-1]


async def test_f5_a_draining_sampler_hands_the_lease_over_at_once(
    job_backend_factory: Any, clock: FrozenClock
) -> None:
    """F5: a sampler that starts draining samples nothing more and releases the lease at once,
    so the other runtime takes it at its next heartbeat instead of after the lease."""
    blocking = anyio.Event()
    started = anyio.Event()

    async def block(ctx: Any, payload: Any) -> None:
        started.set()
        await blocking.wait()

    slow = define_job("workers.slow", block, payload=dict)
    a = Sampling(job_backend_factory(clock))
    b = Sampling(job_backend_factory(clock))
    ra = await a.start([slow], "w-a")
    await wait_listed(a.spy, lambda r: sampler_of(r) == ["w-a"])
    rb = await b.start([PDF], "w-b")
    await a.spy.enqueue(slow, {})
    with anyio.fail_after(10):
        await started.wait()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(ra.stop, 3600)
            await wait_listed(a.spy, lambda r: sampler_of(r) == [] and by_id(r)["w-a"].draining)
            sampled_before = len(a.sampled())
            before = by_id(await listed(b.spy))["w-b"].last_seen_at
            history = await advance_until_listed(clock, b.spy, lambda r: sampler_of(r) == ["w-b"])
            # At b's first heartbeat after the hand-back, not once a's lease would have lapsed.
            assert len([beat for beat in beats(history, "w-b") if beat > before]) <= 1
            await b.spy.wait_calls("queue_depths", 1)
            assert len(a.sampled()) == sampled_before
            blocking.set()
    finally:
        blocking.set()
        await rb.stop()
        await ra.stop()
