"""R2 under attack: generated expressions, hostile types among them, through every method of a
tenant-scoped repository, with another tenant's rows present.

The property (non-interference): each call is either refused with a typed error before any
SQL runs, or what tenant ``acme`` observes (the call's result or error, and acme's rows
afterwards) is the same whatever the other tenant's rows hold, and the other tenant's rows
are never changed. Each example runs its call twice: once beside globex's rows of variant 1
and once beside variant 2 (other secrets, other numbers, a row fewer); a read or a copy of
globex's data, a count of its rows, or a yes/no answer that depends on them shows up as a
difference.

The expressions are plain data (printable in a falsifying example) that :func:`build` turns
into SQLAlchemy objects: the table's own columns, values, operators, pure and unknown
functions, casts, ``type_coerce``, ``literal``, ``literal_execute`` parameters, raw SQL,
subqueries, another table's columns, labels with unquoted names, and types that are
SQLAlchemy's own (with valid or hostile parameters), benign or hostile ``TypeDecorator`` and
``UserDefinedType`` classes made afresh per example, variants and arrays of them, and the
table's own declared column types. Every counterexample found is kept as an explicit test at
the end of this module.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    event,
    func,
    insert,
    literal,
    literal_column,
    not_,
    or_,
    select,
    text,
    true,
    tuple_,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, ENUM, INTERVAL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import quoted_name
from sqlalchemy.types import TypeDecorator, TypeEngine, UserDefinedType
from tests.property.strategies import PortalDatabase, portal_database

from ship_sqla import BoundRepository, Projection, TableRepository, create_unit_of_work
from ship_sqla.errors import RepositoryUsageError, ShipError, TenantViolationError
from ship_sqla.testing import ResolvedServer

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
EXAMPLES = 10_000 if LARGE else 1000
"""CI's fixed budget (the large profile: ``nox -s tests_large``)."""


class LowerText(TypeDecorator[str]):
    """A declared column type with a SQL hook of its own: the schema, trusted where
    SQLAlchemy applies it."""

    impl = Text
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> Any:
        return func.lower(bindvalue)


metadata = MetaData()
acct = Table(
    "adv_acct",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("secret", Text, nullable=False),
    Column("n", Integer, nullable=False),
    Column("tag", LowerText, nullable=True),
    PrimaryKeyConstraint("tenant_id", "id", name="adv_acct_pkey"),
)
other = Table(
    "adv_other",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("secret", Text, nullable=False),
    PrimaryKeyConstraint("tenant_id", "id", name="adv_other_pkey"),
)
peer = acct.alias("peer")
SUMMARY = Projection(name="summary", columns=("id", "secret", "n"), into=lambda **row: row)
ACCT = TableRepository(
    acct,
    tenant_column="tenant_id",
    key="id",
    max_page_size=5,
    max_count=10,
    projections=(SUMMARY,),
)
ACME, GLOBEX = "acme", "globex"
ACME_ROWS = [
    {"tenant_id": ACME, "id": 1, "secret": "acme-1", "n": 1, "tag": "a"},
    {"tenant_id": ACME, "id": 2, "secret": "acme-2", "n": 2, "tag": "b"},
]
GLOBEX_ROWS = {
    1: [
        {"tenant_id": GLOBEX, "id": 1, "secret": "GLOBEX-V1-1", "n": 11, "tag": "g1"},
        {"tenant_id": GLOBEX, "id": 3, "secret": "GLOBEX-V1-3", "n": 13, "tag": "g3"},
    ],
    2: [{"tenant_id": GLOBEX, "id": 1, "secret": "GLOBEX-V2-1", "n": 21, "tag": "h1"}],
}
OTHER_ROWS = {v: [{"tenant_id": GLOBEX, "id": 1, "secret": f"OTHER-V{v}"}] for v in (1, 2)}
SECRET_MARKERS = ("GLOBEX-V", "OTHER-V")
"""In every secret of the other tenant and the other table; in nothing a caller writes."""

# -- what an attacker writes ----------------------------------------------------------------------

