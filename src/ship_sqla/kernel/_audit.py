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
    "MAX_AUDIT_PAGE",
    "AuditEntry",
    "AuditLog",
    "AuditSink",
    "AuditUnavailableError",
    "CheckedAuditSink",
    "InMemoryAuditLog",
    "require_audit_writable",
]

MAX_AUDIT_PAGE: Final = 500
"""Entries per :meth:`AuditLog.list_entries` call."""


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
