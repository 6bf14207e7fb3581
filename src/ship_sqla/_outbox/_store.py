"""The outbox store: enqueue inside the unit of work, claim and settle outside it.

O1 ``enqueue`` joins the active unit of work: its row commits or rolls back with the business
   write, and a committed enqueue wakes this process's relays after the commit.
K1 A committed enqueue of a due message is announced (NOTIFY on :attr:`Outbox.wake_channel`,
   payload the outbox id): in the same statement when the ``Outbox`` has announced nothing for
   one gap, else right after the commit in one notify-only transaction for every outbox id
   committed meanwhile (K8, :mod:`ship_sqla.kernel._plans.announce`); listening relays of any
   process wake after it commits, never after a rollback, and poll.
O2 ``claim`` retakes lapsed leases before due pending rows, with SKIP LOCKED, in its own short
   transaction, reading about ``batch_size`` index entries whatever the backlog.
O3 ``complete`` / ``fail`` / ``release`` / ``heartbeat`` and ``settle`` (the store port's one
   batch settle, :class:`~ship_sqla.kernel._outbox.OutboxStore`; ``fail`` and ``release`` are
   one-settlement settles) are fenced on the lease token: a stale holder changes nothing and
   gets ``"stale"`` (or :class:`OutboxLeaseStaleError`). Completing is idempotent per claim
   (a delivered row keeps its token), so a relay may retry a completion whose reply was lost.
O4 A failure makes the row pending again after a backoff, or dead once ``max_attempts`` are
   spent (decided by the kernel's ``message_failed``, not by SQL); a lease that lapses on the
   final attempt is dead too. Dead rows stay until an operator retries them (``outbox.admin``,
   reached through ``create_outbox_operations``): nothing is dropped silently.

Delivery is at-least-once: a relay that publishes and dies before completing lets its lease
lapse, and the message is published again. Consumers dedupe on the message id.

Every statement reaches the database through one :class:`~ship_sqla._scope.StoreConnections`:
``statement`` for the outbox's own single statements (claim, heartbeat, reads), ``joined`` for
what may join a unit of work (enqueue, settles, retry).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import MetaData, Table

from ship_sqla._naming import quoted_table
from ship_sqla._notify import Announcer, announcement, channel_name, sender_token
from ship_sqla._outbox._admin import OutboxAdmin, record_of
from ship_sqla._outbox._sql import OutboxStatements, build_statements
from ship_sqla._outbox._tables import ship_outbox_table
from ship_sqla._outbox._types import (
    OutboxDeadLetteredError,
    OutboxIntent,
    OutboxLeaseStaleError,
    OutboxMessage,
    OutboxOutcome,
    OutboxPayloadError,
    OutboxPayloadTooLargeError,
    OutboxRecord,
    OutboxTimeoutError,
)
from ship_sqla._scope import OWN, Database, StoreConnections, TransactionScope, tenant_within
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel._clock import Clock, SystemClock, require_aware
from ship_sqla.kernel._durations import MAX_LEASE, MAX_OPERATION_TIMEOUT, require_duration
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._ids import new_uuids
from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json
from ship_sqla.kernel._keys import MAX_KEY_CHARS, InvalidKeyError, require_key, require_text
from ship_sqla.kernel._on_error import ErrorHandler, deliver_error
from ship_sqla.kernel._outbox_records import message_failed, message_released
from ship_sqla.kernel._plans.announce import due_now
from ship_sqla.kernel._plans.backoff import Backoff
from ship_sqla.kernel._tracing import current_trace_context, with_trace_context
from ship_sqla.kernel._waiting import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    from sqlalchemy.sql.expression import Executable

    from ship_sqla.kernel._outbox_records import OutboxSettlement

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_OUTBOX_ID_LENGTH",
    "ErrorHandler",
    "Outbox",
    "Wakeup",
    "check_outbox_id",
    "create_outbox",
    "default_worker",
]

logger = logging.getLogger("ship_sqla")


DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_OPERATION_TIMEOUT = 30.0
"""Seconds one of the outbox's own database calls may take (J24), as the job backend's."""
"""``create_outbox``'s default bound on one message's encoded JSON (payload plus headers): 1 MiB.
Messages are read whole by every claim and held in relays' memory a batch at a time."""

