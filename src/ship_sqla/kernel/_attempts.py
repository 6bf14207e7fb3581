"""A run's history entries, typed (J18): :attr:`RunRecord.entries
<ship_sqla.kernel.RunRecord.entries>` reads :attr:`RunRecord.history
<ship_sqla.kernel.RunRecord.history>`'s JSON objects as :class:`AttemptRecord` values.

An entry is written when an attempt ends without completing (failed, lapsed, released with an
error, snoozed, cancelled...), on every backend, as ``{"attempt", "at", "error", "kind",
"started", "worker"}``: ``started`` (the attempt's start, its claim's) and ``worker`` (the
worker that ran it) since J18's per-attempt times; entries written before have neither, and
read as None. So each attempt that left an entry has its run time (``at - started``), and the
run's first attempt its queue wait (``started - run_at``, while ``run_at`` is still the due
time it was enqueued with: a retry moves it).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import timedelta

    from ship_sqla.kernel._ports import HistoryKind

__all__ = ["AttemptRecord", "attempt_records"]


def _time(raw: object) -> datetime | None:
    """An entry's ISO-8601 text as an aware time (UTC when it names no offset); None when it
    is absent or not a time."""
    if not isinstance(raw, str):
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@attrs.frozen
class AttemptRecord:
    """One attempt that did not complete, as its history entry recorded it (J18)."""

    attempt: int | None
    """The attempt's number (1 for the first)."""
    at: datetime | None
    """When it ended (its settle, or the claim that found its lease lapsed)."""
    error: str | None
    """Its error (the exception's text, or the lapse's or cancel's message)."""
    kind: HistoryKind | None
    """How it ended; None for entries written before ``kind`` existed."""
    started: datetime | None = None
    """When it started (its claim); None for entries written before J18's per-attempt times."""
    worker: str | None = None
    """The worker that ran it (its claim's ``worker``); None for entries written before."""

    @property
    def run_time(self) -> timedelta | None:
        """How long the attempt ran (``at - started``), None when either is unknown."""
        return None if self.at is None or self.started is None else self.at - self.started

    @classmethod
    def of(cls, raw: Any) -> AttemptRecord:  # noqa: ANN401 - a stored JSON value, any shape
        """The entry a stored JSON object holds; a key it lacks (an older entry) reads None."""
        found: dict[str, Any] = raw if isinstance(raw, dict) else {}
        attempt = found.get("attempt")
        error = found.get("error")
        kind = found.get("kind")
        worker = found.get("worker")
        return cls(
            attempt=attempt if isinstance(attempt, int) else None,
            at=_time(found.get("at")),
            error=error if isinstance(error, str) else None,
            kind=cast("HistoryKind", kind) if isinstance(kind, str) else None,
            started=_time(found.get("started")),
            worker=worker if isinstance(worker, str) else None,
        )


def attempt_records(history: Iterable[Any]) -> tuple[AttemptRecord, ...]:
    """``history`` (a run record's JSON objects, oldest first) as typed entries."""
    return tuple(AttemptRecord.of(raw) for raw in history)
