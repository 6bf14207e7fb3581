"""``ship-sqla demo``: a unit of work, the outbox and a job, end to end, in a few seconds.

It needs no configuration: the server is ``SHIP_SQLA_DATABASE_URL`` when set, else the embedded
one from the ``embedded`` extra, so it runs the same with or without a local PostgreSQL.
Everything happens in a scratch database that
is dropped at the end. The module defines its own small table: the ``examples`` package, whose
``examples.quickstart`` is the annotated version to read, is not installed with the wheel.
Public API only, as an application would write it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

import asyncpg
import attrs
import click
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla._outbox import (
    Outbox,
    OutboxMessage,
    create_outbox,
    ship_outbox_table,
    start_outbox_relay,
)
from ship_sqla._repository import BoundRepository, TableRepository
from ship_sqla._server import ResolvedServer, directory_bytes, embedded_dir, resolve_server
from ship_sqla._uow import create_unit_of_work
from ship_sqla.kernel._errors import ShipError, TenantRequiredError
from ship_sqla.kernel._jobs import Concurrency, JobDefinition, RetryPolicy, define_job
from ship_sqla.kernel._runtime.runtime import JobRuntime, start_job_runtime
from ship_sqla.testing._databases import DatabaseFactory

if TYPE_CHECKING:
    import uuid

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla._scope import TransactionScope
    from ship_sqla.kernel._job_context import JobContext

__all__ = ["DemoFailedError", "main"]

WAIT_SECONDS: Final = 30.0
"""How long a step may wait for the relay or the worker before the demo fails (never hangs)."""
OUTBOX_ID: Final = "orders"

metadata = MetaData()
demo_orders = Table(
    "ship_demo_orders",
    metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("id", Integer, nullable=False),
    Column("customer", String(200), nullable=False),
    Column("total", Numeric(12, 2), nullable=False),
    PrimaryKeyConstraint("tenant_id", "id", name="ship_demo_orders_pkey"),
)
outbox_table = ship_outbox_table(metadata)
job_runs = ship_job_runs_table(metadata)
job_history = ship_job_history_table(metadata)  # J16: finished runs leave the runs table
job_state = ship_job_state_table(metadata)
job_workers = ship_job_workers_table(metadata)

ORDERS = TableRepository(demo_orders, tenant_column="tenant_id", key="id", max_page_size=20)


class DemoFailedError(ShipError):
    """The demo could not finish (the CLI prints this and exits 1)."""

    code = "SHIP_SQLA_DEMO_FAILED"


class _ChangedMyMindError(Exception):
    """Raised by the last unit of work to show that a rollback takes everything with it."""


@attrs.frozen
class Receipt:
    """The job's payload."""

    tenant: str
    order_id: int
    customer: str


@attrs.frozen
class Placed:
    message_id: uuid.UUID
    run_id: str | None


@attrs.frozen
class Shop:
    """The domain repository a handler sees: one intent, three writes, one transaction."""

    orders: BoundRepository
    tenant: str
    outbox: Outbox
    runtime: JobRuntime
    receipts: JobDefinition[Receipt]

    async def place_order(self, order_id: int, customer: str, total: Decimal) -> Placed:
        await self.orders.insert({"id": order_id, "customer": customer, "total": total})
        # Both join the running unit of work: they commit or roll back with the row.
        message_id = await self.outbox.enqueue(
            OUTBOX_ID, "order.placed", {"order_id": order_id, "total": str(total)}
        )
        result = await self.runtime.enqueue(
            self.receipts, Receipt(tenant=self.tenant, order_id=order_id, customer=customer)
        )
        return Placed(message_id=message_id, run_id=result.run_id)


def _say(text: str) -> None:
    click.echo(text)


def _describe(server: ResolvedServer) -> str:
    if server.source == "local":
        return f"the local server on {server.url.host}:{server.url.port}"
    if server.source == "embedded":
        where = embedded_dir()
        size = directory_bytes(where) / 1_000_000
        return (
            f"the embedded server (pgserver, from the `embedded` extra), its data in {where}"
            f" ({size:.0f} MB, kept for the next run; `ship-sqla demo --clean` removes it)"
        )
    return f"SHIP_SQLA_DATABASE_URL ({server.url.render_as_string(hide_password=True)})"