DEFAULT_BACKOFF = Backoff()
"""``create_outbox``'s default message backoff: 1 s, 2 s, 4 s ... capped at an hour, full
jitter (the package's one backoff, :class:`~ship_sqla.kernel._plans.backoff.Backoff`)."""

MAX_OUTBOX_ID_LENGTH = MAX_KEY_CHARS
"""Characters (255, the kernel's bound on keys). ``outbox_id`` leads both claim indexes; a longer
one is refused before any SQL instead of failing in PostgreSQL ("index row requires N bytes")."""

_default_table: Table | None = None


def default_worker() -> str:
    """``host:pid:random``: names the holder in ``claimed_by`` for operators."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _default_outbox_table() -> Table:
    global _default_table  # noqa: PLW0603 - one shared default so repeated create_outbox agree
    if _default_table is None:
        _default_table = ship_outbox_table(MetaData())
    return _default_table


class Wakeup:
    """A level-triggered wake signal for one relay: set by commits, consumed by ``wait``."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, at_most: float, clock: Clock) -> bool:
        """Return True at once if set since the last wait, else when set, or False after
        ``at_most`` seconds on ``clock`` (so a frozen clock's ``advance`` ends the wait).
        """
        woke = await wait_event(self._event, clock, at_most)
        self._event.clear()
        return woke


def check_outbox_id(outbox_id: object) -> str:
    """Refuse an ``outbox_id`` that is not a storable key (the kernel's rule: text, no NUL, 1 to
    255 characters; :class:`InvalidKeyError`) or is blank: an empty or whitespace id would name a
    separate outbox nobody meant (every relay of it a silent no-op)."""
    key = require_key(outbox_id, "outbox_id", max_chars=MAX_OUTBOX_ID_LENGTH)
    if not key.strip():
        raise InvalidKeyError(
            f"outbox_id must not be blank, got {key!r}.",
            fix="name each logical outbox with a short stable identifier such as 'orders'.",
        )
    return key


def _check_intent(intent: OutboxIntent) -> None:
    require_text(intent.topic, "topic", max_chars=None)
    if intent.ordering_key is not None:
        require_key(intent.ordering_key, "ordering_key")


def _check_max_payload_bytes(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"max_payload_bytes must be a positive int or None, got {value!r}.",
            fix=f"pass a byte count such as {DEFAULT_MAX_PAYLOAD_BYTES} (1 MiB), or None for no"
            " bound but PostgreSQL's own.",
        )
    return value


def _check_size(payload: str, headers: str, limit: int | None, index: int) -> None:
    # The kernel's encoder escapes non-ASCII, so the length of the text is its byte count.
    size = len(payload) + len(headers)
    if limit is not None and size > limit:
        raise OutboxPayloadTooLargeError(size=size, limit=limit, index=index)


def _json(value: object, what: str) -> str:
    try:
        encoded = encode_compact_json(value)
    except (TypeError, ValueError) as exc:
        raise OutboxPayloadError(
            f"the outbox message {what} cannot be encoded as JSON: {exc}.",
            fix="pass dicts, lists, str, int, float (finite), bool or None; convert datetimes,"
            " UUIDs, decimals and models to JSON-friendly values first.",
        ) from exc
    unstorable = unstorable_json(value, encoded, root=what)
    if unstorable is not None:
        raise OutboxPayloadError(
            f"the outbox message {what} holds {unstorable}: PostgreSQL's jsonb cannot store it.",
            fix=unstorable.fix,
        )
    return encoded


def _message(row: Sequence[Any]) -> OutboxMessage:
    """Built positionally: the claim returns the message's fields in its field order
    (``CLAIM_RETURNING``; tests/unit/test_outbox_values.py checks the two agree)."""
    headers = row[4]
    return OutboxMessage(
        row[0],
        row[1],
        row[2],
        row[3],
        {} if headers is None else headers,  # the claim returns an empty object as NULL
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        row[14],
    )


