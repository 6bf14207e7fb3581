"""Priority aging (F10), run against every backend (in-memory reference, PostgreSQL): a due
run's effective priority rises with its wait by ``step`` every ``every`` seconds up to the
``ceiling`` (kernel ``effective_priority``), and claims take due runs by effective priority,
then ``run_at``, then creation order, composed with the cap and the rate gate (K6, F1, F3).
Time moves only through the FrozenClock; nothing sleeps."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from job_helpers import claim_request

from ship_sqla import define_job
from ship_sqla.errors import ConfigurationError, InvalidPriorityError
from ship_sqla.jobs import Aging, Concurrency, EnqueueRequest, Fairness, RateLimit, aging_bound
from ship_sqla.kernel import completed
from ship_sqla.kernel._priority import effective_priority

LEASE = 300.0
AGING = Aging(step=1, every=10.0)


async def _noop(ctx, payload):
    return None


def job(job_id="conf.aging", *, max_=None, rate=None, aging=AGING, fairness=None):
    return define_job(
        job_id,
        _noop,
        payload=dict,
        concurrency=Concurrency(max=max_, lease=LEASE),
        rate_limit=rate,
        aging=aging,
        fairness=fairness,
    )


GATES = [
    pytest.param(None, None, id="ungated"),
    pytest.param(50, None, id="capped"),
    pytest.param(None, RateLimit(1_000, 1.0), id="rate"),
]


@pytest.mark.parametrize(("max_", "rate"), GATES)
async def test_f10_aged_runs_go_before_fresher_higher_priority_ones(
    clock, job_backend_factory, max_, rate
):
    """F10, K6: with Aging(step=1, every=10 s, ceiling 10), a priority-0 run due 100 s ago
    (effective 10) goes before a fresh priority-10 one, a priority-3 run due 25 s ago
    (effective 5) before a fresh priority-5 one, and a priority-0 run due 35 s ago (effective
    3) after both; the aged seek finds them below the level where the priority walk stopped;
    uncapped, through the cap's gate (F1) and through the rate's (F3) alike."""
    backend = job_backend_factory(clock)
    definition = job(max_=max_, rate=rate)
    now = clock.now()
    for name, priority, ago in [
        ("mid", 0, 35),
        ("fresh5", 5, 0),
        ("fresh10", 10, 0),
        ("p3old", 3, 25),
        ("old", 0, 100),
    ]:
        await backend.enqueue(
            definition, {"name": name}, priority=priority, run_at=now - timedelta(seconds=ago)
        )
    first = await backend.claim(claim_request(definition, worker="A", limit=2))
    assert {run.payload["name"] for run in first} == {"old", "fresh10"}
    assert {run.priority for run in first} == {0, 10}  # the stored priority, never changed
    order = []
    while batch := await backend.claim(claim_request(definition, worker="A", limit=1)):
        order.append(batch[0].payload["name"])
    assert order == ["p3old", "fresh5", "mid"]


async def test_f10_a_fair_job_takes_oldest_first_whatever_the_aging(clock, job_backend_factory):
    """F10 with F2: a fair claim takes each tenant's oldest due runs whatever their priority,
    so aging changes nothing there (the fair claim, not the aged one, serves the job)."""
    backend = job_backend_factory(clock)
    definition = job("conf.aging.fair", fairness=Fairness())
    now = clock.now()
    for name, priority, ago in [("young-high", 10, 1), ("old-low", -10, 5)]:
        await backend.enqueue(
            definition, {"name": name}, priority=priority, run_at=now - timedelta(seconds=ago)
        )
    [run] = await backend.claim(claim_request(definition, worker="A", limit=1))
    assert run.payload["name"] == "old-low"


@pytest.mark.parametrize(("max_", "rate"), GATES)
async def test_f10_claims_match_the_kernel_rule_on_a_random_backlog(
    clock, job_backend_factory, max_, rate
):
    """F10, K6: on a seeded random backlog (priorities -10..10, due times over ten minutes,
    some delayed, ceilings and steps varied), every claim takes exactly the runs the kernel's
    rule ranks first: the due ones by (effective priority DESC, run_at, seq) at the claim's
    instant, as the clock moves between claims; on both backends."""
    rng = random.Random(35)
    for case, aging in enumerate(
        [Aging(step=1, every=30.0), Aging(step=3, every=7.5, ceiling=4), Aging(2, 60.0, 0)]
    ):
        backend = job_backend_factory(clock)
        definition = job(f"conf.aging.r{case}", max_=max_, rate=rate, aging=aging)
        now = clock.now()
        requests = [
            EnqueueRequest(
                {"n": n},
                priority=rng.randint(-10, 10),
                run_at=now - timedelta(seconds=rng.randint(-120, 600)),
            )
            for n in range(120)
        ]
        await backend.enqueue_many(definition, requests)
        ranked = [(n, r) for n, r in enumerate(requests)]
        for _ in range(6):
            limit = rng.randint(1, 12)
            at = clock.now()
            due = [(n, r) for n, r in ranked if r.run_at <= at]
            due.sort(
                key=lambda item: (
                    -effective_priority(item[1].priority, item[1].run_at, at, aging),
                    item[1].run_at,
                    item[0],
                )
            )
            expected = {n for n, _ in due[:limit]}
            batch = await backend.claim(claim_request(definition, worker="A", limit=limit))
            assert {run.payload["n"] for run in batch} == expected, (case, limit)
            await backend.settle([completed(run) for run in batch])
            taken = {run.payload["n"] for run in batch}
            ranked = [(n, r) for n, r in ranked if n not in taken]
            clock.advance(rng.randint(1, 90))


def test_f10_aging_is_validated_where_it_is_declared():
    """F10: a step, an every or a ceiling that cannot be served is refused at declaration with
    a clear message and a fix; the bound is ceil((ceiling - p) / step) * every."""
    with pytest.raises(ConfigurationError, match=r"aging\.step"):
        Aging(step=0, every=1.0)
    with pytest.raises(ConfigurationError, match=r"aging\.every"):
        Aging(step=1, every=0)
    with pytest.raises(InvalidPriorityError, match=r"aging\.ceiling"):
        Aging(step=1, every=1.0, ceiling=11)
    with pytest.raises(ConfigurationError, match="aging must be an Aging"):
        define_job("conf.aging.bad", _noop, payload=dict, aging=5)  # type: ignore[arg-type]
    aging = Aging(step=3, every=timedelta(seconds=20), ceiling=5)
    assert aging.every == 20.0
    assert aging_bound(-10, aging) == timedelta(seconds=100)
    assert aging_bound(5, aging) == timedelta(0)


@pytest.mark.parametrize(("max_", "rate"), GATES)
async def test_f10_under_a_steady_stream_a_low_run_waits_at_most_its_bound_plus_one_interval(
    clock, job_backend_factory, max_, rate
):
    """F10: a claim every 3 s takes 4 runs while 4 fresh priority-10 runs arrive before each
    (the stream fills every claim); a priority -10 run due at the start, with Aging(step=5,
    every=10 s), is claimed at most aging_bound(-10) (40 s) plus one claim interval after it
    became due; without aging it is still waiting after ten times that."""
    interval, per_claim = 3, 4
    for aging, bound in ((Aging(step=5, every=10.0), 40), (None, None)):
        backend = job_backend_factory(clock)
        definition = job(f"conf.aging.stream.{bound}", max_=max_, rate=rate, aging=aging)
        start = clock.now()
        await backend.enqueue(definition, {"name": "low"}, priority=-10, run_at=start)
        claimed_at = None
        for tick in range(10 * 40 // interval + 1):
            fresh = [EnqueueRequest({"name": f"s{tick}.{k}"}, priority=10) for k in range(4)]
            await backend.enqueue_many(definition, fresh)
            batch = await backend.claim(claim_request(definition, worker="A", limit=per_claim))
            assert len(batch) == per_claim
            await backend.settle([completed(run) for run in batch])
            if any(run.payload["name"] == "low" for run in batch):
                claimed_at = clock.now()
                break
            clock.advance(interval)
        if bound is None:
            assert claimed_at is None
        else:
            assert claimed_at is not None
            assert claimed_at - start <= aging_bound(-10, aging) + timedelta(seconds=interval)
            assert aging_bound(-10, aging) == timedelta(seconds=bound)
