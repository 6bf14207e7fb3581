"""The PostgreSQL :class:`~ship_sqla.kernel.WebhookDeliveryStore` (SPEC §16), on the endpoints
and deliveries tables."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Table

from ship_sqla._naming import quoted_table
from ship_sqla._schema_probe import Needed, require_tables
from ship_sqla._scope import OWN, StoreConnections
from ship_sqla._sql import Statements
from ship_sqla._sql_time import now_bound
from ship_sqla._webhooks._out_sql import (
    ADD_ENDPOINT,
    APPEND_ATTEMPT,
    END_ATTEMPT,
    ENDPOINT_FOR_UPDATE,
    GET_DELIVERY,
    GET_ENDPOINT,
    GET_FOR_SEND,
    INSERT_DELIVERY,
    LIST_DELIVERIES,
    LIST_ENDPOINTS,
    RECORD_OUTCOME,
    RESUME_PAUSED,
    SET_DELIVERY_STATE,
    SET_ENDPOINT_SECRETS,
    SET_ENDPOINT_STATE,
    SUBSCRIBED_ENDPOINTS,
)
from ship_sqla._webhooks._out_tables import (
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)
from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._errors import ConfigurationError
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

    from ship_sqla._scope import Database, Within
    from ship_sqla._sql import Template
    from ship_sqla.kernel._clock import Clock

__all__ = ["PostgresWebhookDeliveryStore", "create_webhook_delivery_store"]


def _json(value: Any) -> Any:  # noqa: ANN401 - a jsonb column, decoded or not
    return json.loads(value) if isinstance(value, str) else value


def _secrets_json(secrets: Sequence[WebhookSecret]) -> str:
    return json.dumps(
        [
            {
                "value": s.value,
                "added_at": s.added_at.isoformat(),
                "expires_at": None if s.expires_at is None else s.expires_at.isoformat(),
            }
            for s in secrets
        ]
    )


def _endpoint(row: Any) -> WebhookEndpointRecord:  # noqa: ANN401 - a SQLAlchemy row
    from datetime import datetime  # noqa: PLC0415 - runtime use only here

    secrets = tuple(
        WebhookSecret(
            s["value"],
            datetime.fromisoformat(s["added_at"]),
            None if s.get("expires_at") is None else datetime.fromisoformat(s["expires_at"]),
        )
        for s in _json(row.secrets)
    )
    return WebhookEndpointRecord(
        id=row.id,
        url=row.url,
        topics=tuple(row.topics),
        tenant=row.tenant,
        state=row.state,
        disabled_reason=row.disabled_reason,
        consecutive_failures=row.consecutive_failures,
        created_at=row.created_at,
        updated_at=row.updated_at,
        secrets=secrets,
    )


def _delivery(row: Any) -> WebhookDeliveryRecord:  # noqa: ANN401 - a SQLAlchemy row
    return WebhookDeliveryRecord(
        id=row.id,
        endpoint_id=row.endpoint_id,
        topic=row.topic,
        payload=_json(row.payload),
        tenant=row.tenant,
        state=row.state,
        attempts=tuple(DeliveryAttempt.from_json(a) for a in _json(row.attempts)),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class _Prefixed:
    """The endpoint columns of a GET_FOR_SEND row (``e_``-prefixed), read as a row's."""

    def __init__(self, row: Any) -> None:  # noqa: ANN401 - a SQLAlchemy row
        self._mapping = row._mapping  # noqa: SLF001 - Row's public mapping

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        return self._mapping[f"e_{name}"]