WIDENING = ("true) OR (true",)
"""SQL for a bound value's place in a condition: closes the caller's group, ORs in true."""
READING = (
    "(select string_agg(secret, ',' order by tenant_id, id) from adv_acct)",
    "(select count(*) from adv_acct)",
    "(select max(secret) from adv_other)",
)
"""SQL for a value's place: reads every tenant's rows (or another table)."""
CAST_CLOSING = (
    "text) IS NOT NULL) OR ((true",
    "10)) IS NOT NULL) OR (((true",
    "YEAR) IS NOT NULL) OR ((true",
    '"C") IS NOT NULL) OR ((true',
)
"""Type DDL for ``CAST(x AS <here>) IS NOT NULL``: closes the cast and the group, ORs in true."""
BIND_CAST_CLOSING = ('"C") OR (true', "10) OR (true")
"""Type DDL for ``col = $1::<here>``: closes the group, ORs in true."""
WRITING = (
    (
        "text), n = 666 WHERE adv_acct.tenant_id = 'globex' RETURNING adv_acct.tenant_id,"
        " adv_acct.id, adv_acct.secret, adv_acct.n, adv_acct.tag --"
    ),
)
"""Type DDL for ``SET secret = CAST($1 AS <here>)``: rewrites another tenant's row."""
PAYLOADS = (
    *WIDENING,
    *READING,
    *CAST_CLOSING,
    *BIND_CAST_CLOSING,
    *WRITING,
    "adv_acct.tenant_id = 'globex' --",
    "0 OR true",
    "x",
)
payloads = st.sampled_from(PAYLOADS)
values = st.one_of(
    st.none(),
    st.integers(min_value=-2, max_value=3),
    st.sampled_from(("acme-1", "a", "GLOBEX", "", "1")),
    payloads,
)

SQL_KINDS = ("bind_expression", "column_expression", "literal_processor", "string_subclass")
"""Hostile types whose hook returns SQL for a value's place."""
DDL_KINDS = (
    "user_defined",
    "decorator_over_user_defined",
    "load_dialect_impl",
    "compiles",
    "variant",
    "array_of_user_defined",
    "numeric_precision",
    "interval_fields",
    "string_length",
    "collation",
    "collation_unquoted",
    "enum_unquoted",
)
"""Hostile types whose DDL text carries the payload."""
HOSTILE_KINDS = SQL_KINDS + DDL_KINDS
BUILTINS: dict[str, Callable[[], TypeEngine[Any]]] = {
    "integer": Integer,
    "text": Text,
    "string": lambda: String(20),
    "numeric": lambda: Numeric(10, 2),
    "boolean": Boolean,
    "interval": lambda: INTERVAL(fields="DAY"),
    "collated": lambda: String(collation="C"),
}


def hostile(kinds: tuple[str, ...], family: tuple[str, ...]) -> st.SearchStrategy[Tree]:
    return st.tuples(st.just("hostile"), st.sampled_from(kinds), st.sampled_from(family))


types = st.one_of(
    st.tuples(st.just("builtin"), st.sampled_from(sorted(BUILTINS))),
    hostile(HOSTILE_KINDS, PAYLOADS),
    st.tuples(st.just("benign"), st.sampled_from(("text", "integer", "boolean"))),
    st.just(("own_tag",)),
)

Tree = tuple[Any, ...]

bound = st.sampled_from(("literal", "coerce", "bindlit"))
"""The three ways a caller hands a value with a type of their choosing."""
targeted_values = st.one_of(
    st.tuples(bound, st.just("x"), hostile(SQL_KINDS, READING)),
    st.tuples(st.just("cast"), st.just(("val", "x")), hostile(DDL_KINDS, WRITING)),
)
"""Attacks aimed at a value's place (insert and update values): copy or rewrite."""
targeted_conditions = st.one_of(
    st.tuples(st.just("bool"), st.tuples(bound, st.just(True), hostile(SQL_KINDS, WIDENING))),
    st.tuples(
        st.just("isnull"),
        st.tuples(
            st.just("cast"),
            st.sampled_from((("own", "secret"), ("own", "n"), ("val", "1"))),
            hostile(DDL_KINDS, CAST_CLOSING),
        ),
        st.just(False),
    ),
    st.tuples(
        st.just("cmp"),
        st.just("=="),
        st.sampled_from((("own", "secret"), ("own", "n"))),
        st.tuples(bound, st.sampled_from(("a", 1)), hostile(DDL_KINDS, BIND_CAST_CLOSING)),
    ),
)
"""Attacks aimed at a condition: widen it past the tenant filter."""

