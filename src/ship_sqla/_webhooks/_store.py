"""The webhook event store (SPEC section 6): record deliveries once, link their outbox intent.

``record`` and ``link`` join the active unit of work (given or ambient), so recording the event,
claiming its idempotency key and enqueueing its outbox intent commit or roll back together.
Events are unique per ``(webhook, event_id)``; a duplicate delivery is reported, not re-recorded,
and waits at most ``lock_timeout`` for a concurrent recorder of the same event.

W1 ``cleanup`` deletes one webhook's events past retention ONLY when their outbox intent is no
   longer pending or claimed, and deletes expired idempotency keys under the webhook's prefix;
   each in one bounded statement.

``tenant`` is None or a real tenant (``""`` and blank are refused, :func:`check_tenant`). A
refused or lost connection raises :class:`~ship_sqla.errors.DatabaseUnavailableError`. Every
statement reaches the database through one :class:`~ship_sqla._scope.StoreConnections`, whose
one entry decides how (the unit of work's connection, else a short transaction of the store's
own, or one autocommitted statement).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ship_sqla._idempotency._lock_wait import (
    LockWaitTimedOutError,
    bounded_lock_wait,
    lock_timeout_setting,
)
from ship_sqla._idempotency._sql import build_statements as build_idempotency_statements
from ship_sqla._idempotency._store import check_cleanup_limit, run_cleanup
from ship_sqla._scope import Database, StoreConnections, check_tenant, tenant_within
from ship_sqla._sql_time import now_bound
from ship_sqla._webhooks._sql import WebhookStatements, build_statements
from ship_sqla._webhooks._types import (
    WebhookCleanupResult,
    WebhookEvent,
    WebhookEventInProgressError,
    WebhookEventNotFoundError,
    WebhookRecordResult,
)
from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json, unstorable_text

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from sqlalchemy import Row, Table

    from ship_sqla._scope import TransactionScope

__all__ = [
    "WebhookEventStore",
    "check_webhook_json",
    "create_webhook_event_store",
    "webhook_idempotency_prefix",
]

DEFAULT_LOCK_TIMEOUT = timedelta(seconds=1)
MAX_NAME_LENGTH = 100
MAX_EVENT_ID_LENGTH = 256
_RECORD_ROUNDS = 3


def webhook_idempotency_prefix(webhook: str) -> str:
    """The idempotency prefix a webhook's keys are claimed under (``webhook:<name>``)."""
    return f"webhook:{webhook}"


def _check_name(webhook: str) -> None:
    if not webhook or len(webhook) > MAX_NAME_LENGTH or not webhook.isprintable():
        raise ConfigurationError(
            f"webhook name {webhook[:60]!r} must be 1 to {MAX_NAME_LENGTH} printable characters.",
            fix="name each webhook endpoint with a short stable identifier such as 'stripe'.",
        )


def _check_event_id(event_id: str) -> None:
    if not event_id or len(event_id) > MAX_EVENT_ID_LENGTH or unstorable_text(event_id) is not None:
        raise ConfigurationError(
            f"webhook event id {event_id[:60]!r} must be 1 to {MAX_EVENT_ID_LENGTH} characters"
            " of text PostgreSQL can store (no NUL character, no surrogate code point).",
            fix="record the delivery's webhook-id header as the event id.",
        )


def check_webhook_json(value: object, what: str) -> None:
    """Refuse a webhook event's ``payload`` or ``headers`` that ``jsonb`` cannot store, before
    any SQL runs: not JSON (an object, NaN: what Python's json reads from ``NaN`` in a body),
    or holding a NUL character or a surrogate code point in any string (the kernel's one rule,
    :func:`~ship_sqla.kernel._json_text.unstorable_json`; issue 25 D6). A
    :class:`~ship_sqla.errors.ConfigurationError` naming the path, as for the event's other
    fields, never the driver's error."""
    try:
        encoded = encode_compact_json(value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"the webhook event {what} is not JSON: {exc}.",
            fix="record the delivery's parsed JSON body (dicts, lists, str, finite numbers,"
            " bool, None).",
        ) from exc
    unstorable = unstorable_json(value, encoded, root=what)
    if unstorable is not None:
        raise ConfigurationError(
            f"the webhook event {what} holds {unstorable}: PostgreSQL's jsonb cannot store it.",
            fix=unstorable.fix,
        )


