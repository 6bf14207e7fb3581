"""A consumer over a table-backed stream (SPEC §15 C1-C3): order events appended by other code,
folded into per-customer totals, each batch and its cursor committed in one transaction.

    python examples/consumer.py        # or: python -m examples.consumer

Extras: the ``embedded`` extra unless ``SHIP_SQLA_DATABASE_URL`` names a server, which it then
uses, in a scratch database it drops at the end. It appends 250 events, arms the consumer (its
supervisor's run), waits until the cursor reached the last event, and prints the totals and the
key's progress (lag, batches, items).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    Identity,
    MetaData,
    Table,
    Text,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ship_sqla import (
    JobContext,
    create_job_backend,
    create_unit_of_work,
    ship_job_runs_table,
    ship_job_state_table,
    start_job_runtime,
)
from ship_sqla.consumers import define_consumer
from ship_sqla.testing import DatabaseFactory, resolve_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla import TransactionScope
    from ship_sqla.consumers import Consumer, ConsumerProgress

metadata = MetaData()
job_runs = ship_job_runs_table(metadata)
job_state = ship_job_state_table(metadata)
# The stream: rows other code appends, in id order.
order_events = Table(
    "order_events",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("customer", Text, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
)
# The effect: a total per customer.
customer_totals = Table(
    "customer_totals",
    metadata,
    Column("customer", Text, primary_key=True),
    Column("total_cents", BigInteger, nullable=False),
)
# The cursor seam's table: one row per consumer key.
consumer_cursors = Table(
    "consumer_cursors",
    metadata,
    Column("key", Text, primary_key=True),
    Column("position", BigInteger, nullable=False),
)
EVENTS = 250
PAGE = 100


@attrs.frozen
class Repositories:
    scope: TransactionScope

    async def add_to_total(self, customer: str, amount_cents: int) -> None:
        statement = pg_insert(customer_totals).values(customer=customer, total_cents=amount_cents)
        await self.scope.connection.execute(
            statement.on_conflict_do_update(
                index_elements=[customer_totals.c.customer],
                set_={"total_cents": customer_totals.c.total_cents + amount_cents},
            )
        )

    async def cursor_of(self, key: str) -> int | None:
        statement = select(consumer_cursors.c.position).where(consumer_cursors.c.key == key)
        return (await self.scope.connection.execute(statement)).scalar_one_or_none()

    async def save_cursor(self, key: str, position: int) -> None:
        statement = pg_insert(consumer_cursors).values(key=key, position=position)
        await self.scope.connection.execute(
            statement.on_conflict_do_update(
                index_elements=[consumer_cursors.c.key], set_={"position": position}
            )
        )


class Cursors:
    """The consumer's cursor seam: the application's own table, written in each batch's
    transaction."""

    async def load(self, key: str, repos: Repositories) -> int | None:
        return await repos.cursor_of(key)

    async def save(self, key: str, cursor: int, repos: Repositories) -> None:
        await repos.save_cursor(key, cursor)


def order_totals_consumer(engine: AsyncEngine, caught_up: asyncio.Event) -> Consumer[Any, int]:
    uow = create_unit_of_work(engine, repositories=Repositories)

    async def keys(_ctx: JobContext) -> list[str]:
        return ["orders"]  # one stream; a partitioned one lists a key per partition

    async def read(_ctx: JobContext, _key: str, cursor: int | None) -> AsyncIterator[Any]:
        # Page by page, each page in its own short read: no snapshot is held between batches.
        after = cursor or 0
        while True:
            async with engine.connect() as connection:
                page = (
                    await connection.execute(
                        select(order_events)
                        .where(order_events.c.id > after)
                        .order_by(order_events.c.id)
                        .limit(PAGE)
                    )
                ).all()
            if not page:
                return
            for event in page:
                after = event.id
                yield event

    async def handle(_ctx: JobContext, _key: str, events: list[Any], repos: Repositories) -> int:
        for event in events:
            await repos.add_to_total(event.customer, event.amount_cents)
        return int(events[-1].id)  # the cursor past the batch, saved in this transaction

    async def lag(_ctx: JobContext, _key: str, cursor: int) -> int:
        async with engine.connect() as connection:
            statement = select(func.count()).where(order_events.c.id > cursor)
            behind = int((await connection.execute(statement)).scalar_one())
        if behind == 0:
            caught_up.set()
        return behind

    return define_consumer(
        "orders.totals",
        keys=keys,
        open=read,
        handle=handle,
        cursor=Cursors(),
        transaction=uow,
        batch=50,
        rearm=1,
        lag=lag,
    )


async def run(engine: AsyncEngine) -> tuple[dict[str, int], ConsumerProgress]:
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            insert(order_events),
            [{"customer": f"c{n % 5}", "amount_cents": 100 + n} for n in range(EVENTS)],
        )
    backend = create_job_backend(database=engine, table=job_runs, state_table=job_state)
    caught_up = asyncio.Event()
    consumer = order_totals_consumer(engine, caught_up)
    async with await start_job_runtime(list(consumer.jobs), backend=backend, poll_interval=0.05):
        # Arm now rather than at the supervisor's next tick (every rearm minutes, UTC).
        await backend.enqueue(consumer.supervisor, {})
        async with asyncio.timeout(30):
            await caught_up.wait()
    progress = consumer.progress("orders")
    assert progress is not None
    async with engine.connect() as connection:
        rows = (await connection.execute(select(customer_totals))).all()
    totals = {row.customer: row.total_cents for row in rows}
    print(f"totals    : {dict(sorted(totals.items()))}")
    print(f"progress  : lag={progress.lag} batches={progress.batches} items={progress.items}")
    return totals, progress


async def main() -> None:
    server = resolve_server(prefer_embedded=True)
    print(f"PostgreSQL: {server.source}")
    async with DatabaseFactory(server).private(name="ship_sqla_consumer_example") as (_, engine):
        await run(engine)


if __name__ == "__main__":
    asyncio.run(main())