async def _next(queue: asyncio.Queue[Any], what: str) -> Any:  # noqa: ANN401 - any item
    try:
        return await asyncio.wait_for(queue.get(), timeout=WAIT_SECONDS)
    except TimeoutError as exc:
        raise DemoFailedError(
            f"the {what} did not happen within {WAIT_SECONDS:g}s.",
            fix="check the server's load and logs, then run `ship-sqla demo` again.",
        ) from exc


async def run_demo(engine: AsyncEngine) -> None:
    """Steps 1-6 on ``engine`` (an empty database)."""
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    _say(
        f"1. Created table {demo_orders.name} and the ship tables {outbox_table.name},"
        f" {job_runs.name}, {job_state.name}, {job_workers.name}."
    )

    delivered: asyncio.Queue[OutboxMessage] = asyncio.Queue()
    executed: asyncio.Queue[Receipt] = asyncio.Queue()
    completed: list[Receipt] = []

    async def printing_sink(message: OutboxMessage) -> None:
        payload = json.dumps(message.payload, sort_keys=True)
        _say(f"   relay  -> sink: {message.topic} {payload} (tenant {message.tenant})")
        delivered.put_nowait(message)

    async def send_receipt(ctx: JobContext, payload: Receipt) -> None:
        _say(
            f"   worker -> {ctx.run.job_id}: receipt for order {payload.order_id}"
            f" ({payload.customer}, tenant {payload.tenant}), attempt {ctx.run.attempt}"
        )
        completed.append(payload)
        executed.put_nowait(payload)

    receipts = define_job(
        "demo.send_receipt",
        send_receipt,
        payload=Receipt,
        concurrency=Concurrency(max=5, lease=30),
        retry=RetryPolicy(attempts=3),
    )
    outbox = create_outbox(database=engine, table=outbox_table)
    backend = create_job_backend(
        database=engine, table=job_runs, state_table=job_state, workers_table=job_workers
    )
    runtime = await start_job_runtime([receipts], backend=backend, drain_timeout=5.0)

    def shop(scope: TransactionScope) -> Shop:
        if scope.tenant is None:
            raise TenantRequiredError(
                "the demo's unit of work ran without a tenant.", fix="pass tenant= to uow.run."
            )
        return Shop(ORDERS.for_scope(scope), scope.tenant, outbox, runtime, receipts)

    uow = create_unit_of_work(engine, repositories=shop)
    try:
        async with await start_outbox_relay(outbox, OUTBOX_ID, printing_sink) as relay:
            _say(f"2. Started an outbox relay (its sink prints) and a worker for {receipts.id}.")
            await _place_and_deliver(uow.run, delivered, executed)
            await _show_tenants(uow.run)
            await _roll_back(uow.run, engine, outbox, backend)
    finally:
        await runtime.stop()
    _say(
        f"7. Stopped the relay and the worker: {relay.delivered} message(s) relayed,"
        f" {len(completed)} job run(s) executed."
    )


async def _place_and_deliver(
    run: Any,  # noqa: ANN401 - UnitOfWork[Shop].run
    delivered: asyncio.Queue[OutboxMessage],
    executed: asyncio.Queue[Receipt],
) -> None:
    orders = ((3, "acme", 1, "Ada", Decimal("12.50")), (4, "globex", 1, "Linus", Decimal("5.00")))
    for step, tenant, order_id, customer, total in orders:

        async def place(shop: Shop) -> Placed:
            return await shop.place_order(order_id, customer, total)  # noqa: B023 - awaited now

        await run(place, tenant=tenant)
        _say(
            f"{step}. uow.run(tenant={tenant!r}): insert order {order_id} ({customer}), record a"
            " message, enqueue a job: one commit."
        )
        # The relay and the worker wake after the commit; wait for both before going on.
        await _next(delivered, "outbox delivery")
        await _next(executed, "job run")


