"""Keyset paging as a property: random data (many ties), random orderings, filters and page
sizes; paging returns every matching row exactly once, in order."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    Column,
    Date,
    DateTime,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    insert,
)
from tests.property.strategies import (
    PortalDatabase,
    amounts,
    created_ats,
    days,
    order_specs,
    portal_database,
    statuses,
    tenants,
)

from ship_sqla import BoundRepository, Projection, TableRepository, create_unit_of_work
from ship_sqla.testing import ResolvedServer

metadata = MetaData()
table = Table(
    "prop_paging_orders",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # "C" collation: PostgreSQL then orders text by code point, as Python's sort does.
    Column("status", String(collation="C"), nullable=False),
    Column("amount", Numeric(12, 2), nullable=False),
    Column("day", Date, nullable=False),
    PrimaryKeyConstraint("tenant_id", "id", name="prop_paging_orders_pkey"),
)
MAX_PAGE = 6
ORDERABLE = ("created_at", "status", "amount", "day", "id")


@attrs.frozen
class Summary:
    id: int
    status: str


SUMMARY = Projection(name="summary", columns=("id", "status"), into=Summary)
orders = TableRepository(
    table, tenant_column="tenant_id", max_page_size=MAX_PAGE, projections=(SUMMARY,)
)
rows_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "tenant_id": tenants,
            "created_at": created_ats,
            "status": statuses,
            "amount": amounts,
            "day": days,
        }
    ),
    max_size=25,
)
filters = st.one_of(
    st.none(),
    statuses.map(lambda status: ("status", status)),
    amounts.map(lambda amount: ("amount>=", amount)),
)


@pytest.fixture(scope="module")
def database(ship_server: ResolvedServer) -> Iterator[PortalDatabase]:
    with portal_database(ship_server, metadata) as db:
        yield db


def matches(row: dict[str, Any], where: tuple[str, Any] | None) -> bool:
    if where is None:
        return True
    kind, value = where
    return bool(row["status"] == value if kind == "status" else row["amount"] >= value)


def sql_filter(where: tuple[str, Any] | None) -> Any:
    if where is None:
        return None
    kind, value = where
    return {"status": value} if kind == "status" else table.c.amount >= value


def model_order(rows: list[dict[str, Any]], order: tuple[str, ...]) -> list[int]:
    """The rows' ids in ``order`` then id in the last term's direction (stable sorts, last term
    first)."""
    terms = [(spec.lstrip("-"), spec.startswith("-")) for spec in order]
    if "id" not in {name for name, _ in terms}:
        terms.append(("id", terms[-1][1] if terms else False))
    ordered = list(rows)
    for name, descending in reversed(terms):
        ordered.sort(key=lambda row: row[name], reverse=descending)
    return [row["id"] for row in ordered]


@given(
    rows=rows_strategy,
    order=order_specs(ORDERABLE),
    where=filters,
    sizes=st.lists(st.integers(min_value=1, max_value=MAX_PAGE), min_size=1, max_size=4),
    tenant=tenants,
    projected=st.booleans(),
)
@settings(max_examples=50, deadline=None)
def test_paging_returns_every_matching_row_once_in_order(
    database: PortalDatabase,
    *,
    rows: list[dict[str, Any]],
    order: tuple[str, ...],
    where: tuple[str, Any] | None,
    sizes: list[int],
    tenant: str,
    projected: bool,
) -> None:
    """Paging with any page sizes, over data with duplicate ordering values, returns every
    matching row of the tenant (R2) exactly once, in order, each page within its limit (R1),
    with no empty page and no cursor after the last; projections page the same way (R4)."""
    database.truncate()
    stored = [row | {"id": i} for i, row in enumerate(rows)]

    async def load() -> None:
        if stored:
            async with database.engine.begin() as connection:
                await connection.execute(insert(table), stored)

    database.run(load)
    uow = create_unit_of_work(database.engine, repositories=orders.for_scope)
    where_clause = sql_filter(where)
    seen: list[int] = []
    cursor: str | None = None
    for page_number in range(len(stored) + 2):
        limit = sizes[page_number % len(sizes)]

        async def one_page(
            repo: BoundRepository, limit: int = limit, cursor: str | None = cursor
        ) -> tuple[list[int], Any]:
            if projected:
                page = await repo.project(
                    SUMMARY, where_clause, order_by=order, limit=limit, cursor=cursor
                )
                return [item.id for item in page.items], page.next_cursor
            rows_page = await repo.find(where_clause, order_by=order, limit=limit, cursor=cursor)
            assert all(row["tenant_id"] == tenant for row in rows_page.items)
            return [row["id"] for row in rows_page.items], rows_page.next_cursor

        ids, cursor = database.run(lambda: uow.run(one_page, tenant=tenant))
        assert len(ids) <= limit
        assert ids or (page_number == 0 and cursor is None), "an empty page after the first"
        seen += ids
        if cursor is None:
            break
    else:
        pytest.fail("paging did not end")
    mine = [row for row in stored if row["tenant_id"] == tenant and matches(row, where)]
    assert seen == model_order(mine, order)


def test_model_order_breaks_ties_by_key() -> None:
    def row(key: int, status: str, day: int) -> dict[str, Any]:
        return {"id": key, "status": status, "created_at": datetime(2024, 1, day, tzinfo=UTC)}

    rows = [row(2, "a", 1), row(1, "a", 1), row(3, "b", 2)]
    assert model_order(rows, ("-status",)) == [3, 2, 1]  # id follows the last direction
    assert model_order(rows, ("status", "-id")) == [2, 1, 3]
    assert model_order(rows, ("-created_at", "status")) == [3, 1, 2]
