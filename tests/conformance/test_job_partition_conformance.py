"""Partitioned limits (F8 rate limits, F9 concurrency caps, per tenant) on every backend: each
partition has its own window and its own cap, a partition at its limit never holds the others
back (work-conserving), lapsed runs keep their slot and spend their partition's rate when
retaken, and the claim shares its room across the partitions as a fair claim does (F2).
Time moves only through the FrozenClock."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from job_helpers import claim_request, record_of

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Concurrency, EnqueueRequest, Fairness, RateLimit
from ship_sqla.kernel import completed
from ship_sqla.kernel._tenancy import tenant_ambient

LEASE = 30.0


async def noop(ctx: Any, payload: Any) -> None:
    return None


async def fill(backend: Any, job: Any, tenant: str | None, count: int) -> None:
    with tenant_ambient(tenant):
        await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(count)])


def by_tenant(batch: Any) -> Counter[str | None]:
    return Counter(run.tenant for run in batch)


def per_tenant_rate(job_id: str, limit: int, period: float, **options: Any) -> Any:
    options.setdefault("concurrency", Concurrency(lease=LEASE))
    return define_job(
        job_id,
        noop,
        payload=dict,
        rate_limit=RateLimit(limit, period, partition="tenant"),
        **options,
    )


def per_tenant_cap(job_id: str, cap: int, **options: Any) -> Any:
    return define_job(
        job_id,
        noop,
        payload=dict,
        concurrency=Concurrency(max=cap, lease=LEASE, partition="tenant"),
        **options,
    )


async def test_f8_each_partition_has_its_own_window(clock, job_backend_factory):
    """F8: RateLimit(2, 10 s, partition='tenant') with three tenants of 10 runs: a claim of 100
    starts 2 of each (6), says the windows free in 10 s, starts nothing more before then, and 2
    of each again once the period has passed; each run's updated_at is its start."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.windows", 2, 10.0)
    for tenant in ("a", "b", "c"):
        await fill(backend, job, tenant, 10)
    first = await backend.claim(claim_request(job, worker="w", limit=100))
    assert by_tenant(first) == {"a": 2, "b": 2, "c": 2}
    assert first.rate_wait == pytest.approx(10.0)
    await backend.settle([completed(run) for run in first])
    clock.advance(4)
    blocked = await backend.claim(claim_request(job, worker="w", limit=100))
    assert list(blocked) == []
    clock.advance(6)
    second = await backend.claim(claim_request(job, worker="w", limit=100))
    assert by_tenant(second) == {"a": 2, "b": 2, "c": 2}
    record = await record_of(backend, second[0].run_id)
    assert record.updated_at == clock.now()


async def test_f8_a_full_partition_never_holds_back_another(clock, job_backend_factory):
    """F8 (work-conserving): tenant a has spent its window (1 per 60 s) with 50 runs still
    due; b's runs, enqueued later, are claimed at once, up to b's own limit."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.conserving", 1, 60.0)
    await fill(backend, job, "a", 50)
    assert by_tenant(await backend.claim(claim_request(job, worker="w", limit=10))) == {"a": 1}
    await fill(backend, job, "b", 5)
    batch = await backend.claim(claim_request(job, worker="w", limit=10))
    assert by_tenant(batch) == {"b": 1}


async def test_f8_untenanted_runs_are_one_partition(clock, job_backend_factory):
    """F8: runs enqueued with no tenant share one window, beside the tenants' own."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.untenanted", 3, 60.0)
    await fill(backend, job, None, 10)
    await fill(backend, job, "acme", 10)
    batch = await backend.claim(claim_request(job, worker="w", limit=100))
    assert by_tenant(batch) == {None: 3, "acme": 3}


