"""Which jobs the live workers serve (F6's registry read for issue 27 item 8): a run of a job
no live worker declares waits until one starts, and a mistyped job id waits forever. The CLI's
``enqueue`` warns of it, ``jobs stats`` and the dashboard's overview count each job's live
workers. Live: not draining, and seen within :data:`WORKER_STALE_AFTER`.
"""

from __future__ import annotations

import difflib
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import attrs

from ship_sqla.kernel._workers import WORKER_STALE_AFTER

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ship_sqla.kernel._workers import WorkerRecord

__all__ = ["Serving", "serving_of"]


@attrs.frozen
class Serving:
    """The live workers and how many of them declare each job."""

    live_workers: int
    per_job: dict[str, int]

    def workers_for(self, job_id: str) -> int:
        return self.per_job.get(job_id, 0)

    def unserved(self, job_id: str) -> bool:
        """Workers are live and none declares ``job_id``: its runs wait until one starts."""
        return self.live_workers > 0 and not self.workers_for(job_id)

    def closest(self, job_id: str) -> str | None:
        """The served job id closest to ``job_id`` (a likely typo's intent), if any is close."""
        close = difflib.get_close_matches(job_id, sorted(self.per_job), n=1)
        return close[0] if close else None


def serving_of(records: Iterable[WorkerRecord], *, now: datetime) -> Serving:
    """The live workers among ``records`` (not draining, seen within ``WORKER_STALE_AFTER``)."""
    fresh_since = now - timedelta(seconds=WORKER_STALE_AFTER)
    live = [r for r in records if not r.draining and r.last_seen_at >= fresh_since]
    per_job = Counter(job_id for record in live for job_id in set(record.job_ids))
    return Serving(live_workers=len(live), per_job=dict(per_job))
