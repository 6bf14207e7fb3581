"""Values and errors of the outbox: what enqueue takes, what claim hands out, what settles say."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._errors import DatabaseTimeoutError, OutageError, RefusedError, UsageError

# The claim's and the settles' records live in the kernel, beside the outbox store port
# (kernel/_outbox.py) that the in-memory outbox implements too; re-exported here.
from ship_sqla.kernel._outbox_records import (
    OutboxDeadLetteredError,
    OutboxLeaseStaleError,
    OutboxMessage,
    OutboxOutcome,
    OutboxRecord,
    OutboxState,
)

if TYPE_CHECKING:
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


@attrs.frozen
class OutboxIntent:
    """One message for :meth:`Outbox.enqueue_many`."""

    topic: str
    payload: Any
    headers: Mapping[str, Any] | None = None
    ordering_key: str | None = None
    available_at: datetime | None = None


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


class OutboxTimeoutError(DatabaseTimeoutError):
    """An outbox operation of its own (a relay's claim, settle or heartbeat; an enqueue outside a
    unit of work; an operator verb) did not finish within the outbox's ``operation_timeout``
    (J24): nothing is known about whether it took effect (every settle is fenced, so retrying
    one is safe)."""

    code = "SHIP_SQLA_OUTBOX_TIMEOUT"


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