value_leaves = st.one_of(
    st.tuples(st.just("own"), st.sampled_from(("id", "secret", "n", "tag"))),
    st.just(("tenant",)),
    st.tuples(st.just("foreign"), st.sampled_from(("secret", "id"))),
    st.tuples(st.just("alias"), st.sampled_from(("secret", "n"))),
    st.tuples(st.just("val"), values),
    st.tuples(bound, values, types),
    st.tuples(st.just("raw"), payloads),
    st.tuples(st.just("scalar"), st.sampled_from(("secret", "n"))),
    targeted_values,
)


def _value_branches(children: st.SearchStrategy[Tree]) -> st.SearchStrategy[Tree]:
    return st.one_of(
        st.tuples(st.just("cast"), children, types),
        st.tuples(
            st.just("fn"),
            st.sampled_from(("lower", "coalesce", "length", "concat", "my_leak", "upper")),
            st.lists(children, min_size=1, max_size=2).map(tuple),
        ),
        st.tuples(st.just("op"), st.sampled_from(("+", "||")), children, children),
        st.tuples(st.just("label"), children, payloads),
        st.tuples(st.just("case"), children, children),
    )


value_trees = st.recursive(value_leaves, _value_branches, max_leaves=4)
condition_leaves = st.one_of(
    targeted_conditions,
    st.tuples(st.just("cmp"), st.sampled_from(("==", "!=", "<", "like")), value_trees, value_trees),
    st.tuples(st.just("isnull"), value_trees, st.booleans()),
    st.tuples(st.just("bool"), value_trees),
    st.tuples(st.just("text"), payloads),
    st.tuples(st.just("tuple_in"), payloads),
)
condition_trees = st.recursive(
    condition_leaves,
    lambda children: st.one_of(
        st.tuples(st.just("and"), st.lists(children, min_size=1, max_size=3).map(tuple)),
        st.tuples(st.just("or"), st.lists(children, min_size=1, max_size=3).map(tuple)),
        st.tuples(st.just("not"), children),
    ),
    max_leaves=4,
)
keys = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from((1, 2, 3))),
    st.tuples(st.just("plain"), st.sampled_from(("1", "x", None, 1.5, True, (GLOBEX, 1), (1,)))),
    st.tuples(st.just("expr"), value_trees),
)
"""A key: ("plain", value) or ("expr", an expression tree)."""
writable = st.sampled_from(("secret", "n", "tag"))
calls = st.one_of(
    st.tuples(
        st.just("find"),
        condition_trees,
        st.sampled_from(((), ("-n",), ("secret",), ("tag", "-id"))),
        st.integers(min_value=1, max_value=3),
    ),
    st.tuples(st.just("count"), condition_trees),
    st.tuples(st.just("exists"), condition_trees),
    st.tuples(st.just("project"), condition_trees),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("get_many"), st.lists(keys, min_size=1, max_size=3).map(tuple)),
    st.tuples(
        st.just("insert"),
        st.dictionaries(writable, value_trees, min_size=1).map(lambda d: tuple(sorted(d.items()))),
    ),
    st.tuples(
        st.just("update"),
        keys,
        st.dictionaries(writable, value_trees, min_size=1).map(lambda d: tuple(sorted(d.items()))),
    ),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("where_mapping"), writable, value_trees),
)

# -- building the SQLAlchemy objects --------------------------------------------------------------