async def test_f8_a_retaken_lapsed_lease_spends_its_partitions_rate(clock, job_backend_factory):
    """F8, J6: retaking a lapsed run is a start of its partition: with RateLimit(1, 100 s) per
    tenant the lapsed run of a is not retaken until a's window frees, while b's run starts."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.lapsed", 1, 100.0, concurrency=Concurrency(lease=5.0))
    await fill(backend, job, "a", 1)
    [run] = await backend.claim(claim_request(job, worker="a"))
    clock.advance(10)  # the lease lapsed; a's window has not moved on
    await fill(backend, job, "b", 1)
    batch = await backend.claim(claim_request(job, worker="b", limit=5))
    assert by_tenant(batch) == {"b": 1}
    clock.advance(90)
    [retaken] = await backend.claim(claim_request(job, worker="b", limit=5))
    assert retaken.run_id == run.run_id
    assert retaken.attempt == 2


async def test_f9_at_most_n_running_per_partition(clock, job_backend_factory):
    """F9: Concurrency(max=2, partition='tenant'): a claim of 100 over three tenants of 10
    takes 2 of each; nothing more while they run; completing one of a's lets exactly one more
    of a's start, and none of the others'."""
    backend = job_backend_factory(clock)
    job = per_tenant_cap("f9.cap", 2)
    for tenant in ("a", "b", "c"):
        await fill(backend, job, tenant, 10)
    first = await backend.claim(claim_request(job, worker="w", limit=100))
    assert by_tenant(first) == {"a": 2, "b": 2, "c": 2}
    assert list(await backend.claim(claim_request(job, worker="w", limit=100))) == []
    a_run = next(run for run in first if run.tenant == "a")
    await backend.settle([completed(a_run)])
    assert by_tenant(await backend.claim(claim_request(job, worker="w", limit=100))) == {"a": 1}


async def test_f9_a_lapsed_run_keeps_its_partitions_slot(clock, job_backend_factory):
    """F9, J6: with max=1 per tenant a lapsed run still holds its tenant's slot: a claim
    retakes it (the slot moves) and starts no other run of that tenant."""
    backend = job_backend_factory(clock)
    job = define_job(
        "f9.lapsed",
        noop,
        payload=dict,
        concurrency=Concurrency(max=1, lease=5.0, partition="tenant"),
    )
    await fill(backend, job, "a", 3)
    [run] = await backend.claim(claim_request(job, worker="w1", limit=5))
    clock.advance(10)
    batch = await backend.claim(claim_request(job, worker="w2", limit=5))
    assert [claimed.run_id for claimed in batch] == [run.run_id]


async def test_f8_f9_both_bind_per_partition(clock, job_backend_factory):
    """F8, F9: max=2 and RateLimit(3, 60 s), both per tenant: 2 start (the cap), after they
    complete 1 more (the rate), then none until the period has passed."""
    backend = job_backend_factory(clock)
    job = define_job(
        "f89.both",
        noop,
        payload=dict,
        concurrency=Concurrency(max=2, lease=LEASE, partition="tenant"),
        rate_limit=RateLimit(3, 60.0, partition="tenant"),
    )
    await fill(backend, job, "a", 10)
    await fill(backend, job, "b", 10)
    for expected in (2, 1, 0):
        batch = await backend.claim(claim_request(job, worker="w", limit=10))
        assert by_tenant(batch) == (dict.fromkeys(("a", "b"), expected) if expected else {})
        await backend.settle([completed(run) for run in batch])
    clock.advance(60)
    assert by_tenant(await backend.claim(claim_request(job, worker="w", limit=10))) == {
        "a": 2,
        "b": 2,
    }


async def test_f8_f2_the_room_is_shared_across_partitions(clock, job_backend_factory):
    """F8, F2: a claim of 6 over three tenants each allowed 10 takes 2 of each, and weights
    apply: Fairness(weights={'gold': 2}) gives gold twice a standard tenant's share."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.shared", 10, 60.0, fairness=Fairness(weights={"gold": 2}))
    for tenant in ("gold", "std"):
        await fill(backend, job, tenant, 20)
    batch = await backend.claim(claim_request(job, worker="w", limit=6))
    assert by_tenant(batch) == {"gold": 4, "std": 2}


async def test_f8_partitions_take_turns_past_the_walk(clock, job_backend_factory):
    """F8, F2: with more partitions than one claim visits (max_tenants=2), claims start after
    where the last one stopped, so every partition comes round."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.turns", 1, 600.0, fairness=Fairness(max_tenants=2))
    for tenant in ("a", "b", "c", "d", "e"):
        await fill(backend, job, tenant, 3)
    seen: Counter[str | None] = Counter()
    for _ in range(3):
        seen += by_tenant(await backend.claim(claim_request(job, worker="w", limit=10)))
    assert seen == dict.fromkeys("abcde", 1)


def test_f8_f9_declarations_are_checked():
    """F8, F9: a partitioned cap needs a max; a job's limits are partitioned alike or not at
    all; only 'tenant' partitions are served yet. Each error says what to do."""
    with pytest.raises(ConfigurationError, match="no cap to partition"):
        Concurrency(partition="tenant")
    with pytest.raises(ConfigurationError, match="not supported yet"):
        RateLimit(1, 1.0, partition="customer")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="all partitioned the same way") as caught:
        define_job(
            "f89.mixed",
            noop,
            payload=dict,
            concurrency=Concurrency(max=3),
            rate_limit=RateLimit(1, 1.0, partition="tenant"),
        )
    assert "Fix:" in str(caught.value)
