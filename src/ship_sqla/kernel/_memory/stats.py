"""In-process reference :class:`~ship_sqla.kernel._stats.JobStatsStore` (#36's history): the
model the PostgreSQL store is tested against (tests/conformance)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ship_sqla.kernel._stats import STATS_FLUSH_INTERVAL, STATS_RETENTION, MinuteStats, StatsRow

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime, timedelta

    from ship_sqla.kernel._stats import Backlog

__all__ = ["InMemoryJobStats"]


class InMemoryJobStats:
    """The minute rows in a dict keyed by (job, minute); counters and histograms add up."""

    def __init__(
        self,
        *,
        flush_interval: float = STATS_FLUSH_INTERVAL,
        retention: timedelta = STATS_RETENTION,
    ) -> None:
        self.flush_interval = flush_interval
        self.retention = retention
        self._rows: dict[tuple[str, datetime], StatsRow] = {}
        self.statements = 0
        """How many store calls were made (each is one statement on PostgreSQL)."""

    async def add_stats(self, rows: Sequence[StatsRow]) -> None:
        self.statements += 1
        for row in rows:
            key = (row.job_id, row.minute)
            old = self._rows.get(key)
            if old is None:
                self._rows[key] = attrs.evolve(row, waiting=None, oldest_due_age=None)
                continue
            acc = MinuteStats()
            acc.merge(old)
            acc.merge(row)
            self._rows[key] = attrs.evolve(
                old,
                completed=acc.completed,
                retried=acc.retried,
                dead=acc.dead,
                cancelled=acc.cancelled,
                run_hist=tuple(acc.run_hist),
                wait_hist=tuple(acc.wait_hist),
            )

    async def record_backlog(self, minute: datetime, backlog: Mapping[str, Backlog]) -> None:
        self.statements += 1
        for job_id, gauge in backlog.items():
            key = (job_id, minute)
            old = self._rows.get(key) or StatsRow(job_id, minute)
            self._rows[key] = attrs.evolve(
                old, waiting=gauge.waiting, oldest_due_age=gauge.oldest_due_age
            )

    async def prune_stats(self, before: datetime) -> int:
        self.statements += 1
        old = [key for key in self._rows if key[1] < before]
        for key in old:
            del self._rows[key]
        return len(old)

    async def read_stats(self, job_id: str, start: datetime, end: datetime) -> list[StatsRow]:
        self.statements += 1
        return [
            row
            for (job, minute), row in sorted(self._rows.items())
            if job == job_id and start <= minute < end
        ]
