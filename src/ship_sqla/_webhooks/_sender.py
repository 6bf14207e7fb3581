"""Outbound webhooks (SPEC §16, W1-W5): :func:`create_webhook_sender`.

A delivery is a row of the deliveries table and ONE job run whose payload is only
``{"delivery_id": ...}``: the worker runtime sends it, the job's retry policy spaces its
attempts (one engine, not a second one).

- W1: :meth:`WebhookSender.send` writes the deliveries and enqueues their runs in the caller's
  unit of work (``scope=`` or the ambient one): a rollback sends nothing.
- W2: signed by :func:`~ship_sqla.webhooks.webhook_headers` (the library's one Standard
  Webhooks implementation, the receiver's too) with every secret in force (two while one is
  rotated); the ``webhook-id`` is the delivery id, the same at every attempt. Secrets are read
  from the endpoints table at send time: never in a payload, a delivery row, an error or a log.
- W3: 2xx delivered; 408, 409, 425, 429, 5xx and no answer retried with the job's backoff, a
  ``Retry-After`` (seconds or an HTTP date) through the kernel's :class:`RetryAfter` (clamped
  by the policy's ``max_delay``); any other answer (other 4xx, a redirect: never followed) is
  terminal. Each attempt is recorded on the delivery before the attempt's outcome is raised.
- W4: :data:`DEFAULT_DISABLE_AFTER` (20) consecutive failed deliveries disable the endpoint;
  a delivery of a disabled endpoint is paused (its run ends, no attempt recorded, none spent);
  :meth:`WebhookSender.enable_endpoint` sets them pending and enqueues them again, in one
  transaction.
- W5: at each attempt the host is resolved ONCE through the resolver seam, every address is
  checked (:func:`~ship_sqla.kernel._webhooks_out.refused_address`), and the connection goes to
  the checked address: the sender's own client (:func:`_pinned_client`) has an httpcore network
  backend that connects (host, port) only to the address pinned for the attempt in hand, the
  URL keeping the name (TLS server name, certificate check, ``Host`` and pool keys are the
  name's); a client given by the application gets the URL rewritten to the address, ``Host``
  and httpx's ``sni_hostname`` extension keeping the name. Proxy variables are ignored
  (``trust_env=False``): a proxy would connect elsewhere.

httpx is the optional extra ``ship-sqla[webhooks]``, imported when a sender is created.
"""

from __future__ import annotations

import base64
import email.utils
import json
import os
import socket
import time
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio
import attrs

