"""R2 as a property: random calls through the repositories of two tenants, compared with a model.

Both tenants use the same small key space, so most keys exist in both. After every step the
whole table (read without any tenant filter) must equal the model: no call through tenant T's
repository ever observed or altered a row of the other tenant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    exists,
    literal_column,
    select,
)
from sqlalchemy.exc import IntegrityError
from tests.property.strategies import TENANTS, PortalDatabase, portal_database, statuses, tenants

from ship_sqla import BoundRepository, TableRepository, create_unit_of_work
from ship_sqla._repository_guard import UnsafeExpressionError
from ship_sqla.errors import TenantViolationError, VersionConflictError
from ship_sqla.testing import ResolvedServer

T = TypeVar("T")

metadata = MetaData()
table = Table(
    "prop_tenancy_orders",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("version", Integer, nullable=False, server_default="1"),
    Column("status", String(collation="C"), nullable=False),
    PrimaryKeyConstraint("tenant_id", "id", name="prop_tenancy_orders_pkey"),
)
orders = TableRepository(
    table, tenant_column="tenant_id", version_column="version", max_page_size=3, max_count=50
)

ids = st.integers(min_value=1, max_value=4)
twin = table.alias("twin")
"""The same table under another name: a FROM the tenant filter does not restrict."""


def attacks(tenant: str, key: int) -> dict[str, Callable[[BoundRepository], Awaitable[Any]]]:
    """Calls that would read the other tenant's rows if the expression guard let them through."""
    theirs = (twin.c.tenant_id == other(tenant)) & (twin.c.id == key)
    copy = select(twin.c.status).where(theirs).scalar_subquery()
    return {
        "copy_into_update": lambda repo: repo.update(key, {"status": copy}),
        "copy_into_insert": lambda repo: repo.insert({"id": key, "status": copy}),
        "exists_oracle": lambda repo: repo.count(exists().where(theirs), up_to=5),
        "widen_with_raw_or": lambda repo: repo.count(literal_column("true OR true"), up_to=5),
        "key_as_subquery": lambda repo: repo.get(select(twin.c.id).where(theirs).scalar_subquery()),
    }


claims = st.sampled_from([None, "own", "other"])
"""Whether write values leave the tenant column out, name the own tenant, or the other one."""
Model = dict[tuple[str, int], tuple[str, int]]  # (tenant, id) -> (status, version)


def other(tenant: str) -> str:
    return TENANTS[1 - TENANTS.index(tenant)]


def with_claim(values: dict[str, Any], tenant: str, claim: str | None) -> dict[str, Any]:
    if claim is None:
        return values
    return values | {"tenant_id": tenant if claim == "own" else other(tenant)}


@pytest.fixture(scope="module")
def database(ship_server: ResolvedServer) -> Iterator[PortalDatabase]:
    with portal_database(ship_server, metadata) as db:
        yield db


