"""Outbound webhooks (SPEC §16, W1-W5): the endpoint and delivery records, their store port,
and the pure rules a delivery follows (no I/O here: the sender in ``ship_sqla._webhooks`` does
the HTTP, the stores do the SQL).

- W1: a delivery is a row of the deliveries table plus one job run whose payload is only the
  delivery id (``{"delivery_id": ...}``), both written in the caller's unit of work.
- W2: the delivery id is the ``webhook-id``, stable across retries; the secrets live in the
  endpoints table only, read at send time, and never in a payload, an error or a log line.
- W3: :func:`classify_status` says what an HTTP answer means for the delivery.
- W4: :data:`DEFAULT_DISABLE_AFTER` consecutive FAILED DELIVERIES (a delivery fails when it
  ends failed: a terminal answer, a refused destination, or its attempts spent; a retried
  attempt does not count, a delivered one resets the streak) disable the endpoint.
- W5: :func:`refused_address` says why an address must not be connected to, unless allowed.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Protocol

import attrs

from ship_sqla.kernel._errors import ConfigurationError, RefusedError, UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DEFAULT_DISABLE_AFTER",
    "MAX_BODY_EXCERPT",
    "DeliveryAttempt",
    "DeliveryState",
    "EndpointState",
    "WebhookDeliveryRecord",
    "WebhookDeliveryStore",
    "WebhookDestinationRefusedError",
    "WebhookEndpointRecord",
    "WebhookEndpointUnknownError",
    "WebhookSecret",
    "classify_status",
    "refused_address",
]

EndpointState = Literal["enabled", "disabled"]
DeliveryState = Literal["pending", "delivered", "failed", "paused"]
"""pending: a job run will send it; delivered: a 2xx answer; failed: terminal, or its attempts
spent; paused: its endpoint is disabled (W4), it waits without spending an attempt."""

DEFAULT_DISABLE_AFTER: Final = 20
"""W4's N: an endpoint is disabled after this many consecutive failed deliveries."""

MAX_BODY_EXCERPT: Final = 1024
"""W3: at most this many characters of an answer's body are recorded per attempt."""

MAX_ERROR_LENGTH: Final = 500

RETRYABLE_4XX: Final = frozenset({408, 409, 425, 429})

Classification = Literal["delivered", "retry", "terminal"]


class WebhookDestinationRefusedError(RefusedError):
    """W5: the endpoint's address is loopback, private, link-local (the cloud metadata address
    among them), unspecified, multicast or otherwise not public, and not allowed."""

    code: ClassVar[str] = "SHIP_SQLA_WEBHOOK_DESTINATION_REFUSED"


class WebhookEndpointUnknownError(UsageError, LookupError):
    """No webhook endpoint has that id (or it belongs to another tenant)."""

    code: ClassVar[str] = "SHIP_SQLA_WEBHOOK_ENDPOINT_UNKNOWN"


@attrs.frozen
class WebhookSecret:
    """One signing secret (``whsec_<base64>``) of an endpoint; ``expires_at`` set on the old
    one by a rotation (None: in force until rotated out)."""

    value: str = attrs.field(repr=False)
    added_at: datetime
    expires_at: datetime | None = None

    def active(self, now: datetime) -> bool:
        return self.expires_at is None or now < self.expires_at


@attrs.frozen
class WebhookEndpointRecord:
    id: str
    url: str
    topics: tuple[str, ...]
    tenant: str | None
    state: EndpointState
    disabled_reason: str | None
    consecutive_failures: int
    created_at: datetime
    updated_at: datetime
    secrets: tuple[WebhookSecret, ...] = attrs.field(repr=False)

    def active_secrets(self, now: datetime) -> list[str]:
        """W2: every secret in force at ``now`` (two during a rotation window)."""
        return [s.value for s in self.secrets if s.active(now)]

    def subscribed(self, topic: str) -> bool:
        return topic in self.topics or "*" in self.topics


@attrs.frozen
class DeliveryAttempt:
    """One attempt (W3): when, the HTTP status (None: no answer), how long, a bounded excerpt
    of the answer's body, the error (no answer, or a refused destination)."""

    at: datetime
    status: int | None
    duration: float
    body: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "status": self.status,
            "duration": self.duration,
            "body": self.body,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> DeliveryAttempt:
        return cls(
            at=datetime.fromisoformat(value["at"]),
            status=value.get("status"),
            duration=float(value.get("duration", 0.0)),
            body=value.get("body"),
            error=value.get("error"),
        )


@attrs.frozen
class WebhookDeliveryRecord:
    """One delivery of one event to one endpoint; ``id`` is its ``webhook-id`` (W1, W2)."""

    id: str
    endpoint_id: str
    topic: str
    payload: Any
    tenant: str | None
    state: DeliveryState
    attempts: tuple[DeliveryAttempt, ...]
    created_at: datetime
    updated_at: datetime


