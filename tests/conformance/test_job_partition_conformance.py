"""Partitioned limits (F8 rate limits, F9 concurrency caps, per tenant or per partition key) on
every backend: each
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
from ship_sqla.errors import ConfigurationError, InvalidKeyError
from ship_sqla.jobs import Concurrency, EnqueueRequest, Fairness, JobRegistry, RateLimit
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


def by_customer(payload: Any) -> str:
    return str(payload["customer"])


async def test_f8_a_partition_key_derived_from_the_payload(clock, job_backend_factory):
    """F8 per key: RateLimit(2, 10 s, partition='key') with define_job(partition_key=fn): each
    customer's runs have their own window, and an enqueue's own partition_key= wins over the
    function's (its run is limited in its own key's window)."""
    backend = job_backend_factory(clock)
    job = define_job(
        "f8.keys",
        noop,
        payload=dict,
        rate_limit=RateLimit(2, 10.0, partition="key"),
        partition_key=by_customer,
    )
    for customer in ("a", "b", "c"):
        await backend.enqueue_many(
            job, [EnqueueRequest({"customer": customer, "n": n}) for n in range(5)]
        )
    # Its own key: the payload says "a", the enqueue says "vip".
    await backend.enqueue(job, {"customer": "a", "n": 99}, partition_key="vip")
    batch = await backend.claim(claim_request(job, worker="w", limit=100))
    taken = Counter(run.payload["customer"] for run in batch)
    assert taken == {"a": 3, "b": 2, "c": 2}  # a's window (2) and vip's (1)
    assert any(run.payload["n"] == 99 for run in batch)
    assert list(await backend.claim(claim_request(job, worker="w", limit=100))) == []
    clock.advance(10)
    again = await backend.claim(claim_request(job, worker="w", limit=100))
    assert Counter(run.payload["customer"] for run in again) == {"a": 2, "b": 2, "c": 2}


async def test_f8_a_registry_job_takes_partition_key(clock, job_backend_factory):
    """F8 per key through the registry's decorator: JobRegistry.job(..., partition_key=fn) takes
    every option define_job takes, the partition key function included: each customer's runs
    are limited in their own window."""
    backend = job_backend_factory(clock)
    registry = JobRegistry()

    @registry.job(
        "f8.registry_keys",
        payload=dict,
        rate_limit=RateLimit(1, 10.0, partition="key"),
        partition_key=by_customer,
    )
    async def job(payload: dict[str, Any]) -> None:
        del payload

    assert registry.get("f8.registry_keys").partition_key is by_customer
    for customer in ("a", "b"):
        await backend.enqueue_many(
            job, [EnqueueRequest({"customer": customer, "n": n}) for n in range(3)]
        )
    batch = await backend.claim(claim_request(job, worker="w", limit=100))
    assert Counter(run.payload["customer"] for run in batch) == {"a": 1, "b": 1}


async def test_f9_at_most_n_running_per_partition_key(clock, job_backend_factory):
    """F9 per key: Concurrency(max=1, partition='key') with keys given at enqueue: one running
    run per key; completing it lets the key's next one start; runs enqueued without a key
    are one more partition."""
    backend = job_backend_factory(clock)
    job = define_job("f9.keys", noop, payload=dict, concurrency=Concurrency(max=1, partition="key"))
    for key in ("x", "y", None):
        for n in range(3):
            await backend.enqueue(job, {"key": key, "n": n}, partition_key=key)
    first = await backend.claim(claim_request(job, worker="w", limit=10))
    assert sorted((run.payload["key"] or "") for run in first) == ["", "x", "y"]
    assert list(await backend.claim(claim_request(job, worker="w", limit=10))) == []
    x_run = next(run for run in first if run.payload["key"] == "x")
    await backend.settle([completed(x_run)])
    [nxt] = await backend.claim(claim_request(job, worker="w", limit=10))
    assert nxt.payload == {"key": "x", "n": 1}


async def test_f8_f9_a_partition_key_is_only_for_a_job_partitioned_by_key(
    clock, job_backend_factory
):
    """F8, F9: an enqueue naming a partition_key for a job whose limits are not per key is
    refused before anything is written; a blank key is refused too."""
    backend = job_backend_factory(clock)
    plain = define_job("f8.plain_key", noop, payload=dict)
    with pytest.raises(ConfigurationError, match="partition='key'"):
        await backend.enqueue(plain, {}, partition_key="a")
    keyed = define_job(
        "f8.blank_key", noop, payload=dict, rate_limit=RateLimit(1, 1.0, partition="key")
    )
    with pytest.raises(InvalidKeyError, match="partition_key"):
        await backend.enqueue(keyed, {}, partition_key="")
    assert await backend.admin.job_known(plain.id) is False


def test_f8_f9_declarations_are_checked():
    """F8, F9: a partitioned cap needs a max; a job's limits are partitioned alike or not at
    all; partition is 'tenant' or 'key'; partition_key= needs a limit per key; fair claims
    with limits per key are not supported yet. Each error says what to do."""
    with pytest.raises(ConfigurationError, match="no cap to partition"):
        Concurrency(partition="tenant")
    with pytest.raises(ConfigurationError, match="'tenant' or 'key'"):
        RateLimit(1, 1.0, partition="customer")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="no limit of the job has partition='key'"):
        define_job("f8.fn", noop, payload=dict, partition_key=by_customer)
    with pytest.raises(ConfigurationError, match="not supported yet"):
        define_job(
            "f8.fair_key",
            noop,
            payload=dict,
            rate_limit=RateLimit(1, 1.0, partition="key"),
            fairness=Fairness(),
        )
    with pytest.raises(ConfigurationError, match="all partitioned the same way") as caught:
        define_job(
            "f89.mixed",
            noop,
            payload=dict,
            concurrency=Concurrency(max=3),
            rate_limit=RateLimit(1, 1.0, partition="tenant"),
        )
    assert "Fix:" in str(caught.value)


async def test_f8_a_bulk_enqueue_stores_every_runs_partition_key(clock, job_backend_factory):
    """F8 per key: a bulk enqueue (300 runs: the PostgreSQL backend's COPY size) stores each
    run's key in its own transaction: with RateLimit(1, 60 s, partition='key') over ten keys a
    claim of 100 starts exactly one run of each key."""
    backend = job_backend_factory(clock)
    job = define_job(
        "f8.bulk_keys",
        noop,
        payload=dict,
        rate_limit=RateLimit(1, 60.0, partition="key"),
        partition_key=lambda payload: f"c{payload['n'] % 10}",
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(300)])
    batch = await backend.claim(claim_request(job, worker="w", limit=100))
    assert sorted(run.payload["n"] for run in batch) == list(range(10))


async def test_f8_a_small_claim_visits_as_many_partitions_as_it_can_take_from(
    clock, job_backend_factory
):
    """F8, F2: a partitioned claim visits at most max(limit, PARTITION_WALK_FLOOR) partitions
    (within max_tenants): a claim of 1 over 20 tenants (no Fairness: a walk of 64) visits 16,
    so the next claim starts after the 16th, and every tenant comes round."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.small_walk", 1, 600.0)
    tenants = [f"t{n:02}" for n in range(20)]
    for tenant in tenants:
        await fill(backend, job, tenant, 1)
    first = await backend.claim(claim_request(job, worker="w", limit=1))
    assert (by_tenant(first), first.more_due) == ({"t00": 1}, True)
    second = await backend.claim(claim_request(job, worker="w", limit=1))
    assert by_tenant(second) == {"t16": 1}
    seen = by_tenant(first) + by_tenant(second)
    for _ in range(18):
        seen += by_tenant(await backend.claim(claim_request(job, worker="w", limit=1)))
    assert seen == dict.fromkeys(tenants, 1)


