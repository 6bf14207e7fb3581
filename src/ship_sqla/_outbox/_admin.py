"""Administration of stored outbox messages: the port the operator surface gates.

:class:`OutboxAdmin` reads and changes rows for operators — one message by id, a page of dead
messages, retrying dead ones, purging delivered ones — and checks NO permission itself: the
application reaches it through :func:`~ship_sqla._outbox._operations.create_outbox_operations`
(permission ``ship.outbox:manage``), as the jobs' operator surface gates a backend's ``RunAdmin``.
It takes positions, not cursors: the gate signs and checks cursors.

O4 lives here for operators: dead rows stay until an operator retries them (back to pending
with a fresh attempt budget) — nothing is dropped silently; ``purge_delivered`` deletes only
delivered rows past their retention, never pending, claimed or dead ones.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from ship_sqla._naming import quoted_table
from ship_sqla._outbox._types import OutboxRecord
from ship_sqla._scope import OWN
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel._durations import require_duration
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable, Iterable

    from sqlalchemy import Row, Table

    from ship_sqla._outbox._sql import OutboxStatements
    from ship_sqla._scope import StoreConnections, TransactionScope
    from ship_sqla.kernel._clock import Clock

__all__ = [
    "MAX_RETENTION",
    "OutboxAdmin",
    "check_pages_per_statement",
    "check_retention",
    "record_of",
]

MAX_RETENTION: Final = 100 * 365 * 24 * 3600.0
"""Seconds: the longest ``purge_delivered(older_than=...)`` (a century; beyond it, keep forever by
not purging)."""


def record_of(row: Row[Any]) -> OutboxRecord:
    """A row (every column of the table) as an :class:`OutboxRecord`."""
    m = row._mapping  # noqa: SLF001 - SQLAlchemy's public Row mapping accessor
    return OutboxRecord(
        id=m["id"],
        outbox_id=m["outbox_id"],
        topic=m["topic"],
        payload=m["payload"],
        headers={} if m["headers"] is None else m["headers"],  # the claim's empty-object NULL
        ordering_key=m["ordering_key"],
        tenant=m["tenant_id"],
        state=m["state"],
        attempts=m["attempts"],
        max_attempts=m["max_attempts"],
        available_at=m["available_at"],
        created_at=m["created_at"],
        lease_expires_at=m["lease_expires_at"],
        claimed_by=m["claimed_by"],
        delivered_at=m["delivered_at"],
        last_error=m["last_error"],
    )


class OutboxAdmin:
    """Operator reads and changes of one outbox table (see the module docstring). Reached as
    ``outbox.admin``; inputs are checked by the gate before it calls in."""

    def __init__(
        self,
        *,
        connections: StoreConnections,
        statements: OutboxStatements,
        table: Table,
        clock: Clock,
        wake_all: Callable[[], None],
    ) -> None:
        self._connections = connections
        self._sql = statements
        self._table = table
        self._clock = clock
        self._wake_all = wake_all

    @property
    def table(self) -> Table:
        return self._table

    def _now(self) -> Any:  # noqa: ANN401 - a datetime or None, bound as :now
        return now_bound(self._clock)

    async def get(self, message_id: uuid.UUID) -> OutboxRecord | None:
        """One row, whatever its state; None when no such id."""
        rows = await self._connections.rows(
            "get", self._sql.get, {"message_id": message_id}, scope=OWN, by_name=True
        )
        return record_of(rows[0]) if rows else None

    async def list_dead(
        self,
        outbox_id: str,
        *,
        limit: int,
        after: tuple[Any, uuid.UUID] | None = None,
    ) -> list[OutboxRecord]:
        """At most ``limit`` dead messages of ``outbox_id`` by (created_at, id), strictly after
        ``after`` (the (created_at, id) of the last item of the page before).

        Not index-served (the outbox declares only the claim's indexes): meant for operators.
        """
        params: dict[str, Any] = {"outbox": outbox_id, "limit": limit}
        statement = self._sql.list_dead_first
        if after is not None:
            params["after_created_at"], params["after_id"] = after
            statement = self._sql.list_dead_after
        rows = await self._connections.rows("list_dead", statement, params, scope=OWN, by_name=True)
        return [record_of(row) for row in rows]

    async def retry(
        self, ids: Iterable[uuid.UUID], *, scope: TransactionScope | None = None
    ) -> list[uuid.UUID]:
        """Move dead messages back to pending, due now, with a fresh attempt budget (O4).

        Returns the ids moved, in the order given (duplicates once); ids that are unknown or not
        dead are left alone and absent from the result, so the caller can tell which did not
        move. Joins ``scope`` (or the ambient unit of work); local relays wake after the commit.
        """
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        params = {"ids": wanted, "now": self._now()}
        rows = await self._connections.rows(
            "retry", self._sql.retry, params, scope=scope, by_name=True
        )
        moved = {row.id for row in rows}
        await self._connections.after_commit(scope, self._wake_all)
        return [i for i in wanted if i in moved]

    async def counts(self, outbox_id: str, *, cap: int) -> tuple[int, int]:
        """``outbox_id``'s pending and claimed messages, each counted up to ``cap`` through its
        partial index (the dashboard's outbox page): at most ``2 * cap`` index entries."""
        params = {"outbox": outbox_id, "cap": cap}
        connections = self._connections
        [(pending,)] = await connections.rows(
            "counts", self._sql.count_pending_capped, params, scope=OWN
        )
        [(claimed,)] = await connections.rows(
            "counts", self._sql.count_claimed_capped, params, scope=OWN
        )
        return int(pending or 0), int(claimed or 0)

    async def purge_delivered(
        self, outbox_id: str, *, older_than: float, pages_per_statement: int
    ) -> int:
        """Delete ``outbox_id``'s delivered messages completed at least ``older_than`` seconds
        ago; the number deleted. Pending, claimed and dead messages, and
        other outboxes' rows, are never touched.

        No index serves delivered rows, so it walks the table's heap once, in ranges of
        ``pages_per_statement`` pages (8 kB each), one autocommitted DELETE per range read by a
        TID range scan: each statement's cost is bounded by its range, whatever the table's
        size, and rows completed meanwhile wait for the next purge. Run it from a schedule.
        """
        relation = quoted_table(self._table)
        [(pages,)] = await self._connections.rows(
            "purge_delivered", self._sql.heap_pages, {"relation": relation}, scope=OWN
        )
        deleted = 0
        for first_page in range(0, int(pages), pages_per_statement):
            params = {
                "first_page": first_page,
                "end_page": first_page + pages_per_statement,
                "outbox": outbox_id,
                "age": older_than,
                "now": self._now(),
            }
            deleted += await self._connections.count(
                "purge_delivered", self._sql.purge_delivered_in_pages, params, scope=OWN
            )
        return deleted


def check_retention(older_than: object) -> float:
    """``older_than`` (seconds or a timedelta) as float seconds, within :data:`MAX_RETENTION`."""
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    return require_duration(seconds, "older_than", maximum=MAX_RETENTION, allow_zero=True)


def check_pages_per_statement(value: object) -> int:
    """``pages_per_statement`` when it is an int of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"pages_per_statement must be an int of at least 1, got {value!r}.",
            fix="pass a page count such as 1000 (8 MB of heap per statement).",
        )
    return value
