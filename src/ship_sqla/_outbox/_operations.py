"""The outbox's operator surface: a permission gate over ``outbox.admin``.

``list_dead``, ``get``, ``retry`` (dead messages back to pending) and ``purge_delivered`` each
first ask the application's ``authorizer("ship.outbox:manage", operation)`` through the one gate
of every operator surface (:func:`ship_sqla.kernel._authorize.authorize`); anything but ``True``
raises :class:`~ship_sqla.errors.PermissionDeniedError` before a statement runs, so a refusal
changes nothing. Inputs are checked next, also before any SQL. Pages are the kernel's
:class:`~ship_sqla.kernel._page.Page`, their cursors signed by the kernel's codec
(:mod:`ship_sqla.kernel._cursor`): a cursor altered, forged, or issued for another outbox or
table is refused with :class:`~ship_sqla.errors.InvalidCursorError`.

The shell's ``ship-sqla outbox purge`` goes through this gate too, with an authorizer that
allows everything: the operator at the shell holds the database URL.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from ship_sqla._outbox._admin import check_pages_per_statement, check_retention
from ship_sqla._outbox._store import check_outbox_id
from ship_sqla.kernel._audit import AuditEntry, require_audit_writable
from ship_sqla.kernel._authorize import (
    Authorizer,
    authorize,
    authorize_read,
    check_authorizer,
    granted,
)
from ship_sqla.kernel._cursor import (
    KeysetPosition,
    decode_cursor,
    encode_cursor,
    query_fingerprint,
    resolve_secret,
)
from ship_sqla.kernel._errors import BoundExceededError, ConfigurationError, InvalidCursorError
from ship_sqla.kernel._page import Page
from ship_sqla.kernel._tenancy import check_tenant

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import timedelta

    from sqlalchemy import Table

    from ship_sqla._outbox._store import Outbox
    from ship_sqla._outbox._types import OutboxRecord
    from ship_sqla._scope import TransactionScope
    from ship_sqla.kernel._audit import AuditSink

__all__ = [
    "MANAGE_PERMISSION",
    "MAX_COUNT_CAP",
    "MAX_DEAD_PAGE",
    "MAX_REDRIVE_BATCHES",
    "READ_PERMISSION",
    "OutboxOperations",
    "RedriveResult",
    "allow_every_operation",
    "create_outbox_operations",
    "dead_page_cursor",
    "dead_page_position",
]

MANAGE_PERMISSION: Final = "ship.outbox:manage"
"""The permission every outbox operator operation asks the authorizer for."""

READ_PERMISSION: Final = "ship.outbox:read"
"""What a read asks for when ``ship.outbox:manage`` (which implies it) is refused."""

MAX_COUNT_CAP: Final = 1_000_000
"""The most pending (or claimed) messages ``counts`` counts: its cost."""

MAX_DEAD_PAGE: Final = 1000
"""The largest ``list_dead`` page; a larger ``limit`` is refused, never silently cut."""

MAX_REDRIVE_BATCHES: Final = 1000
"""Pages per :meth:`OutboxOperations.retry_dead_matching` call."""

MAX_AUDIT_IDS: Final = 100
"""Message ids an audit entry lists (its count is always exact)."""


@attrs.frozen
class RedriveResult:
    """What :meth:`OutboxOperations.retry_dead_matching` did: the messages it ``moved`` back to
    pending, in the order read; ``complete`` is False when it stopped at ``max_batches`` with
    dead messages left to read (call again)."""

    moved: tuple[uuid.UUID, ...]
    complete: bool = True


def allow_every_operation(permission: str, operation: str) -> bool:  # noqa: ARG001 - all allowed
    """An authorizer that grants ``ship.outbox:manage``: for the shell, whose operator already
    holds the database URL (and so every row), never for a request from a user."""
    return permission == MANAGE_PERMISSION


def _dead_page_query(table: Table, outbox_id: str) -> str:
    return query_fingerprint(("ship_sqla.outbox.list_dead", table.fullname, outbox_id))


def dead_page_cursor(table: Table, outbox_id: str, last: OutboxRecord, secret: bytes) -> str:
    """The signed cursor of the ``list_dead`` page that follows ``last``."""
    position = KeysetPosition(_dead_page_query(table, outbox_id), (last.created_at, last.id))
    return encode_cursor(position, secret)


def dead_page_position(
    table: Table, outbox_id: str, cursor: str, secret: bytes
) -> tuple[datetime, uuid.UUID]:
    """The (created_at, id) after which the page of ``cursor`` starts; refuses a cursor that was
    altered, signed with another secret, or issued for another outbox or table."""
    values = decode_cursor(cursor, secret=secret, query=_dead_page_query(table, outbox_id))
    match values:
        case (datetime() as created_at, uuid.UUID() as message_id) if created_at.tzinfo:
            return created_at, message_id
    raise InvalidCursorError(  # signed by us: only a format change gets here
        "the dead-letter cursor is signed but does not hold a (created_at, id) position.",
        fix="restart paging from the first page (cursor=None).",
    )


class OutboxOperations:
    """Operator operations on one outbox, each gated by ``ship.outbox:manage``. Build with
    :func:`create_outbox_operations`."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        authorizer: Authorizer,
        cursor_secret: bytes | str | None = None,
        audit: AuditSink | None = None,
        actor: str = "unnamed",
    ) -> None:
        self._outbox = outbox
        self._admin = outbox.admin
        self._authorizer = check_authorizer(authorizer)
        self._secret = resolve_secret(cursor_secret)
        self._audit = audit
        self._actor = actor

    def acting_as(self, actor: str, *, authorizer: Authorizer | None = None) -> OutboxOperations:
        """The same operations for another caller (who the audit log names, what it may do)."""
        return OutboxOperations(
            self._outbox,
            authorizer=self._authorizer if authorizer is None else authorizer,
            cursor_secret=self._secret,
            audit=self._audit,
            actor=actor,
        )

    @property
    def audited(self) -> bool:
        """Whether state-changing operations are written to an audit sink (S1)."""
        return self._audit is not None

    async def _authorize(self, operation: str) -> None:
        await authorize(self._authorizer, MANAGE_PERMISSION, operation)

    async def _authorize_read(self, operation: str) -> None:
        """``ship.outbox:manage`` (which implies read), else ``ship.outbox:read``."""
        await authorize_read(self._authorizer, MANAGE_PERMISSION, READ_PERMISSION, operation)

    async def _audit_ready(self) -> None:
        """S1's one audit rule (:func:`~ship_sqla.kernel._audit.require_audit_writable`): a
        configured audit that cannot be written refuses the operation before its first change."""
        await require_audit_writable(self._audit)

    async def _record(
        self, operation: str, target: str, count: int, details: dict[str, object]
    ) -> None:
        if self._audit is not None:
            entry = AuditEntry(self._actor, f"outbox.{operation}", target, count, details)
            await self._audit.record(entry)

    async def can_manage(self) -> bool:
        """Whether this caller may change messages (``ship.outbox:manage`` for operation
        ``"dashboard"``): the dashboard shows its re-drive forms only then."""
        return await granted(self._authorizer, MANAGE_PERMISSION, "dashboard")

    async def counts(self, outbox_id: str, *, cap: int = 10_000) -> tuple[int, int]:
        """``outbox_id``'s pending and claimed messages, each counted up to ``cap``
        (1..1,000,000; a count equal to ``cap`` means at least that many), index-served."""
        await self._authorize_read("counts")
        check_outbox_id(outbox_id)
        if not 1 <= cap <= MAX_COUNT_CAP:
            raise BoundExceededError(
                f"counts cap must be between 1 and {MAX_COUNT_CAP}, got {cap!r}.",
                fix="count fewer; a capped count says 'at least'.",
            )
        return await self._admin.counts(outbox_id, cap=cap)

    async def list_dead(
        self, outbox_id: str, limit: int = 100, cursor: str | None = None
    ) -> Page[OutboxRecord]:
        """Dead messages of ``outbox_id`` by (created_at, id), keyset-paged (O4): at most
        ``limit`` (1..1000) per page; pass ``next_cursor`` back for the next (None: no more).

        Not index-served (the outbox declares only the claim's indexes): meant for operators.
        """
        await self._authorize_read("list_dead")
        check_outbox_id(outbox_id)
        if not 1 <= limit <= MAX_DEAD_PAGE:
            raise BoundExceededError(
                f"list_dead limit must be between 1 and {MAX_DEAD_PAGE}, got {limit!r}.",
                fix="page with next_cursor instead of asking for everything at once.",
            )
        table = self._admin.table
        after = None
        if cursor is not None:
            after = dead_page_position(table, outbox_id, cursor, self._secret)
        rows = await self._admin.list_dead(outbox_id, limit=limit + 1, after=after)
        items = tuple(rows[:limit])
        more = len(rows) > limit
        next_cursor = dead_page_cursor(table, outbox_id, items[-1], self._secret) if more else None
        return Page(items, next_cursor)

    async def get(self, message_id: uuid.UUID) -> OutboxRecord | None:
        """One message, whatever its state; None when no such id."""
        await self._authorize_read("get")
        return await self._admin.get(message_id)

    async def retry(
        self, ids: Iterable[uuid.UUID], *, scope: TransactionScope | None = None
    ) -> list[uuid.UUID]:
        """Move dead messages back to pending with a fresh attempt budget (O4).

        Returns the ids moved; ids that are unknown or not dead are left alone and absent from
        the result, so the caller can tell which ones did not move. Joins ``scope`` (or the
        ambient unit of work), e.g. to write an audit row in the same transaction.
        """
        await self._authorize("retry")
        wanted = list(ids)
        await self._audit_ready()
        moved = await self._admin.retry(wanted, scope=scope)
        await self._record(
            "retry", "dead messages", len(moved), {"ids": [str(i) for i in moved[:100]]}
        )
        return moved

    async def retry_dead_matching(
        self,
        outbox_id: str,
        *,
        tenant: str | None = None,
        created_before: datetime | None = None,
        batch_size: int = 1000,
        max_batches: int = 10,
    ) -> RedriveResult:
        """Re-drive (see :meth:`retry`) every dead message of ``outbox_id`` of ``tenant`` (None:
        any) created before ``created_before`` (an aware datetime; None: any), oldest first:
        pages of ``batch_size`` (1..1000) dead messages, one ``list_dead`` read and at most one
        retry statement each, at most ``max_batches`` (1..1000) pages; ``complete`` is False
        when dead messages may remain (call again). One audit entry (S1)."""
        await self._authorize("retry_dead_matching")
        check_outbox_id(outbox_id)
        _check_redrive(batch_size, max_batches, created_before)
        check_tenant(tenant, operation="retry_dead_matching")
        await self._audit_ready()
        moved: list[uuid.UUID] = []
        complete = False
        after: tuple[Any, uuid.UUID] | None = None
        try:
            for _ in range(max_batches):
                rows = await self._admin.list_dead(outbox_id, limit=batch_size, after=after)
                wanted = [
                    m.id
                    for m in rows
                    if (tenant is None or m.tenant == tenant)
                    and (created_before is None or m.created_at < created_before)
                ]
                if wanted:
                    moved += await self._admin.retry(wanted)
                if len(rows) < batch_size:
                    complete = True
                    break
                after = (rows[-1].created_at, rows[-1].id)
        finally:
            await self._record(
                "retry_dead_matching",
                _redrive_target(outbox_id, tenant, created_before),
                len(moved),
                {"ids": [str(i) for i in moved[:MAX_AUDIT_IDS]], "complete": complete},
            )
        return RedriveResult(tuple(moved), complete)

    async def purge_delivered(
        self,
        outbox_id: str,
        *,
        older_than: float | timedelta,
        pages_per_statement: int = 1000,
    ) -> int:
        """Delete ``outbox_id``'s delivered messages completed at least ``older_than`` ago
        (seconds or a timedelta); the number deleted. Pending, claimed and dead messages, and
        other outboxes' rows, are never touched. Bounded statements: see
        :meth:`~ship_sqla._outbox._admin.OutboxAdmin.purge_delivered`."""
        await self._authorize("purge_delivered")
        check_outbox_id(outbox_id)
        age = check_retention(older_than)
        pages = check_pages_per_statement(pages_per_statement)
        await self._audit_ready()
        deleted = await self._admin.purge_delivered(
            outbox_id, older_than=age, pages_per_statement=pages
        )
        await self._record("purge_delivered", outbox_id, deleted, {"older_than": age})
        return deleted


