"""An orders service on Starlette: an idempotent ``POST /orders`` and a webhook endpoint.

What it shows
-------------
- ``POST /orders`` sits behind :class:`~ship_sqla.asgi.IdempotencyKeyMiddleware`. The order row
  and its ``order.created`` outbox message are written in ONE unit of work, together with the
  idempotency claim and the stored response. A client that retries with the same
  ``Idempotency-Key`` gets the stored 201 back (with ``Idempotent-Replayed: true``) and no second
  order or message is written; a concurrent retry gets 409, a reused key with another body 422.
- An order over the customer's credit limit is rejected (422) AFTER its row and message were
  written: the whole unit of work rolls back, claim included (``store_client_errors=False``,
  because Starlette's exception handlers turn the exception into a response inside the route).
- ``POST /webhooks/{name}`` is a :class:`~ship_sqla.asgi.WebhookReceiver`: it verifies the
  Standard Webhooks signature over the raw body, then records the event, claims its
  ``webhook-id`` and enqueues a ``payments.event`` outbox message in one unit of work and answers
  202; a redelivery is answered 200 and enqueues nothing.
- :data:`metadata` holds the application's table and the three ship tables, so Alembic's
  autogenerate sees them all.

An outbox relay (``ship_sqla`` outbox) would deliver the messages; it is left out here.

Extras: ``starlette`` and ``httpx`` (``pip install 'ship-sqla[dev]'`` has both), and the
``embedded`` extra unless ``SHIP_SQLA_DATABASE_URL`` names a server. Run the demo (it starts the
embedded PostgreSQL unless ``SHIP_SQLA_DATABASE_URL`` is set), from the repository root::

    python examples/orders_app.py        # or: python -m examples.orders_app

Serve it with any ASGI server, e.g. ``uvicorn --factory examples.orders_app:create_app_from_env``
with ``SHIP_SQLA_DATABASE_URL`` set and ``ORDERS_WEBHOOK_SECRET`` holding the ``whsec_`` secret.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs
import httpx
from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import UUID
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ship_sqla import (
    TransactionScope,
    UnitOfWork,
    create_engine,
    create_idempotency_store,
    create_outbox,
    create_unit_of_work,
    create_webhook_event_store,
    ship_idempotency_table,
    ship_outbox_table,
    ship_webhook_events_table,
)
from ship_sqla.asgi import IdempotencyKeyMiddleware, WebhookEndpoint, WebhookReceiver
from ship_sqla.testing import DatabaseFactory, resolve_server
from ship_sqla.webhooks import WebhookEventStore, webhook_headers

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sqlalchemy.ext.asyncio import AsyncEngine
    from starlette.requests import Request

    from ship_sqla.idempotency import IdempotencyStore
    from ship_sqla.kernel import Clock
    from ship_sqla.outbox import Outbox

ORDERS_OUTBOX = "orders"
DEFAULT_CREDIT_LIMIT_CENTS = 100_000

metadata = MetaData()

orders = Table(
    "example_orders",
    metadata,
    Column("id", UUID(as_uuid=True), nullable=False),
    Column("customer", Text, nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("id", name="example_orders_pkey"),
    CheckConstraint("total_cents > 0", name="example_orders_total_check"),
    Index("example_orders_customer_idx", "customer"),
)
outbox_table = ship_outbox_table(metadata)
idempotency_table = ship_idempotency_table(metadata)
webhook_events_table = ship_webhook_events_table(metadata)


class CreditLimitExceededError(Exception):
    """The order would take the customer's open total over their credit limit."""


# -- the domain: what handlers see -----------------------------------------------------------


class OrderRepository:
    """Intent-named methods over the orders table, bound to one unit of work's scope."""

    def __init__(self, scope: TransactionScope) -> None:
        self._scope = scope

    async def add(self, customer: str, total_cents: int) -> uuid.UUID:
        order_id = uuid.uuid4()
        await self._scope.connection.execute(
            insert(orders).values(id=order_id, customer=customer, total_cents=total_cents)
        )
        return order_id

    async def total_for(self, customer: str) -> int:
        statement = select(func.coalesce(func.sum(orders.c.total_cents), 0)).where(
            orders.c.customer == customer
        )
        return int((await self._scope.connection.execute(statement)).scalar_one())


class Events:
    """Domain events leave through the outbox, in the same transaction as the change."""

    def __init__(self, scope: TransactionScope, outbox: Outbox) -> None:
        self._scope = scope
        self._outbox = outbox

    async def publish(self, topic: str, payload: Mapping[str, Any]) -> None:
        await self._outbox.enqueue(ORDERS_OUTBOX, topic, payload, scope=self._scope)


@attrs.frozen
class Repositories:
    orders: OrderRepository
    events: Events


@attrs.frozen
class Services:
    """Everything the app is built from; tests reach the stores through ``app.state.services``."""

    engine: AsyncEngine
    uow: UnitOfWork[Repositories]
    outbox: Outbox
    idempotency: IdempotencyStore
    webhook_events: WebhookEventStore
    credit_limit_cents: int


async def place_order(
    repos: Repositories, customer: str, total_cents: int, limit: int
) -> uuid.UUID:
    """Write the order and its event, then check credit: a rejection undoes both (U1)."""
    order_id = await repos.orders.add(customer, total_cents)
    await repos.events.publish(
        "order.created",
        {"order_id": str(order_id), "customer": customer, "total_cents": total_cents},
    )
    if await repos.orders.total_for(customer) > limit:
        raise CreditLimitExceededError(customer)
    return order_id


# -- HTTP ------------------------------------------------------------------------------------


