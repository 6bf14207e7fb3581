"""Values and errors of the outbox: what enqueue takes, what claim hands out, what settles say."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import attrs

from ship_sqla.kernel._errors import (
    OutageError,
    RefusedError,
    StaleLeaseError,
    UsageError,
)

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping
    from datetime import datetime

__all__ = [
    "OutboxDeadLetteredError",
    "OutboxIntent",
    "OutboxLeaseStaleError",
    "OutboxMessage",
    "OutboxOutcome",
    "OutboxPayloadError",
    "OutboxPayloadTooLargeError",
    "OutboxPublishError",
    "OutboxRecord",
    "OutboxSinkRejectedError",
    "OutboxState",
]

OutboxState: TypeAlias = Literal["pending", "claimed", "delivered", "dead"]
"""A message's state (the ``state`` column)."""

OutboxOutcome: TypeAlias = Literal["delivered", "retrying", "dead", "released", "stale"]
"""What a settle did. ``"stale"``: the lease token was no longer current (the lease lapsed and the
row was retaken, or it was already settled); nothing was changed (O3)."""


@attrs.frozen
class OutboxIntent:
    """One message for :meth:`Outbox.enqueue_many`."""

    topic: str
    payload: Any
    headers: Mapping[str, Any] | None = None
    ordering_key: str | None = None
    available_at: datetime | None = None


@attrs.frozen
class OutboxMessage:
    """A claimed message. ``token`` (the row's ``lease_token``) fences every settle of this
    claim (O3).

    ``tenant`` is the row's ``tenant_id`` column (Python says ``tenant``, SQL ``tenant_id``).
    ``attempt`` counts this delivery (1 on the first claim); ``lease_expires_at`` is when another
    relay may retake it if it has not been settled.
    """

    id: uuid.UUID
    outbox_id: str
    topic: str
    payload: Any
    headers: Mapping[str, Any]
    ordering_key: str | None
    tenant: str | None
    attempt: int
    max_attempts: int
    token: uuid.UUID
    claimed_by: str
    lease_expires_at: datetime
    available_at: datetime
    created_at: datetime
    last_error: str | None


@attrs.frozen
class OutboxRecord:
    """A row as operators see it (``list_dead``, ``get``), whatever its state."""

    id: uuid.UUID
    outbox_id: str
    topic: str
    payload: Any
    headers: Mapping[str, Any]
    ordering_key: str | None
    tenant: str | None
    state: OutboxState
    attempts: int
    max_attempts: int
    available_at: datetime
    created_at: datetime
    lease_expires_at: datetime | None
    claimed_by: str | None
    delivered_at: datetime | None
    last_error: str | None


class OutboxLeaseStaleError(StaleLeaseError, RuntimeError):
    """A settle carried a lease token that is no longer current: nothing was changed (O3)."""

    code = "SHIP_SQLA_OUTBOX_LEASE_STALE"

    def __init__(self, message_id: uuid.UUID, operation: str) -> None:
        self.message_id = message_id
        self.operation = operation
        super().__init__(
            f"{operation} of outbox message {message_id} was rejected: its lease is no longer"
            " current (the lease lapsed and another relay retook it, or it was already settled);"
            " the row was left unchanged.",
            fix="settle within the lease (or heartbeat it); a retaken message is delivered again by"
            " its new holder, so consumers must tolerate duplicates.",
        )


class OutboxPayloadError(UsageError, TypeError):
    """A payload or headers value could not be encoded as JSON."""

    code = "SHIP_SQLA_OUTBOX_PAYLOAD_NOT_JSON"


class OutboxPayloadTooLargeError(OutboxPayloadError, ValueError):
    """A message's encoded JSON (payload plus headers) exceeds the outbox's ``max_payload_bytes``;
    nothing was written (the check runs before any SQL)."""

    code = "SHIP_SQLA_OUTBOX_PAYLOAD_TOO_LARGE"

    def __init__(self, *, size: int, limit: int, index: int) -> None:
        self.size = size
        self.limit = limit
        self.index = index
        super().__init__(
            f"outbox message {index} of the call encodes to {size} bytes of JSON (payload plus"
            f" headers), over this outbox's max_payload_bytes of {limit}; nothing was enqueued.",
            fix="store large content elsewhere (object storage, a table) and enqueue a reference"
            " to it, or raise create_outbox(max_payload_bytes=...).",
        )


class OutboxPublishError(OutageError, RuntimeError):
    """A relay's sink raised while publishing a message; the original is ``__cause__``."""

    code = "SHIP_SQLA_OUTBOX_PUBLISH_FAILED"

    def __init__(self, message: OutboxMessage, outcome: OutboxOutcome | None, cause: str) -> None:
        self.outbox_message = message
        self.outcome = outcome
        then = {
            "retrying": "it will be retried after a backoff",
            "dead": "it has no attempts left and is now dead (see list_dead / retry)",
            "stale": "its claim had already been retaken, so another relay will deliver it",
            None: "recording the failure failed too; it is retried once its lease lapses",
        }.get(outcome, f"outcome {outcome}")
        super().__init__(
            f"publishing outbox message {message.id} (topic {message.topic!r}, attempt"
            f" {message.attempt}/{message.max_attempts}) failed: {cause}; {then}.",
            fix="fix the sink or what it publishes to; dead messages can be retried"
            " (create_outbox_operations(...).retry).",
        )


class OutboxSinkRejectedError(RefusedError, RuntimeError):
    """A sink's target refused the message (e.g. the job queue is full); it will be retried."""

    code = "SHIP_SQLA_OUTBOX_SINK_REJECTED"


class OutboxDeadLetteredError(StaleLeaseError, RuntimeError):
    """A claim found a lapsed lease on a message's final attempt and dead-lettered it (O4)."""

    code = "SHIP_SQLA_OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT"

    def __init__(self, record: OutboxRecord) -> None:
        self.record = record
        super().__init__(
            f"outbox message {record.id} (outbox {record.outbox_id!r}, topic {record.topic!r})"
            f" was dead-lettered: its lease lapsed on its final attempt"
            f" ({record.attempts}/{record.max_attempts}), so its last holder died or stalled.",
            fix="find why the relay did not settle it within its lease (crash, hung sink, lease"
            " too short); retry it once fixed (create_outbox_operations(...).retry).",
        )