def _require_columns(table: Table, columns: set[str], factory: str, argument: str) -> None:
    missing = columns - set(table.c.keys())
    if missing:
        raise ConfigurationError(
            f"create_webhook_event_store: {argument} lacks columns {sorted(missing)}.",
            fix=f"pass {argument}={factory}(metadata).",
        )


class WebhookEventStore:
    """Webhook deliveries on PostgreSQL. Build with :func:`create_webhook_event_store`."""

    def __init__(
        self,
        *,
        database: Database,
        table: Table,
        outbox_table: Table,
        idempotency_table: Table,
        clock: Clock | None,
        lock_timeout: timedelta,
    ) -> None:
        _require_columns(
            table,
            {"webhook", "event_id", "outbox_message_id"},
            "ship_webhook_events_table",
            "table",
        )
        _require_columns(outbox_table, {"id", "state"}, "ship_outbox_table", "outbox_table")
        _require_columns(
            idempotency_table,
            {"prefix", "key", "expires_at"},
            "ship_idempotency_table",
            "idempotency_table",
        )
        self._connections = StoreConnections(database, name="webhook")
        self._table = table
        self._clock: Clock = clock or SystemClock()
        self._lock_timeout = lock_timeout_setting(lock_timeout)
        self._sql: WebhookStatements = build_statements(table, outbox_table)
        self._idempotency_sql = build_idempotency_statements(idempotency_table)

    @property
    def database(self) -> Database:
        return self._connections.database

    @property
    def table(self) -> Table:
        return self._table

    def _now(self) -> datetime | None:
        return now_bound(self._clock)

    @staticmethod
    def idempotency_prefix(webhook: str) -> str:
        """The idempotency prefix this webhook's keys live under (cleaned up with its events)."""
        return webhook_idempotency_prefix(webhook)

    async def record(
        self,
        webhook: str,
        event_id: str,
        payload: Any,  # noqa: ANN401 - any JSON value, as the sender sent it
        *,
        headers: Mapping[str, str] | None = None,
        tenant: str | None = None,
        signed_at: datetime | None = None,
        raw_body: bytes | None = None,
        idempotency_key: str | None = None,
        scope: TransactionScope | None = None,
    ) -> WebhookRecordResult:
        """Record one delivery of ``event_id`` to ``webhook``, in the caller's unit of work.

        Answers ``duplicate=True`` (writing nothing) when the event is already recorded. Raises
        :class:`WebhookEventInProgressError` when another transaction is recording the same event
        and does not commit within ``lock_timeout``; only this call's savepoint is rolled back.
        ``tenant`` defaults to the unit of work's tenant. A ``payload`` or ``headers`` that
        ``jsonb`` cannot store is refused before any SQL (:func:`check_webhook_json`).
        """
        _check_name(webhook)
        _check_event_id(event_id)
        check_tenant(tenant, operation="webhook record")
        check_webhook_json(payload, "payload")
        check_webhook_json(dict(headers or {}), "headers")
        async with self._connections.transaction("record", scope=scope) as tx:
            tenant = tenant_within(tx.scope, tenant, operation="webhook record")
            params: dict[str, Any] = {
                "w_id": uuid.uuid4(),
                "w_webhook": webhook,
                "w_event": event_id,
                "w_tenant": tenant,
                "w_signed_at": signed_at,
                "w_payload": payload,
                "w_headers": dict(headers or {}),
                "w_raw_body": raw_body,
                "w_idempotency_key": idempotency_key,
                "now": self._now(),
            }
            connection = tx.connection
            # A conflicting row deleted by cleanup between our INSERT and our read is recorded
            # afresh on the next round; the bound keeps a pathological race from looping.
            for _ in range(_RECORD_ROUNDS):
                try:
                    async with bounded_lock_wait(connection, self._lock_timeout):
                        row = (await connection.execute(self._sql.record, params)).first()
                        duplicate = row is None
                        if row is None:
                            row = (await connection.execute(self._sql.get, params)).first()
                except LockWaitTimedOutError as exc:
                    raise _in_progress(webhook, event_id) from exc
                if row is not None:
                    return WebhookRecordResult(event=_event(row), duplicate=duplicate)
        raise _in_progress(webhook, event_id)

    async def link(
        self,
        webhook: str,
        event_id: str,
        outbox_message_id: uuid.UUID,
        *,
        scope: TransactionScope | None = None,
    ) -> None:
        """Link a recorded event to the outbox message it produced, in the caller's unit of work.

        The link is what makes cleanup keep the event while its intent is pending or claimed.
        """
        params = {"w_webhook": webhook, "w_event": event_id, "w_message": outbox_message_id}
        rows = await self._connections.rows("link", self._sql.link, params, scope=scope)
        if not rows:
            raise WebhookEventNotFoundError(
                f"webhook {webhook!r} event {event_id!r} is not recorded, so it cannot be linked"
                f" to outbox message {outbox_message_id}.",
                fix="record the event first, in the same unit of work as the enqueue and link.",
            )

    async def get(
        self, webhook: str, event_id: str, *, scope: TransactionScope | None = None
    ) -> WebhookEvent | None:
        """The recorded event, or None."""
        params = {"w_webhook": webhook, "w_event": event_id}
        rows = await self._connections.rows("get", self._sql.get, params, scope=scope, by_name=True)
        return _event(rows[0]) if rows else None

    async def cleanup(
        self,
        webhook: str,
        *,
        retention: timedelta,
        limit: int = 1000,
        scope: TransactionScope | None = None,
    ) -> WebhookCleanupResult:
        """W1: delete up to ``limit`` of ``webhook``'s events received more than ``retention``
        ago whose outbox intent is no longer pending or claimed, and up to ``limit`` expired
        idempotency keys under the webhook's prefix.

        Call it until both counts are below ``limit`` to drain a backlog. Keep ``retention``
        longer than the sender's retry horizon (about 3 days for Standard Webhooks senders):
        the event row is what deduplicates a late retry.
        """
        _check_name(webhook)
        check_cleanup_limit(limit)
        seconds = retention.total_seconds()
        if seconds <= 0:
            raise ConfigurationError(
                f"retention must be positive, got {seconds:g} s.",
                fix="keep events longer than the sender retries, e.g. timedelta(days=7).",
            )
        now = self._now()
        connections = self._connections
        async with connections.transaction("cleanup", scope=scope) as tx:
            params = {"w_webhook": webhook, "retention": seconds, "limit": limit, "now": now}
            events = await connections.count("cleanup", self._sql.cleanup, params, scope=tx)
            claims = await run_cleanup(
                connections,
                self._idempotency_sql,
                webhook_idempotency_prefix(webhook),
                limit,
                now,
                scope=tx,
            )
        return WebhookCleanupResult(events_deleted=events, claims_deleted=claims)


