"""TableRepository declarations, and call checks that refuse before any SQL runs (no database)."""

from __future__ import annotations

import logging
from typing import Any, cast

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
)

from ship_sqla import (
    BoundRepository,
    Projection,
    RepositoryUsageError,
    TableRepository,
    TransactionScope,
)
from ship_sqla.kernel import (
    BoundExceededError,
    ConfigurationError,
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
    return TransactionScope(cast(Any, None), database=cast(Any, None), tenant=tenant)


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
        TableRepository(cast(Any, "decl_orders"), tenant_column="tenant_id")


# -- projections (R4) -----------------------------------------------------------------------------


def test_projection_columns_are_checked() -> None:
    """R4: a projection is declared once, over columns that exist."""
    with pytest.raises(ConfigurationError, match="projection 'p' column 'nope'"):
        declare(projections=[Projection(name="p", columns=("id", "nope"), into=dict)])
    with pytest.raises(ConfigurationError, match="named 'summary'"):
        declare(projections=[SUMMARY, SUMMARY])
    with pytest.raises(ConfigurationError, match="Projection objects"):
        declare(projections=[cast(Any, "summary")])


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
        Projection(name="p", columns=("id",), into=cast(Any, 3))


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
        await bound.find(cast(Any, "status = 'x'"), limit=1)
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
