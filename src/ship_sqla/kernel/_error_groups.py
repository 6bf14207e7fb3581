"""Error groups (issue 36, item 6; S2): dead runs grouped by job, exception type and normalised
message, for the dashboard's Errors page, the job page's top errors and ``ship-sqla jobs
errors``.

The read is bounded whatever the table size, and every statement is one read of one job's
newest dead runs, newest created first, of only the four columns the grouping needs (id, job,
last error, finish time: :meth:`JobOperations.newest_dead_errors`, on PostgreSQL DEAD_ERRORS:
``<runs>_browse_idx (state, job_id, created_at, id)`` read from its end, stopping at its limit;
``tests/integration/test_dashboard_errors_explain.py``): of one job, its newest
:data:`ERROR_GROUP_SCAN` (2,000) dead runs in one statement (it read 4 pages of 500 full rows
until 2026-12-07: 205-286 ms at 1,000,000 runs); of every job, the newest
:data:`ERROR_GROUP_PER_JOB` (100) dead runs of each of the :data:`ERROR_GROUP_JOBS` (20) jobs
whose newest dead run is the newest (:meth:`JobOperations.dead_by_job`, counting to 1: the
overview's read), 21 statements and at most 2,000 rows at 1M or 10M runs. (``list_dead``, in
finish order, is not used: no index holds a job's dead runs in that order, so each of its pages
reads and sorts every dead run of the job.) The runs read are grouped in memory: a group's
count is exact over them, and the answer says when older dead runs were left unread.

A message is normalised by replacing what varies between occurrences of one failure: UUIDs,
hexadecimal strings of 8 or more digits (and ``0x`` numbers), and numbers, with ``<uuid>``,
``<hex>`` and ``<n>``; quoted text is kept (it usually names what failed).

"Retry all dead in this group" goes through the bulk-by-filter operations
(:meth:`JobOperations.preview_matching` / :meth:`JobOperations.retry_filtered`): the group's
:attr:`ErrorGroup.run_filter` is its job, the dead state and the longest literal fragment of its
summary line as the error text. The preview's count is of the runs that filter matches: it can
include another group's runs whose error contains the same fragment, and the confirmation page
shows that count before anything changes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

import attrs

from ship_sqla.kernel._search import RunFilter

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from ship_sqla.kernel._browse import DeadError
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._ports import RunRecord

__all__ = [
    "ERROR_GROUP_JOBS",
    "ERROR_GROUP_PER_JOB",
    "ERROR_GROUP_SCAN",
    "ErrorGroup",
    "ErrorGroups",
    "error_groups",
    "group_errors",
    "group_key",
    "normalise_message",
]

ERROR_GROUP_SCAN: Final = 2000
"""The most dead runs an error-group read looks at: of one job, its newest (one read)."""
ERROR_GROUP_JOBS: Final = 20
"""Across jobs: the jobs read, those whose newest dead run is the newest..."""
ERROR_GROUP_PER_JOB: Final = 100
"""...and each one's newest dead runs (one read): 20 x 100 = 2,000 rows, 21 statements."""
_MAX_MESSAGE: Final = 300
"""Characters of a normalised message kept (a group's key and its shown text)."""
_MAX_FRAGMENT: Final = 200
"""The search's error filter takes at most 200 characters."""

_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:[.,:]\d+)*")
_SPACES = re.compile(r"\s+")
_PLACEHOLDER = re.compile(r"<(?:uuid|hex|n)>")


def normalise_message(message: str) -> str:
    """``message`` with what varies between occurrences replaced (UUIDs, hex, numbers), its
    whitespace collapsed, cut at 300 characters."""
    text = _UUID.sub("<uuid>", message)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACES.sub(" ", text).strip()[:_MAX_MESSAGE]


def group_key(error: str | None) -> tuple[str, str]:
    """An error text's (exception type, normalised message): from its first line,
    ``Type: message`` (a line without ``: `` is a type alone when it looks like one, else a
    message of type ``""``); no error at all is ``("", "")``."""
    if not error:
        return "", ""
    line = error.strip().splitlines()[0].strip() if error.strip() else ""
    kind, sep, message = line.partition(": ")
    if not sep:
        is_type = bool(re.fullmatch(r"[A-Za-z_][\w.]*", line))
        return (line, "") if is_type else ("", normalise_message(line))
    if not re.fullmatch(r"[A-Za-z_][\w.]*", kind):
        return "", normalise_message(line)
    return kind, normalise_message(message)


def _fragment(kind: str, message: str) -> str:
    """The longest literal piece of ``Type: message`` between placeholders (the error text the
    group's filter searches for)."""
    summary = f"{kind}: {message}" if kind and message else kind or message
    pieces = [p.strip() for p in _PLACEHOLDER.split(summary)]
    best = max(pieces, key=len, default="")
    return best[:_MAX_FRAGMENT]


