"""The in-memory reference outbox: the :class:`~ship_sqla.kernel._outbox.OutboxStore` port over
a dict, the executable statement of what the PostgreSQL outbox's statements do.

The outbox conformance suite (``tests/conformance/test_outbox_store_conformance.py``) runs it
and the PostgreSQL :class:`~ship_sqla._outbox._store.Outbox` through the same tests. Time comes
only from the injected clock.

- O2 ``claim`` retakes lapsed leases (claimed, ``lease_expires_at <= now``, earliest lease
  first) before due pending rows (``available_at <= now``, by ``available_at`` then
  ``created_at``), at most ``batch_size`` in all; each gets a new token, one more attempt and
  the lease; the batch is handed out by ``(created_at, id)``. A lapsed row on its final
  attempt is dead instead (``last_error`` :data:`OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT`), takes
  its place in the batch and is reported to ``on_error``. ``ordered`` skips a row whose
  ordering key has an earlier pending or claimed row.
- O3 ``heartbeat`` and ``settle`` act only on a row claimed under the given token; anything else
  is answered False / ``"stale"`` and changes nothing. A delivered row keeps its token, so a
  delivered settlement repeated answers ``"delivered"`` again.
- O4 a settlement is applied as built: retry or dead was decided by the kernel's constructor.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._clock import SystemClock, require_aware
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._ids import new_uuids
from ship_sqla.kernel._memory.transactions import active_transaction
from ship_sqla.kernel._on_error import deliver_error
from ship_sqla.kernel._outbox_records import (
    OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT,
    OutboxDeadLetteredError,
    OutboxMessage,
    OutboxRecord,
)
from ship_sqla.kernel._plans.backoff import Backoff

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._on_error import ErrorHandler
    from ship_sqla.kernel._outbox_records import OutboxOutcome, OutboxSettlement

__all__ = ["InMemoryOutbox"]


class InMemoryOutbox:
    """An outbox in a dict. ``enqueue`` commits at once (there is no unit of work here)."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        max_attempts: int = 10,
        backoff: Backoff | None = None,
        on_error: ErrorHandler | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError(
                f"max_attempts must be at least 1, got {max_attempts}.",
                fix="pass max_attempts >= 1 (1 means no retry).",
            )
        self._clock: Clock = clock or SystemClock()
        self._max_attempts = max_attempts
        self._backoff = backoff or Backoff()
        self._on_error = on_error
        self._rows: dict[uuid.UUID, OutboxRecord] = {}
        self._tokens: dict[uuid.UUID, uuid.UUID] = {}

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def backoff(self) -> Backoff:
        return self._backoff

    @property
    def max_attempts(self) -> int:
        return self._max_attempts

    def report_error(self, error: BaseException) -> None:
        deliver_error(self._on_error, error, source="ship_sqla in-memory outbox")

    # -- producing -----------------------------------------------------------------------------

    async def enqueue(
        self,
        outbox_id: str,
        topic: str,
        payload: Any,  # noqa: ANN401 - any JSON value
        *,
        headers: Mapping[str, Any] | None = None,
        ordering_key: str | None = None,
        available_at: datetime | None = None,
        tenant: str | None = None,
        max_attempts: int | None = None,
    ) -> uuid.UUID:
        """Record one pending message now; returns its id (ids increase in enqueue order). Inside
        an :class:`~ship_sqla.kernel.InMemoryUnitOfWork` run it is removed again if the run rolls
        back (O1)."""
        (message_id,) = new_uuids(1)
        now = self._clock.now()
        at = now if available_at is None else require_aware(available_at, "available_at")
        self._rows[message_id] = OutboxRecord(
            id=message_id,
            outbox_id=outbox_id,
            topic=topic,
            payload=payload,
            headers=dict(headers or {}),
            ordering_key=ordering_key,
            tenant=tenant,
            state="pending",
            attempts=0,
            max_attempts=self._max_attempts if max_attempts is None else max_attempts,
            available_at=at,
            created_at=now,
            lease_expires_at=None,
            claimed_by=None,
            delivered_at=None,
            last_error=None,
        )
        tx = active_transaction()
        if tx is not None:
            # O1: a message enqueued in a unit of work rolls back with it.
            def undo() -> None:
                self._rows.pop(message_id, None)

            tx.on_rollback(undo)
        return message_id

    async def get(self, message_id: uuid.UUID) -> OutboxRecord | None:
        return self._rows.get(message_id)

    # -- the port ------------------------------------------------------------------------------

    async def claim(
        self,
        outbox_id: str,
        batch_size: int,
        lease: float,
        *,
        worker: str | None = None,
        ordered: bool = False,
        on_error: ErrorHandler | None = None,
    ) -> list[OutboxMessage]:
        if batch_size < 1:
            raise ConfigurationError(
                f"batch_size must be at least 1, got {batch_size}.", fix="pass batch_size >= 1."
            )
        now = self._clock.now()
        picked = self._pick(outbox_id, batch_size, now, ordered=ordered)
        messages: list[OutboxMessage] = []
        for row in picked:
            if row.state == "claimed" and row.attempts >= row.max_attempts:
                dead = attrs.evolve(
                    row,
                    state="dead",
                    lease_expires_at=None,
                    last_error=OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT,
                )
                self._rows[row.id] = dead
                self._tokens.pop(row.id, None)
                (on_error or self.report_error)(OutboxDeadLetteredError(dead))
                continue
            messages.append(self._take(row, now, lease, worker or "in-memory"))
        messages.sort(key=lambda m: (m.created_at, m.id))
        return messages

    def _pick(
        self, outbox_id: str, batch_size: int, now: datetime, *, ordered: bool
    ) -> list[OutboxRecord]:
        """The claim's two ordered scans, as the statement's snapshot sees the rows."""
        rows = [row for row in self._rows.values() if row.outbox_id == outbox_id]
        blocked = _blocked(rows) if ordered else set()
        lapsed = sorted(
            (
                row
                for row in rows
                if row.state == "claimed"
                and row.lease_expires_at is not None
                and row.lease_expires_at <= now
                and row.id not in blocked
            ),
            key=lambda row: (row.lease_expires_at, row.id),
        )[:batch_size]
        due = sorted(
            (
                row
                for row in rows
                if row.state == "pending" and row.available_at <= now and row.id not in blocked
            ),
            key=lambda row: (row.available_at, row.created_at, row.id),
        )[: batch_size - len(lapsed)]
        return lapsed + due

    def _take(self, row: OutboxRecord, now: datetime, lease: float, worker: str) -> OutboxMessage:
        token = uuid.uuid4()
        expires = now + timedelta(seconds=lease)
        taken = attrs.evolve(
            row,
            state="claimed",
            attempts=row.attempts + 1,
            claimed_by=worker,
            lease_expires_at=expires,
        )
        self._rows[row.id] = taken
        self._tokens[row.id] = token
        return OutboxMessage(
            id=row.id,
            outbox_id=row.outbox_id,
            topic=row.topic,
            payload=row.payload,
            headers=row.headers,
            ordering_key=row.ordering_key,
            tenant=row.tenant,
            attempt=taken.attempts,
            max_attempts=row.max_attempts,
            token=token,
            claimed_by=worker,
            lease_expires_at=expires,
            available_at=row.available_at,
            created_at=row.created_at,
            last_error=row.last_error,
        )

    def _held(self, message_id: uuid.UUID, token: uuid.UUID) -> OutboxRecord | None:
        row = self._rows.get(message_id)
        if row is None or row.state != "claimed" or self._tokens.get(message_id) != token:
            return None
        return row

    async def heartbeat(self, messages: Sequence[OutboxMessage], lease: float) -> list[bool]:
        expires = self._clock.now() + timedelta(seconds=lease)
        held: list[bool] = []
        for message in messages:
            row = self._held(message.id, message.token)
            if row is not None:
                self._rows[row.id] = attrs.evolve(row, lease_expires_at=expires)
            held.append(row is not None)
        return held

    async def settle(self, settlements: Sequence[OutboxSettlement]) -> list[OutboxOutcome]:
        now = self._clock.now()
        outcomes: list[OutboxOutcome] = []
        for settlement in settlements:
            row = self._held(settlement.message_id, settlement.token)
            if row is None:
                outcomes.append(self._unheld(settlement))
                continue
            self._rows[row.id] = _applied(row, settlement, now)
            if settlement.settled_as != "delivered":
                self._tokens.pop(row.id, None)
            outcomes.append(settlement.settled_as)
        return outcomes

    def _unheld(self, settlement: OutboxSettlement) -> OutboxOutcome:
        """A completion that already landed under this token answers "delivered" again."""
        row = self._rows.get(settlement.message_id)
        if (
            settlement.settled_as == "delivered"
            and row is not None
            and row.state == "delivered"
            and self._tokens.get(row.id) == settlement.token
        ):
            return "delivered"
        return "stale"


