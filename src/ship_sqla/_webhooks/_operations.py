"""The operator surface of outbound webhooks (SPEC §16, S1): endpoints (list, add, disable,
enable, rotate the secret) and deliveries (list, show, redeliver).

Reads ask ``ship.webhooks:manage`` then ``ship.webhooks:read``; each change asks
``ship.webhooks:manage``, S1's audit rule first, and writes one audit entry
(``webhooks.<method>``) that never holds a secret. ``enable_endpoint`` is W4's audited
re-enable: it resumes the endpoint's paused deliveries.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from ship_sqla.kernel._audit import AuditEntry, AuditSink, require_audit_writable
from ship_sqla.kernel._authorize import Authorizer, authorize, authorize_read, check_authorizer
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._webhooks_out import (
    DeliveryState,
    WebhookDeliveryRecord,
    WebhookEndpointRecord,
    WebhookEndpointUnknownError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ship_sqla._webhooks._sender import WebhookSender

__all__ = [
    "MANAGE_PERMISSION",
    "MAX_LISTED",
    "READ_PERMISSION",
    "WebhookOperations",
    "create_webhook_operations",
]

MANAGE_PERMISSION: Final = "ship.webhooks:manage"
READ_PERMISSION: Final = "ship.webhooks:read"
MAX_LISTED: Final = 1_000


class WebhookOperations:
    """Build with :func:`create_webhook_operations`."""

    def __init__(
        self,
        sender: WebhookSender,
        *,
        authorizer: Authorizer,
        audit: AuditSink | None = None,
        actor: str = "unnamed",
    ) -> None:
        self._sender = sender
        self._store = sender.store
        self._authorizer = check_authorizer(authorizer)
        self._audit = audit
        self._actor = actor

    async def _authorize(self, operation: str) -> None:
        await authorize(self._authorizer, MANAGE_PERMISSION, f"webhooks.{operation}")

    async def _authorize_read(self, operation: str) -> None:
        await authorize_read(
            self._authorizer, MANAGE_PERMISSION, READ_PERMISSION, f"webhooks.{operation}"
        )

    async def _audit_ready(self) -> None:
        """S1's audit rule: a configured audit that cannot be written changes nothing."""
        await require_audit_writable(self._audit)

    async def _record(self, operation: str, target: str, details: dict[str, Any]) -> None:
        if self._audit is not None:
            entry = AuditEntry(self._actor, f"webhooks.{operation}", target, 1, details)
            await self._audit.record(entry)

    async def list_endpoints(self, *, limit: int = MAX_LISTED) -> list[WebhookEndpointRecord]:
        await self._authorize_read("list_endpoints")
        return await self._store.list_endpoints(limit=max(1, min(limit, MAX_LISTED)))

    async def add_endpoint(
        self,
        url: str,
        topics: Sequence[str],
        *,
        endpoint_id: str | None = None,
        tenant: str | None = None,
        secret: str | None = None,
    ) -> tuple[WebhookEndpointRecord, str]:
        """A new endpoint and its secret (shown once: give it to the receiver)."""
        await self._authorize("add_endpoint")
        await self._audit_ready()
        endpoint = await self._sender.add_endpoint(
            url, topics, secret=secret, endpoint_id=endpoint_id, tenant=tenant
        )
        await self._record(
            "add_endpoint", endpoint.id, {"url": endpoint.url, "topics": list(endpoint.topics)}
        )
        return endpoint, endpoint.secrets[-1].value

    async def disable_endpoint(self, endpoint_id: str, *, reason: str) -> WebhookEndpointRecord:
        """Its deliveries wait (paused) until it is enabled again (W4)."""
        await self._authorize("disable_endpoint")
        if not reason.strip():
            raise ConfigurationError("a disable needs a reason.", fix="pass --reason 'why'.")
        await self._audit_ready()
        endpoint = await self._sender.disable_endpoint(endpoint_id, reason=reason)
        await self._record("disable_endpoint", endpoint_id, {"reason": reason})
        return endpoint

    async def enable_endpoint(self, endpoint_id: str) -> list[str]:
        """W4: enable it (its failure streak back to 0) and resume its paused deliveries; their
        ids."""
        await self._authorize("enable_endpoint")
        await self._audit_ready()
        before = await self._store.get_endpoint(endpoint_id)
        resumed = await self._sender.enable_endpoint(endpoint_id)
        await self._record(
            "enable_endpoint",
            endpoint_id,
            {
                "from": None if before is None else before.state,
                "reason": None if before is None else before.disabled_reason,
                "resumed": len(resumed),
            },
        )
        return resumed

    async def rotate_secret(
        self, endpoint_id: str, *, overlap: timedelta = timedelta(hours=24)
    ) -> str:
        """W2: a new secret (returned once); the old ones sign for ``overlap`` more."""
        await self._authorize("rotate_secret")
        await self._audit_ready()
        secret = await self._sender.rotate_secret(endpoint_id, overlap=overlap)
        await self._record(
            "rotate_secret", endpoint_id, {"overlap_seconds": overlap.total_seconds()}
        )
        return secret

    async def list_deliveries(
        self,
        *,
        endpoint_id: str | None = None,
        state: DeliveryState | None = None,
        limit: int = 100,
    ) -> list[WebhookDeliveryRecord]:
        await self._authorize_read("list_deliveries")
        return await self._store.list_deliveries(
            endpoint_id=endpoint_id, state=state, limit=max(1, min(limit, MAX_LISTED))
        )

    async def get_delivery(self, delivery_id: str) -> WebhookDeliveryRecord:
        await self._authorize_read("get_delivery")
        delivery = await self._store.get_delivery(delivery_id)
        if delivery is None:
            raise WebhookEndpointUnknownError(
                f"no webhook delivery has id {delivery_id!r}.",
                fix="list them: ship-sqla webhooks deliveries list.",
            )
        return delivery

    async def redeliver(self, delivery_id: str) -> WebhookDeliveryRecord:
        """Send a delivery again (pending, one new run; the same webhook-id)."""
        await self._authorize("redeliver")
        await self._audit_ready()
        before = await self._store.get_delivery(delivery_id)
        delivery = await self._sender.redeliver(delivery_id)
        await self._record(
            "redeliver", delivery_id, {"from": None if before is None else before.state}
        )
        return delivery


def create_webhook_operations(
    sender: WebhookSender,
    *,
    authorizer: Authorizer,
    audit: AuditSink | None = None,
    actor: str = "unnamed",
) -> WebhookOperations:
    """Operator operations on ``sender``'s endpoints and deliveries (SPEC §16, S1):
    ``ship.webhooks:manage`` to change, ``ship.webhooks:read`` to read, one audit entry per
    change in ``audit`` (never a secret)."""
    if audit is not None and not isinstance(audit, AuditSink):
        raise ConfigurationError(
            f"audit must be an AuditSink (an async record(entry)), got {type(audit).__name__}.",
            fix="pass create_audit_log(...) or InMemoryAuditLog(), or omit it.",
        )
    return WebhookOperations(sender, authorizer=authorizer, audit=audit, actor=actor)