async def _show_tenants(run: Any) -> None:  # noqa: ANN401 - UnitOfWork[Shop].run
    _say("5. Each tenant's repository sees only its own rows (both have an order 1):")
    for tenant in ("acme", "globex"):

        async def listing(shop: Shop) -> list[str]:
            page = await shop.orders.find(limit=20)
            return [f"order {r['id']} {r['customer']} {r['total']}" for r in page.items]

        rows = await run(listing, tenant=tenant)
        _say(f"   {tenant}: {'; '.join(rows) or '(none)'}")


async def _roll_back(
    run: Any,  # noqa: ANN401 - UnitOfWork[Shop].run
    engine: AsyncEngine,
    outbox: Outbox,
    backend: PostgresJobBackend,
) -> None:
    placed: list[Placed] = []

    async def change_of_mind(shop: Shop) -> None:
        placed.append(await shop.place_order(2, "Grace", Decimal("99.00")))
        raise _ChangedMyMindError

    try:
        await run(change_of_mind, tenant="acme")
    except _ChangedMyMindError:
        pass
    else:  # pragma: no cover - uow.run re-raises the handler's exception
        raise DemoFailedError("the unit of work did not raise.", fix="report this bug.")
    [attempt] = placed

    async def order_two(shop: Shop) -> object:
        return await shop.orders.get(2)

    row = await run(order_two, tenant="acme")
    message = await outbox.get(attempt.message_id)
    job_run = None if attempt.run_id is None else await backend.admin.get_run(attempt.run_id)
    async with engine.connect() as connection:
        total_rows = (
            await connection.execute(select(func.count()).select_from(demo_orders))
        ).scalar_one()
    _say(
        "6. uow.run(tenant='acme'): insert order 2 (Grace), record a message, enqueue a job,"
        " then raise."
    )
    left = [
        f"order 2 {'LEFT BEHIND' if row is not None else 'absent'}",
        f"message {'LEFT BEHIND' if message is not None else 'absent'}",
        f"job run {'LEFT BEHIND' if job_run is not None else 'absent'}",
    ]
    _say(f"   rolled back: {', '.join(left)} ({total_rows} rows in {demo_orders.name}).")
    if row is not None or message is not None or job_run is not None:
        raise DemoFailedError(
            "the rolled-back unit of work left something behind.", fix="report this bug."
        )


async def _run(server: ResolvedServer) -> None:
    factory = DatabaseFactory(server)
    name = f"ship_sqla_demo_{secrets.token_hex(4)}"
    _say(f"PostgreSQL: {_describe(server)}; scratch database {name}.")
    async with factory.private(name=name) as (_, engine):
        await run_demo(engine)
    _say(f"8. Dropped the scratch database {name}.")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "(no message)"


def main() -> int:
    """Run the demo; 0 on success. Failures raise :class:`ShipError` (the CLI exits 1)."""
    started = time.monotonic()
    _say("ship-sqla demo: a unit of work, the outbox and a job, end to end.")
    # The embedded server by default, so the demo runs the same with or without a local
    # PostgreSQL; SHIP_SQLA_DATABASE_URL points it at a server instead.
    server = resolve_server(prefer_embedded=True)
    try:
        asyncio.run(_run(server))
    except (SQLAlchemyError, asyncpg.PostgresError, OSError) as exc:
        where = server.url.render_as_string(hide_password=True)
        raise DemoFailedError(
            f"the demo failed on {where}: {type(exc).__name__}: {_first_line(exc)}",
            fix="check that the server is up and that the role may log in and CREATE DATABASE;"
            " point SHIP_SQLA_DATABASE_URL at such a server, or unset it to use the local or"
            " the embedded one.",
        ) from exc
    _say(
        f"Done in {time.monotonic() - started:.1f}s. Annotated code to read:"
        " examples/quickstart.py in the source repository."
    )
    return 0
