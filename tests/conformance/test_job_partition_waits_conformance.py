"""Partitioned limits seen (F8, F9; issue #35 item 6) on every backend: the operator's
``partition_waits`` names each partition whose due runs wait on its rate limit (and until when
its window frees) or on its cap, and no partition that is free to start or has nothing due.
Time moves only through the FrozenClock."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import claim_request

from ship_sqla import create_job_operations, define_job, start_job_runtime
from ship_sqla.errors import BoundExceededError
from ship_sqla.jobs import Concurrency, EnqueueRequest, Fairness, RateLimit
from ship_sqla.kernel import completed
from ship_sqla.kernel._tenancy import tenant_ambient

LEASE = 30.0


async def noop(ctx: Any, payload: Any) -> None:
    return None


async def fill(backend: Any, job: Any, tenant: str | None, count: int) -> None:
    with tenant_ambient(tenant):
        await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(count)])


def ops_of(backend: Any) -> Any:
    return create_job_operations(backend, authorizer=lambda _permission, _operation: True)


async def test_f8_a_partition_at_its_rate_is_seen_with_when_its_window_frees(
    clock, job_backend_factory
):
    """F8 seen: RateLimit(2, 10 s, per tenant): after a claim that started 2 of tenant a's 5
    runs and b's only run, a waits on its rate until the claim's time + 10 s (3 due), b (no
    run due) and c (not yet claimed, its window empty) wait on nothing; once the window has
    passed, nothing waits."""
    backend = job_backend_factory(clock)
    job = define_job(
        "seen.rate",
        noop,
        payload=dict,
        rate_limit=RateLimit(2, 10.0, partition="tenant"),
        concurrency=Concurrency(lease=LEASE),
    )
    await fill(backend, job, "a", 5)
    await fill(backend, job, "b", 1)
    started_at = clock.now()
    batch = await backend.claim(claim_request(job, worker="w", limit=100))
    assert len(batch) == 3
    await backend.settle([completed(run) for run in batch])
    await fill(backend, job, "c", 1)
    clock.advance(4)
    [wait] = await ops_of(backend).partition_waits([job])
    assert (wait.job_id, wait.partition, wait.due, wait.started) == ("seen.rate", "a", 3, 2)
    assert wait.waiting_on == ("rate",)
    assert wait.until == started_at + timedelta(seconds=10)
    clock.advance(6)
    assert await ops_of(backend).partition_waits([job]) == []


async def test_f9_a_partition_at_its_cap_is_seen_until_a_run_ends(clock, job_backend_factory):
    """F9 seen: Concurrency(max=2, per tenant): with two of tenant a's runs running and more
    due, a waits on its cap (until one of them ends: no time), b with one running does not;
    an unpartitioned job is skipped; the bounds are checked."""
    backend = job_backend_factory(clock)
    job = define_job(
        "seen.cap",
        noop,
        payload=dict,
        concurrency=Concurrency(max=2, lease=LEASE, partition="tenant"),
    )
    plain = define_job("seen.plain", noop, payload=dict)
    await fill(backend, job, "a", 4)
    await fill(backend, job, "b", 1)
    await fill(backend, job, None, 1)
    batch = await backend.claim(claim_request(job, worker="w", limit=100))
    assert len(batch) == 4  # a: 2, b: 1, untenanted: 1
    await fill(backend, job, "b", 1)
    ops = ops_of(backend)
    [wait] = await ops.partition_waits([job, plain])
    assert (wait.partition, wait.due, wait.running, wait.until) == ("a", 2, 2, None)
    assert wait.waiting_on == ("concurrency",)
    await backend.settle([completed(run) for run in batch if run.tenant == "a"][:1])
    assert await ops.partition_waits([job]) == []
    with pytest.raises(BoundExceededError):
        await ops.partition_waits([job], max_partitions=0)


async def test_f8_the_worker_logs_a_throttled_claim_at_debug_level_only(
    clock, job_backend_factory, caplog
):
    """F8 seen: a runtime whose claim left a partition's window full logs it at debug level
    (the job, that a partition's rate throttled it, when the window frees), and nothing at
    info level or above: throttling is routine."""
    backend = job_backend_factory(clock)
    done: list[int] = []
    finished = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        done.append(payload["n"])
        if len(done) == 2:
            finished.set()

    job = define_job(
        "seen.log",
        handler,
        payload=dict,
        rate_limit=RateLimit(2, 5.0, partition="tenant"),
        concurrency=Concurrency(lease=LEASE),
    )
    await fill(backend, job, "a", 4)
    with caplog.at_level(logging.DEBUG, logger="ship_sqla.jobs"):
        runtime = await start_job_runtime(job, backend=backend, clock=clock, poll_interval=60.0)
        try:
            with anyio.fail_after(10):
                await finished.wait()
        finally:
            await runtime.stop(drain_timeout=0)
    throttled = [r for r in caplog.records if "claim throttled" in r.getMessage()]
    assert throttled
    assert {r.levelno for r in throttled} == {logging.DEBUG}
    assert "'seen.log'" in throttled[0].getMessage()
    assert "a partition's" in throttled[0].getMessage()


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"fairness": Fairness(max_tenants=2)}, id="fair"),
        pytest.param(
            {
                "fairness": Fairness(max_tenants=2),
                "rate_limit": RateLimit(100, 1.0, partition="tenant"),
            },
            id="partitioned",
        ),
    ],
)
async def test_f2_f8_a_short_claim_whose_walk_stopped_claims_again_at_once(
    clock, job_backend_factory, options
):
    """F2/F8/F9 work-conserving in the runtime: a claim whose tenant walk stopped at
    max_tenants (2 of 7 tenants visited) comes back short with more_due, and the runtime claims
    again at once rather than at its next poll (60 s, on a frozen clock: never), so all 14 runs
    of the 7 tenants start without the clock moving."""
    backend = job_backend_factory(clock)
    done: list[int] = []
    finished = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        done.append(payload["n"])
        if len(done) == 14:
            finished.set()

    job = define_job("seen.walk", handler, payload=dict, **options)
    for tenant in range(7):
        await fill(backend, job, f"t{tenant}", 2)
    first = await backend.claim(claim_request(job, worker="probe", limit=100))
    assert len(first) == 4
    assert first.more_due
    await backend.settle([completed(run) for run in first])
    done.extend([-1] * 4)
    runtime = await start_job_runtime(job, backend=backend, clock=clock, poll_interval=60.0)
    try:
        with anyio.fail_after(10):
            await finished.wait()
    finally:
        await runtime.stop(drain_timeout=0)


async def test_f8_f9_partitions_by_key_are_seen_too(clock, job_backend_factory):
    """F8/F9 seen per partition key: RateLimit(1, 30 s, partition='key') with the key from the
    payload: after a claim, customer a (3 runs) waits on its rate with 2 due until the claim's
    time + 30 s; customer b (1 run, started) has nothing due and is not listed."""
    backend = job_backend_factory(clock)
    job = define_job(
        "seen.keys",
        noop,
        payload=dict,
        rate_limit=RateLimit(1, 30.0, partition="key"),
        concurrency=Concurrency(lease=LEASE),
        partition_key=lambda payload: payload["customer"],
    )
    for customer, count in (("a", 3), ("b", 1)):
        for n in range(count):
            await backend.enqueue(job, {"customer": customer, "n": n})
    started_at = clock.now()
    batch = await backend.claim(claim_request(job, worker="w", limit=10))
    assert len(batch) == 2
    [wait] = await ops_of(backend).partition_waits([job])
    assert (wait.partition, wait.due, wait.waiting_on) == ("a", 2, ("rate",))
    assert wait.until == started_at + timedelta(seconds=30)
