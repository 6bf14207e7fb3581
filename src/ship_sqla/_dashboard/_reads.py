"""The overview's reads (issue 36, S2): what the dashboard's first page asks the operator
surface, kept apart from its HTML so the pages can be rebuilt (templates) without touching them.

Every figure here comes from one bounded, index-served statement, whatever the table size
(``benchmarks/dashboard.py`` times them at 1,000,000 runs; ``tests/integration/
test_dashboard_reads_explain.py`` proves the plans):

- per job, its due, delayed and running runs (:meth:`JobOperations.demand`), each counted
  exactly up to :data:`OVERVIEW_COUNT_CAP` and shown as a floor ("1000+") past it;
- per job, its dead runs (:meth:`JobOperations.dead_by_job`), counted the same way, and when
  its newest dead run finished: a job whose runs all died (nothing waiting or running) is
  listed too, which the backlog alone never showed;
- the jobs listed: those with waiting, running or dead runs, the paused ones and the
  definitions given, in job id order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._ports import JobDemand, JobFailures

__all__ = [
    "OVERVIEW_COUNT_CAP",
    "THROUGHPUT_BUCKET",
    "THROUGHPUT_BUCKETS",
    "THROUGHPUT_CAP",
    "JobRow",
    "overview_jobs",
]

OVERVIEW_COUNT_CAP: Final = 1_000
"""Counts on the overview are exact up to this and a floor ("1000+") past it: each count reads
at most this many index entries per priority level, so the page costs the same at 1M or 10M
runs (at the default 10,000 the overview read 200,000 entries at 1M runs)."""

THROUGHPUT_BUCKET: Final = 300
"""The overview's throughput chart (the page's and the live stream's): five-minute buckets..."""
THROUGHPUT_BUCKETS: Final = 24
"""...24 of them, the last two hours."""
THROUGHPUT_CAP: Final = 100
"""Finished runs counted per job and bucket (the chart marks a bucket that reached it). Each
counted run is a heap row read (the state is not in the index): at 500 the chart read 120,000
rows at 1,000,000 runs and took 300-700 ms; at 100 at most 24,000 (issue 36). The stats table
(issue 36, item 2) is the exact source this chart is meant to move to."""


@attrs.frozen
class JobRow:
    """One job's line on the overview: its backlog (``demand``, None when nothing of it waits
    or runs) and its dead runs (``failures``, None when it has none)."""

    job_id: str
    demand: JobDemand | None
    failures: JobFailures | None

    @property
    def dead(self) -> str:
        """The dead count as shown: exact, or a floor with "+" past the cap."""
        if self.failures is None:
            return "0"
        return f"{self.failures.dead}{'+' if self.failures.capped else ''}"

    @property
    def last_dead_at(self) -> datetime | None:
        return None if self.failures is None else self.failures.last_dead_at

    @property
    def failing(self) -> bool:
        """Dead runs and nothing due or running: the job an on-call engineer looks for first."""
        idle = self.demand is None or (self.demand.due == 0 and self.demand.running == 0)
        return self.failures is not None and idle


async def overview_jobs(ops: JobOperations, also: Iterable[str] = ()) -> list[JobRow]:
    """The overview's per-job lines: every job with waiting, running or dead runs, and the jobs
    of ``also`` (paused, defined), in job id order. Two bounded statements."""
    demand = {d.job_id: d for d in await ops.demand(cap=OVERVIEW_COUNT_CAP)}
    failures = {f.job_id: f for f in await ops.dead_by_job(cap=OVERVIEW_COUNT_CAP)}
    job_ids = sorted(set(demand) | set(failures) | set(also))
    return [JobRow(job_id, demand.get(job_id), failures.get(job_id)) for job_id in job_ids]
