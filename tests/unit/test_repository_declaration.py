"""TableRepository declarations, and call checks that refuse before any SQL runs (no database)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any
from typing import cast as typing_cast

import attrs
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    extract,
    false,
    func,
    insert,
    literal,
    not_,
    null,
    or_,
    select,
    text,
    true,
    tuple_,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, aliased
from sqlalchemy.types import UserDefinedType

from ship_sqla import BoundRepository, Projection, TableRepository, TransactionScope
from ship_sqla._repository_guard import ExpressionGuard, UnsafeExpressionError
from ship_sqla.errors import (
    BoundExceededError,
    ConfigurationError,
    RepositoryUsageError,
    TenantRequiredError,
    TenantViolationError,
    UnknownProjectionError,
)

metadata = MetaData()
orders = Table(
    "decl_orders",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("status", String, nullable=False),
    Column("note", String),
    Column("label", String, nullable=False),
    Column("rev", String, nullable=False),
    PrimaryKeyConstraint("tenant_id", "id"),
)
shared = Table(
    "decl_shared",
    metadata,
    Column("code", String, primary_key=True),
    Column("alt", String, nullable=False),
    Column("part", String, nullable=False),
    Column("name", String),
    UniqueConstraint("alt"),
    Index("decl_shared_part_idx", "part", unique=True, postgresql_where="name is not null"),
)


@attrs.frozen
class Summary:
    id: int
    status: str


SUMMARY = Projection(name="summary", columns=("id", "status"), into=Summary)


def declare(**options: Any) -> TableRepository:
    options.setdefault("tenant_column", "tenant_id")
    return TableRepository(orders, **options)


def scope(tenant: str | None) -> TransactionScope:
    """A scope whose connection must never be reached: these checks run before any SQL.

    Built inside a running event loop (tests using it are async): a scope belongs to a task.
    """
    return TransactionScope(typing_cast(Any, None), database=typing_cast(Any, None), tenant=tenant)


# -- tenancy is an explicit choice (R3) -----------------------------------------------------------


def test_tenancy_must_be_chosen() -> None:
    """R3: a table needs tenant_column= or untenanted="<reason>"; the error says how."""
    with pytest.raises(ConfigurationError, match="tenant_column=") as caught:
        TableRepository(shared, key="code")
    assert "untenanted=" in str(caught.value)
    with pytest.raises(ConfigurationError, match="exactly one"):
        TableRepository(orders, tenant_column="tenant_id", untenanted="shared")


@pytest.mark.parametrize("reason", ["", "   "])
def test_untenanted_needs_a_reason(reason: str) -> None:
    """R3: opting out of tenancy names why."""
    with pytest.raises(ConfigurationError, match="needs a reason"):
        TableRepository(shared, untenanted=reason, key="code")


async def test_untenanted_table_binds_without_tenant() -> None:
    repo = TableRepository(shared, untenanted="currency reference data", key="code")
    assert repo.tenant_column is None
    assert repo.for_scope(scope(None)).tenant is None


def test_columns_are_checked_at_declaration() -> None:
    with pytest.raises(ConfigurationError, match="'tenant' is not a column") as caught:
        declare(tenant_column="tenant")
    assert "tenant_id" in str(caught.value)  # lists the real columns
    with pytest.raises(ConfigurationError, match="key column 'uid'"):
        declare(key="uid")
    with pytest.raises(ConfigurationError, match="version_column 'v'"):
        declare(version_column="v")


def test_tenant_column_must_be_not_null() -> None:
    with pytest.raises(ConfigurationError, match="nullable"):
        declare(tenant_column="note")


def test_key_must_be_unique_not_null_and_without_tenant() -> None:
    """R1: keys identify one row, so update/delete by key never touch several rows."""
    with pytest.raises(ConfigurationError, match="not unique"):
        declare(key="status")
    with pytest.raises(ConfigurationError, match="nullable"):
        declare(key="note")
    with pytest.raises(ConfigurationError, match="includes the tenant column"):
        declare(key=("tenant_id", "id"))
    with pytest.raises(ConfigurationError, match="distinct"):
        declare(key=("id", "id"))


def test_key_uniqueness_sources() -> None:
    assert TableRepository(shared, untenanted="x", key="alt").key == ("alt",)
    with pytest.raises(ConfigurationError, match="not unique"):  # a partial index is not enough
        TableRepository(shared, untenanted="x", key="part")


async def test_version_column_must_be_integer_not_null() -> None:
    with pytest.raises(ConfigurationError, match="integer NOT NULL"):
        declare(version_column="rev")
    assert declare(version_column="version").for_scope(scope("a")) is not None


@pytest.mark.parametrize("bound", ["max_page_size", "max_count"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_bounds_are_positive_integers(bound: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=bound):
        declare(**{bound: value})


def test_default_order_columns_must_exist_and_be_not_null() -> None:
    """Keyset ordering over NULLs would skip or repeat rows: refused at declaration."""
    with pytest.raises(ConfigurationError, match="nullable column 'note'"):
        declare(default_order=("-note",))
    with pytest.raises(ConfigurationError, match="does not name a column"):
        declare(default_order=("-nope",))
    with pytest.raises(ConfigurationError, match="twice"):
        declare(default_order=("status", "-status"))
    assert declare(default_order=("-created_at",)) is not None


def test_cursor_secret_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="cursor_secret"):
        declare(cursor_secret=b"short")


def test_only_tables() -> None:
    with pytest.raises(ConfigurationError, match="sqlalchemy Table"):
        TableRepository(typing_cast(Any, "decl_orders"), tenant_column="tenant_id")


# -- projections (R4) -----------------------------------------------------------------------------


def test_projection_columns_are_checked() -> None:
    """R4: a projection is declared once, over columns that exist."""
    with pytest.raises(ConfigurationError, match="projection 'p' column 'nope'"):
        declare(projections=[Projection(name="p", columns=("id", "nope"), into=dict)])
    with pytest.raises(ConfigurationError, match="named 'summary'"):
        declare(projections=[SUMMARY, SUMMARY])
    with pytest.raises(ConfigurationError, match="Projection objects"):
        declare(projections=[typing_cast(Any, "summary")])


def test_projection_declaration_errors() -> None:
    with pytest.raises(ConfigurationError, match="the string 'id'"):
        Projection(name="p", columns="id", into=dict)
    with pytest.raises(ConfigurationError, match="no columns"):
        Projection(name="p", columns=(), into=dict)
    with pytest.raises(ConfigurationError, match="more than once"):
        Projection(name="p", columns=("id", "id"), into=dict)
    with pytest.raises(ConfigurationError, match="non-empty string name"):
        Projection(name="", columns=("id",), into=dict)
    with pytest.raises(ConfigurationError, match="not callable"):
        Projection(name="p", columns=("id",), into=typing_cast(Any, 3))


def test_projection_selected_by_object_or_name() -> None:
    """R4: selected by its object or its name; unknown names list the known ones."""
    repo = declare(projections=[SUMMARY])
    assert repo.projection("summary") is SUMMARY
    assert repo.projection(SUMMARY) is SUMMARY
    with pytest.raises(UnknownProjectionError, match=r"'nope' \(known: \['summary'\]\)"):
        repo.projection("nope")
    impostor = Projection(name="summary", columns=("id",), into=dict)
    with pytest.raises(UnknownProjectionError):
        repo.projection(impostor)
    assert SUMMARY.build({"id": 1, "status": "open", "note": "ignored"}) == Summary(1, "open")


# -- binding (R2, R3) -----------------------------------------------------------------------------


async def test_tenanted_table_needs_a_scope_tenant() -> None:
    """R2: a tenanted table is never bound without a tenant; the error names both ways out."""
    with pytest.raises(TenantRequiredError, match="tenant=") as caught:
        declare().for_scope(scope(None))
    assert "cross_tenant" in str(caught.value)
    bound = declare().for_scope(scope("a"))
    assert isinstance(bound, BoundRepository)
    assert bound.tenant == "a"


async def test_cross_tenant_is_named_logged_and_traced(caplog: pytest.LogCaptureFixture) -> None:
    """R3: the cross-tenant escape needs a reason and records it in logs and the current span."""
    repo = declare()
    with pytest.raises(ConfigurationError, match="reason"):
        repo.cross_tenant(scope("a"), reason=" ")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with (
        caplog.at_level(logging.INFO, logger="ship_sqla"),
        provider.get_tracer("test").start_as_current_span("handler"),
    ):
        bound = repo.cross_tenant(scope("a"), reason="monthly billing export")
    assert bound.tenant is None
    (record,) = [r for r in caplog.records if "cross-tenant" in r.getMessage()]
    assert "monthly billing export" in record.getMessage()
    assert "decl_orders" in record.getMessage()
    assert "'a'" in record.getMessage()
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["ship.cross_tenant"] is True
    (event,) = span.events
    assert event.name == "ship_sqla.cross_tenant"
    assert event.attributes is not None
    assert event.attributes["ship.cross_tenant.reason"] == "monthly billing export"
    assert event.attributes["ship.table"] == "decl_orders"


async def test_cross_tenant_on_untenanted_table_is_refused() -> None:
    repo = TableRepository(shared, untenanted="reference data", key="code")
    with pytest.raises(ConfigurationError, match="untenanted"):
        repo.cross_tenant(scope("a"), reason="why")


# -- calls refused before any SQL (R1, R2) --------------------------------------------------------


async def test_bounds_are_refused_not_truncated() -> None:
    """R1: a request above a declared bound raises, naming the bound and the fix."""
    bound = declare(max_page_size=5, max_count=50, projections=[SUMMARY]).for_scope(scope("a"))
    with pytest.raises(BoundExceededError, match="limit=6 exceeds max_page_size=5") as caught:
        await bound.find(limit=6)
    assert "cursor" in str(caught.value)  # the fix: page instead
    with pytest.raises(BoundExceededError, match="max_page_size=5"):
        await bound.project(SUMMARY.name, limit=6)
    with pytest.raises(BoundExceededError, match="up_to=51 exceeds max_count=50"):
        await bound.count(up_to=51)
    with pytest.raises(BoundExceededError, match="len\\(keys\\)=6"):
        await bound.get_many(range(6))
    with pytest.raises(BoundExceededError, match="len\\(rows\\)=6"):
        await bound.insert_many([{"id": i} for i in range(6)])
    for bad in (0, -1, True):
        with pytest.raises(RepositoryUsageError, match="positive integer"):
            await bound.find(limit=bad)


async def test_writes_naming_another_tenant_are_refused() -> None:
    """R2: an insert or update naming another tenant raises before reaching the database."""
    bound = declare(version_column="version").for_scope(scope("a"))
    with pytest.raises(TenantViolationError, match="named tenant 'b'"):
        await bound.insert({"id": 1, "tenant_id": "b"})
    with pytest.raises(TenantViolationError):
        await bound.insert_many([{"id": 1}, {"id": 2, "tenant_id": "b"}])
    with pytest.raises(TenantViolationError, match="never moves a row"):
        await bound.update(1, {"tenant_id": "b"})
    with pytest.raises(TenantViolationError):
        await bound.update(1, {"tenant_id": None})


async def test_call_errors_name_the_fix() -> None:
    bound = declare(version_column="version").for_scope(scope("a"))
    with pytest.raises(RepositoryUsageError, match=r"\['colour'\]"):
        await bound.insert({"id": 1, "colour": "red"})
    with pytest.raises(RepositoryUsageError, match="owned by the repository"):
        await bound.update(1, {"version": 9})
    with pytest.raises(RepositoryUsageError, match="nullable column 'note'"):
        await bound.find(order_by="note", limit=1)
    with pytest.raises(RepositoryUsageError, match="neither a mapping"):
        await bound.find(typing_cast(Any, "status = 'x'"), limit=1)
    with pytest.raises(RepositoryUsageError, match="same keys"):
        await bound.insert_many([{"id": 1}, {"id": 2, "status": "x"}])
    unversioned = declare().for_scope(scope("a"))
    with pytest.raises(RepositoryUsageError, match="declares no version_column"):
        await unversioned.update(1, {"status": "x"}, expected_version=1)
    with pytest.raises(UnknownProjectionError):
        await unversioned.get_projection("nope", 1)


async def test_composite_key_values_are_tuples() -> None:
    lines = Table(
        "decl_lines",
        MetaData(),
        Column("tenant_id", String, nullable=False),
        Column("order_id", Integer, nullable=False),
        Column("line_no", Integer, nullable=False),
        PrimaryKeyConstraint("tenant_id", "order_id", "line_no"),
    )
    bound = TableRepository(lines, tenant_column="tenant_id", key=("order_id", "line_no"))
    with pytest.raises(RepositoryUsageError, match="composite key"):
        await bound.for_scope(scope("a")).get(1)


# -- get_many reads a bounded prefix of its keys (R1) ---------------------------------------------


async def test_get_many_refuses_an_endless_iterator_after_bound_plus_one_keys() -> None:
    """R1: get_many refuses more than max_page_size keys after reading at most
    max_page_size + 1 items of an iterator: an endless generator is refused, never read whole."""
    bound = declare(max_page_size=5).for_scope(scope("a"))
    read = 0

    def endless() -> Iterator[int]:
        nonlocal read
        for key in itertools.count():
            read += 1
            yield key

    with pytest.raises(BoundExceededError, match="more than max_page_size=5 keys"):
        await bound.get_many(endless())
    assert read == 6
    with pytest.raises(BoundExceededError):  # duplicates count: the input is bounded, not the set
        await bound.get_many(itertools.repeat(1))
    with pytest.raises(BoundExceededError, match="len\\(keys\\)=1000000000"):
        await bound.get_many(range(10**9))  # sized: refused by its length, nothing read
    with pytest.raises(RepositoryUsageError, match="iterable of keys"):
        await bound.get_many("abc")


# -- the expression guard, without a database (R2, R3) ---------------------------------------------

documents = Table(
    "decl_documents",
    MetaData(),
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, primary_key=True),
    Column("title", String),
    Column("body", JSONB),
    Column("tags", ARRAY(String)),
    Column("created_at", DateTime(timezone=True)),
)
d = documents.c
d_other = documents.alias("d_other")
GUARD = ExpressionGuard(documents, d.tenant_id)


class _Orm(DeclarativeBase):
    pass


class Document(_Orm):
    __table__ = documents


class RawType(UserDefinedType[str]):
    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "text) OR (true"


ACCEPTED: dict[str, Any] = {
    "comparisons": and_(d.id >= 1, d.id != 3, d.title < "m", or_(d.id == 1, d.id > 5)),
    "null_checks": and_(d.title.is_(None), d.title.is_not(None), d.title.is_distinct_from("x")),
    "in_lists": and_(
        d.id.in_([1, 2]), d.id.not_in([3]), d.id.in_([]), tuple_(d.id, d.title).in_([(1, "a")])
    ),
    "any_array": d.id == any_(bindparam("ids", [1, 2], type_=ARRAY(Integer))),
    "between_like": and_(
        d.id.between(1, 2), d.title.like("a%"), d.title.ilike("%b"), ~d.title.contains("c")
    ),
    "regex_and_text_search": and_(d.title.regexp_match("^a"), d.title.startswith("x")),
    "arithmetic": (d.id + 1) * 2 - d.id / 3 % 2 > -d.id,
    "functions": and_(
        func.lower(d.title) == "x",
        func.coalesce(d.title, "") == "",
        func.length(d.title) > 2,
        func.date_trunc("day", d.created_at) == func.now(),
    ),
    "case_cast": case((cast(d.id, String) == "1", True), else_=type_coerce(d.title, String) == "t"),
    "collate": d.title.collate("C") == "a",
    "extract": extract("year", d.created_at) == 2024,
    "json": and_(d.body["k"].astext == "v", d.body.contains({"a": 1}), d.body.has_key("z")),
    "arrays": and_(d.tags.contains(["a"]), d.tags.overlap(["b"]), d.tags[1] == "c"),
    "literals": and_(true(), literal(1) == 1, d.title.is_not(null()), not_(false())),
    "orm_attributes": and_(Document.id == 1, Document.title.is_not(None)),
}


@pytest.mark.parametrize("expression", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_guard_accepts_plain_expressions_over_the_own_row(expression: Any) -> None:
    """R2: expressions over the table's own columns with the listed operators and functions
    pass the guard of a tenant-scoped repository."""
    GUARD.check(expression, GUARD.row, where="where=")


REFUSED_ROW: dict[str, Any] = {
    "extract_field_rendered_verbatim": extract("year FROM now()) OR (true", d.created_at) == 1,
    "cast_to_raw_type": cast(d.title, RawType()) == "x",
    "custom_operator": d.title.op("~~")("x"),
    "unary_distinct": d.id.distinct() == 1,
    "ordering_modifier": d.id.desc(),
    "volatile_function": func.random() > 0.5,
    "current_setting": func.current_setting("ship.tenant_id") == "b",
    "function_filter": func.count().filter(d.id > 1) > 0,
    "within_group": func.percentile_cont(0.5).within_group(d.id) > 1,
    "alias_column": d.id == d_other.c.id,
    "orm_alias": d.id == aliased(Document).id,
}


@pytest.mark.parametrize("expression", REFUSED_ROW.values(), ids=REFUSED_ROW.keys())
def test_guard_refuses_what_it_does_not_list(expression: Any) -> None:
    """R2: the guard is an allow-list: constructs not listed are refused with a typed error."""
    with pytest.raises(UnsafeExpressionError):
        GUARD.check(expression, GUARD.row, where="where=")


def test_insert_values_read_no_column() -> None:
    """R2: an insert has no row to read; a column in an insert value is refused."""
    GUARD.check(func.upper("x"), GUARD.value, where="insert values['title']")
    with pytest.raises(UnsafeExpressionError, match="no row to read"):
        GUARD.check(d.title, GUARD.value, where="insert values['title']")


REFUSED_CROSS: dict[str, Any] = {
    "raw_text_in_subquery": d.id.in_(select(d_other.c.id).where(text("true"))),
    "prefix": d.id.in_(select(d_other.c.id).prefix_with("/* x */")),
    "suffix": d.id.in_(select(d_other.c.id).suffix_with("x")),
    "statement_hint": d.id.in_(select(d_other.c.id).with_statement_hint("x")),
    "row_lock": d.id.in_(select(d_other.c.id).with_for_update()),
    "write_cte": d.id.in_(select(insert(documents).values(id=1).returning(d.id).cte("w").c.id)),
    "set_returning": d.id.in_(select(func.generate_series(1, 2).table_valued("n").c.n)),
    "unknown_function_in_subquery": d.id.in_(select(func.my_fn(d_other.c.id))),
    "cte_prefix": d.id.in_(select(select(d_other.c.id).cte("c").prefix_with("x").c.id)),
}


@pytest.mark.parametrize("expression", REFUSED_CROSS.values(), ids=REFUSED_CROSS.keys())
def test_cross_tenant_guard_still_refuses_raw_sql_and_writes(expression: Any) -> None:
    """R3: a cross-tenant repository may read any FROM, but raw SQL, hidden prefixes and
    hints, row locks, write CTEs, set-returning and unknown functions are still refused."""
    with pytest.raises(UnsafeExpressionError):
        GUARD.check(expression, GUARD.cross, where="where=")


def test_cross_tenant_guard_reads_any_from() -> None:
    """R3: subqueries, EXISTS, joins, aggregates, windows and the tenant column pass the
    cross-tenant guard."""
    per_tenant = (
        select(d_other.c.tenant_id, func.count().label("n"))
        .group_by(d_other.c.tenant_id)
        .subquery()
    )
    GUARD.check(
        and_(
            d.tenant_id.in_(["a", "b"]),
            exists().where(d_other.c.id == d.id),
            d.id == select(func.max(d_other.c.id)).scalar_subquery(),
            per_tenant.c.n > 1,
            d.id.in_(select(func.row_number().over(order_by=d_other.c.id))),
        ),
        GUARD.cross,
        where="where=",
    )