from ship_sqla._scope import Joined
from ship_sqla._webhooks._out_store import (
    PostgresWebhookDeliveryStore,
    create_webhook_delivery_store,
)
from ship_sqla._webhooks._signature import SECRET_PREFIX, webhook_headers
from ship_sqla.kernel._errors import ConfigurationError, JobAttemptError
from ship_sqla.kernel._ids import new_run_ids
from ship_sqla.kernel._jobs import Concurrency, RetryPolicy, define_job
from ship_sqla.kernel._outcomes import RetryAfter, TerminalError
from ship_sqla.kernel._ports import EnqueueRequest
from ship_sqla.kernel._tenancy import ambient_tenant
from ship_sqla.kernel._webhooks_out import (
    DEFAULT_DISABLE_AFTER,
    MAX_BODY_EXCERPT,
    MAX_ERROR_LENGTH,
    Classification,
    DeliveryAttempt,
    DeliveryState,
    WebhookDeliveryRecord,
    WebhookDeliveryStore,
    WebhookDestinationRefusedError,
    WebhookEndpointRecord,
    WebhookEndpointUnknownError,
    check_allow,
    classify_status,
    excerpt,
    refused_address,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    import httpx

    from ship_sqla._scope import Database
    from ship_sqla.kernel._clock import Clock
    from ship_sqla.kernel._job_context import JobContext
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._ports import JobBackend

    Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

__all__ = [
    "DEFAULT_WEBHOOK_RETRY",
    "WebhookDeliveryFailedError",
    "WebhookSender",
    "create_webhook_sender",
    "system_resolver",
]

DEFAULT_WEBHOOK_RETRY: Final = RetryPolicy(attempts=8, base_delay=5.0, max_delay=3600.0)
"""Eight attempts, exponential from 5 s, each wait at most an hour (and a Retry-After too)."""

DEFAULT_JOB_ID: Final = "ship.webhooks.deliver"
_BATCH: Final = 1000


class WebhookDeliveryFailedError(JobAttemptError):
    """W3: one delivery attempt got a retryable answer (408, 409, 425, 429, 5xx) or none; the
    job's retry policy plans the next attempt."""

    code: ClassVar[str] = "SHIP_SQLA_WEBHOOK_DELIVERY_FAILED"


def _httpx() -> Any:  # noqa: ANN401 - the module
    try:
        import httpx  # noqa: PLC0415 - the optional extra, imported when a sender is made
    except ImportError as exc:  # pragma: no cover - the dev extra has it
        raise ConfigurationError(
            "sending webhooks needs httpx, which is not installed.",
            fix="install the extra: pip install 'ship-sqla[webhooks]'.",
        ) from exc
    return httpx


async def system_resolver(host: str, port: int) -> list[str]:
    """The default resolver: the system's, through anyio (one lookup per attempt, W5)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def new_webhook_secret() -> str:
    """A new ``whsec_`` secret of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode("ascii")


def _retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _check_url(url: str) -> None:
    httpx = _httpx()
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigurationError(
            f"a webhook endpoint URL is not a URL ({exc}).", fix="give an https:// URL."
        ) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(
            "a webhook endpoint URL must be http:// or https:// with a host.",
            fix="give an https:// URL such as https://example.com/hooks.",
        )
    if parsed.userinfo:
        raise ConfigurationError(
            "a webhook endpoint URL must not carry credentials (user:password@): they would be"
            " shown wherever the endpoint is listed.",
            fix="authenticate the receiver by the signature (W2), not by URL credentials.",
        )


@attrs.frozen
class _Target:
    url: Any  # httpx.URL
    headers: dict[str, str]
    extensions: dict[str, Any]
    pins: dict[tuple[str, int], str]


_PINS: ContextVar[dict[tuple[str, int], str] | None] = ContextVar(
    "ship_sqla_webhook_pins", default=None
)
"""W5: the checked address of each (host, port) the current attempt may connect to."""


def _pinned_client(httpx: Any, *, timeout: float, http2: bool) -> httpx.AsyncClient:  # noqa: ANN401
    """The sender's own client: one pool, ``timeout`` seconds, redirects never followed, proxy
    variables ignored, and a network backend that connects each (host, port) to the address W5
    checked for this attempt (:data:`_PINS`) and nowhere else. The URL keeps its host name, so
    the pool is keyed by name (two names on one IP never share a TLS connection), TLS's server
    name and certificate check are the name's, and ``Host`` is the URL's."""
    import httpcore  # noqa: PLC0415 - httpx's own dependency

    class PinnedBackend(httpcore.AsyncNetworkBackend):
        def __init__(self) -> None:
            self._inner = httpcore.AnyIOBackend()

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
            local_address: str | None = None,
            socket_options: Any = None,  # noqa: ANN401
        ) -> Any:  # noqa: ANN401
            pins = _PINS.get()
            address = None if pins is None else pins.get((host, port))
            if address is None:
                raise httpcore.ConnectError(
                    f"no W5-checked address for {host}:{port}: the webhook sender's client"
                    " connects only where the sender checked"
                )
            return await self._inner.connect_tcp(
                address,
                port,
                timeout=timeout,
                local_address=local_address,
                socket_options=socket_options,
            )

        async def connect_unix_socket(
            self,
            path: str,  # noqa: ARG002 - httpcore's interface
            timeout: float | None = None,  # noqa: ASYNC109, ARG002 - httpcore's interface
            socket_options: Any = None,  # noqa: ARG002, ANN401
        ) -> Any:  # noqa: ANN401
            raise httpcore.ConnectError("a unix socket is not a webhook destination")

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    transport = httpx.AsyncHTTPTransport(http2=http2, limits=limits, trust_env=False)
    if not hasattr(transport, "_pool"):  # pragma: no cover - a future httpx
        raise ConfigurationError(
            "this httpx version's transport cannot be given a network backend.",
            fix="install httpx>=0.27,<1 (the extra ship-sqla[webhooks]), or pass http_client=.",
        )
    transport._pool = httpcore.AsyncConnectionPool(  # noqa: SLF001 - httpx takes no backend
        ssl_context=httpx.create_ssl_context(trust_env=False),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=http2,
        network_backend=PinnedBackend(),
    )
    return httpx.AsyncClient(  # type: ignore[no-any-return]
        transport=transport,
        timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
        follow_redirects=False,
        trust_env=False,
    )


