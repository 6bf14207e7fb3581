"""#36's job history: per-(job, minute) counters and mergeable histograms, kept for 7 days.

Everything here is pure (no SQLAlchemy): the fold a worker keeps between flushes, the
histograms' fixed buckets, their merge (addition) and percentiles, the clock-aligned buckets of
a chart range, and the store's port (:class:`JobStatsStore`, implemented in memory by
``kernel/_memory/stats.py`` and on PostgreSQL by ``_jobs/_stats.py``).

Why this shape (docs/dashboard.md, "History"):

- The runtime already sees every attempt's outcome, its run time and its claim, so it is the
  source: no statement is added per enqueue, claim or settle. Each process folds its attempts
  into one :class:`MinuteStats` per (job, minute) and flushes the fold every
  ``STATS_FLUSH_INTERVAL`` seconds, one upsert statement per flush, whatever the throughput.
- Counters and histograms merge by addition, so every process adds its own rows into the same
  (job, minute) row (``ON CONFLICT ... SET n = n + excluded.n``): no leader, and the order of
  flushes does not matter (a property test checks it).
- Histograms have fixed logarithmic buckets (``HISTOGRAM_GROWTH`` = 2^(1/4) per bucket from
  1 ms): :func:`percentile` answers the geometric middle of the bucket the rank falls in,
  within a factor 2^(1/8) (about 9 %) of the true value, however many processes merged.
- A process that crashes loses what it folded since its last flush: at most one flush interval
  of its own attempts. A failed flush keeps its rows in the fold for the next one.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from itertools import zip_longest
from typing import TYPE_CHECKING, Final, Literal, Protocol, runtime_checkable

import attrs

from ship_sqla.kernel._errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "HISTOGRAM_BUCKETS",
    "HISTOGRAM_GROWTH",
    "RANGES",
    "STATS_FLUSH_INTERVAL",
    "STATS_RETENTION",
    "Backlog",
    "JobStatsStore",
    "MinuteStats",
    "RangeName",
    "StatsBucket",
    "StatsFold",
    "StatsOutcome",
    "StatsRow",
    "StatsSeries",
    "bucket_index",
    "bucket_value",
    "merge_histograms",
    "minute_of",
    "percentile",
    "range_buckets",
    "series_from_rows",
    "stats_outcome",
    "sum_histograms",
]

STATS_FLUSH_INTERVAL: Final = 15.0
"""Seconds between a worker's flushes of its fold (#36: every 10-15 s): also the most a
crashed process's unflushed attempts span."""

STATS_RETENTION: Final = timedelta(days=7)
"""How long the minute rows are kept (the fleet's sampler prunes older ones)."""

HISTOGRAM_GROWTH: Final = 2.0**0.25
"""Each bucket's upper bound is this much its lower one (milliseconds)."""

HISTOGRAM_BUCKETS: Final = 112
"""Bucket 0: under 1 ms; bucket i (1 <= i < 111): [G^(i-1), G^i) ms; the last: everything from
G^110 ms (about 8.5 hours) on."""

StatsOutcome = Literal["completed", "retried", "dead", "cancelled"]
"""The outcomes #36 counts: a completed attempt, a failed attempt that will be retried, a run
that died (its last attempt failed, or terminal), a run whose cancel request ended it."""

_OUTCOMES: Final[Mapping[str, StatsOutcome]] = {
    "completed": "completed",
    "retrying": "retried",
    "dead": "dead",
    "cancelled": "cancelled",
}


def stats_outcome(outcome: str) -> StatsOutcome | None:
    """The counted outcome of a runtime outcome (J10's ``JobOutcome``), None for the attempts
    that are not finishes (snoozed, suspended, parked, lock held, stale, duplicate)."""
    return _OUTCOMES.get(outcome)


def bucket_index(seconds: float) -> int:
    """The histogram bucket of a duration."""
    ms = seconds * 1000.0
    if not ms >= 1.0:  # also NaN and negatives (a clock stepped back): the first bucket
        return 0
    index = 1 + int(math.log(ms) / math.log(HISTOGRAM_GROWTH))
    return min(index, HISTOGRAM_BUCKETS - 1)


def bucket_value(index: int) -> float:
    """The seconds a bucket stands for: the geometric middle of its bounds (0.5 ms for the
    first, the lower bound for the last)."""
    if index <= 0:
        return 0.0005
    low = HISTOGRAM_GROWTH ** (index - 1)
    if index >= HISTOGRAM_BUCKETS - 1:
        return low / 1000.0
    return low * math.sqrt(HISTOGRAM_GROWTH) / 1000.0


def merge_histograms(left: Sequence[int], right: Sequence[int]) -> tuple[int, ...]:
    """Element-wise sum (the shorter padded with zeros), trailing zeros trimmed."""
    size = max(len(left), len(right))
    merged = [
        (left[i] if i < len(left) else 0) + (right[i] if i < len(right) else 0) for i in range(size)
    ]
    return _trim(merged)


