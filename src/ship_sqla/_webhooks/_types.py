"""Values and errors of the webhook event store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._errors import RefusedError, UsageError

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping
    from datetime import datetime

__all__ = [
    "WebhookCleanupResult",
    "WebhookEvent",
    "WebhookEventInProgressError",
    "WebhookEventNotFoundError",
    "WebhookRecordResult",
]


@attrs.frozen
class WebhookEvent:
    """A recorded delivery: what arrived, and the outbox intent it produced (once linked)."""

    id: uuid.UUID
    webhook: str
    event_id: str
    tenant: str | None
    received_at: datetime
    signed_at: datetime | None
    payload: Any
    headers: Mapping[str, str]
    raw_body: bytes | None
    outbox_message_id: uuid.UUID | None
    idempotency_key: str | None


@attrs.frozen
class WebhookRecordResult:
    """What ``record`` did. ``duplicate``: the event was recorded before and nothing was written;
    ``event`` is then the earlier record (acknowledge the delivery, do not enqueue again)."""

    event: WebhookEvent
    duplicate: bool


@attrs.frozen
class WebhookCleanupResult:
    """What one ``cleanup`` call deleted (each count is at most its ``limit``)."""

    events_deleted: int
    claims_deleted: int


class WebhookEventInProgressError(RefusedError, RuntimeError):
    """Another transaction is recording the same event and has not committed within the bound.

    The delivery should be answered with a retryable status (409): the sender retries later and
    then gets a duplicate acknowledgement, or records the event itself if the first one rolled
    back.
    """

    code = "SHIP_SQLA_WEBHOOK_EVENT_IN_PROGRESS"


class WebhookEventNotFoundError(UsageError, LookupError):
    """``link`` named an event that is not recorded (or not visible to this transaction)."""

    code = "SHIP_SQLA_WEBHOOK_EVENT_NOT_FOUND"
