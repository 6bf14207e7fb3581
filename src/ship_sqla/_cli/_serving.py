"""Which jobs the live workers serve, from the worker registry (F6): a run of a job no live
worker declares waits until one starts, and a mistyped job id waits forever (issue 27 item 8).

``ship-sqla enqueue`` (without ``--registry``) warns on stderr when workers are live and none
declares the job, naming the jobs they do serve and the closest id; ``ship-sqla jobs stats``
shows each job's live workers. A worker is live when it is not draining and its last heartbeat
is younger than ``WORKER_STALE_AFTER`` (:mod:`ship_sqla.kernel._serving`; the dashboard's
overview shows the same count). On a database without the workers table nothing can be told,
and nothing is said.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy.exc import ProgrammingError

from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._serving import Serving, serving_of
from ship_sqla.kernel._workers import MAX_WORKERS_LISTED

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ship_sqla.kernel._workers import WorkerRecord

__all__ = ["Serving", "serving", "unserved_warning"]

_UNDEFINED_TABLE = "42P01"


async def serving(list_workers: Callable[[int], Awaitable[list[WorkerRecord]]]) -> Serving | None:
    """What the worker registry says, read through ``list_workers(limit)``; None when the
    database has no workers table (nothing can be told)."""
    try:
        records = await list_workers(MAX_WORKERS_LISTED)
    except ProgrammingError as exc:
        if sqlstate_of(exc) != _UNDEFINED_TABLE:
            raise
        return None
    return serving_of(records, now=datetime.now(UTC))


def unserved_warning(served: Serving | None, job_id: str) -> str | None:
    """The warning for a run of ``job_id`` when workers are live and none declares it."""
    if served is None or not served.unserved(job_id):
        return None
    closest = served.closest(job_id)
    guess = f" Did you mean {closest!r}?" if closest else ""
    return (
        f"warning: no live worker serves job {job_id!r}: the {served.live_workers} live"
        f" worker(s) serve {', '.join(sorted(served.per_job))}. The run waits until a worker"
        f" serving {job_id!r} starts.{guess} Fix: check the job id, or enqueue with --registry"
        " APP:REGISTRY to check it against the application's jobs."
    )