class WebhookSender:
    """Sends webhooks (SPEC §16). Build with :func:`create_webhook_sender`; register
    :attr:`jobs` with the worker runtime."""

    def __init__(
        self,
        *,
        store: WebhookDeliveryStore,
        backend: JobBackend,
        allow: Sequence[str],
        http_client: httpx.AsyncClient | None,
        resolver: Resolver | None,
        clock: Clock,
        retry: RetryPolicy,
        disable_after: int,
        timeout: float,
        http2: bool,
        job_id: str,
        concurrency: Concurrency | None = None,
    ) -> None:
        self._httpx = _httpx()
        if disable_after < 1:
            raise ConfigurationError(
                f"disable_after must be at least 1, got {disable_after}.",
                fix=f"omit it for the default ({DEFAULT_DISABLE_AFTER}).",
            )
        self.store = store
        self.backend = backend
        self.allow = check_allow(allow)
        self.clock = clock
        self.disable_after = disable_after
        self._given_client = http_client
        self._client: httpx.AsyncClient | None = http_client
        self._resolver: Resolver = resolver or system_resolver
        self._timeout = timeout
        self._http2 = http2
        self.job: JobDefinition[dict[str, Any]] = define_job(
            job_id,
            self._deliver,
            payload=dict,
            retry=retry,
            timeout=timeout * 3,
            concurrency=concurrency,
        )

    @property
    def jobs(self) -> tuple[JobDefinition[Any], ...]:
        """The delivery job: register it with the worker runtime."""
        return (self.job,)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = _pinned_client(self._httpx, timeout=self._timeout, http2=self._http2)
        return self._client

    async def aclose(self) -> None:
        """Close the sender's own HTTP client (a given one is the caller's to close)."""
        if self._client is not None and self._given_client is None:
            await self._client.aclose()
            self._client = None

    # --- endpoints ---------------------------------------------------------------------------

    async def add_endpoint(
        self,
        url: str,
        topics: Sequence[str],
        *,
        secret: str | None = None,
        endpoint_id: str | None = None,
        tenant: str | None = None,
    ) -> WebhookEndpointRecord:
        """Register an endpoint (enabled) for ``topics`` (``"*"``: every topic); ``secret``
        (default: a new ``whsec_`` one) is returned once, on the endpoint's ``secrets``."""
        _check_url(url)
        if isinstance(topics, str) or not topics:
            raise ConfigurationError(
                "topics must be a non-empty list of topic names.", fix="pass topics=['order.paid']."
            )
        return await self.store.add_endpoint(
            endpoint_id=endpoint_id or f"ep_{new_run_ids(1)[0]}",
            url=url,
            topics=list(topics),
            secret=secret or new_webhook_secret(),
            tenant=tenant if tenant is not None else ambient_tenant(),
        )

    async def rotate_secret(
        self,
        endpoint_id: str,
        *,
        secret: str | None = None,
        overlap: timedelta = timedelta(hours=24),
    ) -> str:
        """W2: add a new secret (returned); the ones in force keep signing for ``overlap``,
        so receivers can switch without refusing a delivery."""
        secret = secret or new_webhook_secret()
        endpoint = await self.store.rotate_secret(
            endpoint_id, secret=secret, old_expires_at=self.clock.now() + overlap
        )
        if endpoint is None:
            raise _unknown(endpoint_id)
        return secret

    async def disable_endpoint(self, endpoint_id: str, *, reason: str) -> WebhookEndpointRecord:
        endpoint = await self.store.set_endpoint_state(endpoint_id, "disabled", reason=reason)
        if endpoint is None:
            raise _unknown(endpoint_id)
        return endpoint

    async def enable_endpoint(self, endpoint_id: str) -> list[str]:
        """W4: enable the endpoint (its failure streak back to 0) and resume its paused
        deliveries: pending again and enqueued, in one transaction. Their ids."""
        async with self._transaction("enable endpoint", None) as tx:
            endpoint = await self.store.set_endpoint_state(
                endpoint_id, "enabled", reason=None, scope=tx
            )
            if endpoint is None:
                raise _unknown(endpoint_id)
            resumed = await self.store.resume_paused(endpoint_id, scope=tx)
            later = await self._enqueue(resumed, tx)
        await self._enqueue_now(later, None)
        return resumed

    async def redeliver(self, delivery_id: str) -> WebhookDeliveryRecord:
        """Send a delivery again (pending, a new run; same ``webhook-id``)."""
        async with self._transaction("redeliver", None) as tx:
            delivery = await self.store.set_delivery_state(delivery_id, "pending", scope=tx)
            if delivery is None:
                raise WebhookEndpointUnknownError(
                    f"no webhook delivery has id {delivery_id!r}.",
                    fix="list deliveries (ship-sqla webhooks deliveries list) for the ids.",
                )
            later = await self._enqueue([delivery_id], tx)
        await self._enqueue_now(later, None)
        return delivery

    # --- W1 ----------------------------------------------------------------------------------

    def _transaction(self, what: str, scope: Any) -> Any:  # noqa: ANN401
        if isinstance(self.store, PostgresWebhookDeliveryStore):
            return self.store.connections.transaction(what, scope=scope)
        return _NoTransaction(scope)

    async def _enqueue(self, delivery_ids: Sequence[str], tx: Any) -> Sequence[str]:  # noqa: ANN401
        """Enqueue the deliveries' runs in the unit of work ``tx`` joined (W1); without one
        (the store's own transaction), nothing now: the ids to enqueue after its commit (a
        failure between leaves pending deliveries without a run: ``redeliver`` sends them)."""
        scope = tx.scope if isinstance(tx, Joined) else tx
        if scope is None:
            return delivery_ids
        await self._enqueue_now(delivery_ids, scope)
        return ()

    async def _enqueue_now(self, delivery_ids: Sequence[str], scope: Any) -> None:  # noqa: ANN401
        for start in range(0, len(delivery_ids), _BATCH):
            requests = [
                EnqueueRequest({"delivery_id": d}) for d in delivery_ids[start : start + _BATCH]
            ]
            await self.backend.enqueue_many(self.job, requests, scope=scope)

    async def send(
        self,
        topic: str,
        payload: Any,  # noqa: ANN401 - any JSON value
        *,
        endpoint: str | None = None,
        scope: Any = None,  # noqa: ANN401 - a TransactionScope
    ) -> list[str]:
        """W1: one delivery per endpoint (``endpoint``, or every enabled endpoint of the
        tenant subscribed to ``topic``), written and enqueued in the unit of work (``scope``,
        else the ambient one, else a transaction of its own): a rollback sends nothing.
        Returns the delivery ids (each one's ``webhook-id``)."""
        given: object = topic
        if not isinstance(given, str) or not topic:
            raise ConfigurationError(
                "topic must be a non-empty string.", fix="send('order.paid', ...)"
            )
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"a webhook payload must be JSON: {exc}.", fix="send a dict of JSON values."
            ) from None
        tenant = getattr(scope, "tenant", None) if scope is not None else ambient_tenant()
        async with self._transaction("send", scope) as tx:
            if endpoint is not None:
                found = await self.store.get_endpoint(endpoint)
                if found is None or found.tenant != tenant:
                    raise _unknown(endpoint)
                targets = [found]
            else:
                targets = await self.store.subscribed_endpoints(topic, tenant=tenant, scope=tx)
            now = self.clock.now()
            ids = [f"msg_{i}" for i in new_run_ids(len(targets))] if targets else []
            deliveries = [
                WebhookDeliveryRecord(
                    id=delivery_id,
                    endpoint_id=target.id,
                    topic=topic,
                    payload=payload,
                    tenant=tenant,
                    state="pending",
                    attempts=(),
                    created_at=now,
                    updated_at=now,
                )
                for delivery_id, target in zip(ids, targets, strict=True)
            ]
            await self.store.insert_deliveries(deliveries, scope=tx)
            later = await self._enqueue(ids, tx)
        await self._enqueue_now(later, None)
        return ids

    # --- the delivery job (W2-W5) ------------------------------------------------------------

    async def _target(self, url: str) -> _Target:
        """W5: resolve once, check every address, and aim the request at the checked one."""
        httpx = self._httpx
        parsed = httpx.URL(url)
        host = parsed.host
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            import ipaddress  # noqa: PLC0415

            ipaddress.ip_address(host)
            addresses: Sequence[str] = [host]
        except ValueError:
            try:
                addresses = await self._resolver(host, port)
            except OSError as exc:
                raise WebhookDeliveryFailedError(
                    f"the endpoint's host could not be resolved ({type(exc).__name__})."
                ) from None
        if not addresses:
            raise WebhookDeliveryFailedError("the endpoint's host resolved to no address.")
        for address in addresses:
            why = refused_address(host, address, self.allow)
            if why is not None:
                raise WebhookDestinationRefusedError(
                    f"the endpoint's host {host!r} resolves to a refused destination: {why} (W5).",
                    fix="point the endpoint at a public address, or allow this host or network"
                    " explicitly: create_webhook_sender(allow=[...]).",
                )
        address = addresses[0]
        if self._given_client is None:
            # Our client connects (host, port) to the checked address itself (_pinned_client).
            return _Target(parsed, {}, {}, {(host, port): address})
        # A client of yours: the URL names the checked address, Host and the TLS server name
        # keep the host's name (its pool is then keyed by address).
        extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
        headers = {"host": parsed.netloc.decode("ascii")}
        return _Target(parsed.copy_with(host=address), headers, extensions, {})

    async def _post(
        self, target: _Target, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, str | None]:
        client = self._http()
        request = client.build_request(
            "POST",
            target.url,
            content=body,
            headers={**headers, **target.headers},
            extensions=target.extensions,
        )
        pinned = _PINS.set(target.pins)
        try:
            response = await client.send(request, stream=True, follow_redirects=False)
        finally:
            _PINS.reset(pinned)
        try:
            chunks = bytearray()
            async for chunk in response.aiter_bytes():
                chunks += chunk
                if len(chunks) > 4 * MAX_BODY_EXCERPT:
                    break
        finally:
            await response.aclose()
        text = bytes(chunks).decode("utf-8", errors="replace")
        return response.status_code, text, response.headers.get("retry-after")

    async def _end(
        self, delivery: WebhookDeliveryRecord, attempt: DeliveryAttempt, state: DeliveryState
    ) -> None:
        """W3: the attempt recorded first; W4: an ended delivery moves the endpoint's streak
        (one statement on PostgreSQL)."""
        await self.store.end_attempt(
            delivery.id, attempt, state=state, disable_after=self.disable_after
        )

    async def _ready(
        self, payload: dict[str, Any]
    ) -> tuple[WebhookDeliveryRecord, WebhookEndpointRecord] | None:
        """The delivery and its endpoint when there is something to send, else None."""
        delivery_id = payload.get("delivery_id")
        if not isinstance(delivery_id, str):
            raise TerminalError("a webhook delivery run carries no delivery_id")
        found = await self.store.get_for_send(delivery_id)
        if found is None:
            raise TerminalError(f"webhook delivery {delivery_id!r} does not exist")
        delivery, endpoint = found
        if delivery.state in ("delivered", "failed"):
            return None  # a duplicate run of an ended delivery: nothing to send
        if endpoint is None:
            gone = DeliveryAttempt(self.clock.now(), None, 0.0, error="the endpoint is gone")
            await self.store.record_attempt(delivery.id, gone, state="failed")
            raise TerminalError(f"webhook delivery {delivery_id}: its endpoint no longer exists")
        if endpoint.state == "disabled":
            # W4: waits without spending an attempt; enable_endpoint enqueues it again.
            await self.store.set_delivery_state(delivery.id, "paused")
            return None
        return delivery, endpoint

    async def _deliver(self, ctx: JobContext, payload: dict[str, Any]) -> None:
        found = await self._ready(payload)
        if found is None:
            return
        delivery, endpoint = found
        at = self.clock.now()
        where = f"webhook delivery {delivery.id} to endpoint {endpoint.id}"
        started = time.perf_counter()
        try:
            target = await self._target(endpoint.url)
        except WebhookDestinationRefusedError as exc:
            await self._end(delivery, DeliveryAttempt(at, None, 0.0, error=exc.message), "failed")
            raise TerminalError(f"{where}: {exc.message}") from None
        except WebhookDeliveryFailedError as exc:
            attempt = DeliveryAttempt(at, None, 0.0, error=str(exc))
            await self._end(delivery, attempt, "failed" if ctx.is_final_attempt else "pending")
            raise
        body = json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False).encode()
        headers = webhook_headers(endpoint.active_secrets(at), delivery.id, at, body)
        headers["content-type"] = "application/json"
        headers["user-agent"] = "ship-sqla-webhooks"
        retry_after: float | None = None
        status: int | None = None
        text: str | None = None
        error: str | None = None
        try:
            status, text, retry_header = await self._post(target, headers, body)
        except self._httpx.HTTPError as exc:
            error = excerpt(f"{type(exc).__name__}: {exc}", MAX_ERROR_LENGTH)
            outcome: Classification = "retry"
        else:
            outcome = classify_status(status)
            retry_after = _retry_after(retry_header, self.clock.now())
        attempt = DeliveryAttempt(at, status, time.perf_counter() - started, excerpt(text), error)
        state: DeliveryState = (
            "delivered"
            if outcome == "delivered"
            else "failed"
            if outcome == "terminal" or ctx.is_final_attempt
            else "pending"
        )
        await self._end(delivery, attempt, state)
        if state == "delivered":
            return
        answer = f"HTTP {status}" if status is not None else f"no answer ({error})"
        if outcome == "terminal":
            raise TerminalError(f"{where}: {answer} is a terminal answer (W3)")
        if retry_after is not None:
            raise RetryAfter(retry_after, f"{where}: {answer}")
        raise WebhookDeliveryFailedError(f"{where}: {answer}")


