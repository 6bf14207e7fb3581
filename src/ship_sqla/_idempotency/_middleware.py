"""The Idempotency-Key middleware (draft-ietf-httpapi-idempotency-key-header), pure ASGI.

For the configured methods a request carries ``Idempotency-Key``. The middleware reads the body,
fingerprints the request (method, path and query, SHA-256 of the body) and, in ONE unit of work,
claims the key, runs the wrapped application and stores its response:

- no key where one is required, or a malformed key: 400;
- the key's first request is still running: 409 (after at most the store's ``lock_timeout``);
- the key was used for a different request: 422;
- the key's first request completed: its stored status, headers and body, plus a marker header;
- otherwise the application runs. Its response is stored and committed with its writes (I1);
  a 5xx response or an exception rolls the unit of work back, which releases the claim, so a
  retry runs again. 4xx responses are stored and replayed like successes, unless
  ``store_client_errors=False``: then they roll back and release the claim too.

The wrapped application runs inside the middleware's unit of work: a ``uow.run`` it makes on the
same engine joins that transaction (U5) and ship stores it calls join it too, so the business
writes, the outbox messages, the claim and the stored response commit together. An application
that writes through another engine or connection is not covered by that guarantee. Each
protected request holds one pooled connection, in a transaction, for as long as it runs.

Frameworks turn exceptions into responses INSIDE the route (Starlette's exception handlers run in
the route's ``request_response`` wrapper), so this middleware sees a response, not the exception.
A nested ``uow.run`` that joined this unit of work and raised marks it rollback-only (U5): the
middleware then sends the application's response but stores nothing and rolls everything back,
claim included, so a retry runs again. To keep and replay such a 4xx, make the nested run
``uow.run(..., savepoint=True)``: its failure then rolls back alone.

Responses are buffered whole before they are sent (they must be stored first): do not put
long-lived streams behind this middleware.

The keys' table is checked once (issue 27 item 7, the one probe of
:mod:`ship_sqla._schema_probe`): at the application's startup, where the server sends the
lifespan protocol (a missing table fails the startup, naming it and the ``ship-sqla schema
apply`` command), else at the first protected request, which then raises
:class:`~ship_sqla.errors.MissingTablesError` instead of the driver's "relation does not exist".
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ship_sqla._asgi_io import (
    ASGIApp,
    BodyTooLargeError,
    ClientDisconnectedError,
    Receive,
    ResponseRecorder,
    Scope,
    Send,
    header_values,
    problem_response,
    read_body,
    replaying_receive,
    scope_without_send_extensions,
    send_stored,
)
from ship_sqla._idempotency._store import MAX_KEY_LENGTH, IdempotencyStore
from ship_sqla._idempotency._types import (
    IdempotencyFingerprintMismatch,
    IdempotencyInProgress,
    IdempotencyReplay,
    IdempotencyStarted,
    StoredResponse,
)
from ship_sqla._schema_probe import MissingTablesError, Needed, require_tables
from ship_sqla._uow import create_unit_of_work
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ship_sqla._asgi_io import Message
    from ship_sqla._scope import TransactionScope

__all__ = ["IdempotencyKeyMiddleware", "parse_idempotency_key", "request_fingerprint"]

DEFAULT_METHODS = ("POST", "PATCH")
DEFAULT_PREFIX = "http"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
REPLAY_HEADER = "idempotent-replayed"


def request_fingerprint(method: str, path: str, query_string: bytes, body: bytes) -> str:
    """What makes two requests "the same request" for one key: method, target and body."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), query_string):
        digest.update(len(part).to_bytes(8, "big"))  # length-prefixed: no ambiguous joins
        digest.update(part)
    digest.update(hashlib.sha256(body).digest())
    return f"sha256:{digest.hexdigest()}"


def parse_idempotency_key(raw: str) -> str | None:
    """The key of an ``Idempotency-Key`` value, or None when it is malformed.

    The draft defines the field as a Structured Field String (``"..."``); a bare token is
    accepted too, as many clients send one.
    """
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':  # noqa: PLR2004 - the two quotes
        inner = value[1:-1]
        if '"' in inner.replace('\\"', "").replace("\\\\", ""):
            return None
        value = inner.replace('\\"', '"').replace("\\\\", "\\")
    if not value or len(value) > MAX_KEY_LENGTH or not value.isascii() or not value.isprintable():
        return None
    return value


