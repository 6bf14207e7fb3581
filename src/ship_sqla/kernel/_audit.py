"""The operator audit log (S1): who did what, when, to how many.

Every state-changing operator operation (retry, cancel, discard, pause, resume, re-drive, the
bulk operations, cleanup, rerun) is written to an :class:`AuditSink` by the operator surface
that ran it (:class:`~ship_sqla.jobs.JobOperations`, the outbox's operations), whether it was
called from Python, the CLI or the dashboard. The entry is written after the operation's
statements, in the same unit of work when the caller runs one (the PostgreSQL log joins it), so
a rolled-back operation leaves no entry; outside one, an entry that cannot be written raises
(never swallowed) after the change itself committed, and the error says so.

The one audit rule (S1, issue 33): an operator action whose configured audit cannot be written
changes nothing. Before its first change, the operator surface asks a sink that can tell
(:class:`CheckedAuditSink`: the PostgreSQL log probes its table) whether it can write; when it
cannot, the action raises :class:`AuditUnavailableError`, naming the table and how to create
it, and nothing changed. Surfaces configured with no sink (``audit=None`` in Python) write no
entry at all: that is the documented opt-out, as the CLI's ``--no-audit``.

The in-memory log here is the reference; the PostgreSQL one is
:func:`ship_sqla.create_audit_log` over :func:`ship_sqla.ship_audit_table`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import attrs

from ship_sqla.kernel._errors import RefusedError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ship_sqla.kernel._clock import Clock

__all__ = [
    "AUDIT_SCAN",
    "MAX_AUDIT_PAGE",
    "AuditEntry",
    "AuditFilter",
    "AuditLog",
    "AuditPage",
    "AuditSink",
    "AuditUnavailableError",
    "CheckedAuditSink",
    "InMemoryAuditLog",
    "require_audit_writable",
]

MAX_AUDIT_PAGE: Final = 500
"""Entries per :meth:`AuditLog.list_entries` call."""
AUDIT_SCAN: Final = 5000
"""Entries a filtered audit page reads past at most (:func:`search_audit`: ten reads of the
log's newest-first order), then stops and says so; its "older" link goes on from there."""
MAX_AUDIT_FILTER_CHARS: Final = 200


@attrs.frozen
class AuditFilter:
    """What an audit page is filtered by (each None: any): ``actor`` and ``operation``
    (``"jobs.retry"``) exactly, ``target`` as text in the entry's target (a run id, a job id, a
    bulk filter; case-insensitive), and ``since`` / ``until`` on the entry's time (``since``
    included, ``until`` excluded)."""

    actor: str | None = None
    operation: str | None = None
    target: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in attrs.astuple(self))

    def matches(self, entry: AuditEntry) -> bool:
        if self.actor is not None and entry.actor != self.actor:
            return False
        if self.operation is not None and entry.operation != self.operation:
            return False
        if self.target is not None and self.target.casefold() not in entry.target.casefold():
            return False
        if self.since is not None and (entry.at is None or entry.at < self.since):
            return False
        return self.until is None or (entry.at is not None and entry.at < self.until)


@attrs.frozen
class AuditPage:
    """A filtered page of the audit log, newest first: the ``entries`` that matched, the
    entries read (``scanned``), and ``next_before`` (the id to read on from, None when the log
    has no older entry); ``stopped`` when the scan bound ended the page before it was full."""

    entries: tuple[AuditEntry, ...]
    scanned: int
    next_before: int | None
    stopped: bool


async def search_audit(
    log: AuditLog, match: AuditFilter, *, limit: int, before: int | None, scan: int = AUDIT_SCAN
) -> AuditPage:
    """At most ``limit`` entries matching ``match``, newest first, older than ``before``,
    reading at most ``scan`` entries: pages of the log's own newest-first read
    (:meth:`AuditLog.list_entries`, served by the PostgreSQL log's primary key), the filter
    applied to each entry. Every log, every backend: no statement of its own."""
    found: list[AuditEntry] = []
    scanned, cursor, more = 0, before, True
    while more and len(found) < limit and scanned < scan:
        asked = min(MAX_AUDIT_PAGE, scan - scanned)
        batch = await log.list_entries(limit=asked, before=cursor)
        more = len(batch) == asked  # a short read: the log has no older entry
        for i, entry in enumerate(batch):
            scanned += 1
            cursor = entry.entry_id
            if match.matches(entry):
                found.append(entry)
                if len(found) == limit:
                    more = more or i < len(batch) - 1
                    break
    return AuditPage(
        entries=tuple(found),
        scanned=scanned,
        next_before=cursor if more and cursor != before else None,
        stopped=more and len(found) < limit,
    )


@attrs.frozen
class AuditEntry:
    """One operator action: ``actor`` (who: the dashboard's user, ``cli:<user>@<host>``, or
    what the Python caller named), ``operation`` (``"jobs.retry"``, ``"outbox.retry"``...),
    ``target`` (a run id, a job id, an outbox id, or the filter of a bulk operation), ``count``
    (how many runs or messages it changed), ``at`` (when; the database's clock in the
    PostgreSQL log, None before it is stored) and ``details`` (JSON: e.g. the ids of a bulk
    operation, capped, or the error that stopped it). ``entry_id`` is the log's own id."""

    actor: str
    operation: str
    target: str
    count: int
    details: Mapping[str, Any] = attrs.field(factory=dict)
    at: datetime | None = None
    entry_id: int | None = None


@runtime_checkable
class AuditSink(Protocol):
    """Where operator surfaces write their entries."""

    async def record(self, entry: AuditEntry) -> None:
        """Store ``entry`` (joining the ambient unit of work where the sink can)."""
        ...


class AuditUnavailableError(RefusedError, RuntimeError):
    """An operator action was refused before it changed anything: its configured audit log
    cannot be written (its table is missing); S1."""

    code = "SHIP_SQLA_AUDIT_UNAVAILABLE"


@runtime_checkable
class CheckedAuditSink(AuditSink, Protocol):
    """An :class:`AuditSink` that can tell, before an operator action changes anything, whether
    its entries can be written (the PostgreSQL log: its table exists)."""

    async def require_writable(self) -> None:
        """Raise :class:`AuditUnavailableError` (naming what is missing and how to create it)
        when an entry could not be written."""
        ...


async def require_audit_writable(sink: AuditSink | None) -> None:
    """The one audit rule (S1): before an operator action's first change, a configured sink
    that can tell (:class:`CheckedAuditSink`) must be writable, else the action raises
    :class:`AuditUnavailableError` and changes nothing. No sink: nothing to check (the
    documented opt-out)."""
    if isinstance(sink, CheckedAuditSink):
        await sink.require_writable()


@runtime_checkable
class AuditLog(AuditSink, Protocol):
    """An :class:`AuditSink` that can also be read back, newest first."""

    async def list_entries(self, *, limit: int, before: int | None = None) -> list[AuditEntry]:
        """At most ``limit`` entries, newest first, with ``entry_id`` below ``before``."""
        ...


class InMemoryAuditLog:
    """The reference :class:`AuditLog`: entries in a list, ``at`` from ``clock``."""

    __slots__ = ("_clock", "entries")

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock
        self.entries: list[AuditEntry] = []

    async def record(self, entry: AuditEntry) -> None:
        at = self._clock.now() if self._clock is not None else datetime.now().astimezone()
        self.entries.append(attrs.evolve(entry, at=at, entry_id=len(self.entries) + 1))

    async def list_entries(self, *, limit: int, before: int | None = None) -> list[AuditEntry]:
        older = [e for e in self.entries if before is None or (e.entry_id or 0) < before]
        return list(reversed(older))[:limit]