class PostgresWebhookDeliveryStore:
    """A :class:`~ship_sqla.kernel.WebhookDeliveryStore` on two tables. Build with
    :func:`create_webhook_delivery_store`."""

    __slots__ = ("_connections", "_s", "_tables_seen", "clock", "deliveries", "endpoints")

    def __init__(
        self, *, database: Database, endpoints: Table, deliveries: Table, clock: Clock
    ) -> None:
        self.endpoints = endpoints
        self.deliveries = deliveries
        self.clock = clock
        self._tables_seen = False
        self._connections = StoreConnections(database, name="webhook delivery store")
        self._s = Statements(
            {"{endpoints}": quoted_table(endpoints), "{deliveries}": quoted_table(deliveries)}
        )

    @property
    def connections(self) -> StoreConnections:
        return self._connections

    async def require_tables(self, surface: str) -> None:
        """Raise :class:`~ship_sqla.errors.MissingTablesError` unless both tables exist."""
        if not self._tables_seen:
            self._tables_seen = await require_tables(
                self._connections,
                [
                    Needed.table(self.endpoints, "webhook-endpoints"),
                    Needed.table(self.deliveries, "webhook-deliveries"),
                ],
                surface=surface,
            )

    async def _rows(
        self, what: str, template: Template, params: dict[str, Any], scope: object = None
    ) -> Sequence[Any]:
        params = {"now": now_bound(self.clock), **params}
        return await self._connections.rows(
            what, self._s[template], params, scope=cast("Within", scope), by_name=True
        )

    async def add_endpoint(
        self,
        *,
        endpoint_id: str,
        url: str,
        topics: Sequence[str],
        secret: str,
        tenant: str | None,
    ) -> WebhookEndpointRecord:
        params = {
            "id": endpoint_id,
            "tenant": tenant,
            "url": url,
            "topics": list(topics),
            "secrets": _secrets_json([WebhookSecret(secret, self.clock.now())]),
        }
        rows = await self._rows("add endpoint", ADD_ENDPOINT, params)
        if rows:
            return _endpoint(rows[0])
        found = await self.get_endpoint(endpoint_id)
        assert found is not None  # noqa: S101 - the conflict was this id
        return found

    async def get_endpoint(self, endpoint_id: str) -> WebhookEndpointRecord | None:
        rows = await self._rows("get endpoint", GET_ENDPOINT, {"id": endpoint_id})
        return _endpoint(rows[0]) if rows else None

    async def list_endpoints(self, *, limit: int) -> list[WebhookEndpointRecord]:
        return [
            _endpoint(r)
            for r in await self._rows("list endpoints", LIST_ENDPOINTS, {"limit": limit})
        ]

    async def subscribed_endpoints(
        self, topic: str, *, tenant: str | None, scope: object = None
    ) -> list[WebhookEndpointRecord]:
        params = {"topic": topic, "tenant": tenant}
        rows = await self._rows("subscribed endpoints", SUBSCRIBED_ENDPOINTS, params, scope)
        return [_endpoint(r) for r in rows]

    async def set_endpoint_state(
        self, endpoint_id: str, state: EndpointState, *, reason: str | None, scope: object = None
    ) -> WebhookEndpointRecord | None:
        params = {"id": endpoint_id, "state": state, "reason": reason}
        rows = await self._rows("set endpoint state", SET_ENDPOINT_STATE, params, scope)
        return _endpoint(rows[0]) if rows else None

    async def rotate_secret(
        self, endpoint_id: str, *, secret: str, old_expires_at: datetime
    ) -> WebhookEndpointRecord | None:
        now = self.clock.now()
        async with self._connections.transaction("rotate secret", scope=OWN) as tx:
            params = {"now": now_bound(self.clock), "id": endpoint_id}
            row = (await tx.connection.execute(self._s[ENDPOINT_FOR_UPDATE], params)).first()
            if row is None:
                return None
            kept = [
                WebhookSecret(
                    s.value, s.added_at, min(old_expires_at, s.expires_at or old_expires_at)
                )
                for s in _endpoint(row).secrets
                if s.active(now)
            ]
            params["secrets"] = _secrets_json([*kept, WebhookSecret(secret, now)])
            written = (await tx.connection.execute(self._s[SET_ENDPOINT_SECRETS], params)).first()
            return _endpoint(written)

    async def insert_deliveries(
        self, deliveries: Sequence[WebhookDeliveryRecord], *, scope: object = None
    ) -> None:
        if not deliveries:
            return
        now = now_bound(self.clock)
        params = [
            {
                "now": now,
                "id": d.id,
                "endpoint_id": d.endpoint_id,
                "tenant": d.tenant,
                "topic": d.topic,
                "payload": json.dumps(d.payload),
            }
            for d in deliveries
        ]
        async with self._connections.transaction(
            "insert deliveries", scope=cast("Within", scope)
        ) as tx:
            await tx.connection.execute(self._s[INSERT_DELIVERY], params)

    async def get_delivery(self, delivery_id: str) -> WebhookDeliveryRecord | None:
        rows = await self._rows("get delivery", GET_DELIVERY, {"id": delivery_id})
        return _delivery(rows[0]) if rows else None

    async def list_deliveries(
        self,
        *,
        endpoint_id: str | None = None,
        state: DeliveryState | None = None,
        limit: int,
    ) -> list[WebhookDeliveryRecord]:
        params = {"endpoint_id": endpoint_id, "state": state, "limit": limit}
        return [_delivery(r) for r in await self._rows("list deliveries", LIST_DELIVERIES, params)]

    async def record_attempt(
        self, delivery_id: str, attempt: DeliveryAttempt, *, state: DeliveryState
    ) -> WebhookDeliveryRecord | None:
        params = {"id": delivery_id, "attempt": json.dumps(attempt.to_json()), "state": state}
        rows = await self._rows("record attempt", APPEND_ATTEMPT, params, OWN)
        return _delivery(rows[0]) if rows else None

    async def set_delivery_state(
        self, delivery_id: str, state: DeliveryState, *, scope: object = None
    ) -> WebhookDeliveryRecord | None:
        params = {"id": delivery_id, "state": state}
        rows = await self._rows("set delivery state", SET_DELIVERY_STATE, params, scope)
        return _delivery(rows[0]) if rows else None

    async def record_outcome(
        self, endpoint_id: str, *, delivered: bool, disable_after: int
    ) -> WebhookEndpointRecord | None:
        params = {"id": endpoint_id, "delivered": delivered, "disable_after": disable_after}
        rows = await self._rows("record outcome", RECORD_OUTCOME, params, OWN)
        return _endpoint(rows[0]) if rows else None

    async def resume_paused(self, endpoint_id: str, *, scope: object = None) -> list[str]:
        rows = await self._rows("resume paused", RESUME_PAUSED, {"endpoint_id": endpoint_id}, scope)
        return sorted(r.id for r in rows)

    async def get_for_send(
        self, delivery_id: str
    ) -> tuple[WebhookDeliveryRecord, WebhookEndpointRecord | None] | None:
        rows = await self._rows("get for send", GET_FOR_SEND, {"id": delivery_id}, OWN)
        if not rows:
            return None
        row = rows[0]
        endpoint = None if row.e_id is None else _endpoint(_Prefixed(row))
        return _delivery(row), endpoint

    async def end_attempt(
        self,
        delivery_id: str,
        attempt: DeliveryAttempt,
        *,
        state: DeliveryState,
        disable_after: int,
    ) -> None:
        params = {
            "id": delivery_id,
            "attempt": json.dumps(attempt.to_json()),
            "state": state,
            "ended": state in ("delivered", "failed"),
            "delivered": state == "delivered",
            "disable_after": disable_after,
        }
        await self._rows("end attempt", END_ATTEMPT, params, OWN)


