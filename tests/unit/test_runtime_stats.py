"""#36: the runtime's side of the job history, on the in-memory backend and store: a worker
folds its finishes with no statement of its own per settle, flushes once per interval (one
``add_stats`` per flush, none when idle), flushes what is left at stop, keeps a failed flush's
rows for the next one (J11: reported), measures queue wait on the database's clock; the fleet's
sampler (F5) records the backlog and prunes past the retention. The store's contract on every
backend is tests/conformance/test_job_stats_conformance.py."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from job_helpers import ErrorLog, advance_until_awaited, claim_request, settle_loop
from spy_backend import SpyBackend

from ship_sqla import define_job, start_job_runtime
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._memory.stats import InMemoryJobStats
from ship_sqla.kernel._stats import percentile
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from ship_sqla.kernel._stats import Backlog, StatsRow


async def _noop(ctx: Any, payload: Any) -> None:
    return None


async def _fail(ctx: Any, payload: Any) -> None:
    message = "declined"
    raise ValueError(message)


OK = define_job("stats.ok", _noop, payload=dict)
FAILS = define_job(
    "stats.fails",
    _fail,
    payload=dict,
    retry=RetryPolicy(attempts=2, backoff="fixed", base_delay=3600, jitter="none"),
)


class CountingStats(InMemoryJobStats):
    """The in-memory store, counting each method's calls; ``add_stats`` raises while ``down``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.adds: list[int] = []
        self.backlogs: list[dict[str, Backlog]] = []
        self.prunes: list[datetime] = []
        self.down = False

    async def add_stats(self, rows: Sequence[StatsRow]) -> None:
        if self.down:
            message = "stats: connection refused"
            raise ConnectionRefusedError(message)
        self.adds.append(len(rows))
        await super().add_stats(rows)

    async def record_backlog(self, minute: datetime, backlog: Mapping[str, Backlog]) -> None:
        self.backlogs.append(dict(backlog))
        await super().record_backlog(minute, backlog)

    async def prune_stats(self, before: datetime) -> int:
        self.prunes.append(before)
        return await super().prune_stats(before)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def errors() -> ErrorLog:
    return ErrorLog()


@pytest.fixture
def backend(clock: FrozenClock, errors: ErrorLog) -> InMemoryJobBackend:
    return InMemoryJobBackend(clock=clock, on_error=errors)


async def _rows(store: InMemoryJobStats, job_id: str, clock: FrozenClock) -> list[StatsRow]:
    now = clock.now()
    return await store.read_stats(job_id, now - timedelta(hours=1), now + timedelta(hours=1))


async def test_finishes_are_flushed_once_per_interval_and_at_stop(
    clock: FrozenClock, backend: InMemoryJobBackend
) -> None:
    """No statement per settle: three finishes land in the store in one flush at the end of
    the interval; an idle interval flushes nothing; the attempts after the last flush are
    flushed at stop. Completed, retried and dead are counted apart."""
    stats = CountingStats(flush_interval=10.0)
    spy = SpyBackend(backend)
    for _ in range(2):
        await backend.enqueue(OK, {})
    await backend.enqueue(FAILS, {})
    runtime = await start_job_runtime([OK, FAILS], backend=spy, stats=stats)
    try:
        await spy.wait_settled(None, 3)
        await settle_loop()
        assert stats.adds == []
        await advance_until_awaited(clock, lambda: _flushes(stats, 1), step=1.0, limit=20)
        assert stats.adds == [2]  # two (job, minute) rows, one statement
        clock.advance(10.0)
        await settle_loop()
        assert stats.adds == [2]  # nothing new: no statement
        await backend.enqueue(OK, {})
        await spy.wait_settled(None, 4)
    finally:
        await runtime.stop()
    assert stats.adds == [2, 1]
    (ok,) = await _rows(stats, OK.id, clock)
    (fails,) = await _rows(stats, FAILS.id, clock)
    assert (ok.completed, ok.retried, ok.dead) == (3, 0, 0)
    assert (fails.completed, fails.retried, fails.dead) == (0, 1, 0)
    assert sum(ok.run_hist) == 3


async def _flushes(stats: CountingStats, count: int) -> None:
    while len(stats.adds) < count:
        await settle_loop(1)