def excerpt(text: str | None, limit: int = MAX_BODY_EXCERPT) -> str | None:
    """At most ``limit`` characters, marked when cut (never a silent truncation)."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters]"


def classify_status(status: int) -> Classification:
    """W3: 2xx delivered; 408, 409, 425, 429 and 5xx retried; any other answer (1xx, 3xx: a
    redirect is never followed, other 4xx) terminal."""
    if 200 <= status < 300:  # noqa: PLR2004 - the HTTP classes
        return "delivered"
    if status in RETRYABLE_4XX or 500 <= status < 600:  # noqa: PLR2004
        return "retry"
    return "terminal"


def _allowed(
    host: str,
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    allow: Sequence[str],
) -> bool:
    for entry in allow:
        if entry.lower() == host.lower():
            return True
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue
        if address.version == network.version and address in network:
            return True
    return False


def refused_address(host: str, address: str, allow: Sequence[str]) -> str | None:
    """W5: why ``address`` (resolved from ``host``) must not be connected to, or None.

    Refused: loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
    (169.254/16, which holds the 169.254.169.254 metadata address, fe80::/10), unspecified,
    multicast, and every other address that is not globally routable (an IPv4-mapped IPv6
    address is judged as the IPv4 one), unless ``allow`` names the host or a network holding
    the address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if _allowed(host, ip, allow):
        return None
    for kind, flag in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
    ):
        if flag:
            return f"{address} is a {kind} address"
    if not ip.is_global:
        return f"{address} is not a public address"
    return None


def check_allow(allow: Sequence[str]) -> tuple[str, ...]:
    """The allowlist as given, each entry a host name or a CIDR (checked now, not at send)."""
    if isinstance(allow, str):
        raise ConfigurationError(
            "allow must be a list of host names or CIDRs, got one string.",
            fix=f"pass allow=[{allow!r}].",
        )
    return tuple(entry.strip() for entry in allow if entry.strip())


class WebhookDeliveryStore(Protocol):
    """The outbound webhooks' store port: endpoints and deliveries. ``scope`` is where a write
    runs (the caller's unit of work for ``insert_deliveries``: W1); Any keeps the kernel
    ORM-free."""

    async def add_endpoint(
        self,
        *,
        endpoint_id: str,
        url: str,
        topics: Sequence[str],
        secret: str,
        tenant: str | None,
    ) -> WebhookEndpointRecord: ...

    async def get_endpoint(self, endpoint_id: str) -> WebhookEndpointRecord | None: ...

    async def list_endpoints(self, *, limit: int) -> list[WebhookEndpointRecord]: ...

    async def subscribed_endpoints(
        self, topic: str, *, tenant: str | None, scope: object = None
    ) -> list[WebhookEndpointRecord]:
        """The enabled endpoints of ``tenant`` whose topics hold ``topic`` (or ``*``)."""
        ...

    async def set_endpoint_state(
        self, endpoint_id: str, state: EndpointState, *, reason: str | None, scope: object = None
    ) -> WebhookEndpointRecord | None:
        """Enable (the failure streak back to 0) or disable with a reason."""
        ...

    async def rotate_secret(
        self, endpoint_id: str, *, secret: str, old_expires_at: datetime
    ) -> WebhookEndpointRecord | None:
        """Add ``secret``; every secret in force expires at ``old_expires_at`` (W2's window:
        both sign until then); expired ones are dropped."""
        ...

    async def insert_deliveries(
        self, deliveries: Sequence[WebhookDeliveryRecord], *, scope: object = None
    ) -> None: ...

    async def get_delivery(self, delivery_id: str) -> WebhookDeliveryRecord | None: ...

    async def list_deliveries(
        self,
        *,
        endpoint_id: str | None = None,
        state: DeliveryState | None = None,
        limit: int,
    ) -> list[WebhookDeliveryRecord]:
        """Newest first."""
        ...

    async def record_attempt(
        self, delivery_id: str, attempt: DeliveryAttempt, *, state: DeliveryState
    ) -> WebhookDeliveryRecord | None:
        """W3: append ``attempt`` and set ``state``, before the next attempt is planned."""
        ...

    async def set_delivery_state(
        self, delivery_id: str, state: DeliveryState, *, scope: object = None
    ) -> WebhookDeliveryRecord | None: ...

    async def record_outcome(
        self, endpoint_id: str, *, delivered: bool, disable_after: int
    ) -> WebhookEndpointRecord | None:
        """W4: a delivered delivery resets the endpoint's streak; a failed one adds one, and
        the endpoint is disabled when the streak reaches ``disable_after``."""
        ...

    async def resume_paused(self, endpoint_id: str, *, scope: object = None) -> list[str]:
        """W4: every paused delivery of the endpoint back to pending; their ids."""
        ...

    async def get_for_send(
        self, delivery_id: str
    ) -> tuple[WebhookDeliveryRecord, WebhookEndpointRecord | None] | None:
        """A delivery and its endpoint (None: gone), read together: what an attempt needs."""
        ...

    async def end_attempt(
        self,
        delivery_id: str,
        attempt: DeliveryAttempt,
        *,
        state: DeliveryState,
        disable_after: int,
    ) -> None:
        """:meth:`record_attempt` and, when ``state`` ends the delivery (delivered or failed),
        :meth:`record_outcome` on its endpoint, at once (W3's record, W4's streak)."""
        ...