def _trim(counts: Sequence[int]) -> tuple[int, ...]:
    end = len(counts)
    while end and counts[end - 1] == 0:
        end -= 1
    return tuple(counts[:end])


def percentile(histogram: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) in seconds, read from the buckets (nearest rank); None
    for an empty histogram."""
    total = sum(histogram)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return bucket_value(index)
    return bucket_value(len(histogram) - 1)  # pragma: no cover - seen reaches total


def minute_of(at: datetime) -> datetime:
    """The UTC minute ``at`` falls in (a clock-aligned bucket start)."""
    at = at.astimezone(UTC)
    return at.replace(second=0, microsecond=0)


@attrs.define
class MinuteStats:
    """One (job, minute)'s counters and histograms, mutable while a fold adds to it."""

    completed: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    run_hist: list[int] = attrs.field(factory=list)
    wait_hist: list[int] = attrs.field(factory=list)

    def add(self, outcome: StatsOutcome, run_seconds: float | None, wait: float | None) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if run_seconds is not None:
            _bump(self.run_hist, bucket_index(run_seconds))
        if wait is not None:
            _bump(self.wait_hist, bucket_index(wait))

    def merge(self, other: MinuteStats | StatsRow) -> None:
        self.completed += other.completed
        self.retried += other.retried
        self.dead += other.dead
        self.cancelled += other.cancelled
        self.run_hist = list(merge_histograms(self.run_hist, other.run_hist))
        self.wait_hist = list(merge_histograms(self.wait_hist, other.wait_hist))


def _bump(counts: list[int], index: int) -> None:
    if len(counts) <= index:
        counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1


@attrs.frozen
class StatsRow:
    """One stored (job, minute) row: what a flush adds, and what the store reads back (with
    the fleet sampler's backlog gauge of that minute, None where none was sampled)."""

    job_id: str
    minute: datetime
    completed: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    run_hist: tuple[int, ...] = ()
    wait_hist: tuple[int, ...] = ()
    waiting: int | None = None
    oldest_due_age: float | None = None


class StatsFold:
    """A process's attempts since its last flush, per (job, minute). Recording is a dict
    lookup and a few additions on the event loop (no I/O); :meth:`take` empties it."""

    __slots__ = ("_minutes",)

    def __init__(self) -> None:
        self._minutes: dict[tuple[str, datetime], MinuteStats] = {}

    def __len__(self) -> int:
        return len(self._minutes)

    def record(
        self,
        job_id: str,
        at: datetime,
        outcome: StatsOutcome,
        run_seconds: float | None = None,
        wait: float | None = None,
    ) -> None:
        key = (job_id, minute_of(at))
        entry = self._minutes.get(key)
        if entry is None:
            entry = self._minutes[key] = MinuteStats()
        entry.add(outcome, run_seconds, wait)

    def add_rows(self, rows: Iterable[StatsRow]) -> None:
        """Fold rows back in (a failed flush's, for the next one)."""
        for row in rows:
            key = (row.job_id, row.minute)
            entry = self._minutes.get(key)
            if entry is None:
                entry = self._minutes[key] = MinuteStats()
            entry.merge(row)

    def take(self) -> list[StatsRow]:
        """The fold's rows (in (job, minute) order, so concurrent upserts lock rows in one
        order), leaving it empty."""
        minutes, self._minutes = self._minutes, {}
        return [
            StatsRow(
                job_id,
                minute,
                s.completed,
                s.retried,
                s.dead,
                s.cancelled,
                _trim(s.run_hist),
                _trim(s.wait_hist),
            )
            for (job_id, minute), s in sorted(minutes.items())
        ]


@attrs.frozen
class Backlog:
    """A job's backlog gauge as the fleet's sampler saw it (F5, J10's queue depth): runs
    waiting (due or delayed), and seconds since the oldest due one became due."""

    waiting: int
    oldest_due_age: float | None


@runtime_checkable
class JobStatsStore(Protocol):
    """Where the minute rows live, shared by every process of the fleet; with how often a
    worker flushes into it and how long its rows are kept."""

    flush_interval: float
    retention: timedelta

    async def add_stats(self, rows: Sequence[StatsRow]) -> None:
        """Add ``rows`` to the stored ones (counters and histograms summed): one statement."""

    async def record_backlog(self, minute: datetime, backlog: Mapping[str, Backlog]) -> None:
        """Set the backlog gauge of each job's ``minute`` row (the last sample of a minute
        wins): one statement."""

    async def prune_stats(self, before: datetime) -> int:
        """Delete the rows of minutes before ``before``; how many."""

    async def read_stats(self, job_id: str, start: datetime, end: datetime) -> list[StatsRow]:
        """The job's rows of the minutes in [start, end), in minute order."""


RangeName = Literal["1h", "6h", "24h", "7d"]

