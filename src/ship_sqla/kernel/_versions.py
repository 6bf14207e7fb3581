"""D9: pinned handler versions, the rules once for every backend.

A job declared with ``define_job(..., version=N, previous={M: handler_m})`` serves versions
``{N, M, ...}``; each run records the version it was enqueued under (``handler_version``) and
only that version's handler executes it (the executor hands a run of a version it lacks back,
its attempt unspent: :meth:`~ship_sqla.kernel._jobs.JobDefinition.at_version`). A run stored
before versions existed (``handler_version`` None) counts as the lowest version its job serves,
so it never strands.

This module holds what the gauges and the deploy check compute from a store's counts
(:class:`VersionCountSource`): which live runs are **stranded**, i.e. of a version that no
registered worker (or, for the deploy check, no job of the registry about to be deployed)
serves. Workers report the versions they serve in their registry entry (F6) as
``"<job_id>:<version>"`` texts (:func:`served_entries`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ship_sqla.kernel._jobs import JobDefinition

__all__ = [
    "MAX_VERSION_ROWS",
    "Stranded",
    "VersionCount",
    "VersionCountSource",
    "describe_stranded",
    "served_by_entries",
    "served_by_jobs",
    "served_entries",
    "stranded_runs",
    "warn_stranded",
]

logger = logging.getLogger("ship_sqla.jobs")

MAX_VERSION_ROWS: Final = 10_000
"""The most (job, version, state) groups one count answers: far above any real fleet's."""

LiveState = Literal["waiting", "running"]


@attrs.frozen
class VersionCount:
    """Live runs of one job recorded under one handler version, in one live state (D9)."""

    job_id: str
    version: int
    state: LiveState
    runs: int


@attrs.frozen
class Stranded:
    """Live runs of ``job_id`` recorded under ``version``, which nothing serves (D9)."""

    job_id: str
    version: int
    runs: int


@runtime_checkable
class VersionCountSource(Protocol):
    """A store that counts live runs per handler version (D9): the PostgreSQL backend (an
    index-only scan of ``<runs>_version_idx``) and the in-memory one."""

    async def version_counts(
        self, job_ids: Sequence[str] | None = None, *, limit: int = MAX_VERSION_ROWS
    ) -> list[VersionCount]:
        """Live (waiting or running) runs of versioned jobs per (job, version, state), of
        ``job_ids`` (None: every job), ordered by job, version and state, at most ``limit``
        groups. Runs of unversioned jobs (no recorded version) are not counted."""
        ...


def served_by_jobs(jobs: Iterable[JobDefinition[Any]]) -> dict[str, frozenset[int]]:
    """The versions each job of a registry serves (only versioned jobs)."""
    return {job.id: job.served_versions for job in jobs if job.version is not None}


def served_entries(jobs: Iterable[JobDefinition[Any]]) -> tuple[str, ...]:
    """What a worker's registry entry reports it serves: ``"<job_id>:<version>"``, sorted."""
    return tuple(
        sorted(
            f"{job_id}:{version}"
            for job_id, versions in served_by_jobs(jobs).items()
            for version in versions
        )
    )


def served_by_entries(entries: Iterable[str]) -> dict[str, frozenset[int]]:
    """:func:`served_entries`' texts (of one or many workers) back into versions per job; a
    text that is not one is skipped."""
    served: dict[str, set[int]] = {}
    for text in entries:
        job_id, _, version = text.rpartition(":")
        if job_id and version.isdigit():
            served.setdefault(job_id, set()).add(int(version))
    return {job_id: frozenset(versions) for job_id, versions in served.items()}


def stranded_runs(
    counts: Iterable[VersionCount], served: Mapping[str, frozenset[int]]
) -> list[Stranded]:
    """The live runs no one serves: per (job, version) of ``counts`` that ``served`` lacks, the
    total of its live states, in (job, version) order."""
    totals: dict[tuple[str, int], int] = {}
    for count in counts:
        if count.version not in served.get(count.job_id, frozenset()):
            key = (count.job_id, count.version)
            totals[key] = totals.get(key, 0) + count.runs
    return [Stranded(job_id, version, runs) for (job_id, version), runs in sorted(totals.items())]


def describe_stranded(stranded: Sequence[Stranded]) -> str:
    """One line per stranded (job, version): what the deploy check and the worker's start
    warning print."""
    return "; ".join(
        f"job {s.job_id!r} has {s.runs} live run{'' if s.runs == 1 else 's'} of version {s.version}"
        for s in stranded
    )


async def warn_stranded(
    source: VersionCountSource,
    jobs: Iterable[JobDefinition[Any]],
    report_error: Callable[[BaseException], None],
) -> list[Stranded]:
    """D9: a worker starting with ``jobs`` logs one WARNING naming the live runs of its
    versioned jobs that it cannot execute (a version it does not serve): another worker must
    serve them, or they are stranded. One statement; a failure is reported (J11), never
    raised."""
    served = served_by_jobs(jobs)
    if not served:
        return []
    try:
        counts = await source.version_counts(sorted(served))
    except Exception as exc:  # noqa: BLE001 - J11: the start goes on
        report_error(exc)
        return []
    stranded = stranded_runs(counts, served)
    if stranded:
        logger.warning(
            "this worker does not serve versions live runs need: %s; keep those versions in"
            " define_job(..., previous={...}) or run a worker that serves them (D9)",
            describe_stranded(stranded),
        )
    return stranded
