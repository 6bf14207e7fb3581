"""The enqueue-mode webhook receiver (SPEC section 6), pure ASGI.

A delivery is answered in three steps, fast:

1. Read the RAW body (within a byte limit) and verify its Standard Webhooks signature over those
   exact bytes (400 when malformed, 401 when the signature or timestamp does not verify). Nothing
   unauthenticated is parsed or stored.
2. In ONE unit of work: claim the idempotency key ``webhook-id`` under the webhook's prefix,
   record the event, enqueue its outbox intent and link the two (U1, O1). They commit or roll
   back together: a failure leaves neither a claim, nor a record, nor a message behind.
3. Answer 202 once committed. The work itself happens later, from the outbox.

A duplicate delivery (the same ``webhook-id``: senders retry with a new timestamp and signature)
is acknowledged with 200 and enqueues nothing. A delivery that meets a concurrent, uncommitted
delivery of the same event is answered 409 within the stores' ``lock_timeout``; the sender
retries. A database outage (:class:`~ship_sqla.errors.DatabaseUnavailableError`) is answered
503: the sender retries, and a delivery whose COMMIT was cut off is then acknowledged as a
duplicate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from sqlalchemy.exc import DBAPIError

from ship_sqla._asgi_io import (
    BodyTooLargeError,
    ClientDisconnectedError,
    Receive,
    Scope,
    Send,
    header_map,
    json_response,
    problem_response,
    read_body,
    send_stored,
    serve_lifespan,
)
from ship_sqla._idempotency._types import (
    IdempotencyFingerprintMismatch,
    IdempotencyInProgress,
    IdempotencyReplay,
    IdempotencyStarted,
    StoredResponse,
)
from ship_sqla._scope import check_tenant
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla._uow import create_unit_of_work
from ship_sqla._webhooks._signature import (
    DEFAULT_TOLERANCE,
    VerifiedWebhook,
    WebhookVerificationError,
    parse_webhook_secret,
    verify_webhook,
)
from ship_sqla._webhooks._store import (
    WebhookEventStore,
    check_webhook_json,
    webhook_idempotency_prefix,
)
from ship_sqla._webhooks._types import WebhookEventInProgressError
from ship_sqla.kernel._clock import Clock, SystemClock
from ship_sqla.kernel._errors import ConfigurationError, DatabaseUnavailableError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ship_sqla._idempotency._store import IdempotencyStore
    from ship_sqla._scope import TransactionScope

__all__ = ["OutboxWriter", "WebhookEndpoint", "WebhookReceiver"]

logger = logging.getLogger("ship_sqla")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_DEDUPE_TTL = timedelta(days=7)
DEFAULT_OUTBOX_ID = "webhooks"
UNTRANSLATABLE_CHARACTER = "22P05"
"""SQLSTATE of a jsonb string holding \\u0000 (valid JSON, not storable in PostgreSQL)."""
# Credentials of the hop to us are not part of the event; never persist them.
_UNRECORDED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


class OutboxWriter(Protocol):
    """What the receiver needs of an outbox: ``ship_sqla.create_outbox(...)`` is one.

    ``enqueue`` must join the given scope (O1) and return the message id (or an object with an
    ``id``).
    """

    async def enqueue(
        self,
        outbox_id: str,
        topic: str,
        payload: Any,  # noqa: ANN401 - any JSON value
        *,
        headers: Mapping[str, Any] | None = ...,
        tenant: str | None = ...,
        scope: TransactionScope | None = ...,
    ) -> object: ...


def _secrets(value: str | bytes | Sequence[str | bytes]) -> tuple[str | bytes, ...]:
    if isinstance(value, str | bytes):
        return (value,)
    return tuple(value)


@attrs.frozen
class WebhookEndpoint:
    """One webhook the receiver accepts: its name, its secrets (several while rotating), and
    where its events go (``outbox_id``, ``topic``; default ``webhook.<name>``)."""

    name: str
    secrets: tuple[str | bytes, ...] = attrs.field(converter=_secrets)
    topic: str | None = None
    outbox_id: str = DEFAULT_OUTBOX_ID
    tenant: str | None = attrs.field(default=None, validator=lambda _, __, t: _endpoint_tenant(t))
    tolerance: timedelta = DEFAULT_TOLERANCE

    @property
    def outbox_topic(self) -> str:
        return self.topic or f"webhook.{self.name}"


def _endpoint_tenant(tenant: str | None) -> None:
    check_tenant(tenant, operation="WebhookEndpoint")


@attrs.frozen
class _Delivery:
    endpoint: WebhookEndpoint
    verified: VerifiedWebhook
    payload: Any
    headers: dict[str, str]
    body: bytes


class WebhookReceiver:
    """ASGI app receiving Standard Webhooks deliveries for one or more endpoints.

    Mount it at a path with a ``{name}`` parameter (``Route("/webhooks/{name}", receiver,
    methods=["POST"])`` in Starlette) or, for a single endpoint, at a fixed path. ``events``,
    ``idempotency`` and ``outbox`` must live in the same database: they join one unit of work
    opened on ``events.database``.
    """

    def __init__(
        self,
        *,
        endpoints: WebhookEndpoint | Sequence[WebhookEndpoint],
        events: WebhookEventStore,
        idempotency: IdempotencyStore,
        outbox: OutboxWriter,
        clock: Clock | None = None,
        path_param: str = "name",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        dedupe_ttl: timedelta = DEFAULT_DEDUPE_TTL,
        keep_raw_body: bool = False,
    ) -> None:
        if isinstance(endpoints, WebhookEndpoint):
            endpoints = [endpoints]
        self._endpoints = {e.name: e for e in endpoints}
        if not self._endpoints or len(self._endpoints) != len(endpoints):
            raise ConfigurationError(
                "WebhookReceiver needs at least one endpoint, each with a distinct name.",
                fix="pass endpoints=[WebhookEndpoint('stripe', secrets=['whsec_...']), ...].",
            )
        for endpoint in self._endpoints.values():
            if not endpoint.secrets:
                raise ConfigurationError(
                    f"webhook endpoint {endpoint.name!r} has no secret; nothing could verify.",
                    fix="configure the whsec_ secret(s) the sender shows for this endpoint.",
                )
            for secret in endpoint.secrets:
                parse_webhook_secret(secret)  # refuse a bad secret at startup, not per request
        if max_body_bytes < 1:
            raise ConfigurationError(
                f"max_body_bytes must be positive, got {max_body_bytes}.",
                fix="use the largest delivery the sender may post, e.g. 1 MiB.",
            )
        self._events = events
        self._idempotency = idempotency
        self._outbox = outbox
        self._clock: Clock = clock or SystemClock()
        self._path_param = path_param
        self._max_body_bytes = max_body_bytes
        self._dedupe_ttl = dedupe_ttl
        self._keep_raw_body = keep_raw_body
        self._uow = create_unit_of_work(events.database, repositories=_scope_itself)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            msg = f"WebhookReceiver serves HTTP only, not {scope['type']!r}"
            raise RuntimeError(msg)
        response = await self._answer(scope, receive)
        if response is not None:
            await send_stored(send, response)

    async def _answer(self, scope: Scope, receive: Receive) -> StoredResponse | None:
        if scope["method"].upper() != "POST":
            return _problem(405, "SHIP_SQLA_WEBHOOK_METHOD", "webhooks are delivered with POST.")
        endpoint = self._endpoint(scope)
        if endpoint is None:
            return _problem(404, "SHIP_SQLA_WEBHOOK_UNKNOWN", "no webhook is configured here.")
        delivery = await self._verified_delivery(scope, receive, endpoint)
        if not isinstance(delivery, _Delivery):
            return delivery
        return await self._record(delivery)

    async def _record(self, delivery: _Delivery) -> StoredResponse:
        """Step 2 in one unit of work, or the problem answer for why it could not be done."""

        async def handler(tx: TransactionScope) -> StoredResponse:
            return await self._accept(tx, delivery)

        try:
            return await self._uow.run(handler, tenant=delivery.endpoint.tenant)
        except WebhookEventInProgressError as exc:
            return _problem(409, exc.code, exc.message, exc.fix)
        except DatabaseUnavailableError as exc:
            # The sender retries a 5xx; the detail stays generic (the error names our database).
            logger.warning("ship_sqla webhook receiver: answering 503", exc_info=exc)
            return _problem(
                503,
                exc.code,
                "the delivery could not be recorded: the database is unavailable.",
                "retry the delivery later.",
            )
        except DBAPIError as exc:
            if sqlstate_of(exc) != UNTRANSLATABLE_CHARACTER:
                raise
            return _problem(
                400,
                "SHIP_SQLA_WEBHOOK_BODY_UNSTORABLE",
                "the delivery's JSON holds a \\u0000 character, which PostgreSQL jsonb cannot"
                " store.",
                "send text without NUL characters (encode binary data, e.g. as base64).",
            )

    async def _verified_delivery(
        self, scope: Scope, receive: Receive, endpoint: WebhookEndpoint
    ) -> _Delivery | StoredResponse | None:
        """The verified, parsed delivery, or the 4xx answer to give (None: the client left)."""
        try:
            body = await read_body(scope, receive, self._max_body_bytes)
        except BodyTooLargeError:
            return _problem(
                413,
                "SHIP_SQLA_REQUEST_TOO_LARGE",
                f"the delivery exceeds {self._max_body_bytes} bytes.",
            )
        except ClientDisconnectedError:
            return None
        headers = header_map(scope)
        try:
            verified = verify_webhook(
                headers,
                body,
                secrets=endpoint.secrets,
                now=self._clock.now(),
                tolerance=endpoint.tolerance,
            )
            payload = json.loads(body)
        except WebhookVerificationError as exc:
            return _problem(exc.http_status, exc.code, exc.message, exc.fix)
        except ValueError:  # verified first: nothing unauthenticated is parsed
            return _problem(
                400, "SHIP_SQLA_WEBHOOK_BODY_NOT_JSON", "the delivery's body is not JSON."
            )
        recorded = {k: v for k, v in headers.items() if k not in _UNRECORDED_HEADERS}
        try:
            # Valid JSON that jsonb cannot store (NaN, a \u0000 or a lone \ud800 escape), or
            # a header holding a NUL, is the sender's mistake: 400 before any SQL, never a
            # driver error (issue 25 D6).
            check_webhook_json(payload, "payload")
            check_webhook_json(recorded, "headers")
        except ConfigurationError as exc:
            return _problem(400, "SHIP_SQLA_WEBHOOK_BODY_UNSTORABLE", exc.message, exc.fix)
        return _Delivery(
            endpoint=endpoint,
            verified=verified,
            payload=payload,
            headers=recorded,
            body=body,
        )

    def _endpoint(self, scope: Scope) -> WebhookEndpoint | None:
        name = scope.get("path_params", {}).get(self._path_param)
        if name is None and len(self._endpoints) == 1:
            return next(iter(self._endpoints.values()))
        return self._endpoints.get(name) if isinstance(name, str) else None

    async def _accept(self, tx: TransactionScope, delivery: _Delivery) -> StoredResponse:
        """One attempt of the unit of work: claim, record, enqueue, link; the answer to give."""
        endpoint, verified, payload, body = (
            delivery.endpoint,
            delivery.verified,
            delivery.payload,
            delivery.body,
        )
        event_id = verified.webhook_id
        claimed = await self._idempotency.begin(
            event_id,
            f"sha256:{hashlib.sha256(body).hexdigest()}",
            prefix=webhook_idempotency_prefix(endpoint.name),
            tenant=endpoint.tenant,
            ttl=self._dedupe_ttl,
            scope=tx,
        )
        if isinstance(claimed, IdempotencyReplay):
            return _duplicate(endpoint, event_id)
        if isinstance(claimed, IdempotencyInProgress):
            return _problem(
                409,
                "SHIP_SQLA_WEBHOOK_EVENT_IN_PROGRESS",
                f"event {event_id!r} is being received right now; retry later.",
            )
        if isinstance(claimed, IdempotencyFingerprintMismatch):
            return _problem(
                422,
                "SHIP_SQLA_WEBHOOK_ID_REUSED",
                f"webhook-id {event_id!r} was delivered before with a different body.",
                "a sender must keep one webhook-id per event and resend the same body.",
            )
        assert isinstance(claimed, IdempotencyStarted)  # noqa: S101 - the match is exhaustive
        recorded = await self._events.record(
            endpoint.name,
            event_id,
            payload,
            headers=delivery.headers,
            tenant=endpoint.tenant,
            signed_at=verified.timestamp,
            raw_body=body if self._keep_raw_body else None,
            idempotency_key=event_id,
            scope=tx,
        )
        if recorded.duplicate:  # its key had expired, but the event row still deduplicates
            answer = _duplicate(endpoint, event_id)
        else:
            enqueued = await self._outbox.enqueue(
                endpoint.outbox_id,
                endpoint.outbox_topic,
                payload,
                headers={
                    "webhook": endpoint.name,
                    "webhook-id": event_id,
                    "webhook-timestamp": verified.timestamp.isoformat(),
                    "webhook-event-record": str(recorded.event.id),
                },
                tenant=endpoint.tenant,
                scope=tx,
            )
            await self._events.link(endpoint.name, event_id, _message_id(enqueued), scope=tx)
            answer = json_response(
                202, {"status": "accepted", "webhook": endpoint.name, "event_id": event_id}
            )
        await claimed.claim.complete(answer, scope=tx)
        return answer


def _message_id(enqueued: object) -> uuid.UUID:
    if isinstance(enqueued, uuid.UUID):
        return enqueued
    message_id = getattr(enqueued, "id", None)
    if not isinstance(message_id, uuid.UUID):
        msg = f"outbox.enqueue returned {type(enqueued).__name__}, neither a UUID nor with an id"
        raise TypeError(msg)
    return message_id


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


def _duplicate(endpoint: WebhookEndpoint, event_id: str) -> StoredResponse:
    return json_response(
        200, {"status": "duplicate", "webhook": endpoint.name, "event_id": event_id}
    )


def _problem(status: int, code: str, detail: str, fix: str | None = None) -> StoredResponse:
    titles = {
        400: "Malformed webhook delivery",
        401: "Webhook verification failed",
        404: "Unknown webhook",
        405: "Method not allowed",
        409: "Webhook event in progress",
        413: "Webhook delivery too large",
        422: "Webhook id reused",
        503: "Webhook receiver unavailable",
    }
    response = problem_response(
        status, title=titles.get(status, "Webhook error"), code=code, detail=detail, fix=fix
    )
    if status == 405:  # noqa: PLR2004 - RFC 9110 requires Allow on a 405
        return StoredResponse(status, [*response.headers, ("allow", "POST")], response.body)
    return response