class _NoTransaction:
    """The in-memory store's stand-in for a transaction block: the scope itself."""

    def __init__(self, scope: Any) -> None:  # noqa: ANN401
        self._scope = scope

    async def __aenter__(self) -> Any:  # noqa: ANN401
        return self._scope

    async def __aexit__(self, *exc: object) -> None:
        return None


def _unknown(endpoint_id: str) -> WebhookEndpointUnknownError:
    return WebhookEndpointUnknownError(
        f"no webhook endpoint has id {endpoint_id!r} (for this tenant).",
        fix="list the endpoints (ship-sqla webhooks endpoints list) for the ids.",
    )


def create_webhook_sender(
    *,
    backend: JobBackend,
    database: Database | None = None,
    store: WebhookDeliveryStore | None = None,
    allow: Sequence[str] = (),
    http_client: httpx.AsyncClient | None = None,
    resolver: Resolver | None = None,
    clock: Clock | None = None,
    retry: RetryPolicy = DEFAULT_WEBHOOK_RETRY,
    disable_after: int = DEFAULT_DISABLE_AFTER,
    timeout: float = 10.0,
    http2: bool = False,
    job_id: str = DEFAULT_JOB_ID,
    concurrency: Concurrency | None = None,
) -> WebhookSender:
    """A webhook sender (SPEC §16, W1-W5) enqueueing its deliveries on ``backend``; register
    ``sender.jobs`` with the worker. Its endpoints and deliveries are in ``store``
    (:func:`create_webhook_delivery_store` for other table names), else the default tables of
    ``database`` (an ``AsyncEngine``).

    ``allow``: host names or CIDRs W5 lets through although they are loopback, private or
    link-local (``["127.0.0.1/32"]`` for a local receiver in tests). ``http_client``: an
    ``httpx.AsyncClient`` of yours (else one pooled client per sender, ``timeout`` seconds,
    HTTP/2 only with ``http2=True``, redirects never followed, proxies from the environment
    ignored). ``resolver``: ``async (host, port) -> [addresses]`` (default the system's).
    ``retry``: the delivery job's policy (W3's backoff and Retry-After clamp).
    ``disable_after``: W4's N consecutive failed deliveries (default 20). ``concurrency``: the
    delivery job's (a fleet-wide cap, the lease a crashed worker's deliveries wait out)."""
    from ship_sqla.kernel._clock import SystemClock  # noqa: PLC0415

    if store is None:
        if database is None:
            raise ConfigurationError(
                "create_webhook_sender needs database= (or store=).",
                fix="create_webhook_sender(database=engine, backend=backend).",
            )
        store = create_webhook_delivery_store(database=database, clock=clock)
    return WebhookSender(
        store=store,
        backend=backend,
        allow=allow,
        http_client=http_client,
        resolver=resolver,
        clock=clock or getattr(store, "clock", None) or SystemClock(),
        retry=retry,
        disable_after=disable_after,
        timeout=timeout,
        http2=http2,
        job_id=job_id,
        concurrency=concurrency,
    )
