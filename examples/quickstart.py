"""The quickstart: a table, a domain repository, a unit of work for two tenants, a projection.

Extras: the ``embedded`` extra (``pip install 'ship-sqla[embedded]'``) unless
``SHIP_SQLA_DATABASE_URL`` names a server, which it then uses. From the repository root::

    python examples/quickstart.py        # or: python -m examples.quickstart
"""

from __future__ import annotations

import asyncio
import sys
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

if __package__ in (None, ""):  # run as `python examples/quickstart.py`: find the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.schema import metadata, orders
from ship_sqla import (
    BoundRepository,
    Page,
    Projection,
    TableRepository,
    TransactionScope,
    create_unit_of_work,
)
from ship_sqla.testing import DatabaseFactory, resolve_server

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


@attrs.frozen
class OrderSummary:
    """What a list screen needs: never the whole row."""

    id: int
    status: str
    total: Decimal


SUMMARY = Projection(name="order_summary", columns=("id", "status", "total"), into=OrderSummary)

# Declared once, next to the table: tenancy, key, version column, bounds and projections.
ORDERS = TableRepository(
    orders,
    tenant_column="tenant_id",
    key="id",
    version_column="version",
    max_page_size=50,
    projections=(SUMMARY,),
    default_order=("-created_at",),
)


class OrderRepository:
    """The domain repository handlers see: intent-named methods, no SQL, no tenant argument."""

    def __init__(self, rows: BoundRepository) -> None:
        self._rows = rows

    async def place(self, order_id: int, customer: str, total: Decimal) -> None:
        await self._rows.insert({"id": order_id, "customer": customer, "total": total})

    async def mark_paid(self, order_id: int, *, version: int) -> None:
        await self._rows.update(order_id, {"status": "paid"}, expected_version=version)

    async def summaries(self, *, limit: int = 20) -> Page[OrderSummary]:
        return await self._rows.project(SUMMARY, limit=limit)

    async def count_open(self) -> int:
        return await self._rows.count({"status": "open"}, up_to=1000)


@attrs.frozen
class Repositories:
    orders: OrderRepository


def repositories(scope: TransactionScope) -> Repositories:
    return Repositories(orders=OrderRepository(ORDERS.for_scope(scope)))


async def run_demo(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    uow = create_unit_of_work(engine, repositories=repositories)

    async def open_orders(repos: Repositories) -> None:
        await repos.orders.place(1, "Ada", Decimal("12.50"))
        await repos.orders.place(2, "Grace", Decimal("99.00"))

    async def one_order(repos: Repositories) -> None:
        await repos.orders.place(1, "Linus", Decimal("5.00"))  # same id, another tenant

    await uow.run(open_orders, tenant="acme")
    await uow.run(one_order, tenant="globex")

    async def pay_first(repos: Repositories) -> None:
        await repos.orders.mark_paid(1, version=1)

    await uow.run(pay_first, tenant="acme")

    for tenant in ("acme", "globex"):

        async def report(repos: Repositories) -> tuple[Page[OrderSummary], int]:
            return await repos.orders.summaries(), await repos.orders.count_open()

        page, still_open = await uow.run(report, tenant=tenant)
        print(f"tenant {tenant}: {still_open} open")
        for summary in page.items:
            print(f"  order {summary.id}: {summary.status:<6} {summary.total}")


async def main() -> None:
    server = resolve_server(prefer_embedded=True)
    print(f"PostgreSQL: {server.source}")
    async with DatabaseFactory(server).private(name="ship_sqla_quickstart") as (_, engine):
        await run_demo(engine)


if __name__ == "__main__":
    asyncio.run(main())