def hostile_type(kind: str, payload: str) -> TypeEngine[Any]:  # noqa: PLR0911, PLR0912 - one per kind
    """A type whose hooks or parameters carry ``payload`` as SQL; classes are made afresh."""

    def user_defined() -> TypeEngine[Any]:
        return type(
            "HostileUDT",
            (UserDefinedType,),
            {"cache_ok": True, "get_col_spec": lambda _self, **_kw: payload},
        )()

    if kind in ("bind_expression", "column_expression"):
        hook = lambda _self, _expression: literal_column(payload)  # noqa: E731
        return type(
            "HostileDecorator", (TypeDecorator,), {"impl": Text, "cache_ok": True, kind: hook}
        )()
    if kind == "literal_processor":
        return type(
            "HostileLiteral",
            (TypeDecorator,),
            {
                "impl": Text,
                "cache_ok": True,
                "process_literal_param": lambda _self, _value, _dialect: payload,
            },
        )()
    if kind == "user_defined":
        return user_defined()
    if kind == "decorator_over_user_defined":
        udt = type(user_defined())
        return type("HostileWrapper", (TypeDecorator,), {"impl": udt, "cache_ok": True})()
    if kind == "load_dialect_impl":
        return type(
            "HostileDialectImpl",
            (TypeDecorator,),
            {
                "impl": Text,
                "cache_ok": True,
                "load_dialect_impl": lambda _self, _dialect: user_defined(),
            },
        )()
    if kind == "compiles":
        cls = type("HostileCompiled", (TypeDecorator,), {"impl": Text, "cache_ok": True})
        compiles(cls)(lambda _type, _compiler, **_kw: payload)
        return cls()
    if kind == "string_subclass":
        return type(
            "HostileString",
            (String,),
            {"bind_expression": lambda _self, _value: literal_column(payload)},
        )()
    if kind == "variant":
        return String().with_variant(user_defined(), "postgresql")
    if kind == "array_of_user_defined":
        return ARRAY(user_defined())
    if kind == "numeric_precision":
        return Numeric(precision=payload)  # type: ignore[arg-type]
    if kind == "interval_fields":
        return INTERVAL(fields=payload)
    if kind == "string_length":
        return String(length=payload)  # type: ignore[arg-type]
    if kind == "collation":
        return String(collation=payload)
    if kind == "collation_unquoted":
        return String(collation=quoted_name(payload, quote=False))
    assert kind == "enum_unquoted"
    return ENUM("a", "b", name=quoted_name(payload, quote=False), create_type=False)


def build_type(spec: Tree) -> TypeEngine[Any]:
    if spec[0] == "builtin":
        return BUILTINS[spec[1]]()
    if spec[0] == "hostile":
        return hostile_type(spec[1], spec[2])
    if spec[0] == "benign":
        impl = {"text": Text, "integer": Integer, "boolean": Boolean}[spec[1]]
        return type(
            "BenignDecorator",
            (TypeDecorator,),
            {"impl": impl, "cache_ok": True, "process_bind_param": lambda _s, v, _d: v},
        )()
    assert spec == ("own_tag",)
    return acct.c.tag.type


def build(tree: Tree) -> Any:  # noqa: PLR0911, PLR0912 - one branch per node kind
    kind = tree[0]
    if kind == "own":
        return acct.c[tree[1]]
    if kind == "tenant":
        return acct.c.tenant_id
    if kind == "foreign":
        return other.c[tree[1]]
    if kind == "alias":
        return peer.c[tree[1]]
    if kind == "val":
        return literal(tree[1])
    if kind == "literal":
        return literal(tree[1], type_=build_type(tree[2]))
    if kind == "coerce":
        return type_coerce(tree[1], build_type(tree[2]))
    if kind == "bindlit":
        return bindparam("p", tree[1], type_=build_type(tree[2]), literal_execute=True)
    if kind == "raw":
        return literal_column(tree[1])
    if kind == "scalar":
        return select(peer.c[tree[1]]).where(peer.c.id == acct.c.id).scalar_subquery()
    if kind == "cast":
        return cast(build(tree[1]), build_type(tree[2]))
    if kind == "fn":
        return getattr(func, tree[1])(*(build(child) for child in tree[2]))
    if kind == "op":
        left, right = build(tree[2]), build(tree[3])
        return left + right if tree[1] == "+" else left.concat(right)
    if kind == "label":
        return build(tree[1]).label(quoted_name(tree[2], quote=False))
    if kind == "case":
        return case((acct.c.n > 0, build(tree[1])), else_=build(tree[2]))
    return build_condition(tree)