class Outbox:
    """The transactional outbox on one table. Safe to share across tasks and relays.

    Build it with :func:`create_outbox`. Producing and consuming are here; the operator verbs
    (list dead, retry, purge delivered) are on :attr:`admin`, reached through the permission
    gate :func:`~ship_sqla._outbox._operations.create_outbox_operations`.
    """

    def __init__(
        self,
        *,
        database: Database,
        table: Table,
        clock: Clock,
        max_attempts: int,
        backoff: Backoff,
        on_error: ErrorHandler | None,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
    ) -> None:
        self._max_payload_bytes = max_payload_bytes
        self._table = table
        self._sql: OutboxStatements = build_statements(table)
        self._clock = clock
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._on_error = on_error
        self._wakeups: dict[str, set[Wakeup]] = {}
        self.wake_channel = channel_name("ship_sqla.outbox", quoted_table(table))
        """The NOTIFY channel of this outbox table (payload: the outbox id), the same in every
        process: enqueues announce on it (K1), listening relays wake on it."""
        self.sender: Final = sender_token()
        """Who this outbox's announcements come from: its own relays ignore them (its local
        commits woke them already)."""
        # The outbox's own statements are single statements: on an engine they run on
        # autocommit connections, one round trip each instead of BEGIN, statement, COMMIT.
        # J24: each call of its own (a relay's claim, settle, heartbeat) is bounded.
        self._connections = StoreConnections(
            database,
            name="outbox",
            operation_timeout=require_duration(
                operation_timeout, "operation_timeout", maximum=MAX_OPERATION_TIMEOUT
            ),
            timeout_error=OutboxTimeoutError,
        )
        self._announcer: Announcer | None = Announcer(
            channel=self.wake_channel,
            sender=self.sender,
            send=self._send_announcement,
            report_error=self.report_error,
            concurrent=self._connections.concurrent,
            pool=self._connections.pool_in_use,
        )
        """K1, K8: announces committed due messages by the kernel's rule (None: never)."""
        self._admin = OutboxAdmin(
            connections=self._connections,
            statements=self._sql,
            table=table,
            clock=clock,
            wake_all=self._wake_every_outbox,
        )

    # -- configuration -------------------------------------------------------------------------

    @property
    def database(self) -> Database:
        return self._connections.database

    @property
    def connections(self) -> StoreConnections:
        """How the outbox reaches the database; ``connections.concurrent`` says whether two of
        its statements may run at once (an engine: yes; one ``AsyncConnection``: no)."""
        return self._connections

    @property
    def admin(self) -> OutboxAdmin:
        """The operator port (list dead, retry, purge delivered). It checks no permission:
        applications reach it through ``create_outbox_operations(outbox, authorizer=...)``."""
        return self._admin

    @property
    def table(self) -> Table:
        return self._table

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def max_attempts(self) -> int:
        return self._max_attempts

    @property
    def backoff(self) -> Backoff:
        """The message backoff: the wait after a failed delivery attempt (O4)."""
        return self._backoff

    @property
    def max_payload_bytes(self) -> int | None:
        """The bound on one message's encoded JSON, payload plus headers (None: unbounded)."""
        return self._max_payload_bytes

    def report_error(self, error: BaseException) -> None:
        """Hand an absorbed error to ``on_error`` (or log it); never raises."""
        deliver_error(self._on_error, error, source="ship_sqla outbox", log=logger)

    def _now(self) -> datetime | None:
        return now_bound(self._clock)

    # -- local wake-ups ------------------------------------------------------------------------

    def subscribe(self, outbox_id: str) -> Wakeup:
        """A wake signal set after every local commit that enqueued into ``outbox_id``."""
        wakeup = Wakeup()
        self._wakeups.setdefault(outbox_id, set()).add(wakeup)
        return wakeup

    def unsubscribe(self, outbox_id: str, wakeup: Wakeup) -> None:
        self._wakeups.get(outbox_id, set()).discard(wakeup)

    def notify(self, outbox_id: str) -> None:
        """Wake this process's relays of ``outbox_id`` now (other processes poll)."""
        self._wake(outbox_id)()

    def _wake(self, outbox_id: str) -> Callable[[], None]:
        def wake() -> None:
            for wakeup in tuple(self._wakeups.get(outbox_id, ())):
                wakeup.set()

        return wake

    def _wake_every_outbox(self) -> None:
        for outbox_id in tuple(self._wakeups):
            self._wake(outbox_id)()

    # -- producing (joins the unit of work) ----------------------------------------------------

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
        scope: TransactionScope | None = None,
    ) -> uuid.UUID:
        """Record a message in the caller's transaction (O1); returns its id.

        Joins ``scope`` or the ambient ``uow.run`` scope, else runs in its own short transaction.
        ``tenant`` defaults to the scope's tenant. Rows of one ``ordering_key`` are delivered in
        enqueue order by an ordered relay (see :func:`start_outbox_relay`).
        """
        intent = OutboxIntent(
            topic=topic,
            payload=payload,
            headers=headers,
            ordering_key=ordering_key,
            available_at=available_at,
        )
        (message_id,) = await self.enqueue_many(
            outbox_id, [intent], tenant=tenant, max_attempts=max_attempts, scope=scope
        )
        return message_id

    async def enqueue_many(
        self,
        outbox_id: str,
        intents: Sequence[OutboxIntent],
        *,
        tenant: str | None = None,
        max_attempts: int | None = None,
        scope: TransactionScope | None = None,
    ) -> list[uuid.UUID]:
        """Record many messages in one statement, in the caller's transaction (O1).

        Ids are returned in ``intents`` order and increase in that order, so one ordering key's
        messages keep the order they are given in.

        When a span is current, each message's headers also carry its W3C trace context
        (``traceparent``, ``tracestate``; K7) unless the intent set ``traceparent`` itself; the
        relay publishes the message under it.

        Every message is checked before any SQL runs: JSON (no NaN; no NUL character or
        surrogate code point in any string, the refusal naming its path), at most
        ``max_payload_bytes`` of encoded payload plus headers (:class:`OutboxPayloadTooLargeError`),
        a topic without NUL and an ordering key that is a storable key (``InvalidKeyError``), as
        is ``outbox_id``; one refused intent refuses the whole call.
        """
        check_outbox_id(outbox_id)
        attempts = self._max_attempts if max_attempts is None else max_attempts
        _check_max_attempts(attempts)
        if not intents:
            return []
        payloads: list[str] = []
        header_docs: list[str] = []
        # K7: the W3C trace context current at the enqueue rides in the headers to the sink.
        carrier = current_trace_context()
        for index, intent in enumerate(intents):
            _check_intent(intent)
            payloads.append(_json(intent.payload, "payload"))
            headers = with_trace_context(intent.headers, carrier)
            header_docs.append(_json(dict(headers or {}), "headers"))
            _check_size(payloads[-1], header_docs[-1], self._max_payload_bytes, index)
        ids = new_uuids(len(intents))
        params = {
            "ids": ids,
            "topics": [i.topic for i in intents],
            "payloads": payloads,
            "header_docs": header_docs,
            "ordering_keys": [i.ordering_key for i in intents],
            "available_ats": [
                None if i.available_at is None else require_aware(i.available_at, "available_at")
                for i in intents
            ],
            "outbox": outbox_id,
            "attempt_limit": attempts,
            "now": self._now(),
        }
        announcer = self._announcer
        due = announcer is not None and due_now(
            (intent.available_at for intent in intents), self._clock.now()
        )
        folded = due and announcer is not None and announcer.fold(outbox_id) is not None
        statement: Executable = self._sql.enqueue
        if folded:
            statement = self._sql.enqueue_announced
            params["channel"] = self.wake_channel
            params["payload"] = announcement(self.sender, outbox_id)
        connections = self._connections
        params["tenant"] = tenant_within(connections.scope_of(scope), tenant, operation="enqueue")
        await connections.execute("enqueue", statement, params, scope=scope)
        wakes = [self._wake(outbox_id)]
        if due and announcer is not None:
            wakes.append(lambda: announcer.committed(outbox_id, folded=folded))
        await connections.after_commit(scope, *wakes)
        return ids

    async def _send_announcement(self, payloads: list[str]) -> None:
        """The announcer's send: ANNOUNCE_AFTER_COMMIT on a connection of the outbox's own."""
        await self._connections.rows(
            "announce",
            self._sql.announce_after_commit,
            {"channel": self.wake_channel, "payloads": payloads},
            scope=OWN,
        )

    # -- consuming (own short transactions) ----------------------------------------------------

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
        """Claim up to ``batch_size`` messages for ``lease`` seconds (O2), in enqueue order.

        Lapsed leases are retaken first, then due pending rows. Each claimed row gets a new lease
        token and one more attempt. A lapsed row already on its final attempt is dead-lettered
        instead, and reported as :class:`OutboxDeadLetteredError` to ``on_error`` (default: the
        outbox's).

        ``ordered``: skip any row whose ordering key has an earlier row (by ``created_at``, id)
        that is pending or claimed; see :func:`start_outbox_relay` for the guarantee.

        Never joins a unit of work: rows a SKIP LOCKED scan locks stay locked until the
        transaction ends, so the claim runs and commits on its own (on an engine, as one
        autocommit statement).
        """
        check_outbox_id(outbox_id)
        if batch_size < 1:
            raise ConfigurationError(
                f"batch_size must be at least 1, got {batch_size}.", fix="pass batch_size >= 1."
            )
        _check_lease(lease)
        statement = self._sql.claim_ordered if ordered else self._sql.claim
        params = {
            "outbox": outbox_id,
            "batch_size": batch_size,
            "lease": float(lease),
            "worker": worker or default_worker(),
            "now": self._now(),
        }
        rows = await self._connections.rows("claim", statement, params, scope=OWN, by_name=True)
        messages: list[OutboxMessage] = []
        for row in rows:
            if row.state == "dead":
                dead = OutboxDeadLetteredError(record_of(row))
                if on_error is None:
                    self.report_error(dead)
                else:
                    on_error(dead)
            else:
                messages.append(_message(row))
        messages.sort(key=lambda m: (m.created_at, m.id))
        return messages

    async def complete(
        self,
        message: OutboxMessage,
        *,
        raise_if_stale: bool = False,
        scope: TransactionScope | None = None,
    ) -> OutboxOutcome:
        """Mark the message delivered while its claim is current (O3): ``"delivered"``/``"stale"``.

        Joins ``scope`` (or the ambient one) when given, so a consumer can settle in the same
        transaction as its own writes.
        """
        (outcome,) = await self.complete_many([message], scope=scope)
        if raise_if_stale and outcome == "stale":
            raise OutboxLeaseStaleError(message.id, "complete")
        return outcome

    async def complete_many(
        self, messages: Sequence[OutboxMessage], *, scope: TransactionScope | None = None
    ) -> list[OutboxOutcome]:
        """Complete many messages in one statement; outcomes in ``messages`` order (O3).

        Joins ``scope`` or the ambient unit of work; otherwise, on an engine, the statement
        commits by itself (autocommit: one round trip).
        """
        delivered = await self._complete_pairs([(m.id, m.token) for m in messages], scope)
        return ["delivered" if ok else "stale" for ok in delivered]

    async def _complete_pairs(
        self, pairs: list[tuple[uuid.UUID, uuid.UUID]], scope: TransactionScope | None
    ) -> list[bool]:
        """COMPLETE over (id, token) pairs: per pair, whether it is delivered under it now."""
        if not pairs:
            return []
        params = {
            "ids": [message_id for message_id, _ in pairs],
            "tokens": [token for _, token in pairs],
            "now": self._now(),
        }
        rows = await self._connections.rows(
            "complete", self._sql.complete, params, scope=scope, by_name=True
        )
        if not rows:  # the statement answers the pairs it did not complete
            return [True] * len(pairs)
        stale = {(row.id, row.token) for row in rows}
        return [pair not in stale for pair in pairs]

    async def fail(
        self,
        message: OutboxMessage,
        error: str | BaseException,
        *,
        retry_in: float | None = None,
        permanent: bool = False,
        raise_if_stale: bool = False,
        scope: TransactionScope | None = None,
    ) -> OutboxOutcome:
        """Record a failed delivery (O3, O4): ``"retrying"``, ``"dead"`` or ``"stale"``.

        Retries after ``retry_in`` seconds, default the outbox's backoff for this attempt; the
        message is dead once its attempts are spent, or at once with ``permanent=True`` (the
        kernel's rule, :func:`~ship_sqla.kernel._outbox_records.message_failed`).
        """
        settlement = message_failed(
            message, error, self._backoff, retry_in=retry_in, permanent=permanent
        )
        (outcome,) = await self.settle([settlement], scope=scope)
        if raise_if_stale and outcome == "stale":
            raise OutboxLeaseStaleError(message.id, "fail")
        return outcome

    async def release(
        self,
        message: OutboxMessage,
        *,
        available_at: datetime | None = None,
        raise_if_stale: bool = False,
        scope: TransactionScope | None = None,
    ) -> OutboxOutcome:
        """Hand a claimed message back unpublished (O3): ``"released"`` or ``"stale"``.

        The attempt the claim counted is given back; the row is due at ``available_at`` (now).
        """
        (outcome,) = await self.settle([message_released(message, available_at)], scope=scope)
        if raise_if_stale and outcome == "stale":
            raise OutboxLeaseStaleError(message.id, "release")
        return outcome

    async def settle(
        self,
        settlements: Sequence[OutboxSettlement],
        *,
        scope: TransactionScope | None = None,
    ) -> list[OutboxOutcome]:
        """Apply a batch of settlements (delivered, retrying, dead, released) in ONE statement,
        each fenced on its token (O3, O4); outcomes in order: its ``settled_as``, or
        ``"stale"``. Build them with the kernel's ``message_delivered``, ``message_failed``,
        ``message_released``.

        Joins ``scope`` or the ambient unit of work; otherwise, on an engine, the statement
        commits by itself. A settlement that makes its message due now wakes this process's
        relays of its outbox after the commit.
        """
        if all(s.settled_as == "delivered" for s in settlements):
            # The usual batch (every message published): the plain completion, two arrays
            # instead of six, about a millisecond less per 100 messages (BENCHMARKS.md).
            delivered = await self._complete_pairs(
                [(s.message_id, s.token) for s in settlements], scope
            )
            return ["delivered" if ok else "stale" for ok in delivered]
        params = {
            "ids": [s.message_id for s in settlements],
            "tokens": [s.token for s in settlements],
            "settled_as": [s.settled_as for s in settlements],
            "delays": [s.delay for s in settlements],
            "release_ats": [s.release_at for s in settlements],
            "errors": [s.error for s in settlements],
            "now": self._now(),
        }
        connections = self._connections
        rows = await connections.rows("settle", self._sql.settle, params, scope=scope, by_name=True)
        stale = {(row.id, row.token, row.settled_as) for row in rows}
        landed = [(s.message_id, s.token, s.settled_as) not in stale for s in settlements]
        woken = {s.outbox_id for s, ok in zip(settlements, landed, strict=True) if ok and s.wakes}
        await connections.after_commit(scope, *(self._wake(outbox_id) for outbox_id in woken))
        return [s.settled_as if ok else "stale" for s, ok in zip(settlements, landed, strict=True)]

    async def heartbeat(self, messages: Sequence[OutboxMessage], lease: float) -> list[bool]:
        """Push each lease to now + ``lease`` seconds while its claim is current (O3).

        Returns, per message, whether it is still held; False means another relay may have it.
        """
        _check_lease(lease)
        if not messages:
            return []
        params = {
            "ids": [m.id for m in messages],
            "tokens": [m.token for m in messages],
            "lease": float(lease),
            "now": self._now(),
        }
        rows = await self._connections.rows(
            "heartbeat", self._sql.heartbeat, params, scope=OWN, by_name=True
        )
        held = {(row.id, row.token) for row in rows}
        return [(m.id, m.token) in held for m in messages]

    async def get(self, message_id: uuid.UUID) -> OutboxRecord | None:
        """One row, whatever its state; None when no such id (a read, no permission needed)."""
        return await self._admin.get(message_id)


