"""What partitioned limits hold back, seen (F8, F9; issue #35 item 6): per partition of a job,
its due runs waiting on its rate limit or its concurrency cap, and until when.

Both backends measure each partition the same way (its due runs, counted up to a cap; its
running runs, each holding a slot, F9; the starts in its rate window ending at its gate's time,
F8) and :func:`judge` decides here, once, whether the partition waits on a limit:

- on its **rate** (``"rate"``) when its window holds ``limit`` starts: ``until`` is when the
  window's oldest start leaves it (what the claim's ``rate_wait`` says);
- on its **cap** (``"concurrency"``) when ``max`` of its runs are running: a slot frees when one
  of them ends (settles, or lapses and is retaken or buried), which no clock says: ``until`` is
  None unless the rate holds it longer.

A partition with no due run waits on nothing and is not reported.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ship_sqla.kernel._jobs import JobDefinition, PartitionBy

__all__ = [
    "DEFAULT_PARTITION_WAIT_CAP",
    "MAX_WAIT_PARTITIONS",
    "PartitionLimits",
    "PartitionWait",
    "judge",
    "window_measure",
]

MAX_WAIT_PARTITIONS: Final = 1_000
"""The most partitions of one job a partition-wait query visits (tenant order)."""
DEFAULT_PARTITION_WAIT_CAP: Final = 1_000
"""Due runs counted per partition, at most (a count equal to it means at least that many)."""

LimitKind = Literal["rate", "concurrency"]


@attrs.frozen
class PartitionLimits:
    """A job's partitioned limits, as a partition-wait query needs them (from its definition)."""

    job_id: str
    max_running: int | None
    rate_limit: int | None
    rate_period: float | None
    by: PartitionBy = "tenant"
    """What the limits are partitioned by: the run's tenant, or its partition key."""

    @classmethod
    def of(cls, job: JobDefinition[Any]) -> PartitionLimits | None:
        """``job``'s partitioned limits; None when its limits are not partitioned."""
        if job.partition is None:
            return None
        rate = job.rate_limit
        return cls(
            job.id,
            job.concurrency.max,
            None if rate is None else rate.limit,
            None if rate is None else rate.period,
            job.partition,
        )


@attrs.frozen
class PartitionWait:
    """One partition of a job whose due runs wait on a limit (F8, F9): ``partition`` is the
    tenant or the partition key, as the job's limits are partitioned (None: the runs with no
    tenant, or no key), ``due`` its due runs (up to ``cap``), ``running`` its
    running runs, ``started`` its starts in the rate window (0 without a rate limit),
    ``waiting_on`` the limits that hold it (``"rate"``, ``"concurrency"``), ``until`` when the
    rate lets it start again (None when only its cap holds it: until one of its runs ends)."""

    job_id: str
    partition: str | None
    due: int
    running: int
    started: int
    waiting_on: tuple[LimitKind, ...]
    until: datetime | None
    cap: int

    @property
    def capped(self) -> bool:
        """True when ``due`` reached ``cap`` (the true number may be higher)."""
        return self.due >= self.cap


def window_measure(
    starts: Sequence[tuple[datetime, int]], now: datetime, period: float
) -> tuple[int, datetime | None]:
    """F8: the starts in the window ending at the gate's time (``now``, never before its last
    recorded start) and the oldest of them (None: none): what :func:`judge` reads."""
    at = max([now, *(start for start, _ in starts)])
    since = at - timedelta(seconds=period)
    inside = [(start, n) for start, n in starts if start > since and n > 0]
    return sum(n for _, n in inside), min((start for start, _ in inside), default=None)


def judge(
    limits: PartitionLimits,
    partition: str | None,
    *,
    due: int,
    running: int,
    started: int,
    oldest_start: datetime | None,
    cap: int,
) -> PartitionWait | None:
    """The partition's wait (see the module), or None when it waits on no limit."""
    if due <= 0:
        return None
    on: list[LimitKind] = []
    until: datetime | None = None
    rate, period = limits.rate_limit, limits.rate_period
    if rate is not None and period is not None and started >= rate and oldest_start is not None:
        on.append("rate")
        until = oldest_start + timedelta(seconds=period)
    if limits.max_running is not None and running >= limits.max_running:
        on.append("concurrency")
    if not on:
        return None
    return PartitionWait(
        limits.job_id, partition, min(due, cap), running, started, tuple(on), until, cap
    )