def build_condition(tree: Tree) -> Any:  # noqa: PLR0911 - one branch per node kind
    kind = tree[0]
    if kind == "cmp":
        left, right = build(tree[2]), build(tree[3])
        if tree[1] == "like":
            return left.like(right)
        return {"==": left == right, "!=": left != right, "<": left < right}[tree[1]]
    if kind == "isnull":
        value = build(tree[1])
        return value.is_(None) if tree[2] else value.is_not(None)
    if kind == "bool":  # the value itself as the condition, when it is a boolean
        value = build(tree[1])
        impl = getattr(value.type, "impl_instance", value.type)
        return value if isinstance(impl, Boolean) else value.is_not(None)
    if kind == "text":
        return and_(true(), text(tree[1]))
    if kind == "tuple_in":
        inner = select(peer.c.secret).where(peer.c.tenant_id == GLOBEX).scalar_subquery()
        return tuple_(acct.c.id, acct.c.secret).in_([(1, inner)])
    if kind == "and":
        return and_(*(build_condition(child) for child in tree[1]))
    if kind == "or":
        return or_(*(build_condition(child) for child in tree[1]))
    assert kind == "not"
    return not_(build_condition(tree[1]))


def build_key(key: Tree) -> object:
    return key[1] if key[0] == "plain" else build(key[1])


def build_call(call: Tree) -> Callable[[BoundRepository], Any]:  # noqa: PLR0911 - one per method
    method = call[0]
    if method == "find":
        where, order_by, limit = build_condition(call[1]), call[2], call[3]

        async def find_all(repo: BoundRepository) -> Any:
            pages, cursor = [], None
            for _ in range(10):
                page = await repo.find(where, order_by=order_by, limit=limit, cursor=cursor)
                pages.append(page.items)
                if (cursor := page.next_cursor) is None:
                    return pages
            return ("paging did not end", pages)  # observed, not raised: a BaseException would
            # end the test's event loop

        return find_all
    if method == "count":
        where = build_condition(call[1])
        return lambda repo: repo.count(where, up_to=10)
    if method == "exists":
        where = build_condition(call[1])
        return lambda repo: repo.exists(where)
    if method == "project":
        where = build_condition(call[1])
        return lambda repo: repo.project(SUMMARY, where, limit=5)
    if method == "get":
        key = build_key(call[1])
        return lambda repo: repo.get(key)
    if method == "get_many":
        many = [build_key(key) for key in call[1]]
        return lambda repo: repo.get_many(many)
    if method == "insert":
        row = {"id": 7, "secret": "new", "n": 0} | {name: build(v) for name, v in call[1]}
        return lambda repo: repo.insert(row)
    if method == "update":
        key, changes = build_key(call[1]), {name: build(v) for name, v in call[2]}
        return lambda repo: repo.update(key, changes)
    if method == "delete":
        key = build_key(call[1])
        return lambda repo: repo.delete(key)
    assert method == "where_mapping"
    mapping = {call[1]: build(call[2])}
    return lambda repo: repo.find(mapping, limit=5)


# -- running a call beside each variant -----------------------------------------------------------


class Refused(enum.Enum):
    BEFORE_SQL = "refused before SQL"


@attrs.frozen
class Observed:
    """What acme sees of one call, and what became of globex's rows."""

    outcome: object
    acme_rows: tuple[tuple[Any, ...], ...]
    globex_rows: tuple[tuple[Any, ...], ...]
    other_rows: tuple[tuple[Any, ...], ...]
    statements: int


def _rows(rows: Any) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(row) for row in rows)


