"""Repositories on real PostgreSQL: CRUD, tenancy (R2, R3), the expression guard (R2, R3),
bounds (R1), keyset paging, projections (R4) and joining the unit of work (U1)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import attrs
import pytest
from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    between,
    case,
    column,
    event,
    exists,
    func,
    insert,
    literal,
    literal_column,
    not_,
    or_,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from ship_sqla import (
    BoundRepository,
    Page,
    Projection,
    TableRepository,
    TransactionScope,
    create_unit_of_work,
)
from ship_sqla._repository_guard import UnsafeExpressionError
from ship_sqla.errors import (
    BoundExceededError,
    InvalidCursorError,
    RepositoryUsageError,
    ScopeClosedError,
    TenantRequiredError,
    TenantViolationError,
    UnknownProjectionError,
    VersionConflictError,
)

T = TypeVar("T")

metadata = MetaData()
orders_table = Table(
    "repo_orders",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("version", Integer, nullable=False, server_default="1"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("status", String(collation="C"), nullable=False),
    Column("amount", Numeric(12, 2), nullable=False),
    Column("note", String),
    PrimaryKeyConstraint("tenant_id", "id", name="repo_orders_pkey"),
)
lines_table = Table(
    "repo_lines",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("order_id", Integer, nullable=False),
    Column("line_no", Integer, nullable=False),
    Column("sku", String, nullable=False),
    PrimaryKeyConstraint("tenant_id", "order_id", "line_no", name="repo_lines_pkey"),
)
currencies_table = Table(
    "repo_currencies",
    metadata,
    Column("code", String, primary_key=True),
    Column("name", String, nullable=False),
)
audit_table = Table(
    "repo_audit", metadata, Column("id", Integer, primary_key=True), Column("what", String)
)


@attrs.frozen
class OrderSummary:
    id: int
    status: str


SUMMARY = Projection(name="order_summary", columns=("id", "status"), into=OrderSummary)
AMOUNTS = Projection(name="amounts", columns=("amount",), into=Decimal)

orders = TableRepository(
    orders_table,
    tenant_column="tenant_id",
    key="id",
    version_column="version",
    max_page_size=10,
    max_count=100,
    projections=(SUMMARY, Projection(name="notes", columns=("id", "note"), into=dict)),
)
lines = TableRepository(lines_table, tenant_column="tenant_id", key=("order_id", "line_no"))
currencies = TableRepository(
    currencies_table,
    untenanted="ISO currency reference data, the same for every tenant",
    key="code",
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.fixture
async def conn(ship_connection: AsyncConnection) -> AsyncConnection:
    await ship_connection.run_sync(metadata.create_all)
    return ship_connection


async def in_tenant(
    conn: AsyncConnection,
    tenant: str | None,
    work: Callable[[BoundRepository], Awaitable[T]],
    *,
    repository: TableRepository = orders,
) -> T:
    """Run ``work`` with ``repository`` bound to a unit-of-work scope of ``tenant``."""
    uow = create_unit_of_work(conn, repositories=repository.for_scope)
    return await uow.run(work, tenant=tenant)


def order(i: int, **values: Any) -> dict[str, Any]:
    row = {
        "id": i,
        "created_at": T0 + timedelta(minutes=i % 3),
        "status": "open",
        "amount": Decimal(i),
    }
    return row | values


async def seed(conn: AsyncConnection, tenant: str, ids: range) -> None:
    async def write(repo: BoundRepository) -> None:
        await repo.insert_many([order(i) for i in ids])

    await in_tenant(conn, tenant, write)


@contextmanager
def statements(conn: AsyncConnection) -> Iterator[list[str]]:
    """The SQL text of every statement run on ``conn`` inside the block."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(args[2])

    event.listen(conn.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(conn.sync_engine, "before_cursor_execute", record)


# -- CRUD -----------------------------------------------------------------------------------------


async def test_crud_round_trip(conn: AsyncConnection) -> None:
    """insert stamps the tenant and returns the stored row; update bumps the version."""

    async def work(repo: BoundRepository) -> None:
        row = await repo.insert(order(1, note="first"))
        assert row["tenant_id"] == "a"
        assert row["version"] == 1
        assert row["amount"] == Decimal("1.00")
        with pytest.raises(TypeError):
            row["status"] = "x"  # type: ignore[index]  # rows are immutable
        assert await repo.get(1) == row
        assert await repo.get(2) is None
        updated = await repo.update(1, {"status": "paid"})
        assert updated is not None
        assert (updated["status"], updated["version"]) == ("paid", 2)
        assert await repo.update(2, {"status": "paid"}) is None
        assert await repo.exists({"status": "paid"})
        assert not await repo.exists({"status": "void"})
        assert await repo.delete(1) is True
        assert await repo.delete(1) is False
        assert await repo.get(1) is None

    await in_tenant(conn, "a", work)


async def test_get_many_and_insert_many(conn: AsyncConnection) -> None:
    """insert_many is one statement and returns rows in input order; get_many is by key."""

    async def work(repo: BoundRepository) -> None:
        with statements(conn) as seen:
            rows = await repo.insert_many([order(i) for i in (5, 3, 9)])
        assert [r["id"] for r in rows] == [5, 3, 9]
        assert len([s for s in seen if s.startswith("INSERT")]) == 1
        found = await repo.get_many([9, 3, 3, 42])
        assert list(found) == [3, 9]
        assert found[9]["id"] == 9
        assert await repo.get_many([]) == {}
        assert await repo.insert_many([]) == []

    await in_tenant(conn, "a", work)


async def test_update_without_changes_returns_the_row(conn: AsyncConnection) -> None:
    """R2: naming the row's own tenant in update values is allowed and changes nothing."""
    await seed(conn, "a", range(1, 2))

    async def work(repo: BoundRepository) -> None:
        row = await repo.update(1, {"tenant_id": "a"})
        assert row is not None
        assert (row["tenant_id"], row["version"]) == ("a", 2)

    await in_tenant(conn, "a", work)


async def test_optimistic_concurrency(conn: AsyncConnection) -> None:
    """update/delete with expected_version raise VersionConflictError and change nothing."""
    await seed(conn, "a", range(1, 2))

    async def work(repo: BoundRepository) -> None:
        with pytest.raises(VersionConflictError, match="version 1, not the expected 7"):
            await repo.update(1, {"status": "paid"}, expected_version=7)
        with pytest.raises(VersionConflictError):
            await repo.delete(1, expected_version=7)
        row = await repo.get(1)
        assert row is not None
        assert (row["status"], row["version"]) == ("open", 1)
        row = await repo.update(1, {"status": "paid"}, expected_version=1)
        assert row is not None
        assert row["version"] == 2
        assert await repo.update(99, {"status": "x"}, expected_version=1) is None
        assert await repo.delete(1, expected_version=2) is True

    await in_tenant(conn, "a", work)


async def test_composite_keys(conn: AsyncConnection) -> None:
    async def work(repo: BoundRepository) -> None:
        await repo.insert_many([{"order_id": 1, "line_no": n, "sku": f"s{n}"} for n in (1, 2)])
        row = await repo.get((1, 2))
        assert row is not None
        assert row["sku"] == "s2"
        assert list(await repo.get_many([(1, 2), (1, 1), (2, 1)])) == [(1, 1), (1, 2)]
        assert await repo.update((1, 1), {"sku": "x"}) is not None
        assert await repo.delete((1, 2)) is True
        page = await repo.find(limit=5)
        assert [(r["order_id"], r["line_no"], r["sku"]) for r in page.items] == [(1, 1, "x")]

    await in_tenant(conn, "a", work, repository=lines)


async def test_key_values_of_the_wrong_type_are_named_before_sql(conn: AsyncConnection) -> None:
    """R2: a key value that is not a value of its key column (a string for an integer key, the
    (tenant, id) pair for a one-column key, NUL in a text key) raises RepositoryUsageError naming
    the column and its type before any SQL runs, in get, get_many, get_projection, update and
    delete; never a raw driver error."""
    await seed(conn, "a", range(1, 3))
    calls: dict[str, Callable[[BoundRepository], Awaitable[object]]] = {
        "get": lambda repo: repo.get("x"),
        "get_pair": lambda repo: repo.get(("b", 1)),
        "get_many": lambda repo: repo.get_many([1, "2"]),
        "get_projection": lambda repo: repo.get_projection(SUMMARY, 1.5),
        "update": lambda repo: repo.update(True, {"note": "x"}),
        "delete": lambda repo: repo.delete(b"1"),
    }

    async def work(repo: BoundRepository) -> None:
        for name, call in calls.items():
            with statements(conn) as seen, pytest.raises(RepositoryUsageError) as caught:
                await call(repo)
            assert seen == [], name
            assert "the key value for 'id' (INTEGER of 'repo_orders') must be an int" in str(
                caught.value
            ), name
            assert "the tenant comes from the scope" in str(caught.value.fix), name

    await in_tenant(conn, "a", work)

    async def text_keys(repo: BoundRepository) -> None:
        with pytest.raises(RepositoryUsageError, match="NUL character"):
            await repo.get("a\x00b")
        with pytest.raises(RepositoryUsageError, match="surrogate code point"):
            await repo.get("\ud800")
        with pytest.raises(RepositoryUsageError, match="must be a str, got int"):
            await repo.get(1)

    await in_tenant(conn, None, text_keys, repository=currencies)


async def test_untenanted_table(conn: AsyncConnection) -> None:
    """R3: a table declared untenanted is read and written without a tenant."""

    async def work(repo: BoundRepository) -> None:
        await repo.insert({"code": "EUR", "name": "Euro"})
        row = await repo.get("EUR")
        assert row is not None
        assert row["name"] == "Euro"

    await in_tenant(conn, None, work, repository=currencies)
    assert await in_tenant(conn, "a", lambda r: r.count(up_to=10), repository=currencies) == 1


# -- tenancy (R2, R3) -----------------------------------------------------------------------------


async def test_tenants_never_see_or_touch_each_others_rows(conn: AsyncConnection) -> None:
    """R2: with the same keys in two tenants, every read, update and delete stays in its own."""
    await seed(conn, "a", range(1, 4))
    await seed(conn, "b", range(1, 3))

    async def as_b(repo: BoundRepository) -> None:
        assert await repo.count(up_to=100) == 2
        assert {r["tenant_id"] for r in (await repo.find(limit=10)).items} == {"b"}
        assert await repo.get(3) is None
        assert list(await repo.get_many([1, 2, 3])) == [1, 2]
        assert await repo.update(3, {"status": "void"}) is None
        assert await repo.delete(3) is False
        assert await repo.exists({"id": 3}) is False
        # An expression cannot widen the tenant filter: it is ANDed with it, as a group.
        widened = or_(orders_table.c.id == 3, orders_table.c.id > 0)
        assert await repo.count(widened, up_to=100) == 2
        row = await repo.update(1, {"status": "void"})
        assert row is not None
        assert row["tenant_id"] == "b"

    await in_tenant(conn, "b", as_b)
    rows = (await conn.execute(select(orders_table).order_by("tenant_id", "id"))).all()
    assert [(r.tenant_id, r.id, r.status) for r in rows] == [
        ("a", 1, "open"),
        ("a", 2, "open"),
        ("a", 3, "open"),
        ("b", 1, "void"),
        ("b", 2, "open"),
    ]


async def test_writes_naming_another_tenant_are_refused(conn: AsyncConnection) -> None:
    """R2: an insert or update naming another tenant raises; the row's tenant never changes."""
    await seed(conn, "a", range(1, 2))

    async def as_a(repo: BoundRepository) -> None:
        with pytest.raises(TenantViolationError):
            await repo.insert(order(2, tenant_id="b"))
        with pytest.raises(TenantViolationError):
            await repo.update(1, {"tenant_id": "b", "status": "void"})
        row = await repo.insert(order(3, tenant_id="a"))  # its own tenant: fine
        assert row["tenant_id"] == "a"

    await in_tenant(conn, "a", as_a)
    rows = (await conn.execute(select(orders_table.c.tenant_id, orders_table.c.status))).all()
    assert sorted(rows) == [("a", "open"), ("a", "open")]


async def test_tenanted_table_refuses_a_scope_without_tenant(conn: AsyncConnection) -> None:
    """R2: binding a tenanted table to a scope with no tenant raises TenantRequiredError."""
    with pytest.raises(TenantRequiredError):
        await in_tenant(conn, None, lambda repo: repo.count(up_to=1))


async def test_cross_tenant_escape(conn: AsyncConnection, caplog: pytest.LogCaptureFixture) -> None:
    """R3: cross_tenant reads every tenant, is logged with its reason, and still never moves a
    row to another tenant; keys unique only per tenant become (tenant, key)."""
    await seed(conn, "a", range(1, 3))
    await seed(conn, "b", range(1, 2))

    def repositories(scope: TransactionScope) -> BoundRepository:
        return orders.cross_tenant(scope, reason="support dashboard")

    async def work(repo: BoundRepository) -> None:
        assert await repo.count(up_to=100) == 3
        page = await repo.find(limit=10)
        assert [(r["tenant_id"], r["id"]) for r in page.items] == [("a", 1), ("a", 2), ("b", 1)]
        row = await repo.get(("b", 1))
        assert row is not None
        assert row["tenant_id"] == "b"
        with pytest.raises(TenantViolationError):
            await repo.update(("b", 1), {"tenant_id": "a"})
        assert await repo.update(("b", 1), {"tenant_id": "b", "status": "paid"}) is not None
        inserted = await repo.insert(order(7, tenant_id="b"))
        assert inserted["tenant_id"] == "b"

    with caplog.at_level(logging.INFO, logger="ship_sqla"):
        await create_unit_of_work(conn, repositories=repositories).run(work, tenant="ops")
    assert any(
        "support dashboard" in r.getMessage() and "repo_orders" in r.getMessage()
        for r in caplog.records
    )


# -- the expression guard (R2, R3) ---------------------------------------------------------------

o = orders_table.c
other_orders = orders_table.alias("other_orders")
"""Another copy of the table: a FROM the tenant filter does not restrict."""
b_secret = (
    select(other_orders.c.note)
    .where(other_orders.c.tenant_id == "b", other_orders.c.id == 1)
    .scalar_subquery()
)
"""Tenant b's note, read through a subquery: the value-copy attack."""
b_ids = select(other_orders.c.id).where(other_orders.c.tenant_id == "b")
Call = Callable[[BoundRepository], Awaitable[Any]]

REFUSED: dict[str, Call] = {
    "text_in_where": lambda r: r.find(text("status = 'open' OR true"), limit=10),
    "literal_column_with_or": lambda r: r.count(literal_column("true OR true"), up_to=100),
    "table_less_column": lambda r: r.find(column("status") == "open", limit=10),
    "custom_operator": lambda r: r.exists(o.status.op("= 'x' OR true OR")("y")),
    "scalar_subquery_in_where": lambda r: r.exists(o.note == b_secret),
    "scalar_subquery_in_update_values": lambda r: r.update(1, {"note": b_secret}),
    "scalar_subquery_in_insert_values": lambda r: r.insert(order(5, note=b_secret)),
    "scalar_subquery_in_insert_many_values": lambda r: r.insert_many([order(5, note=b_secret)]),
    "scalar_subquery_in_mapping_where_value": lambda r: r.count({"note": b_secret}, up_to=10),
    "exists_in_where": lambda r: r.count(
        exists().where(other_orders.c.tenant_id == "b", other_orders.c.note == "secret"),
        up_to=10,
    ),
    "select_in_in": lambda r: r.find(o.id.in_(b_ids), limit=10),
    "alias_of_the_table": lambda r: r.count(o.id == other_orders.c.id, up_to=100),
    "another_tables_column": lambda r: r.count(o.id == lines_table.c.order_id, up_to=100),
    "tenant_column_in_where": lambda r: r.count(o.tenant_id == "b", up_to=100),
    "tenant_column_in_mapping_where": lambda r: r.count({"tenant_id": "a"}, up_to=100),
    "tenant_column_in_update_values": lambda r: r.update(1, {"note": o.tenant_id}),
    "tenant_column_value_as_expression": lambda r: r.update(1, {"tenant_id": func.lower("A")}),
    "set_returning_function": lambda r: r.find(
        o.id == func.generate_series(1, 3).column_valued(), limit=10
    ),
    "table_valued_function": lambda r: r.exists(
        o.id == func.unnest(literal([1, 2])).table_valued("n").c.n
    ),
    "unknown_function": lambda r: r.count(func.tenant_secret(o.id) == 1, up_to=10),
    "schema_qualified_function": lambda r: r.count(func.billing.lower(o.status) == "x", up_to=1),
    "aggregate_function": lambda r: r.exists(func.max(o.amount) > 0),
    "window_function": lambda r: r.find(func.count().over() > 1, limit=10),
    "lateral": lambda r: r.count(o.id == select(other_orders.c.id).lateral("l").c.id, up_to=10),
    "nested_deep_in_a_safe_tree": lambda r: r.count(
        and_(o.id > 0, or_(o.status == "open", not_(o.note.in_(select(other_orders.c.note))))),
        up_to=10,
    ),
    "projection_where": lambda r: r.project(SUMMARY, literal_column("true OR true"), limit=10),
    "key_of_get_as_subquery": lambda r: r.get(select(other_orders.c.id).scalar_subquery()),
    "key_of_get_many_as_subquery": lambda r: r.get_many([1, b_ids.scalar_subquery()]),
    "key_of_update_as_subquery": lambda r: r.update(b_ids.scalar_subquery(), {"note": "x"}),
    "key_of_delete_as_subquery": lambda r: r.delete(b_ids.scalar_subquery()),
    "key_of_get_projection_as_subquery": lambda r: r.get_projection(
        SUMMARY, b_ids.scalar_subquery()
    ),
    "expected_version_as_subquery": lambda r: r.update(
        1, {"note": "x"}, expected_version=select(other_orders.c.version).scalar_subquery()
    ),
}


async def seed_secret(conn: AsyncConnection) -> None:
    await seed(conn, "a", range(1, 3))
    await conn.execute(
        insert(orders_table).values(tenant_id="b", **order(1, note="secret", amount=999))
    )


@pytest.mark.parametrize("attack", REFUSED.values(), ids=REFUSED.keys())
async def test_expression_reaching_past_the_tenant_filter_is_refused_before_sql(
    conn: AsyncConnection, attack: Call
) -> None:
    """R2: every construct that could read a FROM other than the repository's own row (a
    subquery, EXISTS, an alias, another table, a set-returning or unknown function, a window),
    any raw SQL (text, literal_column, table-less column, custom operator) and the tenant
    column itself is refused with UnsafeExpressionError, wherever it enters (where=, mapping
    values, insert/update values, keys, expected_version), before any SQL runs."""
    await seed_secret(conn)

    async def work(repo: BoundRepository) -> None:
        with statements(conn) as seen, pytest.raises(UnsafeExpressionError) as caught:
            await attack(repo)
        assert seen == []
        assert caught.value.code == "SHIP_SQLA_UNSAFE_EXPRESSION"
        assert isinstance(caught.value, TenantViolationError)
        assert caught.value.fix

    await in_tenant(conn, "a", work)
    note = select(orders_table.c.note).where(orders_table.c.tenant_id == "a")
    assert "secret" not in (await conn.execute(note)).scalars().all()


async def test_refusals_name_the_construct_and_the_fix(conn: AsyncConnection) -> None:
    """R2: the error says where the expression entered, what was refused, and the way out."""

    async def work(repo: BoundRepository) -> None:
        with pytest.raises(UnsafeExpressionError, match="where= contains a scalar subquery"):
            await repo.count(o.note == b_secret, up_to=1)
        with pytest.raises(UnsafeExpressionError, match=r"literal_column\('true OR true'\)"):
            await repo.count(literal_column("true OR true"), up_to=1)
        with pytest.raises(UnsafeExpressionError, match="cross_tenant") as caught:
            await repo.update(1, {"note": b_secret})
        assert "update values['note']" in caught.value.message
        with pytest.raises(UnsafeExpressionError, match=r"tenant_secret\(\)") as caught:
            await repo.exists(func.tenant_secret(o.id) == 1)
        assert "lower" in str(caught.value.fix)  # lists the allowed functions
        with pytest.raises(UnsafeExpressionError, match="the tenant column 'tenant_id'"):
            await repo.exists(o.tenant_id == "a")
        with pytest.raises(UnsafeExpressionError, match="key"):
            await repo.get(b_ids.scalar_subquery())

    await in_tenant(conn, "a", work)


async def test_allowed_expressions_still_work(conn: AsyncConnection) -> None:
    """R2: plain column expressions, the listed operators and built-in functions, CASE, and
    updates computed from the row's own columns are accepted and stay in the tenant."""
    await seed(conn, "a", range(1, 6))
    await seed(conn, "b", range(1, 6))

    async def work(repo: BoundRepository) -> None:
        found = await repo.find(
            and_(
                o.id.in_([1, 2, 3, 4]),
                between(o.amount, 2, 4),
                func.lower(o.status).like("op%"),
                func.coalesce(o.note, "none") == "none",
                o.note.is_(None),
                case((o.id > 2, True), else_=False),
            ),
            limit=10,
        )
        assert [r["id"] for r in found.items] == [3, 4]
        row = await repo.update(3, {"amount": o.amount + 10, "note": func.upper(o.status)})
        assert row is not None
        assert (row["amount"], row["note"]) == (Decimal(13), "OPEN")
        inserted = await repo.insert(order(9, note=func.concat("n", literal("9"))))
        assert inserted["note"] == "n9"
        assert await repo.count({"note": func.upper("open")}, up_to=10) == 1

    await in_tenant(conn, "a", work)
    b_rows = (await conn.execute(select(orders_table).where(o.tenant_id == "b"))).all()
    assert {(r.id, r.amount, r.note) for r in b_rows} == {
        (i, Decimal(i), None) for i in range(1, 6)
    }


async def test_tenant_filter_and_caller_condition_are_separate_groups(
    conn: AsyncConnection,
) -> None:
    """R2: the caller's condition is parenthesised as one group beside the tenant predicate,
    so no operator inside it can bind to the tenant predicate."""

    async def work(repo: BoundRepository) -> None:
        with statements(conn) as seen:
            await repo.count(o.status == "open", up_to=5)
            await repo.exists(or_(o.id == 1, o.id == 2))
            await repo.find({"status": "open"}, limit=5)
        for sql in seen:
            condition = sql.split("WHERE", 1)[1]
            assert condition.lstrip().startswith("repo_orders.tenant_id = $1::VARCHAR AND (")

    await in_tenant(conn, "a", work)


async def test_cross_tenant_reads_any_from_but_never_raw_sql(conn: AsyncConnection) -> None:
    """R3: cross_tenant is the one escape: it accepts subqueries, EXISTS, other tables and the
    tenant column, but still refuses raw SQL, unknown functions and a tenant given as an
    expression (which could move a row to another tenant, R2), before any SQL runs."""
    await seed_secret(conn)

    def repositories(scope: TransactionScope) -> BoundRepository:
        return orders.cross_tenant(scope, reason="fraud review")

    async def work(repo: BoundRepository) -> None:
        assert await repo.count(o.note == b_secret, up_to=10) == 1
        assert await repo.count(o.tenant_id == "b", up_to=10) == 1
        assert await repo.exists(exists().where(lines_table.c.order_id == o.id)) is False
        counted = select(func.count()).select_from(other_orders).scalar_subquery()
        assert await repo.count(counted == 3, up_to=10) == 3
        row = await repo.update(("a", 1), {"note": b_secret})
        assert row is not None
        assert row["note"] == "secret"
        with pytest.raises(RepositoryUsageError, match="must name the row's tenant"):
            await repo.insert(order(8))
        ids = select(other_orders.c.id.label("i")).where(other_orders.c.tenant_id == "b")
        assert await repo.count(o.id == ids.subquery().c.i, up_to=10) == 2  # a:1 and b:1
        hidden = select(other_orders.c.id).where(text("true")).subquery()
        for refused in (
            lambda: repo.count(o.id == hidden.c.id, up_to=10),  # raw SQL inside a FROM
            lambda: repo.count(o.id == ids.where(text("true")).subquery().c.i, up_to=10),
            lambda: repo.count(literal_column("true OR true"), up_to=10),
            lambda: repo.exists(text("true")),
            lambda: repo.exists(func.tenant_secret(o.id) == 1),
            lambda: repo.exists(o.id.in_(select(other_orders.c.id).prefix_with("/*x*/"))),
            lambda: repo.update(("a", 1), {"note": literal_column("'x', tenant_id = 'b'")}),
            lambda: repo.update(("a", 1), {"tenant_id": select(literal("a")).scalar_subquery()}),
            lambda: repo.get(("a", b_ids.scalar_subquery())),
        ):
            with statements(conn) as seen, pytest.raises(UnsafeExpressionError):
                await refused()
            assert seen == []

    await create_unit_of_work(conn, repositories=repositories).run(work, tenant="ops")
    tenants = (await conn.execute(select(o.tenant_id, o.id).order_by(o.tenant_id, o.id))).all()
    assert tenants == [("a", 1), ("a", 2), ("b", 1)]


async def test_untenanted_repository_is_guarded_too(conn: AsyncConnection) -> None:
    """R2: a repository of an untenanted table accepts only that table's own columns: a
    subquery over a tenanted table in its where= would read every tenant's rows."""
    await seed_secret(conn)
    await in_tenant(
        conn, None, lambda r: r.insert({"code": "EUR", "name": "Euro"}), repository=currencies
    )

    async def work(repo: BoundRepository) -> None:
        assert await repo.count({"name": "Euro"}, up_to=5) == 1
        assert await repo.count(func.lower(currencies_table.c.code) == "eur", up_to=5) == 1
        with statements(conn) as seen:
            with pytest.raises(UnsafeExpressionError, match="untenanted"):
                await repo.exists(currencies_table.c.name == b_secret)
            with pytest.raises(UnsafeExpressionError, match=r"scope\.connection"):
                await repo.exists(currencies_table.c.code == o.status)
        assert seen == []

    await in_tenant(conn, "a", work, repository=currencies)


# -- bounds (R1) ----------------------------------------------------------------------------------


async def test_count_is_bounded_and_never_truncates_silently(conn: AsyncConnection) -> None:
    """R1: count reads at most up_to rows; asking beyond max_count raises, naming the bound."""
    await seed(conn, "a", range(1, 8))

    async def work(repo: BoundRepository) -> None:
        assert await repo.count(up_to=100) == 7
        assert await repo.count(up_to=3) == 3
        assert await repo.count({"id": 2}, up_to=3) == 1
        with pytest.raises(BoundExceededError, match="max_count=100"):
            await repo.count(up_to=101)
        with pytest.raises(BoundExceededError, match="max_page_size=10"):
            await repo.find(limit=11)
        with statements(conn) as seen:
            await repo.count(up_to=3)
        assert "LIMIT" in seen[0]

    await in_tenant(conn, "a", work)


# -- keyset paging --------------------------------------------------------------------------------


async def page_all(
    repo: BoundRepository, limit: int, **options: Any
) -> tuple[list[int], list[Page[Any]]]:
    pages: list[Page[Any]] = []
    cursor = None
    while True:
        page = await repo.find(limit=limit, cursor=cursor, **options)
        pages.append(page)
        cursor = page.next_cursor
        if cursor is None:
            return [r["id"] for r in (row for p in pages for row in p.items)], pages


async def test_paging_ascending_and_descending(conn: AsyncConnection) -> None:
    """Every matching row exactly once, in order; no empty last page; ties broken by key."""
    await seed(conn, "a", range(1, 10))

    async def work(repo: BoundRepository) -> None:
        ids, pages = await page_all(repo, 3)
        assert ids == list(range(1, 10))
        assert [len(p.items) for p in pages] == [3, 3, 3]
        ids, _ = await page_all(repo, 4, order_by=("-created_at",))
        expected = sorted(range(1, 10), key=lambda i: (-(i % 3), -i))  # key follows: id DESC
        assert ids == expected
        ids, _ = await page_all(repo, 4, order_by=("-created_at", "id"))
        assert ids == sorted(range(1, 10), key=lambda i: (-(i % 3), i))  # a named key wins
        ids, _ = await page_all(repo, 2, order_by=("-id",), where={"status": "open"})
        assert ids == list(range(9, 0, -1))
        ids, _ = await page_all(repo, 2, where=orders_table.c.amount >= 5)
        assert ids == [5, 6, 7, 8, 9]

    await in_tenant(conn, "a", work)


async def test_cursor_is_bound_to_its_query_and_tenant(conn: AsyncConnection) -> None:
    """A cursor reused on another filter, order, projection or tenant, or altered, is refused."""
    await seed(conn, "a", range(1, 5))
    await seed(conn, "b", range(1, 5))

    async def first_cursor(repo: BoundRepository) -> str:
        page = await repo.find({"status": "open"}, limit=2)
        assert page.next_cursor is not None
        return page.next_cursor

    cursor = await in_tenant(conn, "a", first_cursor)

    async def misuse(repo: BoundRepository) -> None:
        with pytest.raises(InvalidCursorError, match="different query"):
            await repo.find({"status": "paid"}, limit=2, cursor=cursor)
        with pytest.raises(InvalidCursorError, match="different query"):
            await repo.find({"status": "open"}, order_by="-id", limit=2, cursor=cursor)
        with pytest.raises(InvalidCursorError, match="different query"):
            await repo.project(SUMMARY, {"status": "open"}, limit=2, cursor=cursor)
        tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
        with pytest.raises(InvalidCursorError):
            await repo.find({"status": "open"}, limit=2, cursor=tampered)
        page = await repo.find({"status": "open"}, limit=2, cursor=cursor)
        assert [r["id"] for r in page.items] == [3, 4]

    await in_tenant(conn, "a", misuse)

    async def as_b(repo: BoundRepository) -> None:
        with pytest.raises(InvalidCursorError, match="different query"):
            await repo.find({"status": "open"}, limit=2, cursor=cursor)

    await in_tenant(conn, "b", as_b)


async def test_cursor_secret_makes_cursors_portable(conn: AsyncConnection) -> None:
    """Two declarations with the same cursor_secret (two processes) accept each other's cursors;
    with different secrets they refuse them."""
    await seed(conn, "a", range(1, 5))
    secret = b"s" * 32
    here = TableRepository(orders_table, tenant_column="tenant_id", cursor_secret=secret)
    there = TableRepository(orders_table, tenant_column="tenant_id", cursor_secret=secret)
    elsewhere = TableRepository(orders_table, tenant_column="tenant_id", cursor_secret=b"t" * 32)

    async def first(repo: BoundRepository) -> str | None:
        return (await repo.find(limit=2)).next_cursor

    cursor = await in_tenant(conn, "a", first, repository=here)

    async def next_ids(repo: BoundRepository) -> list[int]:
        return [r["id"] for r in (await repo.find(limit=2, cursor=cursor)).items]

    assert await in_tenant(conn, "a", next_ids, repository=there) == [3, 4]
    with pytest.raises(InvalidCursorError, match="cursor_secret"):
        await in_tenant(conn, "a", next_ids, repository=elsewhere)


# -- projections (R4) -----------------------------------------------------------------------------


async def test_projection_reads_only_its_columns(conn: AsyncConnection) -> None:
    """R4: a projection selected by object or name returns typed values, reading only its
    columns (checked on the SQL sent to the server)."""
    await seed(conn, "a", range(1, 4))

    async def work(repo: BoundRepository) -> None:
        with statements(conn) as seen:
            page = await repo.project(SUMMARY, limit=2)
            one = await repo.get_projection(SUMMARY, 3)
            by_name = await repo.project("order_summary", {"id": 1}, limit=2)
        assert page.items == (OrderSummary(1, "open"), OrderSummary(2, "open"))
        assert one == OrderSummary(3, "open")
        assert by_name.items == (OrderSummary(1, "open"),)
        assert await repo.get_projection("order_summary", 42) is None
        for sql in seen:
            selected = sql.split("FROM")[0]
            assert selected.split() == ["SELECT", "repo_orders.id,", "repo_orders.status"]
        with pytest.raises(UnknownProjectionError, match="known: \\['notes', 'order_summary'\\]"):
            await repo.project("nope", limit=1)
        with pytest.raises(UnknownProjectionError):
            await repo.project(AMOUNTS, limit=1)  # not declared on this repository

    await in_tenant(conn, "a", work)


async def test_projection_paging_by_a_column_outside_it(conn: AsyncConnection) -> None:
    """R4: ordering by a column the projection lacks reads that column for the cursor only."""
    await seed(conn, "a", range(1, 8))

    async def work(repo: BoundRepository) -> list[OrderSummary]:
        items: list[OrderSummary] = []
        cursor = None
        while True:
            page = await repo.project(SUMMARY, order_by="-created_at", limit=3, cursor=cursor)
            items += page.items
            if (cursor := page.next_cursor) is None:
                return items

    items = await in_tenant(conn, "a", work)
    assert [i.id for i in items] == sorted(range(1, 8), key=lambda i: (-(i % 3), -i))


# -- unit of work (U1) ----------------------------------------------------------------------------


class HandlerFailedError(Exception):
    pass


async def test_repository_and_raw_writes_roll_back_together(conn: AsyncConnection) -> None:
    """U1: repository writes and raw statements on scope.connection commit or roll back as one."""

    @attrs.frozen
    class Repos:
        orders: BoundRepository
        scope: TransactionScope

    uow = create_unit_of_work(
        conn, repositories=lambda scope: Repos(orders.for_scope(scope), scope)
    )

    async def fail(repos: Repos) -> None:
        await repos.orders.insert(order(1))
        await repos.scope.connection.execute(insert(audit_table).values(id=1, what="created 1"))
        raise HandlerFailedError

    with pytest.raises(HandlerFailedError):
        await uow.run(fail, tenant="a")
    assert (await conn.execute(select(orders_table))).first() is None
    assert (await conn.execute(select(audit_table))).first() is None

    async def succeed(repos: Repos) -> None:
        await repos.orders.insert(order(2))
        await repos.scope.connection.execute(insert(audit_table).values(id=2, what="created 2"))

    await uow.run(succeed, tenant="a")
    assert (await conn.execute(select(orders_table.c.id))).scalars().all() == [2]
    assert (await conn.execute(select(audit_table.c.id))).scalars().all() == [2]


async def test_failed_statement_rolls_back_the_run(conn: AsyncConnection) -> None:
    """U1: a duplicate key fails the run and nothing it wrote remains."""
    await seed(conn, "a", range(1, 2))

    async def work(repo: BoundRepository) -> None:
        await repo.insert(order(2))
        await repo.insert(order(1))

    with pytest.raises(IntegrityError):
        await in_tenant(conn, "a", work)
    assert (await conn.execute(select(orders_table.c.id))).scalars().all() == [1]


async def test_bound_repository_is_unusable_after_its_run(conn: AsyncConnection) -> None:
    """U2: a repository kept past its run is refused, not run outside the transaction."""
    kept = await in_tenant(conn, "a", _return_repo)
    with pytest.raises(ScopeClosedError):
        await kept.get(1)


async def _return_repo(repo: BoundRepository) -> BoundRepository:
    return repo
