"""F3 against the model: whatever claims arrive when, with whatever limits asked, caps and
lapsed leases, no window of the period holds more starts than the rate limit allows, and a
claim that leaves the window full says exactly when it frees."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from job_helpers import claim_request

from ship_sqla import define_job
from ship_sqla.jobs import Concurrency, EnqueueRequest, RateLimit
from ship_sqla.kernel import InMemoryJobBackend, completed
from ship_sqla.testing import FrozenClock

START = datetime(2030, 1, 1, tzinfo=UTC)


async def noop(ctx: Any, payload: Any) -> None:
    return None


steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3_000),  # milliseconds to advance first
        st.integers(min_value=1, max_value=8),  # the claim's limit
        st.booleans(),  # settle what it claimed (else leave the leases to lapse)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=6),
    period_ms=st.integers(min_value=100, max_value=5_000),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=6)),
    script=steps,
)
def test_f3_no_window_holds_more_than_the_limit(
    limit: int, period_ms: int, cap: int | None, script: list[tuple[int, int, bool]]
) -> None:
    """F3 (and F1 where a cap is drawn): over any script of claims, clock moves, settles and
    lapsed leases on the in-memory model, every window of the period holds at most ``limit``
    starts, a capped job never has more than ``cap`` running runs, and every ``rate_wait`` a
    claim answers is when its window's oldest start leaves it."""
    asyncio.run(_script(limit, period_ms / 1000, cap, script))


async def _script(
    limit: int, period: float, cap: int | None, script: list[tuple[int, int, bool]]
) -> None:
    clock = FrozenClock(START)
    backend = InMemoryJobBackend(clock=clock)
    job = define_job(
        "f3.prop",
        noop,
        payload=dict,
        rate_limit=RateLimit(limit, period),
        concurrency=Concurrency(max=cap, lease=1.0),
    )
    await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(200)])
    starts: list[datetime] = []
    for advance_ms, asked, settle in script:
        clock.advance(advance_ms / 1000)
        batch = await backend.claim(claim_request(job, worker="w", limit=asked))
        now = clock.now()
        starts += [now] * len(batch)
        if batch.rate_wait is not None:
            window = [at for at in starts if at > now - timedelta(seconds=period)]
            assert len(window) >= limit
            oldest = min(window)
            assert batch.rate_wait == (oldest + timedelta(seconds=period) - now).total_seconds()
        if cap is not None:
            [demand] = await backend.admin.demand([job.id], cap=1_000, max_jobs=1)
            assert demand.running <= cap
        if settle:
            await backend.settle([completed(run) for run in batch])
    starts.sort()
    for first, later in zip(starts, starts[limit:], strict=False):
        assert later - first >= timedelta(seconds=period)