def _check_redrive(batch_size: int, max_batches: int, created_before: datetime | None) -> None:
    """:meth:`OutboxOperations.retry_dead_matching`'s bounds, checked before any statement."""
    if not 1 <= batch_size <= MAX_DEAD_PAGE:
        raise BoundExceededError(
            f"retry_dead_matching batch_size must be 1..{MAX_DEAD_PAGE}, got {batch_size!r}.",
            fix="use at most 1000 and more batches.",
        )
    if not 1 <= max_batches <= MAX_REDRIVE_BATCHES:
        raise BoundExceededError(
            f"retry_dead_matching max_batches must be 1..{MAX_REDRIVE_BATCHES}, got"
            f" {max_batches!r}.",
            fix="call again while the result is not complete.",
        )
    if created_before is not None and not _aware(created_before):
        raise ConfigurationError(
            f"retry_dead_matching created_before must be an aware datetime, got"
            f" {created_before!r}.",
            fix="pass datetime(..., tzinfo=UTC).",
        )


def _redrive_target(outbox_id: str, tenant: str | None, created_before: datetime | None) -> str:
    parts = [f"dead messages of {outbox_id}"]
    if tenant is not None:
        parts.append(f"tenant={tenant}")
    if created_before is not None:
        parts.append(f"created before {created_before.isoformat()}")
    return ", ".join(parts)