RANGES: Final[Mapping[str, tuple[timedelta, timedelta]]] = {
    "1h": (timedelta(hours=1), timedelta(minutes=1)),
    "6h": (timedelta(hours=6), timedelta(minutes=5)),
    "24h": (timedelta(hours=24), timedelta(minutes=15)),
    "7d": (timedelta(days=7), timedelta(hours=2)),
}
"""Each chart range and its step (60, 72, 96 and 84 buckets)."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def range_buckets(name: str, now: datetime) -> tuple[datetime, datetime, timedelta]:
    """The range's [start, end) and step, aligned to the clock: ``end`` is the start of the
    step after the one ``now`` is in (so the last bucket is the current, partial one), and a
    bucket's bounds are multiples of the step since the epoch, the same on every request."""
    try:
        span, step = RANGES[name]
    except KeyError:
        raise UsageError(
            f"unknown history range {name!r}.", fix=f"choose among {', '.join(RANGES)}."
        ) from None
    steps = (now.astimezone(UTC) - _EPOCH) // step
    end = _EPOCH + (steps + 1) * step
    return end - span, end, step


@attrs.frozen
class StatsBucket:
    """One chart bucket: [start, start + step)."""

    start: datetime
    completed: int
    retried: int
    dead: int
    cancelled: int
    run_p50: float | None
    run_p95: float | None
    run_p99: float | None
    wait_p95: float | None
    waiting: int | None
    oldest_due_age: float | None

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts (retried or dead) over all finished attempts, None with none."""
        done = self.completed + self.retried + self.dead
        return (self.retried + self.dead) / done if done else None


@attrs.frozen
class StatsSeries:
    """A job's history over a range: its buckets, and the totals over the whole range (exact
    up to what crashed processes had not flushed: at most ``loss_bound`` seconds of attempts
    per crash, which a page should say)."""

    job_id: str
    range: str
    start: datetime
    end: datetime
    step: timedelta
    buckets: tuple[StatsBucket, ...]
    total: StatsBucket
    loss_bound: float = STATS_FLUSH_INTERVAL

    @property
    def loss_note(self) -> str:
        return (
            f"Counts are exact, except that a worker process that crashed loses at most its"
            f" last {self.loss_bound:g} s of finishes (its unflushed interval)."
        )


def sum_histograms(histograms: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """Element-wise sum of many histograms, trailing zeros trimmed: what folding
    :func:`merge_histograms` over them gives, summed a column at a time (the 7-day chart sums
    10,080 minute rows: one merge per row cost 100 ms of its page, issue 36)."""
    return _trim([sum(column) for column in zip_longest(*histograms, fillvalue=0)])


@attrs.frozen
class _Summed:
    """A bucket's minute rows summed (and the last one with a backlog sample)."""

    completed: int
    retried: int
    dead: int
    cancelled: int
    run_hist: tuple[int, ...]
    wait_hist: tuple[int, ...]
    last: StatsRow | None

    @classmethod
    def of(cls, rows: Sequence[StatsRow | _Summed]) -> _Summed:
        candidates = [row.last if isinstance(row, _Summed) else row for row in rows]
        sampled = [row for row in candidates if row is not None and row.waiting is not None]
        return cls(
            completed=sum(row.completed for row in rows),
            retried=sum(row.retried for row in rows),
            dead=sum(row.dead for row in rows),
            cancelled=sum(row.cancelled for row in rows),
            run_hist=sum_histograms(row.run_hist for row in rows),
            wait_hist=sum_histograms(row.wait_hist for row in rows),
            last=max(sampled, key=lambda row: row.minute) if sampled else None,
        )


def _bucket(start: datetime, summed: _Summed) -> StatsBucket:
    last = summed.last
    return StatsBucket(
        start=start,
        completed=summed.completed,
        retried=summed.retried,
        dead=summed.dead,
        cancelled=summed.cancelled,
        run_p50=percentile(summed.run_hist, 0.50),
        run_p95=percentile(summed.run_hist, 0.95),
        run_p99=percentile(summed.run_hist, 0.99),
        wait_p95=percentile(summed.wait_hist, 0.95),
        waiting=None if last is None else last.waiting,
        oldest_due_age=None if last is None else last.oldest_due_age,
    )


def series_from_rows(
    job_id: str,
    name: str,
    now: datetime,
    rows: Iterable[StatsRow],
    *,
    loss_bound: float = STATS_FLUSH_INTERVAL,
) -> StatsSeries:
    """The chart series of ``rows`` (a job's minute rows) over range ``name`` ending at the
    clock-aligned bucket of ``now``: one bucket per step (empty ones included), each with the
    merged counters and percentiles of its minutes and the last backlog sample in it."""
    start, end, step = range_buckets(name, now)
    count = (end - start) // step
    grouped: list[list[StatsRow]] = [[] for _ in range(count)]
    for row in rows:
        if start <= row.minute < end:
            grouped[(row.minute - start) // step].append(row)
    summed = [_Summed.of(group) for group in grouped]
    buckets = tuple(_bucket(start + i * step, summed[i]) for i in range(count))
    return StatsSeries(
        job_id=job_id,
        range=name,
        start=start,
        end=end,
        step=step,
        buckets=buckets,
        total=_bucket(start, _Summed.of(summed)),
        loss_bound=loss_bound,
    )