def _outcome(value: object) -> object:
    """The call's result as plain, comparable data."""
    if isinstance(value, list | tuple):
        return tuple(_outcome(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _outcome(v)) for k, v in value.items()))
    if hasattr(value, "items") and hasattr(value, "next_cursor"):  # a Page
        return (_outcome(value.items), value.next_cursor is not None)
    if hasattr(value, "_mapping"):
        return tuple(sorted(value._mapping.items()))
    if hasattr(value, "keys") and hasattr(value, "values"):  # a RowMapping
        return tuple(sorted(dict(value).items()))
    return value


class Harness:
    def __init__(self, database: PortalDatabase) -> None:
        self.database = database
        self.statements = 0
        event.listen(database.engine.sync_engine, "before_cursor_execute", self._count)
        self.uow = create_unit_of_work(database.engine, repositories=ACCT.for_scope)

    def _count(self, *_args: object) -> None:
        self.statements += 1

    def observe(self, call: Callable[[BoundRepository], Any], variant: int) -> Observed:
        database = self.database

        async def reset() -> None:
            async with database.engine.begin() as connection:
                await connection.execute(delete(acct))
                await connection.execute(delete(other))
                await connection.execute(insert(acct), ACME_ROWS + GLOBEX_ROWS[variant])
                await connection.execute(insert(other), OTHER_ROWS[variant])

        database.run(reset)
        counted: list[int] = []

        async def handler(repo: BoundRepository) -> Any:
            before = self.statements
            try:
                return await call(repo)
            finally:
                counted.append(self.statements - before)

        outcome: object
        refusal: Exception | None = None
        try:
            outcome = _outcome(database.run(lambda: self.uow.run(handler, tenant=ACME)))
        except (TenantViolationError, RepositoryUsageError) as error:  # refusals, by contract
            outcome, refusal = Refused.BEFORE_SQL, error
        except ShipError as error:
            outcome = (type(error).__name__, str(error))
        except DBAPIError as error:  # the database's own refusal, e.g. a type mismatch
            outcome = (type(error).__name__, str(error.orig))
        except Exception as error:
            outcome = (type(error).__name__, str(error))

        assert refusal is None or counted == [0], f"{refusal!r} raised after {counted} statements"

        async def stored() -> tuple[Any, ...]:
            async with database.engine.connect() as connection:
                order = (acct.c.tenant_id, acct.c.id)
                rows = (await connection.execute(select(acct).order_by(*order))).all()
                others = (await connection.execute(select(other).order_by(other.c.id))).all()
                return rows, others

        rows, others = database.run(stored)
        return Observed(
            outcome=outcome,
            acme_rows=_rows(r for r in rows if r.tenant_id == ACME),
            globex_rows=_rows(r for r in rows if r.tenant_id == GLOBEX),
            other_rows=_rows(others),
            statements=counted[0] if counted else 0,
        )

    def check(self, call_tree: Tree) -> None:
        """The property, for one call (see the module docstring)."""
        try:
            call = build_call(call_tree)
        except Exception:
            reject()
        seen = {variant: self.observe(call, variant) for variant in (1, 2)}
        for variant, observed in seen.items():
            assert observed.globex_rows == _rows(
                tuple(row.values()) for row in GLOBEX_ROWS[variant]
            ), f"globex's rows changed (variant {variant}): {observed.globex_rows}"
            assert observed.other_rows == _rows(
                tuple(row.values()) for row in OTHER_ROWS[variant]
            ), f"another table changed (variant {variant}): {observed.other_rows}"
            seen_by_acme = repr((observed.outcome, observed.acme_rows))
            assert not any(marker in seen_by_acme for marker in SECRET_MARKERS), (
                f"acme saw another tenant's data (variant {variant}): {observed}"
            )
        assert seen[1].outcome == seen[2].outcome, (
            f"acme's answer depends on globex's rows: {seen[1].outcome!r} / {seen[2].outcome!r}"
        )
        assert seen[1].acme_rows == seen[2].acme_rows, (
            f"acme's rows depend on globex's: {seen[1].acme_rows} / {seen[2].acme_rows}"
        )


@pytest.fixture(scope="module")
def harness(ship_server: ResolvedServer) -> Iterator[Harness]:
    with portal_database(ship_server, metadata) as database:
        yield Harness(database)