def create_outbox_operations(
    outbox: Outbox,
    *,
    authorizer: Authorizer,
    cursor_secret: bytes | str | None = None,
    audit: AuditSink | None = None,
    actor: str = "unnamed",
) -> OutboxOperations:
    """Operator operations on ``outbox``: ``list_dead``, ``get``, ``retry``,
    ``retry_dead_matching``, ``purge_delivered``.

    ``authorizer(permission, operation)`` (sync or async) is asked for ``"ship.outbox:manage"``
    before every operation (a read: then ``"ship.outbox:read"`` if refused) and must return
    ``True``; anything else raises :class:`~ship_sqla.errors.PermissionDeniedError` and changes
    nothing. ``audit`` receives one entry per retry, re-drive and purge, naming ``actor`` (S1);
    a configured audit that cannot be written (its table is missing) refuses every operation
    that would change a message before it changes one (:class:`~ship_sqla.errors.
    AuditUnavailableError`); ``audit=None`` writes no entry at all.
    ``cursor_secret`` signs ``list_dead`` cursors (default: random per process, so cursors die
    with it; pass the same secret to every process that serves the same pages).
    """
    return OutboxOperations(
        outbox, authorizer=authorizer, cursor_secret=cursor_secret, audit=audit, actor=actor
    )


def _aware(value: object) -> bool:
    """Whether ``value`` is an aware datetime (typed one, but a caller may pass anything)."""
    return isinstance(value, datetime) and value.tzinfo is not None
