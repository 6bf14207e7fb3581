"""The outbox's plain records: what a claim hands out, what a row is, how a claimed message
settles (one :class:`OutboxSettlement`, built here and nowhere else), and the two errors a
holder meets (O3, O4).

Like a run's :class:`~ship_sqla.kernel._settlement.Settlement`, a message's settlement is decided
once, in the kernel, by a named constructor: :func:`message_delivered`, :func:`message_failed`
(retry after a backoff, or dead once the attempts are spent: the kernel's one rule,
:func:`~ship_sqla.kernel._plans.retry.attempts_spent`, the rule the runs use) and
:func:`message_released`. A store (:class:`~ship_sqla.kernel._outbox.OutboxStore`) applies a
batch of them in one fenced call and decides nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import attrs

from ship_sqla.kernel._clock import require_aware
from ship_sqla.kernel._durations import MAX_RETRY_DELAY, require_duration
from ship_sqla.kernel._errors import StaleLeaseError
from ship_sqla.kernel._json_text import storable_text
from ship_sqla.kernel._plans.retry import attempts_spent

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping
    from datetime import datetime

    from ship_sqla.kernel._plans.backoff import Backoff

__all__ = [
    "OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT",
    "OutboxDeadLetteredError",
    "OutboxLeaseStaleError",
    "OutboxMessage",
    "OutboxOutcome",
    "OutboxRecord",
    "OutboxSettlement",
    "OutboxState",
    "SettledAs",
    "error_text",
    "message_delivered",
    "message_failed",
    "message_released",
]

OutboxState: TypeAlias = Literal["pending", "claimed", "delivered", "dead"]
"""A message's state (the ``state`` column)."""

OutboxOutcome: TypeAlias = Literal["delivered", "retrying", "dead", "released", "stale"]
"""What a settle did. ``"stale"``: the lease token was no longer current (the lease lapsed and the
row was retaken, or it was already settled); nothing was changed (O3)."""

SettledAs: TypeAlias = Literal["delivered", "retrying", "dead", "released"]
"""What a settlement does when its token is current: its answer then (else ``"stale"``)."""

OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT: Final = "SHIP_SQLA_OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT"
"""The ``last_error`` of a row dead-lettered because its lease lapsed on its final attempt."""


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


@attrs.frozen
class OutboxSettlement:
    """How one claimed message settles; a store applies it while ``token`` is current (O3).

    - ``settled_as``: ``"delivered"`` (state delivered, the token kept so a retried completion
      answers "delivered" again), ``"retrying"`` (pending again ``delay`` seconds after the
      store's now, the attempt spent), ``"dead"`` (O4), ``"released"`` (pending at
      ``release_at``, None: now, the attempt the claim counted given back);
    - ``error``: the row's new ``last_error`` (retrying, dead), else None.

    Build it with :func:`message_delivered`, :func:`message_failed` or
    :func:`message_released`.
    """

    message_id: uuid.UUID
    token: uuid.UUID
    outbox_id: str
    settled_as: SettledAs
    delay: float = 0.0
    release_at: datetime | None = None
    error: str | None = None

    @property
    def wakes(self) -> bool:
        """True when the message is due again at once: the store wakes the outbox's local
        relays after it lands (a release for now, a retry without delay)."""
        if self.settled_as == "released":
            return self.release_at is None
        return self.settled_as == "retrying" and self.delay <= 0


def message_delivered(message: OutboxMessage) -> OutboxSettlement:
    """The message was published: delivered (O3)."""
    return OutboxSettlement(message.id, message.token, message.outbox_id, "delivered")


def message_failed(
    message: OutboxMessage,
    error: str | BaseException,
    backoff: Backoff,
    *,
    retry_in: float | None = None,
    permanent: bool = False,
) -> OutboxSettlement:
    """A failed delivery (O4): dead when ``permanent`` or when this was the last attempt the
    message allows (the kernel's one rule, :func:`attempts_spent`); else pending again after
    ``retry_in`` seconds, by default ``backoff``'s delay for this attempt."""
    delay = require_duration(
        backoff.delay(message.attempt) if retry_in is None else retry_in,
        "retry_in (or the outbox backoff's delay)",
        maximum=MAX_RETRY_DELAY,
        allow_zero=True,
    )
    text = error_text(error)
    if permanent or attempts_spent(message.attempt, message.max_attempts):
        return OutboxSettlement(message.id, message.token, message.outbox_id, "dead", error=text)
    return OutboxSettlement(
        message.id, message.token, message.outbox_id, "retrying", delay=float(delay), error=text
    )


def message_released(
    message: OutboxMessage, available_at: datetime | None = None
) -> OutboxSettlement:
    """Hand the message back unpublished, due at ``available_at`` (None: now); the attempt the
    claim counted is given back (O3)."""
    at = None if available_at is None else require_aware(available_at, "available_at")
    return OutboxSettlement(message.id, message.token, message.outbox_id, "released", release_at=at)


def error_text(error: str | BaseException) -> str:
    """What a failure stores as ``last_error``: the text, or ``Type: message``, always text
    PostgreSQL can store (a NUL or a lone surrogate escaped, as a run's history entry: J23), so
    a sink's odd error never makes its batch's settle unstorable."""
    if isinstance(error, BaseException):
        text = str(error)
        error = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return storable_text(error)


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
