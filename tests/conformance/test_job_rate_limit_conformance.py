"""Fleet-wide rate limits (F3) and the claim gate (F1) on every backend: what one claim may
start, what it tells the runtime, and how the window moves. Time moves only through the
FrozenClock (the PostgreSQL backend then uses the clock's time as the database's).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import claim_request, record_of

from ship_sqla import define_job, start_job_runtime
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import Concurrency, EnqueueRequest, RateLimit
from ship_sqla.kernel import completed

LEASE = 30.0


async def noop(ctx: Any, payload: Any) -> None:
    return None


def rated(job_id: str, limit: int, period: float, **options: Any) -> Any:
    options.setdefault("concurrency", Concurrency(lease=LEASE))
    return define_job(job_id, noop, payload=dict, rate_limit=RateLimit(limit, period), **options)


async def test_f3_a_claim_starts_at_most_the_limit_per_period(clock, job_backend_factory):
    """F3: with RateLimit(3, 10 s) a claim of 10 starts 3 and says the window frees in 10 s;
    claims before then start nothing (and keep saying when); once the period has passed the
    next 3 start, and completing runs frees nothing early (the limit counts starts)."""
    backend = job_backend_factory(clock)
    job = rated("f3.window", 3, 10.0)
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(10)])
    first = await backend.claim(claim_request(job, worker="w", limit=10))
    assert len(first) == 3
    assert first.rate_wait == pytest.approx(10.0)
    await backend.settle([completed(run) for run in first])
    clock.advance(4)
    blocked = await backend.claim(claim_request(job, worker="w", limit=10))
    assert list(blocked) == []
    assert blocked.rate_wait == pytest.approx(6.0)
    clock.advance(6)
    second = await backend.claim(claim_request(job, worker="w", limit=10))
    assert len(second) == 3
    record = await record_of(backend, second[0].run_id)
    assert record.updated_at == clock.now()


async def test_f3_the_window_slides_with_each_claims_starts(clock, job_backend_factory):
    """F3: starts leave the window one claim at a time: 2 at t=0 and 1 at t=4 under
    RateLimit(3, 10 s); at t=10 the first claim's 2 have left (2 more may start), the t=4 one
    has not, so the window is full again until t=14."""
    backend = job_backend_factory(clock)
    job = rated("f3.slide", 3, 10.0)
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(10)])
    assert len(await backend.claim(claim_request(job, worker="w", limit=2))) == 2
    clock.advance(4)
    one = await backend.claim(claim_request(job, worker="w", limit=1))
    assert len(one) == 1
    assert one.rate_wait == pytest.approx(6.0)
    clock.advance(6)
    again = await backend.claim(claim_request(job, worker="w", limit=10))
    assert len(again) == 2
    assert again.rate_wait == pytest.approx(4.0)


async def test_f3_a_retaken_lapsed_lease_is_a_start(clock, job_backend_factory):
    """F3, J6: retaking a run whose lease lapsed starts it again, so it counts against the
    rate: with RateLimit(1, 100 s) a lapsed run is not retaken until the window frees."""
    backend = job_backend_factory(clock)
    job = rated("f3.lapsed", 1, 100.0, concurrency=Concurrency(lease=5.0))
    await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="a"))
    clock.advance(10)  # the lease lapsed; the window has not moved on
    assert list(await backend.claim(claim_request(job, worker="b"))) == []
    clock.advance(90)
    [retaken] = await backend.claim(claim_request(job, worker="b"))
    assert retaken.run_id == run.run_id
    assert retaken.attempt == 2


async def test_f1_f3_a_cap_and_a_rate_both_bind(clock, job_backend_factory):
    """F1, F3: Concurrency(max=2) with RateLimit(5, 60 s): a claim takes 2 (the cap); after
    those complete another 2, then 1 (the rate), then nothing until the period has passed."""
    backend = job_backend_factory(clock)
    job = rated("f3.both", 5, 60.0, concurrency=Concurrency(max=2, lease=LEASE))
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(10)])
    taken = []
    for expected in (2, 2, 1, 0):
        batch = await backend.claim(claim_request(job, worker="w", limit=10))
        assert len(batch) == expected
        taken.append(len(batch))
        await backend.settle([completed(run) for run in batch])
    clock.advance(60)
    assert len(await backend.claim(claim_request(job, worker="w", limit=10))) == 2


async def test_f3_a_runtime_claims_again_when_the_window_frees(clock, job_backend_factory):
    """F3: a runtime whose claim found the window full claims the job again when the window
    frees (the claim said when), not only at its next poll: with a 60 s poll and
    RateLimit(2, 5 s), advancing the clock 5 s starts the next two runs."""
    backend = job_backend_factory(clock)
    done: list[int] = []
    finished = anyio.Event()

    async def handler(ctx: Any, payload: Any) -> None:
        done.append(payload["n"])
        if len(done) in (2, 4):
            finished.set()

    job = define_job(
        "f3.runtime", handler, payload=dict, rate_limit=RateLimit(2, timedelta(seconds=5))
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(6)])
    runtime = await start_job_runtime(job, backend=backend, clock=clock, poll_interval=60.0)
    try:
        with anyio.fail_after(10):
            await finished.wait()
        assert len(done) == 2
        finished = anyio.Event()
        clock.advance(5)
        with anyio.fail_after(10):
            await finished.wait()
        assert len(done) == 4
    finally:
        await runtime.stop(drain_timeout=0)


@pytest.mark.parametrize(
    ("limit", "period"),
    [(0, 1.0), (True, 1.0), (1.5, 1.0), (10**7, 1.0), (1, 0.0), (1, float("nan")), (1, 1e9)],
)
def test_f3_a_bad_rate_limit_is_refused(limit: Any, period: Any) -> None:
    """F3: the limit is an int from 1 to 1,000,000 and the period a finite positive duration
    of at most a day: ConfigurationError naming the field."""
    with pytest.raises(ConfigurationError, match="rate_limit"):
        RateLimit(limit, period)


def test_f3_rate_limit_must_be_a_rate_limit() -> None:
    """F3: define_job refuses anything but a RateLimit for rate_limit=."""
    with pytest.raises(ConfigurationError, match="rate_limit must be a RateLimit"):
        define_job("f3.bad", noop, payload=dict, rate_limit=(10, 1.0))  # type: ignore[arg-type]
