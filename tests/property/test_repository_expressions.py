"""R2 against caller-built expressions: random condition trees through a tenant-A repository
answer exactly as an in-Python evaluation over A's rows only, with SQL's three-valued logic.

Each example loads rows for tenants A and B with the same keys and nullable columns, then,
through A's repository, pages ``find`` to the end, ``count``s, asks ``exists``, ``update``s
every key (of either tenant) with values computed by a CASE over the same condition, and
deletes the rows it matched. The model evaluates the condition in Python (NULL as None);
afterwards B's rows must be exactly as loaded.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    Column,
    ColumnElement,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    case,
    func,
    insert,
    not_,
    or_,
    select,
)
from tests.property.strategies import (
    TENANTS,
    PortalDatabase,
    Tree,
    condition_trees,
    portal_database,
    short_texts,
    small_ints,
)

from ship_sqla import BoundRepository, TableRepository, create_unit_of_work
from ship_sqla.testing import ResolvedServer

metadata = MetaData()
table = Table(
    "prop_expr_items",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("a", Integer),
    Column("b", Integer),
    # "C" collation: PostgreSQL then compares and lowercases text as Python does.
    Column("s", String(collation="C")),
    Column("mark", String),
    PrimaryKeyConstraint("tenant_id", "id", name="prop_expr_items_pkey"),
)
MAX_PAGE = 4
items = TableRepository(table, tenant_column="tenant_id", max_page_size=MAX_PAGE, max_count=20)
A, B = TENANTS
INTS, TEXTS = ("a", "b"), ("s",)

Truth = bool | None
"""SQL's three truth values: True, False, and NULL (None)."""
Row = dict[str, Any]

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


# -- the condition as SQL -------------------------------------------------------------------------


def to_sql(tree: Tree) -> ColumnElement[bool]:  # noqa: PLR0911 - one branch per node kind
    kind = tree[0]
    c = table.c
    if kind == "and":
        return and_(*(to_sql(child) for child in tree[1]))
    if kind == "or":
        return or_(*(to_sql(child) for child in tree[1]))
    if kind == "not":
        return not_(to_sql(tree[1]))
    if kind == "cmp":
        _, op, name, (side, value) = tree
        return _COMPARE[op](c[name], c[value] if side == "col" else value)  # type: ignore[no-any-return]
    if kind == "in":
        _, name, values, negated = tree
        return c[name].not_in(values) if negated else c[name].in_(values)
    if kind == "between":
        _, name, low, high = tree
        return c[name].between(low, high)
    if kind == "like":
        _, name, pattern, insensitive, negated = tree
        if insensitive:
            return c[name].not_ilike(pattern) if negated else c[name].ilike(pattern)
        return c[name].not_like(pattern) if negated else c[name].like(pattern)
    if kind == "null":
        _, name, is_null = tree
        return c[name].is_(None) if is_null else c[name].is_not(None)
    if kind == "add":
        _, left, right, op, value = tree
        return _COMPARE[op](c[left] + c[right], value)  # type: ignore[no-any-return]
    if kind == "coalesce":
        _, name, default, op, value = tree
        return _COMPARE[op](func.coalesce(c[name], default), value)  # type: ignore[no-any-return]
    _, name, value = tree  # "lower"
    return func.lower(c[name]) == value


# -- the condition in Python, with NULL as None ---------------------------------------------------


def evaluate(tree: Tree, row: Row) -> Truth:  # noqa: PLR0911 - one branch per node kind
    kind = tree[0]
    if kind == "and":
        values = [evaluate(child, row) for child in tree[1]]
        return False if False in values else (None if None in values else True)
    if kind == "or":
        values = [evaluate(child, row) for child in tree[1]]
        return True if True in values else (None if None in values else False)
    if kind == "not":
        value = evaluate(tree[1], row)
        return None if value is None else not value
    if kind == "cmp":
        _, op, name, (side, other) = tree
        return _compare(op, row[name], row[other] if side == "col" else other)
    if kind == "in":
        _, name, values, negated = tree
        found = _in(row[name], values)
        return found if not negated or found is None else not found
    if kind == "between":
        _, name, low, high = tree
        return _and(_compare(">=", row[name], low), _compare("<=", row[name], high))
    if kind == "like":
        _, name, pattern, insensitive, negated = tree
        found = _like(row[name], pattern, insensitive=insensitive)
        return found if not negated or found is None else not found
    if kind == "null":
        _, name, is_null = tree
        return (row[name] is None) == is_null
    if kind == "add":
        _, left, right, op, value = tree
        total = None if row[left] is None or row[right] is None else row[left] + row[right]
        return _compare(op, total, value)
    if kind == "coalesce":
        _, name, default, op, value = tree
        return _compare(op, default if row[name] is None else row[name], value)
    _, name, value = tree  # "lower"
    return None if row[name] is None else row[name].lower() == value


def _compare(op: str, left: object, right: object) -> Truth:
    return None if left is None or right is None else bool(_COMPARE[op](left, right))


def _and(left: Truth, right: Truth) -> Truth:
    if left is False or right is False:
        return False
    return None if left is None or right is None else True


def _in(value: object, values: tuple[object, ...]) -> Truth:
    if not values:  # SQLAlchemy renders an empty IN as a false condition, NULL or not
        return False
    if value is None:
        return None
    if value in values:
        return True
    return None if None in values else False


def _like(value: str | None, pattern: str, *, insensitive: bool) -> Truth:
    if value is None:
        return None
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    flags = re.IGNORECASE | re.DOTALL if insensitive else re.DOTALL
    return re.fullmatch(regex, value, flags) is not None


def mark_of(truth: Truth) -> str:
    return {True: "T", False: "F", None: "N"}[truth]


# -- the property ---------------------------------------------------------------------------------