def _applied(row: OutboxRecord, settlement: OutboxSettlement, now: datetime) -> OutboxRecord:
    kind = settlement.settled_as
    if kind == "delivered":
        return attrs.evolve(row, state="delivered", delivered_at=now, lease_expires_at=None)
    if kind == "released":
        return attrs.evolve(
            row,
            state="pending",
            attempts=max(row.attempts - 1, 0),
            available_at=now if settlement.release_at is None else settlement.release_at,
            lease_expires_at=None,
        )
    if kind == "retrying":
        return attrs.evolve(
            row,
            state="pending",
            available_at=now + timedelta(seconds=settlement.delay),
            last_error=settlement.error,
            lease_expires_at=None,
        )
    return attrs.evolve(row, state="dead", last_error=settlement.error, lease_expires_at=None)


def _blocked(rows: list[OutboxRecord]) -> set[uuid.UUID]:
    """Ordered claims: the rows whose ordering key has an earlier pending or claimed row."""
    first: dict[str, tuple[datetime, uuid.UUID]] = {}
    for row in rows:
        if row.ordering_key is None or row.state not in {"pending", "claimed"}:
            continue
        position = (row.created_at, row.id)
        if row.ordering_key not in first or position < first[row.ordering_key]:
            first[row.ordering_key] = position
    return {
        row.id
        for row in rows
        if row.ordering_key is not None
        and row.ordering_key in first
        and (row.created_at, row.id) > first[row.ordering_key]
    }
