"""An order saga as a durable workflow (docs/workflows.md): charge, reserve stock, wait for the
carrier's shipping webhook, then notify; when the webhook does not come in time, compensate.

    python -m examples.order_saga        (or: python examples/order_saga.py)

It uses the server ``SHIP_SQLA_DATABASE_URL`` names, else the embedded one (the ``embedded``
extra: ``pip install 'ship-sqla[embedded]'``), in a scratch database it drops at the end.

What it shows
-------------
- Placing an order writes the order row and enqueues its workflow run in ONE unit of work: no
  order without its saga, no saga without its order.
- ``charge`` and ``reserve`` are transactional steps (``ctx.transaction``): the payment row and
  the stock decrement commit with the step's stored result, so they happen exactly once
  however often the run is replayed (D2).
- ``ctx.wait_for_event("shipped", "order.shipped", key=order_id, timeout=...)`` suspends the run
  without a slot, lease or attempt (D3) until the event, or until the timeout passes by the
  database's clock (D4).
- The carrier's webhook is recorded by the webhook event store (deduplicated by its delivery id)
  and turned into the event by ``backend.publish_event`` in the SAME unit of work, with the
  order's status change: the record, the status and the event commit together or not at all.
- On timeout a transactional ``compensate`` step refunds the charge and releases the stock. It
  changes the order only while it is still ``reserved``: a webhook that committed before the
  wait began (an event the wait never sees, D4) or just after it timed out has already marked
  the order shipped, and then nothing is refunded.
- ``notify`` is a plain step (``ctx.step``, at least once, with its own retries): an e-mail sent
  twice after a crash is acceptable here. For exactly once, enqueue an outbox message in a
  transactional step instead.

Two orders run: one gets its webhook (delivered twice: the duplicate is acknowledged and
publishes nothing), the other times out after ``SHIPPING_TIMEOUT`` seconds and is compensated.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    CheckConstraint,
    Column,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    insert,
    select,
    update,
)

from ship_sqla import (
    JobContext,
    TransactionScope,
    create_job_backend,
    create_job_operations,
    create_unit_of_work,
    create_webhook_event_store,
    define_job,
    ship_idempotency_table,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
    ship_job_workers_table,
    ship_outbox_table,
    ship_webhook_events_table,
    start_job_runtime,
)
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.testing import DatabaseFactory, resolve_server
from ship_sqla.workflows import StepRetry

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla import UnitOfWork
    from ship_sqla.jobs import JobOperations, PostgresJobBackend
    from ship_sqla.webhooks import WebhookEventStore

SHIPPING_TIMEOUT = 1.0
"""Seconds an order waits for its shipping webhook (days in real life; short for the demo)."""
SHIPPED = "order.shipped"
CARRIER = "carrier"

metadata = MetaData()
# The ship tables, on the application's metadata (Alembic would create them).
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)
job_steps = ship_job_steps_table(metadata)  # the workflows' stored steps
job_events = ship_job_events_table(metadata)  # and their events
job_workers = ship_job_workers_table(metadata)  # the worker registry (F6)
webhook_events = ship_webhook_events_table(metadata)
# The webhook store cleans up the idempotency keys and checks the outbox link of its events.
outbox = ship_outbox_table(metadata)
idempotency = ship_idempotency_table(metadata)

orders = Table(
    "example_saga_orders",
    metadata,
    Column("id", Text, nullable=False),
    Column("sku", Text, nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("cents", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("tracking", Text, nullable=True),
    PrimaryKeyConstraint("id", name="example_saga_orders_pkey"),
    CheckConstraint(
        "status IN ('placed', 'reserved', 'shipped', 'cancelled')",
        name="example_saga_orders_status_check",
    ),
)
payments = Table(
    "example_saga_payments",
    metadata,
    Column("order_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("cents", Integer, nullable=False),
    # One charge and at most one refund per order: a second one would be a bug, not a retry.
    PrimaryKeyConstraint("order_id", "kind", name="example_saga_payments_pkey"),
    CheckConstraint("kind IN ('charge', 'refund')", name="example_saga_payments_kind_check"),
)
stock = Table(
    "example_saga_stock",
    metadata,
    Column("sku", Text, nullable=False),
    Column("available", Integer, nullable=False),
    PrimaryKeyConstraint("sku", name="example_saga_stock_pkey"),
    CheckConstraint("available >= 0", name="example_saga_stock_available_check"),
)


@attrs.frozen
class Order:
    order_id: str
    sku: str
    quantity: int
    cents: int


class Shop:
    """The domain writes, bound to one unit of work's scope (what its handlers see)."""

    def __init__(self, scope: TransactionScope) -> None:
        self._connection = scope.connection

    async def place(self, order: Order) -> None:
        await self._connection.execute(
            insert(orders).values(
                id=order.order_id,
                sku=order.sku,
                quantity=order.quantity,
                cents=order.cents,
                status="placed",
            )
        )

    async def charge(self, order: Order) -> str:
        # A real shop would call its payment provider with the order id as idempotency key and
        # store the provider's answer here; the row and the step's result commit together.
        await self._connection.execute(
            insert(payments).values(order_id=order.order_id, kind="charge", cents=order.cents)
        )
        return f"charged {order.cents}"

    async def reserve(self, order: Order) -> bool:
        taken = await self._connection.execute(
            update(stock)
            .where(stock.c.sku == order.sku, stock.c.available >= order.quantity)
            .values(available=stock.c.available - order.quantity)
            .returning(stock.c.available)
        )
        if taken.first() is None:
            return False
        await self._set_status(order.order_id, "reserved", when="placed")
        return True

    async def compensate(self, order: Order, *, release: bool) -> str:
        """Refund (and release the stock) unless the order shipped meanwhile."""
        expected = "reserved" if release else "placed"
        if not await self._set_status(order.order_id, "cancelled", when=expected):
            return "shipped"  # the webhook won the race: keep the charge
        await self._connection.execute(
            insert(payments).values(order_id=order.order_id, kind="refund", cents=order.cents)
        )
        if release:
            await self._connection.execute(
                update(stock)
                .where(stock.c.sku == order.sku)
                .values(available=stock.c.available + order.quantity)
            )
        return "cancelled"

    async def mark_shipped(self, order_id: str, tracking: str) -> bool:
        return await self._set_status(order_id, "shipped", when="reserved", tracking=tracking)

    async def _set_status(
        self, order_id: str, status: str, *, when: str, tracking: str | None = None
    ) -> bool:
        """Move the order from ``when`` to ``status``; False when it was not in ``when``. The row
        lock orders a compensation and a webhook racing for the same order."""
        values: dict[str, Any] = {"status": status}
        if tracking is not None:
            values["tracking"] = tracking
        changed = await self._connection.execute(
            update(orders)
            .where(orders.c.id == order_id, orders.c.status == when)
            .values(**values)
            .returning(orders.c.id)
        )
        return changed.first() is not None