async def create_order(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        body = await request.json()
        customer, total_cents = str(body["customer"]), int(body["total_cents"])
    except (ValueError, KeyError, TypeError):
        return JSONResponse(
            {"error": "send a JSON object with customer (string) and total_cents (integer)"},
            status_code=400,
        )
    if total_cents <= 0:
        return JSONResponse({"error": "total_cents must be positive"}, status_code=400)

    async def handler(repos: Repositories) -> uuid.UUID:
        return await place_order(repos, customer, total_cents, services.credit_limit_cents)

    # This run joins the middleware's unit of work (same engine): the order, its outbox message,
    # the idempotency claim and the stored response commit together.
    order_id = await services.uow.run(handler)
    return JSONResponse(
        {"id": str(order_id), "customer": customer, "total_cents": total_cents},
        status_code=201,
        headers={"location": f"/orders/{order_id}"},
    )


async def credit_limit_exceeded(_request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"credit limit exceeded for {exc}"}, status_code=422)


def build_app(
    engine: AsyncEngine,
    *,
    webhook_secrets: Mapping[str, Sequence[str]],
    clock: Clock | None = None,
    credit_limit_cents: int = DEFAULT_CREDIT_LIMIT_CENTS,
) -> Starlette:
    """The application over ``engine``. ``webhook_secrets``: ``{webhook name: [whsec_...]}``."""
    outbox = create_outbox(database=engine, table=outbox_table, clock=clock)
    idempotency = create_idempotency_store(
        database=engine, table=idempotency_table, clock=clock, lock_timeout=timedelta(seconds=1)
    )
    webhook_events = create_webhook_event_store(
        database=engine,
        table=webhook_events_table,
        outbox_table=outbox_table,
        idempotency_table=idempotency_table,
        clock=clock,
    )

    def repositories(scope: TransactionScope) -> Repositories:
        return Repositories(orders=OrderRepository(scope), events=Events(scope, outbox))

    services = Services(
        engine=engine,
        uow=create_unit_of_work(engine, repositories=repositories),
        outbox=outbox,
        idempotency=idempotency,
        webhook_events=webhook_events,
        credit_limit_cents=credit_limit_cents,
    )
    receiver = WebhookReceiver(
        endpoints=[
            WebhookEndpoint(name, secrets=list(secrets), topic=f"{name}.event")
            for name, secrets in webhook_secrets.items()
        ],
        events=webhook_events,
        idempotency=idempotency,
        outbox=outbox,
        clock=clock,
    )
    idempotent = Middleware(IdempotencyKeyMiddleware, store=idempotency, store_client_errors=False)
    app = Starlette(
        routes=[
            Route("/orders", create_order, methods=["POST"], middleware=[idempotent]),
            Route("/webhooks/{name}", receiver, methods=["POST"]),
        ],
        exception_handlers={CreditLimitExceededError: credit_limit_exceeded},
    )
    app.state.services = services
    return app


def create_app_from_env() -> Starlette:
    """For ASGI servers: ``SHIP_SQLA_DATABASE_URL`` and ``ORDERS_WEBHOOK_SECRET`` (whsec_...)."""
    engine = create_engine(os.environ["SHIP_SQLA_DATABASE_URL"])
    return build_app(engine, webhook_secrets={"payments": [os.environ["ORDERS_WEBHOOK_SECRET"]]})


# -- the demo --------------------------------------------------------------------------------


async def run_demo(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    app = build_app(engine, webhook_secrets={"payments": [secret]}, credit_limit_cents=50_000)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://orders") as client:
        order = {"customer": "ada", "total_cents": 1250}
        headers = {"idempotency-key": f'"{uuid.uuid4()}"'}
        first = await client.post("/orders", json=order, headers=headers)
        retry = await client.post("/orders", json=order, headers=headers)
        print(f"POST /orders        -> {first.status_code} {first.json()}")
        replayed = retry.headers.get("idempotent-replayed")
        same = retry.json() == first.json()
        print(f"retry, same key     -> {retry.status_code} replayed={replayed} same={same}")
        big = {"customer": "ada", "total_cents": 60_000}
        rejected = await client.post(
            "/orders", json=big, headers={"idempotency-key": f'"{uuid.uuid4()}"'}
        )
        print(f"over credit limit   -> {rejected.status_code} {rejected.json()}")

        body = json.dumps({"type": "payment.succeeded", "order": first.json()["id"]}).encode()
        signed = webhook_headers(secret, "msg_demo_1", datetime.now(UTC), body)
        delivered = await client.post("/webhooks/payments", content=body, headers=signed)
        redelivered = await client.post("/webhooks/payments", content=body, headers=signed)
        print(f"webhook delivery    -> {delivered.status_code} {delivered.json()}")
        print(f"webhook redelivery  -> {redelivered.status_code} {redelivered.json()}")
        forged = {**signed, "webhook-signature": "v1,Zm9yZ2Vk"}
        refused = await client.post("/webhooks/payments", content=body, headers=forged)
        print(f"forged signature    -> {refused.status_code} {refused.json()['code']}")

    async with engine.connect() as connection:
        counted = {
            table.name: (await connection.execute(select(func.count()).select_from(table))).scalar()
            for table in (orders, outbox_table, idempotency_table, webhook_events_table)
        }
    print(f"rows: {counted}")
    assert counted == {
        "example_orders": 1,
        "ship_outbox": 2,
        "ship_idempotency": 2,
        "ship_webhook_events": 1,
    }, counted


async def main() -> None:
    server = resolve_server(prefer_embedded=True)
    print(f"PostgreSQL: {server.source}")
    async with DatabaseFactory(server).private(name="ship_sqla_orders_example") as (_, engine):
        await run_demo(engine)


if __name__ == "__main__":
    asyncio.run(main())
