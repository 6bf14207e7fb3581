# ruff: noqa: ARG002 - scope= is the port's; this model joins no transaction
"""The in-memory :class:`~ship_sqla.kernel._webhooks_out.WebhookDeliveryStore` (SPEC §16): the
reference model the conformance suite runs beside the PostgreSQL store. ``scope`` is accepted
and ignored: this model joins no transaction (a rollback's W1 is proven on PostgreSQL)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._webhooks_out import (
    DeliveryAttempt,
    DeliveryState,
    EndpointState,
    WebhookDeliveryRecord,
    WebhookEndpointRecord,
    WebhookSecret,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from ship_sqla.kernel._clock import Clock

__all__ = ["InMemoryWebhookDeliveryStore"]


class InMemoryWebhookDeliveryStore:
    """Endpoints and deliveries in dicts, on ``clock``."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._endpoints: dict[str, WebhookEndpointRecord] = {}
        self._deliveries: dict[str, WebhookDeliveryRecord] = {}

    async def add_endpoint(
        self,
        *,
        endpoint_id: str,
        url: str,
        topics: Sequence[str],
        secret: str,
        tenant: str | None,
    ) -> WebhookEndpointRecord:
        now = self.clock.now()
        endpoint = WebhookEndpointRecord(
            id=endpoint_id,
            url=url,
            topics=tuple(topics),
            tenant=tenant,
            state="enabled",
            disabled_reason=None,
            consecutive_failures=0,
            created_at=now,
            updated_at=now,
            secrets=(WebhookSecret(secret, now),),
        )
        self._endpoints.setdefault(endpoint_id, endpoint)
        return self._endpoints[endpoint_id]

    async def get_endpoint(self, endpoint_id: str) -> WebhookEndpointRecord | None:
        return self._endpoints.get(endpoint_id)

    async def list_endpoints(self, *, limit: int) -> list[WebhookEndpointRecord]:
        return [self._endpoints[k] for k in sorted(self._endpoints)][:limit]

    async def subscribed_endpoints(
        self, topic: str, *, tenant: str | None, scope: object = None
    ) -> list[WebhookEndpointRecord]:
        return [
            e
            for k, e in sorted(self._endpoints.items())
            if e.state == "enabled" and e.tenant == tenant and e.subscribed(topic)
        ]

    def _change(self, endpoint_id: str, **changes: Any) -> WebhookEndpointRecord | None:  # noqa: ANN401
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            return None
        endpoint = attrs.evolve(endpoint, updated_at=self.clock.now(), **changes)
        self._endpoints[endpoint_id] = endpoint
        return endpoint

    async def set_endpoint_state(
        self, endpoint_id: str, state: EndpointState, *, reason: str | None, scope: object = None
    ) -> WebhookEndpointRecord | None:
        if state == "enabled":
            return self._change(
                endpoint_id, state=state, disabled_reason=None, consecutive_failures=0
            )
        return self._change(endpoint_id, state=state, disabled_reason=reason)

    async def rotate_secret(
        self, endpoint_id: str, *, secret: str, old_expires_at: datetime
    ) -> WebhookEndpointRecord | None:
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            return None
        now = self.clock.now()
        kept = tuple(
            attrs.evolve(s, expires_at=min(old_expires_at, s.expires_at or old_expires_at))
            for s in endpoint.secrets
            if s.active(now)
        )
        return self._change(endpoint_id, secrets=(*kept, WebhookSecret(secret, now)))

    async def insert_deliveries(
        self, deliveries: Sequence[WebhookDeliveryRecord], *, scope: object = None
    ) -> None:
        for delivery in deliveries:
            self._deliveries[delivery.id] = delivery

    async def get_delivery(self, delivery_id: str) -> WebhookDeliveryRecord | None:
        return self._deliveries.get(delivery_id)

    async def list_deliveries(
        self,
        *,
        endpoint_id: str | None = None,
        state: DeliveryState | None = None,
        limit: int,
    ) -> list[WebhookDeliveryRecord]:
        found = [
            d
            for d in self._deliveries.values()
            if (endpoint_id is None or d.endpoint_id == endpoint_id)
            and (state is None or d.state == state)
        ]
        return sorted(found, key=lambda d: d.id, reverse=True)[:limit]

    def _set(self, delivery_id: str, **changes: Any) -> WebhookDeliveryRecord | None:  # noqa: ANN401
        delivery = self._deliveries.get(delivery_id)
        if delivery is None:
            return None
        delivery = attrs.evolve(delivery, updated_at=self.clock.now(), **changes)
        self._deliveries[delivery_id] = delivery
        return delivery

    async def record_attempt(
        self, delivery_id: str, attempt: DeliveryAttempt, *, state: DeliveryState
    ) -> WebhookDeliveryRecord | None:
        delivery = self._deliveries.get(delivery_id)
        if delivery is None:
            return None
        return self._set(delivery_id, state=state, attempts=(*delivery.attempts, attempt))

    async def set_delivery_state(
        self, delivery_id: str, state: DeliveryState, *, scope: object = None
    ) -> WebhookDeliveryRecord | None:
        return self._set(delivery_id, state=state)

    async def record_outcome(
        self, endpoint_id: str, *, delivered: bool, disable_after: int
    ) -> WebhookEndpointRecord | None:
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            return None
        if delivered:
            return self._change(endpoint_id, consecutive_failures=0)
        failures = endpoint.consecutive_failures + 1
        if failures >= disable_after and endpoint.state == "enabled":
            return self._change(
                endpoint_id,
                consecutive_failures=failures,
                state="disabled",
                disabled_reason=f"{failures} consecutive failed deliveries",
            )
        return self._change(endpoint_id, consecutive_failures=failures)

    async def resume_paused(self, endpoint_id: str, *, scope: object = None) -> list[str]:
        ids = [
            d.id
            for d in self._deliveries.values()
            if d.endpoint_id == endpoint_id and d.state == "paused"
        ]
        for delivery_id in ids:
            self._set(delivery_id, state="pending")
        return sorted(ids)

    async def get_for_send(
        self, delivery_id: str
    ) -> tuple[WebhookDeliveryRecord, WebhookEndpointRecord | None] | None:
        delivery = self._deliveries.get(delivery_id)
        if delivery is None:
            return None
        return delivery, self._endpoints.get(delivery.endpoint_id)

    async def end_attempt(
        self,
        delivery_id: str,
        attempt: DeliveryAttempt,
        *,
        state: DeliveryState,
        disable_after: int,
    ) -> None:
        delivery = await self.record_attempt(delivery_id, attempt, state=state)
        if delivery is not None and state in ("delivered", "failed"):
            await self.record_outcome(
                delivery.endpoint_id, delivered=state == "delivered", disable_after=disable_after
            )