def _check_lease(lease: float) -> float:
    return require_duration(lease, "lease", maximum=MAX_LEASE)


def _check_max_attempts(value: int) -> None:
    if value < 1:
        raise ConfigurationError(
            f"max_attempts must be at least 1, got {value}.",
            fix="pass max_attempts >= 1 (1 means no retry).",
        )


def create_outbox(
    *,
    database: Database,
    table: Table | None = None,
    clock: Clock | None = None,
    max_attempts: int = 10,
    backoff: Backoff = DEFAULT_BACKOFF,
    on_error: ErrorHandler | None = None,
    max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
    operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
) -> Outbox:
    """The transactional outbox on ``table`` (default ``ship_outbox_table`` named ship_outbox).

    - ``database``: an ``AsyncEngine``, or an ``AsyncConnection`` in a transaction (tests).
    - ``clock``: time source; a frozen clock is passed to SQL as ``:now`` (default system).
    - ``max_attempts``: deliveries before a message is dead (per message overridable).
    - ``backoff``: the wait after failed delivery attempt n, a
      :class:`~ship_sqla.kernel._plans.backoff.Backoff` (default exponential 1 s .. 1 h, full
      jitter), the same value a job's ``RetryPolicy`` is made of.
    - ``on_error``: receives errors the outbox and its relays absorb (dead-lettering by lease
      lapse, publish failures, poll failures); default logs them on the ``ship_sqla`` logger.
    - ``max_payload_bytes``: the largest message enqueue accepts, counted as the bytes of its
      encoded JSON, payload plus headers (default 1 MiB; None: only PostgreSQL's own bound).
      A larger one raises :class:`OutboxPayloadTooLargeError` before any SQL runs.
    - ``operation_timeout`` (J24): seconds any one of the outbox's own database calls (a
      relay's claim, settle or heartbeat; an enqueue outside a unit of work; an operator verb)
      may take before :class:`OutboxTimeoutError` (default 30; finite, positive, at most an
      hour, else ``ConfigurationError``). A relay reports it (``on_error``) and tries again,
      so a database that stops answering is reported every ``operation_timeout``, never a
      silent hang. Calls joined to a unit of work are bounded by the unit of work's.
    """
    _check_max_attempts(max_attempts)
    limit = _check_max_payload_bytes(max_payload_bytes)
    if not isinstance(backoff, Backoff):
        raise ConfigurationError(
            f"backoff must be a Backoff, got {type(backoff).__name__}.",
            fix="pass Backoff(kind='exponential', base=1.0, max_delay=3600.0, jitter='full') or"
            " another Backoff value.",
        )
    if table is None:
        table = _default_outbox_table()
    elif not isinstance(table, Table):
        raise ConfigurationError(
            f"table must be a sqlalchemy Table, got {type(table).__name__}.",
            fix="pass ship_outbox_table(metadata).",
        )
    missing = {"id", "outbox_id", "lease_token", "state", "lease_expires_at"} - set(table.c.keys())
    if missing:
        raise ConfigurationError(
            f"table {table.name!r} is not an outbox table: it lacks {sorted(missing)}.",
            fix="build it with ship_outbox_table(metadata, name=...).",
        )
    return Outbox(
        database=database,
        table=table,
        clock=clock or SystemClock(),
        max_attempts=max_attempts,
        backoff=backoff,
        on_error=on_error,
        max_payload_bytes=limit,
        operation_timeout=operation_timeout,
    )