def tenant_names(count: int) -> list[str]:
    return [f"t{n:03}" for n in range(count)]


async def test_f8_f2_a_claim_walks_on_until_its_room_is_found(clock, job_backend_factory):
    """F8, F2: without a Fairness, a claim whose first 64 partitions (DEFAULT_PARTITION_WALK)
    hold fewer due runs than its room walks on, up to max(limit, 16) partitions, and stops at
    the partition that fills it: 150 tenants of 2 due runs, a claim of 200 takes 2 of each of
    the first 100 in one statement (not 128 from 64), the next one starts after the 100th."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.walk_on", 1_000, 60.0)
    tenants = tenant_names(150)
    for tenant in tenants:
        await fill(backend, job, tenant, 2)
    first = await backend.claim(claim_request(job, worker="w", limit=200))
    assert (by_tenant(first), first.more_due) == (dict.fromkeys(tenants[:100], 2), True)
    second = await backend.claim(claim_request(job, worker="w", limit=200))
    assert by_tenant(second) == dict.fromkeys(tenants[100:], 2)


async def test_f8_f2_the_walk_goes_on_no_further_than_the_claims_size(clock, job_backend_factory):
    """F8, F2: the walk goes on at most max(limit, 16) partitions: 120 tenants of one due run,
    a claim of 100 visits 100 (its room filled there), and every tenant comes round."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.walk_widest", 1_000, 60.0)
    tenants = tenant_names(120)
    for tenant in tenants:
        await fill(backend, job, tenant, 1)
    first = await backend.claim(claim_request(job, worker="w", limit=100))
    assert (by_tenant(first), first.more_due) == (dict.fromkeys(tenants[:100], 1), True)
    second = await backend.claim(claim_request(job, worker="w", limit=100))
    assert by_tenant(second) == dict.fromkeys(tenants[100:], 1)


