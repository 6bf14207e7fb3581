"""D10: runs parked on a divergence, the rules once for every backend.

A workflow run whose handler diverges from its history (D7) is parked by the executor
(:func:`~ship_sqla.kernel._settlement.parked`): waiting, due never, ``wait_for = '#diverged'``,
no attempt spent, slot and lease released, the divergence in its history. It leaves that state
only by an operator (:meth:`~ship_sqla.kernel.JobOperations.unpark`, ``rerun_from_step``,
``discard``, ``cancel``) or by a deploy: the first worker of a new build (``build_id``) to start
for a job unparks the job's parked runs once, in bounded batches (:func:`unpark_for_build`); if
the new code still diverges, they park again, and the next worker of the same build does not
unpark them.

The stores implement :class:`ParkedRuns` (the PostgreSQL run administration through
``<runs>_parked_idx``, and the in-memory one).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from ship_sqla.kernel._settlement import DIVERGED

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ship_sqla.kernel._ports import RunRecord

__all__ = [
    "DIVERGED",
    "MAX_PARKED_PAGE",
    "UNPARK_BATCH",
    "UNPARK_MAX_BATCHES",
    "ParkedCountSource",
    "ParkedRuns",
    "unpark_for_build",
]

logger = logging.getLogger("ship_sqla.jobs")

MAX_PARKED_PAGE: Final = 1000
"""The most parked runs one listing answers."""
UNPARK_BATCH: Final = 500
"""Parked runs one statement of a new build's unpark makes due at most."""
UNPARK_MAX_BATCHES: Final = 200
"""Batches one worker's start runs per job at most (100,000 runs); the rest stay parked for an
operator (``ship-sqla workflows unpark``), and the log says so."""


@runtime_checkable
class ParkedCountSource(Protocol):
    """A store that counts parked runs per job (the ``ship.workflow.runs.parked`` gauge): both
    job backends, through their run administration."""

    async def parked_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """Parked runs per job of ``job_ids`` (jobs with none are absent)."""
        ...


@runtime_checkable
class ParkedRuns(ParkedCountSource, Protocol):
    """A store's parked runs (D10)."""

    async def list_parked(
        self, *, job_id: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[RunRecord]:
        """At most ``limit`` parked runs (of ``job_id``, or every job) by (job id, run id),
        after the ``(job_id, run_id)`` cursor."""
        ...

    async def unpark(self, run_id: str) -> RunRecord | None:
        """Make the parked run ``run_id`` due now (no longer waiting for ``'#diverged'``); None
        when it is not parked."""
        ...

    async def move_version(self, run_id: str, version: int) -> RunRecord | None:
        """Record handler ``version`` on the parked run ``run_id`` and make it due now; None
        when it is not parked."""
        ...

    async def claim_build_unpark(self, job_id: str, build_id: str) -> bool:
        """Record ``build_id`` as the last build to unpark ``job_id``'s runs: True when it was
        not already, so the caller (and no other worker of that build) unparks them."""
        ...

    async def unpark_batch(self, job_id: str, *, limit: int) -> int:
        """Make at most ``limit`` parked runs of ``job_id`` due now; how many it did."""
        ...


async def unpark_for_build(
    store: ParkedRuns,
    job_ids: Sequence[str],
    build_id: str,
    report_error: Callable[[BaseException], None],
    *,
    batch: int = UNPARK_BATCH,
    max_batches: int = UNPARK_MAX_BATCHES,
) -> dict[str, int]:
    """D10: a worker of build ``build_id`` starts: for each job of ``job_ids`` whose parked runs
    no worker of this build unparked yet, unpark them in batches of at most ``batch`` (at most
    ``max_batches``). Per job, how many were unparked. A failure is reported (J11) and that
    job's runs stay parked (an operator can unpark them)."""
    done: dict[str, int] = {}
    for job_id in job_ids:
        try:
            if not await store.claim_build_unpark(job_id, build_id):
                continue
            total = 0
            for _ in range(max_batches):
                count = await store.unpark_batch(job_id, limit=batch)
                total += count
                if count < batch:
                    break
            else:
                logger.warning(
                    "build %s unparked %d parked runs of job %s; more remain parked: unpark"
                    " them one by one (`ship-sqla workflows unpark RUN_ID`)",
                    build_id,
                    total,
                    job_id,
                )
        except Exception as exc:  # noqa: BLE001 - J11: reported; the runs stay parked
            report_error(exc)
            continue
        if total:
            logger.info("build %s unparked %d parked runs of job %s", build_id, total, job_id)
        done[job_id] = total
    return done