async def test_a_failed_flush_keeps_its_rows_for_the_next(
    clock: FrozenClock, backend: InMemoryJobBackend, errors: ErrorLog
) -> None:
    """J11: a flush that fails is reported; its rows are folded back and land with the next
    flush, so only a crash loses finishes."""
    stats = CountingStats(flush_interval=5.0)
    stats.down = True
    spy = SpyBackend(backend)
    await backend.enqueue(OK, {})
    runtime = await start_job_runtime(OK, backend=spy, stats=stats)
    try:
        await spy.wait_settled(None, 1)
        await advance_until_awaited(clock, lambda: errors.wait_count(1), step=1.0, limit=20)
        assert "connection refused" in str(errors.errors[0])
        stats.down = False
        await backend.enqueue(OK, {})
        await spy.wait_settled(None, 2)
        await advance_until_awaited(clock, lambda: _flushes(stats, 1), step=1.0, limit=20)
    finally:
        await runtime.stop()
    (row,) = await _rows(stats, OK.id, clock)
    assert row.completed == 2


async def test_queue_wait_is_from_due_time_to_claim(
    clock: FrozenClock, backend: InMemoryJobBackend
) -> None:
    """The wait is the database's: due at enqueue, claimed 42 s later (the claim's
    ``lease_expires_at`` minus its lease), whatever the worker's monotonic clock says."""
    stats = CountingStats()
    spy = SpyBackend(backend)
    await backend.enqueue(OK, {})
    clock.advance(42.0)
    runtime = await start_job_runtime(OK, backend=spy, stats=stats)
    try:
        await spy.wait_settled(None, 1)
    finally:
        await runtime.stop()
    (row,) = await _rows(stats, OK.id, clock)
    assert percentile(row.wait_hist, 0.95) == pytest.approx(42.0, rel=0.1)


async def test_the_sampler_records_backlog_and_prunes(
    clock: FrozenClock, backend: InMemoryJobBackend
) -> None:
    """F5: with a history store, the sampler samples without a metric reader: each sample
    writes the jobs' backlog into the minute's rows, and prunes minutes older than the store's
    retention once per maintenance interval."""
    stats = CountingStats(retention=timedelta(days=2))
    await backend.enqueue(FAILS, {}, run_at=clock.now() + timedelta(hours=1))
    runtime = await start_job_runtime(FAILS, backend=backend, stats=stats)
    try:
        await advance_until_awaited(clock, lambda: _backlogs(stats, 2), step=1.0, limit=60)
    finally:
        await runtime.stop()
    assert stats.backlogs[0][FAILS.id].waiting == 1
    assert stats.prunes
    assert stats.prunes[0] <= clock.now() - timedelta(days=2)
    assert stats.prunes[0] >= clock.now() - timedelta(days=2, minutes=1)
    (row,) = await _rows(stats, FAILS.id, clock)
    assert row.waiting == 1


async def _backlogs(stats: CountingStats, count: int) -> None:
    while len(stats.backlogs) < count:
        await settle_loop(1)


async def test_enqueue_only_runtime_records_nothing(backend: InMemoryJobBackend) -> None:
    stats = CountingStats()
    async with await start_job_runtime(OK, backend=backend, mode="enqueue-only", stats=stats):
        await backend.enqueue(OK, {})
    assert stats.adds == []
    assert stats.backlogs == []


async def test_a_run_buried_by_a_claim_counts_dead(
    clock: FrozenClock, backend: InMemoryJobBackend
) -> None:
    """J6: a run whose lease lapsed on its last attempt is dead-lettered by the next claim, not
    by a settle: the history counts it dead (no run time: its holder never settled it)."""
    job = define_job(
        "stats.lapses",
        _noop,
        payload=dict,
        concurrency=Concurrency(lease=1.0),
        retry=RetryPolicy(attempts=1),
    )
    await backend.enqueue(job, {})
    await backend.claim(claim_request(job, worker="gone"))  # a holder that dies
    clock.advance(5.0)
    stats = CountingStats()
    async with await start_job_runtime(job, backend=backend, stats=stats):
        for _ in range(10):  # the runtime's first claims (the stop flushes what they saw)
            clock.advance(0.5)
            await settle_loop()
    (row,) = await _rows(stats, job.id, clock)
    assert (row.dead, row.run_hist) == (1, ())