def _in_progress(webhook: str, event_id: str) -> WebhookEventInProgressError:
    return WebhookEventInProgressError(
        f"webhook {webhook!r} event {event_id!r} is being recorded (or deleted) by another"
        " transaction that has not committed yet.",
        fix="answer the delivery with 409 so the sender retries; the retry is then acknowledged"
        " as a duplicate (or recorded, if the first one rolled back).",
    )


def _event(row: Row[Any]) -> WebhookEvent:
    return WebhookEvent(
        id=row.id,
        webhook=row.webhook,
        event_id=row.event_id,
        tenant=row.tenant_id,
        received_at=row.received_at,
        signed_at=row.signed_at,
        payload=row.payload,
        headers=row.headers,
        raw_body=row.raw_body,
        outbox_message_id=row.outbox_message_id,
        idempotency_key=row.idempotency_key,
    )


def create_webhook_event_store(
    *,
    database: Database,
    table: Table,
    outbox_table: Table,
    idempotency_table: Table,
    clock: Clock | None = None,
    lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
) -> WebhookEventStore:
    """A webhook event store over ``table`` (from :func:`ship_webhook_events_table`).

    ``outbox_table`` and ``idempotency_table`` are the application's ship tables: cleanup reads
    the outbox's state and removes the webhook's expired idempotency keys (W1).
    ``lock_timeout`` bounds how long ``record`` waits for a concurrent recorder of the same event.
    """
    return WebhookEventStore(
        database=database,
        table=table,
        outbox_table=outbox_table,
        idempotency_table=idempotency_table,
        clock=clock,
        lock_timeout=lock_timeout,
    )