class _ReleaseClaimError(Exception):
    """Internal: the app answered 5xx; roll the unit of work back (and the claim with it)."""

    def __init__(self, response: StoredResponse) -> None:
        self.response = response


class IdempotencyKeyMiddleware:
    """ASGI middleware making unsafe requests idempotent with the ``Idempotency-Key`` header.

    ``store`` keeps the keys (its ``database`` is also where the unit of work runs: build the
    application's own unit of work on the same engine so its writes join). ``methods``: the
    methods the header applies to. ``required``: answer 400 when it is missing (else such
    requests pass through unprotected). ``prefix`` namespaces the keys in the store;
    ``tenant(scope)`` may scope them per tenant (and is the unit of work's tenant).
    ``max_body_bytes`` bounds the buffered request body (413 above it).
    ``store_client_errors``: store and replay 4xx responses (default), or roll them back and
    release the key like 5xx (see the module's note on exception handlers).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore,
        methods: Iterable[str] = DEFAULT_METHODS,
        required: bool = True,
        header: str = "idempotency-key",
        prefix: str = DEFAULT_PREFIX,
        tenant: Callable[[Scope], str | None] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        replay_header: str = REPLAY_HEADER,
        store_client_errors: bool = True,
        max_attempts: int = 1,
    ) -> None:
        if not isinstance(store, IdempotencyStore):
            raise ConfigurationError(
                "IdempotencyKeyMiddleware needs an IdempotencyStore.",
                fix="pass store=create_idempotency_store(database=engine, table=...).",
            )
        if max_body_bytes < 1:
            raise ConfigurationError(
                f"max_body_bytes must be positive, got {max_body_bytes}.",
                fix="use the largest request body these endpoints accept, e.g. 1 MiB.",
            )
        self.app = app
        self._store = store
        self._methods = frozenset(m.upper() for m in methods)
        self._required = required
        self._header = header.lower()
        self._prefix = prefix
        self._tenant = tenant
        self._max_body_bytes = max_body_bytes
        self._replay_header = replay_header.lower()
        # Statuses at or above this roll the unit of work back and release the key.
        self._release_from = 500 if store_client_errors else 400
        # max_attempts > 1 re-runs the wrapped app on serialization failures (U3): only safe
        # when the app has no effects outside the transaction.
        self._uow = create_unit_of_work(
            store.database, repositories=_scope_itself, max_attempts=max_attempts
        )
        self._tables_checked = False

    async def require_tables(self) -> None:
        """Return once the keys' table has been seen to exist (asked until it is); else raise
        :class:`~ship_sqla.errors.MissingTablesError` naming it and the command that creates
        it."""
        if self._tables_checked:
            return
        store = self._store
        self._tables_checked = await require_tables(
            store.database,
            [Needed.table(store.table, "idempotency")],
            surface="the Idempotency-Key middleware",
        )

    def _startup_checked(self, send: Send) -> Send:
        """The lifespan's ``send``: the table check runs before the application's startup is
        reported complete; a missing table reports it failed instead. A database it cannot
        reach leaves the check to the first request (an application may start before its
        database)."""

        async def checked(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await self.require_tables()
                except MissingTablesError as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
            await send(message)

        return checked

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._startup_checked(send))
            return
        if scope["type"] != "http" or scope["method"].upper() not in self._methods:
            await self.app(scope, receive, send)
            return
        values = header_values(scope, self._header)
        if not values and not self._required:
            await self.app(scope, receive, send)
            return
        request = await self._read_request(scope, receive, values)
        if request is None:  # the client disconnected: there is no one to answer
            return
        if isinstance(request, StoredResponse):
            await send_stored(send, request)
            return
        key, body = request
        fingerprint = request_fingerprint(
            scope["method"], scope.get("path", ""), scope.get("query_string", b""), body
        )
        tenant = self._tenant(scope) if self._tenant is not None else None
        await self.require_tables()

        async def handler(tx: TransactionScope) -> tuple[StoredResponse, bool]:
            return await self._claim_and_run(
                tx, scope, receive, key=key, fingerprint=fingerprint, tenant=tenant, body=body
            )

        try:
            response, replayed = await self._uow.run(handler, tenant=tenant)
        except _ReleaseClaimError as released:
            response, replayed = released.response, False
        extra = [(self._replay_header, "true")] if replayed else None
        await send_stored(send, response, extra)

    async def _read_request(
        self, scope: Scope, receive: Receive, values: list[str]
    ) -> tuple[str, bytes] | StoredResponse | None:
        """The key and body, or the 4xx answer to give instead (None: client gone)."""
        if not values:
            return _missing_key(self._header)
        key = parse_idempotency_key(values[0]) if len(values) == 1 else None
        if key is None:
            return _malformed_key(self._header, len(values))
        try:
            body = await read_body(scope, receive, self._max_body_bytes)
        except BodyTooLargeError:
            return _too_large(self._max_body_bytes)
        except ClientDisconnectedError:
            return None
        return key, body

    async def _claim_and_run(
        self,
        tx: TransactionScope,
        scope: Scope,
        receive: Receive,
        *,
        key: str,
        fingerprint: str,
        tenant: str | None,
        body: bytes,
    ) -> tuple[StoredResponse, bool]:
        """One attempt of the unit of work: the response to send, and whether it is a replay."""
        outcome = await self._store.begin(
            key, fingerprint, prefix=self._prefix, tenant=tenant, scope=tx
        )
        if isinstance(outcome, IdempotencyReplay):
            return outcome.response, True
        if isinstance(outcome, IdempotencyInProgress):
            return _in_progress(), False
        if isinstance(outcome, IdempotencyFingerprintMismatch):
            return _mismatch(self._header), False
        assert isinstance(outcome, IdempotencyStarted)  # noqa: S101 - the match is exhaustive
        recorder = ResponseRecorder()
        await self.app(
            scope_without_send_extensions(scope), replaying_receive(body, receive), recorder.send
        )
        response = recorder.response()
        if response.status >= self._release_from or tx.rollback_only:
            # A joined nested uow.run that raised (and was turned into this response by the
            # framework) can never commit: answer with the response, store nothing (U5).
            raise _ReleaseClaimError(response)
        await outcome.claim.complete(response, scope=tx)
        return response, False


def _scope_itself(scope: TransactionScope) -> TransactionScope:
    return scope


def _missing_key(header: str) -> StoredResponse:
    return problem_response(
        400,
        title="Idempotency-Key is missing",
        code="SHIP_SQLA_IDEMPOTENCY_KEY_MISSING",
        detail=f"this request must carry an {header} header.",
        fix=f'send {header}: "<a unique value, e.g. a UUID>" and reuse it only to retry.',
    )


def _malformed_key(header: str, count: int) -> StoredResponse:
    detail = (
        f"the request carries {count} {header} headers; exactly one is allowed."
        if count > 1
        else f"the {header} value is not a string of 1 to {MAX_KEY_LENGTH} printable ASCII"
        " characters."
    )
    return problem_response(
        400,
        title="Idempotency-Key is malformed",
        code="SHIP_SQLA_IDEMPOTENCY_KEY_INVALID",
        detail=detail,
        fix=f'send one {header}: "<a UUID>" header.',
    )


def _too_large(limit: int) -> StoredResponse:
    return problem_response(
        413,
        title="Request body too large",
        code="SHIP_SQLA_REQUEST_TOO_LARGE",
        detail=f"the request body exceeds {limit} bytes, the most an idempotent request may carry.",
        fix="send a smaller body, or raise max_body_bytes on the middleware.",
    )


def _in_progress() -> StoredResponse:
    return problem_response(
        409,
        title="A request with this Idempotency-Key is being processed",
        code="SHIP_SQLA_IDEMPOTENCY_IN_PROGRESS",
        detail="the first request with this key has not finished yet.",
        fix="retry later with the same key to receive its response.",
    )


def _mismatch(header: str) -> StoredResponse:
    return problem_response(
        422,
        title="Idempotency-Key reused for a different request",
        code="SHIP_SQLA_IDEMPOTENCY_FINGERPRINT_MISMATCH",
        detail=f"this {header} was first used with a different method, path or body.",
        fix="use a new key for a new request; reuse a key only to retry the identical request.",
    )