async def test_f8_f2_a_walk_that_visited_every_partition_leaves_no_cursor(
    clock, job_backend_factory
):
    """F8, F2: a walk that went on past 64 partitions and ran out of them (its room not
    filled) says no more is due (more_due False): the next claim starts from the first."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.walk_all", 1_000, 60.0)
    tenants = tenant_names(80)
    for tenant in tenants:
        await fill(backend, job, tenant, 2)
    first = await backend.claim(claim_request(job, worker="w", limit=1_000))
    assert (by_tenant(first), first.more_due) == (dict.fromkeys(tenants, 2), False)


async def test_f8_f2_the_first_64_partitions_are_visited_whatever_they_hold(
    clock, job_backend_factory
):
    """F8, F2: the walk never stops before DEFAULT_PARTITION_WALK partitions (F2's turns are
    as before): one tenant with 500 due runs first, then 99 of one each; a claim of 200 visits
    64 (the first fills the room alone), shares it by water-filling (63 and 137), and the next
    claim starts after the 64th."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.walk_least", 1_000, 60.0)
    tenants = tenant_names(100)
    await fill(backend, job, tenants[0], 500)
    for tenant in tenants[1:]:
        await fill(backend, job, tenant, 1)
    first = await backend.claim(claim_request(job, worker="w", limit=200))
    assert by_tenant(first) == {tenants[0]: 137, **dict.fromkeys(tenants[1:64], 1)}
    assert first.more_due
    second = await backend.claim(claim_request(job, worker="w", limit=36))
    assert by_tenant(second) == dict.fromkeys(tenants[64:], 1)


async def test_f9_each_partitions_cap_holds_past_the_first_64(clock, job_backend_factory):
    """F9 (with F8's walk): Concurrency(max=2, partition='tenant'), 100 tenants of 3 due runs:
    the first 64 hold 192 due runs, under the room of 300, so the walk goes on to 100, and
    each tenant starts 2, no more; the next claim, every tenant at its cap, starts none."""
    backend = job_backend_factory(clock)
    job = per_tenant_cap("f9.walk_on", 2)
    tenants = tenant_names(100)
    for tenant in tenants:
        await fill(backend, job, tenant, 3)
    first = await backend.claim(claim_request(job, worker="w", limit=300))
    assert by_tenant(first) == dict.fromkeys(tenants, 2)
    again = await backend.claim(claim_request(job, worker="w", limit=300))
    assert list(again) == []


async def test_f8_each_partitions_rate_holds_past_the_first_64(clock, job_backend_factory):
    """F8: RateLimit(1, 600 s, partition='tenant'), 100 tenants of 2 due runs, a claim of 200:
    the walk goes on past 64 and each tenant starts one; nothing more within the period."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.walk_on_rate", 1, 600.0)
    tenants = tenant_names(100)
    for tenant in tenants:
        await fill(backend, job, tenant, 2)
    first = await backend.claim(claim_request(job, worker="w", limit=200))
    assert by_tenant(first) == dict.fromkeys(tenants, 1)
    await backend.settle([completed(run) for run in first])
    clock.advance(300)
    again = await backend.claim(claim_request(job, worker="w", limit=200))
    assert list(again) == []


async def test_f2_a_fair_partitioned_claim_keeps_max_tenants(clock, job_backend_factory):
    """F2, F8: with a Fairness, max_tenants stays a hard bound: 100 tenants of one due run, a
    claim of 100 takes the first 64 (the walk goes on only without one)."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.walk_fair", 1_000, 60.0, fairness=Fairness())
    tenants = tenant_names(100)
    for tenant in tenants:
        await fill(backend, job, tenant, 1)
    first = await backend.claim(claim_request(job, worker="w", limit=100))
    assert (by_tenant(first), first.more_due) == (dict.fromkeys(tenants[:64], 1), True)


async def test_f8_f2_partitions_short_of_their_share_leave_it_to_the_others(
    clock, job_backend_factory
):
    """F8, F2 (issue 35 item 4, kernel counted_for_shares): a claim of 20 over four partitions
    whose limits allow 20 each, two holding 1 due run and two holding 20. Each is counted up to
    an equal share plus one (6) first; the two short ones leave 6 of the room, so the two full
    ones are counted again up to 12, and the room is shared as over the whole counts: 1, 1, 9
    and 9 (work-conserving, equal shares of what is left)."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.short", 100, 10.0)
    for tenant, count in (("a", 1), ("b", 1), ("c", 20), ("d", 20)):
        await fill(backend, job, tenant, count)
    batch = await backend.claim(claim_request(job, worker="w", limit=20))
    assert by_tenant(batch) == {"a": 1, "b": 1, "c": 9, "d": 9}


async def test_f8_f2_a_small_claim_over_deep_partitions_takes_one_of_each(
    clock, job_backend_factory
):
    """F8, F2 (issue 35 item 4): a claim of 8 over eight partitions of 30 due runs each, whose
    limits allow 30 each: each is counted up to 2 (an equal share, 1, plus one), not 30, and
    each gives one run."""
    backend = job_backend_factory(clock)
    job = per_tenant_rate("f8.deep", 100, 10.0)
    for tenant in "abcdefgh":
        await fill(backend, job, tenant, 30)
    batch = await backend.claim(claim_request(job, worker="w", limit=8))
    assert by_tenant(batch) == dict.fromkeys("abcdefgh", 1)