class Mailer:
    """Stands in for an e-mail provider."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, order_id: str, outcome: str) -> str:
        self.sent.append(f"{order_id}: {outcome}")
        return f"mail for {order_id}: your order is {outcome}"


@attrs.define
class Saga:
    """The pieces of the application the workflow and the webhook use."""

    uow: UnitOfWork[Shop]
    backend: PostgresJobBackend
    webhooks: WebhookEventStore
    mailer: Mailer = attrs.Factory(Mailer)
    outcomes: dict[str, str] = attrs.Factory(dict)

    async def fulfil(self, ctx: JobContext, order: Order) -> None:
        """The workflow. Every call below is a named step: a replay (after a crash, a retry, the
        wait) returns stored results and continues at the first step not done."""
        await ctx.transaction("charge", self.uow, lambda shop: shop.charge(order))
        reserved = await ctx.transaction("reserve", self.uow, lambda shop: shop.reserve(order))
        outcome = "out of stock"
        if reserved:
            shipped = await ctx.wait_for_event(
                "shipped", SHIPPED, key=order.order_id, timeout=SHIPPING_TIMEOUT
            )
            outcome = "shipped" if shipped is not None else "timed out"
        if outcome != "shipped":
            # Also when the wait timed out: the webhook may have come before the wait began.
            outcome = await ctx.transaction(
                "compensate", self.uow, lambda shop: shop.compensate(order, release=reserved)
            )
        await ctx.step(
            "notify",
            lambda: self.mailer.send(order.order_id, outcome),
            retry=StepRetry(attempts=3, delay=0.1),
        )
        self.outcomes[order.order_id] = outcome

    async def receive_shipping_webhook(self, delivery_id: str, body: dict[str, Any]) -> str:
        """What the carrier's (verified) webhook does: record the delivery once, mark the order
        shipped and publish the event, in one unit of work. An HTTP endpoint would verify the
        Standard Webhooks signature first (``verify_webhook``, docs/idempotency-and-webhooks.md)."""

        async def handler(shop: Shop) -> str:
            recorded = await self.webhooks.record(CARRIER, delivery_id, body)
            if recorded.duplicate:
                return "duplicate: acknowledged, nothing published"
            order_id = str(body["order_id"])
            if not await shop.mark_shipped(order_id, str(body["tracking"])):
                return "refused: the order is not reserved (cancelled?)"  # a human looks
            await self.backend.publish_event(SHIPPED, body, key=order_id)
            return "accepted: the order is shipped, its workflow woken"

        return await self.uow.run(handler)


def build(engine: AsyncEngine) -> Saga:
    backend = create_job_backend(
        database=engine,
        table=job_runs,
        state_table=job_state,
        steps_table=job_steps,
        events_table=job_events,
        workers_table=job_workers,
    )
    webhooks = create_webhook_event_store(
        database=engine, table=webhook_events, outbox_table=outbox, idempotency_table=idempotency
    )
    return Saga(create_unit_of_work(engine, repositories=Shop), backend, webhooks)


async def allow_everything(_permission: str, _operation: str) -> bool:
    return True  # an application checks its operator's role here


async def until_waiting_for_event(ops: JobOperations, run_id: str) -> None:
    """Until the run is suspended in its wait: an event committed before that is not its (D4)."""
    async with asyncio.timeout(30):
        while True:
            record = await ops.get_run(run_id)
            if record is not None and record.wait_for is not None:
                return
            await asyncio.sleep(0.02)


async def until_finished(ops: JobOperations, run_id: str) -> str:
    async with asyncio.timeout(30):
        while True:
            record = await ops.get_run(run_id)
            if record is not None and record.state not in ("waiting", "running"):
                return record.state
            await asyncio.sleep(0.05)


async def run(engine: AsyncEngine) -> Saga:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(insert(stock).values(sku="book", available=5))
    saga = build(engine)
    fulfil = define_job(
        "orders.fulfil",
        saga.fulfil,
        payload=Order,
        concurrency=Concurrency(lease=30.0),
        retry=RetryPolicy(attempts=5, base_delay=0.1),
    )
    ops = create_job_operations(saga.backend, authorizer=allow_everything)
    runtime = await start_job_runtime([fulfil], backend=saga.backend, poll_interval=0.1)
    try:
        run_ids: dict[str, str] = {}
        for order in (Order("A-1", "book", 2, 2500), Order("B-2", "book", 1, 1250)):

            async def place(shop: Shop, order: Order = order) -> str | None:
                await shop.place(order)
                # Joins this unit of work: the order and its workflow run commit together.
                return (await saga.backend.enqueue(fulfil, order, run_id=order.order_id)).run_id

            run_id = await saga.uow.run(place)
            assert run_id is not None
            run_ids[order.order_id] = run_id

        await until_waiting_for_event(ops, run_ids["A-1"])
        body = {"order_id": "A-1", "tracking": "TRACK-123"}
        print("webhook   :", await saga.receive_shipping_webhook("dlv_1", body))
        print("redelivery:", await saga.receive_shipping_webhook("dlv_1", body))
        # B-2 gets no webhook: its wait times out and it is compensated.
        for order_id, run_id in run_ids.items():
            print(f"run {order_id}   : {await until_finished(ops, run_id)}")
            for step in await ops.list_steps(run_id):
                print(f"  {step.seq} {step.name:<10} {step.kind:<11} -> {step.result}")
    finally:
        await runtime.stop()

    async with engine.connect() as connection:
        status = dict((await connection.execute(select(orders.c.id, orders.c.status))).all())
        paid = sorted(tuple(row) for row in await connection.execute(select(payments)))
        left = (await connection.execute(select(stock.c.available))).scalar_one()
    print("orders    :", status)
    print("payments  :", paid)
    print("stock left:", left)
    print("mails     :", saga.mailer.sent)
    assert status == {"A-1": "shipped", "B-2": "cancelled"}, status
    assert paid == [("A-1", "charge", 2500), ("B-2", "charge", 1250), ("B-2", "refund", 1250)]
    assert left == 3, left  # A-1's two books shipped; B-2's one came back
    return saga


async def main() -> None:
    server = resolve_server(prefer_embedded=True)
    print(f"PostgreSQL: {server.source}")
    async with DatabaseFactory(server).private(name="ship_sqla_order_saga_example") as (_, engine):
        await run(engine)


if __name__ == "__main__":
    asyncio.run(main())
