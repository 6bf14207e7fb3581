"""Purging delivered outbox messages (retention): only delivered rows of the outbox, past their
age, in TID-range statements that read only their pages."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._outbox import Outbox, create_outbox, create_outbox_operations, ship_outbox_table
from ship_sqla.errors import ConfigurationError
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def outbox(engine: AsyncEngine, ship_clock: FrozenClock) -> Outbox:
    return create_outbox(database=engine, table=table, clock=ship_clock, max_attempts=1)


def allow(permission: str, operation: str) -> bool:
    return permission == "ship.outbox:manage"


async def statuses(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as connection:
        result = await connection.execute(select(table.c.outbox_id, table.c.state, table.c.payload))
        counts: dict[str, int] = {}
        for outbox_id, status, _ in result:
            key = f"{outbox_id}:{status}"
            counts[key] = counts.get(key, 0) + 1
        return counts


async def deliver(outbox: Outbox, outbox_id: str, count: int) -> None:
    messages = await outbox.claim(outbox_id, count, 30.0)
    assert len(messages) == count
    assert await outbox.complete_many(messages) == ["delivered"] * count


async def test_purge_deletes_only_old_delivered_rows_of_the_outbox(
    outbox: Outbox, engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """Delivered rows of this outbox completed at least older_than ago go, in statements of
    one page each here; recent deliveries, pending, claimed and dead rows, and another outbox's
    delivered rows stay. Nothing is lost that a relay still owes anyone."""
    for n in range(300):
        await outbox.enqueue("orders", "order.placed", {"n": n, "pad": "x" * 200})
    await deliver(outbox, "orders", 250)
    await outbox.enqueue("billing", "invoice.sent", {"n": 0})
    await deliver(outbox, "billing", 1)
    ship_clock.advance(timedelta(days=8))
    await deliver(outbox, "orders", 20)  # delivered recently: kept
    [claimed, to_fail] = await outbox.claim("orders", 2, 30.0)
    assert await outbox.fail(to_fail, "boom") == "dead"  # max_attempts=1
    before = await statuses(engine)
    assert before == {
        "orders:delivered": 270,
        "orders:pending": 28,
        "orders:claimed": 1,
        "orders:dead": 1,
        "billing:delivered": 1,
    }

    ops = create_outbox_operations(outbox, authorizer=allow)
    deleted = await ops.purge_delivered(
        "orders", older_than=timedelta(days=7), pages_per_statement=1
    )

    assert deleted == 250
    assert await statuses(engine) == {**before, "orders:delivered": 20}
    assert await outbox.get(claimed.id) is not None


async def test_purge_statement_reads_only_its_pages(outbox: Outbox, engine: AsyncEngine) -> None:
    """The purge's DELETE is a TID range scan over its page range, never a scan of the table."""
    for n in range(200):
        await outbox.enqueue("orders", "order.placed", {"n": n, "pad": "x" * 200})
    statement = outbox._sql.purge_delivered_in_pages
    params: dict[str, Any] = {
        "first_page": 2,
        "end_page": 4,
        "outbox": "orders",
        "age": 0.0,
        "now": None,
    }
    async with engine.connect() as connection:
        await connection.exec_driver_sql("ANALYZE " + table.name)
        plan = (
            await connection.exec_driver_sql("EXPLAIN (FORMAT JSON) " + _inlined(statement, params))
        ).scalar_one()
        await connection.rollback()
    document = json.loads(plan) if isinstance(plan, str) else plan
    nodes = _nodes(document[0]["Plan"])
    assert any(node["Node Type"] == "Tid Range Scan" for node in nodes), nodes
    assert not any(node["Node Type"] == "Seq Scan" for node in nodes), nodes


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _inlined(statement: Any, params: dict[str, Any]) -> str:
    """The statement with its parameters inlined as literals (for EXPLAIN)."""
    sql = str(statement.compile(dialect=postgresql.dialect()))
    for name, value in params.items():
        sql = sql.replace(f"%({name})s", _literal(value))
    return sql


async def test_purge_refuses_bad_arguments(outbox: Outbox) -> None:
    ops = create_outbox_operations(outbox, authorizer=allow)
    with pytest.raises(ConfigurationError, match="older_than"):
        await ops.purge_delivered("orders", older_than=-1)
    with pytest.raises(ConfigurationError, match="pages_per_statement"):
        await ops.purge_delivered("orders", older_than=0, pages_per_statement=0)