class TenancyMachine(RuleBasedStateMachine):
    def __init__(self, db: PortalDatabase) -> None:
        super().__init__()
        self.db = db
        self.uow = create_unit_of_work(db.engine, repositories=orders.for_scope)
        self.model: Model = {}
        db.truncate()

    def call(self, tenant: str, work: Callable[[BoundRepository], Awaitable[T]]) -> T:
        """One unit of work of ``tenant`` (its own committed transaction)."""
        return self.db.run(lambda: self.uow.run(work, tenant=tenant))

    def own(self, tenant: str) -> dict[int, tuple[str, int]]:
        return {key: value for (t, key), value in self.model.items() if t == tenant}

    @rule(tenant=tenants, key=ids, status=statuses, claim=claims)
    def insert(self, tenant: str, key: int, status: str, claim: str | None) -> None:
        values = with_claim({"id": key, "status": status}, tenant, claim)
        if claim == "other":
            with pytest.raises(TenantViolationError):
                self.call(tenant, lambda repo: repo.insert(values))
        elif (tenant, key) in self.model:
            with pytest.raises(IntegrityError):  # the key is taken in this tenant only
                self.call(tenant, lambda repo: repo.insert(values))
        else:
            row = self.call(tenant, lambda repo: repo.insert(values))
            assert (row["tenant_id"], row["id"], row["version"]) == (tenant, key, 1)
            self.model[tenant, key] = (status, 1)

    @rule(
        tenant=tenants,
        key=ids,
        status=statuses,
        claim=claims,
        expected=st.none() | st.integers(min_value=1, max_value=3),
    )
    def update(
        self, tenant: str, key: int, status: str, claim: str | None, expected: int | None
    ) -> None:
        values = with_claim({"status": status}, tenant, claim)
        current = self.model.get((tenant, key))

        def work(repo: BoundRepository) -> Awaitable[Any]:
            return repo.update(key, values, expected_version=expected)

        if claim == "other":
            with pytest.raises(TenantViolationError):
                self.call(tenant, work)
        elif current is None:
            assert self.call(tenant, work) is None
        elif expected is not None and expected != current[1]:
            with pytest.raises(VersionConflictError):
                self.call(tenant, work)
        else:
            row = self.call(tenant, work)
            assert row is not None
            assert (row["tenant_id"], row["status"], row["version"]) == (
                tenant,
                status,
                current[1] + 1,
            )
            self.model[tenant, key] = (status, current[1] + 1)

    @rule(tenant=tenants, key=ids, attack=st.sampled_from(sorted(attacks("tenant-a", 1))))
    def expression_attack(self, tenant: str, key: int, attack: str) -> None:
        with pytest.raises(UnsafeExpressionError):
            self.call(tenant, attacks(tenant, key)[attack])

    @rule(tenant=tenants, key=ids)
    def delete(self, tenant: str, key: int) -> None:
        deleted = self.call(tenant, lambda repo: repo.delete(key))
        assert deleted == ((tenant, key) in self.model)
        self.model.pop((tenant, key), None)

    @rule(tenant=tenants, key=ids)
    def get(self, tenant: str, key: int) -> None:
        row = self.call(tenant, lambda repo: repo.get(key))
        expected = self.model.get((tenant, key))
        if expected is None:
            assert row is None
        else:
            assert row is not None
            assert (row["tenant_id"], row["status"], row["version"]) == (tenant, *expected)

    @rule(tenant=tenants, keys=st.lists(ids, max_size=3))
    def get_many(self, tenant: str, keys: list[int]) -> None:
        rows = self.call(tenant, lambda repo: repo.get_many(keys))
        own = self.own(tenant)
        assert sorted(rows) == sorted(set(keys) & set(own))
        assert all(row["tenant_id"] == tenant for row in rows.values())

    @rule(tenant=tenants, status=st.none() | statuses, limit=st.integers(min_value=1, max_value=3))
    def find_all_pages(self, tenant: str, status: str | None, limit: int) -> None:
        where = None if status is None else {"status": status}
        seen: list[tuple[int, str]] = []
        cursor = None
        while True:
            page = self.call(tenant, lambda repo: repo.find(where, limit=limit, cursor=cursor))
            assert all(row["tenant_id"] == tenant for row in page.items)
            seen += [(row["id"], row["status"]) for row in page.items]
            if (cursor := page.next_cursor) is None:
                break
        expected = sorted(
            (key, s) for key, (s, _) in self.own(tenant).items() if status in (None, s)
        )
        assert seen == expected

    @rule(tenant=tenants, status=st.none() | statuses, up_to=st.integers(min_value=1, max_value=5))
    def count(self, tenant: str, status: str | None, up_to: int) -> None:
        where = None if status is None else {"status": status}
        counted = self.call(tenant, lambda repo: repo.count(where, up_to=up_to))
        matching = [s for s, _ in self.own(tenant).values() if status in (None, s)]
        assert counted == min(len(matching), up_to)

    @invariant()
    def table_equals_model(self) -> None:
        async def read_all() -> Model:
            async with self.db.engine.connect() as connection:
                rows = await connection.execute(select(table))
                return {(r.tenant_id, r.id): (r.status, r.version) for r in rows}

        assert self.db.run(read_all) == self.model


def test_no_call_crosses_the_tenant_boundary(database: PortalDatabase) -> None:
    """R2: no sequence of insert/update (incl. attempts to change the tenant)/delete/get/
    get_many/find/count, and of expressions that would read the other tenant's rows (a
    subquery copied into values, an EXISTS oracle, raw SQL widening the filter, a key given as
    a subquery: all refused), through tenant A's or B's repository observes or alters the other
    tenant's rows; each tenant's view equals the model's."""
    run_state_machine_as_test(
        lambda: TenancyMachine(database),
        settings=settings(max_examples=40, stateful_step_count=30, deadline=None),
    )