@pytest.mark.timeout(3600 if LARGE else 120)
@given(call=calls)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_no_expression_or_type_crosses_the_tenant_boundary(harness: Harness, call: Tree) -> None:
    """R2: any generated expression (hostile types, raw SQL, subqueries, other tables, unquoted
    names, literal_execute parameters...) through find (every page), count, exists, project,
    get, get_many, insert, update, delete and a mapping where=, with another tenant's rows
    present, is refused with a typed error before any SQL runs, or acme's answer and rows are
    the same whatever globex's rows hold, and globex's rows never change."""
    harness.check(call)


# -- counterexamples, kept -----------------------------------------------------------------------

TRIALS: dict[str, Tree] = {
    # The trial report's D1 and D2 (trials-2026-12-02-tenant-and-inputs.md), as data.
    "d1_project_leak_bool": (
        "project",
        ("bool", ("literal", True, ("hostile", "bind_expression", "true) OR (true"))),
    ),
    "d1_update_copies_secrets": (
        "update",
        ("plain", 1),
        (("secret", ("coerce", "x", ("hostile", "bind_expression", PAYLOADS[1]))),),
    ),
    "d1_insert_copies_secrets": (
        "insert",
        (("secret", ("literal", "x", ("hostile", "bind_expression", PAYLOADS[1]))),),
    ),
    "d2_cast_decorator_over_udt": (
        "find",
        (
            "isnull",
            ("cast", ("own", "secret"), ("hostile", "decorator_over_user_defined", PAYLOADS[3])),
            False,
        ),
        (),
        3,
    ),
    "d2_numeric_precision": (
        "count",
        ("isnull", ("cast", ("own", "n"), ("hostile", "numeric_precision", PAYLOADS[4])), False),
    ),
    "d2_interval_fields": (
        "exists",
        ("isnull", ("cast", ("val", "1"), ("hostile", "interval_fields", PAYLOADS[5])), False),
    ),
    "d2_update_rewrites_globex": (
        "update",
        ("plain", 1),
        (
            (
                "secret",
                ("cast", ("val", "x"), ("hostile", "decorator_over_user_defined", PAYLOADS[7])),
            ),
        ),
    ),
    "unquoted_collation_in_bind_cast": (
        "count",
        (
            "cmp",
            "==",
            ("own", "secret"),
            ("literal", "a", ("hostile", "collation_unquoted", '"C") OR (true')),
        ),
    ),
    "unquoted_enum_name": (
        "count",
        (
            "cmp",
            "==",
            ("own", "secret"),
            ("cast", ("val", "a"), ("hostile", "enum_unquoted", PAYLOADS[0])),
        ),
    ),
    "literal_execute_numeric": (
        "count",
        ("cmp", "==", ("own", "n"), ("bindlit", "0 OR true", ("builtin", "numeric"))),
    ),
    "string_length_in_cast": (
        "count",
        ("isnull", ("cast", ("own", "secret"), ("hostile", "string_length", PAYLOADS[4])), False),
    ),
    "variant_of_udt": (
        "count",
        ("isnull", ("cast", ("own", "secret"), ("hostile", "variant", PAYLOADS[3])), False),
    ),
    "tuple_in_with_subquery_value": ("count", ("tuple_in", "x")),
    "unquoted_label": ("count", ("isnull", ("label", ("own", "n"), PAYLOADS[8]), False)),
    "key_of_another_tenant_shape": ("get", ("plain", (GLOBEX, 1))),
    "own_hook_type_as_bind": (
        "count",
        ("cmp", "==", ("own", "tag"), ("literal", "A", ("own_tag",))),
    ),
    "own_hook_type_as_cast_target": (
        "count",
        ("cmp", "==", ("own", "tag"), ("cast", ("val", "A"), ("own_tag",))),
    ),
}


@pytest.mark.parametrize("call", TRIALS.values(), ids=TRIALS.keys())
def test_kept_counterexamples_hold(harness: Harness, call: Tree) -> None:
    """R2: the trial report's reproductions (D1, D2) and every counterexample the property
    found are refused before SQL, or answer acme alone."""
    harness.check(call)