columns = st.fixed_dictionaries(
    {"a": st.none() | small_ints, "b": st.none() | small_ints, "s": st.none() | short_texts}
)
tenant_rows = st.lists(columns, max_size=6)
mappings = st.fixed_dictionaries(
    {},
    optional={
        "a": st.none() | small_ints,
        "b": st.none() | small_ints,
        "s": st.none() | short_texts,
    },
).filter(bool)
"""A mapping where=: column -> value, None meaning IS NULL."""


def mapping_truth(where: dict[str, Any], row: Row) -> Truth:
    """A mapping where=: equality per column (None meaning IS NULL), ANDed."""
    return _and_all(
        [(row[k] is None) if v is None else _compare("==", row[k], v) for k, v in where.items()]
    )


def _and_all(values: list[Truth]) -> Truth:
    result: Truth = True
    for value in values:
        result = _and(result, value)
    return result


@pytest.fixture(scope="module")
def database(ship_server: ResolvedServer) -> Iterator[PortalDatabase]:
    with portal_database(ship_server, metadata) as db:
        yield db


@given(
    rows_a=tenant_rows,
    rows_b=tenant_rows,
    condition=condition_trees(INTS, TEXTS) | mappings,
    limit=st.integers(min_value=1, max_value=MAX_PAGE),
    up_to=st.integers(min_value=1, max_value=8),
)
@settings(max_examples=100, deadline=None)
def test_tenant_repository_answers_equal_the_model_over_its_own_rows(
    database: PortalDatabase,
    *,
    rows_a: list[Row],
    rows_b: list[Row],
    condition: Tree | dict[str, Any],
    limit: int,
    up_to: int,
) -> None:
    """R2: for any condition tree (and/or/not, comparisons, IN with NULLs, BETWEEN, LIKE,
    IS NULL, arithmetic, coalesce/lower, nesting) over nullable columns, tenant A's find (every
    page), count(up_to=), exists, update (by a CASE over the condition) and delete equal an
    in-Python evaluation over A's rows only, with three-valued NULL logic; B's rows, under the
    same keys, are never returned or changed."""
    database.truncate()
    loaded = [
        {"tenant_id": tenant, "id": i, **row, "mark": None}
        for tenant, rows in ((A, rows_a), (B, rows_b))
        for i, row in enumerate(rows, start=1)
    ]

    async def load() -> None:
        if loaded:
            async with database.engine.begin() as connection:
                await connection.execute(insert(table), loaded)

    database.run(load)
    if isinstance(condition, dict):
        where: Any = condition
        truth: Callable[[Row], Truth] = lambda row: mapping_truth(condition, row)  # noqa: E731
        sql = and_(
            *(table.c[k].is_(None) if v is None else table.c[k] == v for k, v in condition.items())
        )
    else:
        where = sql = to_sql(condition)
        truth = lambda row: evaluate(condition, row)  # noqa: E731
    own = [row for row in loaded if row["tenant_id"] == A]
    matching = [row["id"] for row in own if truth(row) is True]
    uow = create_unit_of_work(database.engine, repositories=items.for_scope)

    async def read(repo: BoundRepository) -> tuple[list[int], int, bool]:
        seen: list[int] = []
        cursor = None
        for _ in range(len(own) + 1):
            page = await repo.find(where, limit=limit, cursor=cursor)
            assert all(row["tenant_id"] == A for row in page.items)
            seen += [row["id"] for row in page.items]
            if (cursor := page.next_cursor) is None:
                break
        else:
            pytest.fail("paging did not end")
        return seen, await repo.count(where, up_to=up_to), await repo.exists(where)

    seen, counted, exists = database.run(lambda: uow.run(read, tenant=A))
    assert seen == matching
    assert counted == min(len(matching), up_to)
    assert exists == bool(matching)

    keys = sorted({row["id"] for row in loaded})
    marker = case((sql, "T"), (not_(sql), "F"), else_="N")

    async def write(repo: BoundRepository) -> tuple[dict[int, Any], list[bool]]:
        marks = {}
        for key in keys:
            row = await repo.update(key, {"mark": marker})
            marks[key] = None if row is None else (row["tenant_id"], row["mark"])
        return marks, [await repo.delete(key) for key in matching]

    marks, deleted = database.run(lambda: uow.run(write, tenant=A))
    assert marks == {
        key: next(((A, mark_of(truth(r))) for r in own if r["id"] == key), None) for key in keys
    }
    assert deleted == [True] * len(matching)

    async def stored() -> list[Row]:
        async with database.engine.connect() as connection:
            result = await connection.execute(select(table).order_by(table.c.tenant_id, table.c.id))
            return [dict(row) for row in result.mappings()]

    expected = [row | {"mark": mark_of(truth(row))} for row in own if row["id"] not in matching] + [
        row for row in loaded if row["tenant_id"] == B
    ]
    assert database.run(stored) == expected


def test_model_uses_three_valued_logic() -> None:
    """The Python model: NULL propagates through comparisons, AND/OR absorb it, NOT keeps it."""
    row = {"a": None, "b": 1, "s": "Ab"}
    assert evaluate(("cmp", "==", "a", ("val", 1)), row) is None
    assert evaluate(("and", (("cmp", "==", "a", ("val", 1)), ("null", "b", True))), row) is False
    assert evaluate(("or", (("cmp", "==", "a", ("val", 1)), ("null", "a", True))), row) is True
    assert evaluate(("not", ("cmp", ">", "a", ("val", 0))), row) is None
    assert evaluate(("in", "b", (2, None), False), row) is None
    assert evaluate(("in", "b", (), True), row) is True
    assert evaluate(("like", "s", "a_", True, False), row) is True
    assert evaluate(("between", "b", 2, 1), row) is False