def create_webhook_delivery_store(
    *,
    database: Database,
    endpoints_table: Table | None = None,
    deliveries_table: Table | None = None,
    clock: Clock | None = None,
) -> PostgresWebhookDeliveryStore:
    """The outbound webhooks' store on ``endpoints_table`` and ``deliveries_table`` (defaults:
    ``ship_webhook_endpoints_table`` and ``ship_webhook_deliveries_table`` with their default
    names)."""
    from sqlalchemy import MetaData  # noqa: PLC0415 - only for the default tables

    metadata = MetaData()
    endpoints = (
        endpoints_table if endpoints_table is not None else ship_webhook_endpoints_table(metadata)
    )
    deliveries = (
        deliveries_table
        if deliveries_table is not None
        else ship_webhook_deliveries_table(metadata)
    )
    for table, column, factory in (
        (endpoints, "secrets", "ship_webhook_endpoints_table"),
        (deliveries, "attempts", "ship_webhook_deliveries_table"),
    ):
        given: object = table
        if not isinstance(given, Table) or column not in table.c:
            raise ConfigurationError(
                f"expected a table made by {factory}, got {table!r}.",
                fix=f"pass {factory}(metadata, name=...).",
            )
    return PostgresWebhookDeliveryStore(
        database=database, endpoints=endpoints, deliveries=deliveries, clock=clock or SystemClock()
    )