@attrs.frozen
class ErrorGroup:
    """Dead runs of one job failing alike: ``count`` of the runs read, when the oldest and the
    newest of them finished, and the newest one's id and whole first error line (an example)."""

    job_id: str
    exception: str
    message: str
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    example_run_id: str
    example_error: str

    @property
    def fragment(self) -> str:
        return _fragment(self.exception, self.message)

    @property
    def run_filter(self) -> RunFilter:
        """The bulk-by-filter operations' filter for "retry all dead in this group"."""
        fragment = self.fragment
        return RunFilter.of(job_id=self.job_id, state="dead", error=fragment or None)


@attrs.frozen
class ErrorGroups:
    """The groups, most runs first; ``scanned`` dead runs read; ``complete`` False when older
    dead runs were left unread (the counts are of the newest ``scanned``)."""

    groups: tuple[ErrorGroup, ...]
    scanned: int
    complete: bool
    bound: int = ERROR_GROUP_SCAN

    @property
    def note(self) -> str:
        if self.complete:
            return f"Every dead run read ({self.scanned})."
        return (
            f"Grouped from {self.scanned} of the newest dead runs (the bound: at most"
            f" {self.bound} are read); older ones are not counted."
        )


def group_errors(records: Iterable[DeadError | RunRecord]) -> list[ErrorGroup]:
    """``records`` (newest first) grouped by (job, exception type, normalised message), the
    groups with most runs first (then newest)."""
    found: dict[tuple[str, str, str], list[DeadError | RunRecord]] = {}
    for record in records:
        kind, message = group_key(record.last_error)
        found.setdefault((record.job_id, kind, message), []).append(record)
    groups = []
    for (job_id, kind, message), runs in found.items():
        newest = runs[0]
        times = [r.finished_at for r in runs if r.finished_at is not None]
        first_line = (newest.last_error or "").strip().splitlines()
        groups.append(
            ErrorGroup(
                job_id=job_id,
                exception=kind,
                message=message,
                count=len(runs),
                first_seen=min(times, default=None),
                last_seen=max(times, default=None),
                example_run_id=newest.run_id,
                example_error=first_line[0][:_MAX_MESSAGE] if first_line else "",
            )
        )
    groups.sort(key=lambda g: (-g.count, -(g.last_seen.timestamp() if g.last_seen else 0)))
    return groups


async def error_groups(
    ops: JobOperations, *, job_id: str | None = None, scan: int = ERROR_GROUP_SCAN
) -> ErrorGroups:
    """The error groups of the newest dead runs: of ``job_id``, its newest ``scan`` (at most
    :data:`ERROR_GROUP_SCAN`: pages of 500); of every job, the newest
    :data:`ERROR_GROUP_PER_JOB` of each of the :data:`ERROR_GROUP_JOBS` jobs that failed last
    (found by :meth:`JobOperations.dead_by_job`, counting to 1). Each job is one read
    (:meth:`JobOperations.newest_dead_errors`), stopping at its limit."""
    scan = max(1, min(scan, ERROR_GROUP_SCAN))
    if job_id is not None:
        newest, complete = await _newest_dead(ops, job_id, scan)
        return ErrorGroups(tuple(group_errors(newest)), len(newest), complete, scan)
    failing = sorted(
        await ops.dead_by_job(cap=1),
        key=lambda f: (f.last_dead_at is not None, f.last_dead_at),
        reverse=True,
    )
    per_job = max(1, min(ERROR_GROUP_PER_JOB, scan // ERROR_GROUP_JOBS))
    records: list[DeadError] = []
    complete = len(failing) <= ERROR_GROUP_JOBS
    for failures in failing[:ERROR_GROUP_JOBS]:
        found, whole = await _newest_dead(ops, failures.job_id, per_job)
        records.extend(found)
        complete = complete and whole
    records.sort(key=lambda r: (r.finished_at is not None, r.finished_at), reverse=True)
    bound = per_job * ERROR_GROUP_JOBS
    return ErrorGroups(tuple(group_errors(records)), len(records), complete, bound)


async def _newest_dead(ops: JobOperations, job_id: str, most: int) -> tuple[list[DeadError], bool]:
    """The job's newest ``most`` dead runs (newest created first: the runs pages' order, which
    ``<runs>_browse_idx`` serves; ``list_dead``'s finish order is not in an index of one job
    and reads every dead run of it), and whether they are all of them: ONE read of the four
    columns the grouping needs (:meth:`JobOperations.newest_dead_errors`), one more than
    ``most`` asked to tell."""
    found = await ops.newest_dead_errors(job_id, limit=most + 1)
    return found[:most], len(found) <= most
