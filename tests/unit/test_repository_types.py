"""The type half of the expression guard (R2, R3), without a database.

A type is SQL too: its DDL is written into CASTs and bind casts, its hooks wrap values and
selected expressions. These tests pin which types the guard accepts where (SQLAlchemy's own
with valid parameters, TypeDecorators adding no SQL, the table's declared column types where
SQLAlchemy applies them) and that everything else is refused with a typed error naming the
type and the fix. ``tests/property/test_repository_adversarial.py`` proves the same against
a database, by fuzzing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import uuid
from typing import Any

import pytest
from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    bindparam,
    cast,
    func,
    literal,
    literal_column,
    select,
    tuple_,
    type_coerce,
)
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, BIT, ENUM, INTERVAL, JSONB, TIMESTAMP
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import Label, quoted_name
from sqlalchemy.types import TypeDecorator, TypeEngine, UserDefinedType

from ship_sqla._repository_guard import ExpressionGuard, UnsafeExpressionError
from ship_sqla._repository_types import INTERVAL_FIELDS, key_value_refusal


class Geometry(UserDefinedType[str]):
    """A declared column type from another library's mould: raw DDL and SQL hooks."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "geometry(POINT, 4326)"

    def bind_expression(self, bindvalue: Any) -> Any:
        return func.st_geomfromtext(bindvalue, 4326)


class Trimmed(TypeDecorator[str]):
    """An application TypeDecorator that adds no SQL: Python-side processing only."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, _dialect: Any) -> str | None:
        return None if value is None else value.strip()


class Hostile(TypeDecorator[str]):
    impl = Text
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> Any:  # noqa: ARG002 - the attack
        return literal_column("true) OR (true")


class Selecting(TypeDecorator[str]):
    impl = Text
    cache_ok = True

    def column_expression(self, colexpr: Any) -> Any:  # noqa: ARG002 - the attack
        return literal_column("(select string_agg(secret, ',') from places)")


class LiteralInjecting(TypeDecorator[str]):
    impl = Text
    cache_ok = True

    def process_literal_param(self, value: Any, dialect: Any) -> str:  # noqa: ARG002
        return "'x' OR true"


class RawSpec(UserDefinedType[str]):
    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "text) IS NOT NULL) OR ((true"


class OverRaw(TypeDecorator[str]):
    impl = RawSpec
    cache_ok = True


class DialectRaw(TypeDecorator[str]):
    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:  # noqa: ARG002
        return RawSpec()


class DialectUuid(TypeDecorator[uuid.UUID]):
    """The common GUID recipe: load_dialect_impl answers one of SQLAlchemy's own types."""

    impl = String(36)
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        return dialect.type_descriptor(postgresql.UUID())


class Compiled(TypeDecorator[str]):
    impl = Text
    cache_ok = True


@compiles(Compiled, "postgresql")
def _compiled(_type: Any, _compiler: Any, **_kw: Any) -> str:
    return "text) OR (true"


class SubString(String):
    """A subclass of a built-in type: not SQLAlchemy's, whatever it overrides."""


metadata = MetaData()
places = Table(
    "places",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, primary_key=True),
    Column("name", String(50)),
    Column("secret", Text),
    Column("at", Geometry),
    Column("label", Trimmed),
)
other = Table("other_places", metadata, Column("id", Integer), Column("odd", Hostile))
p = places.c
GUARD = ExpressionGuard(places, p.tenant_id)


def _refused(expression: Any, *, cross: bool = False) -> str:
    policy = GUARD.cross if cross else GUARD.row
    with pytest.raises(UnsafeExpressionError) as raised:
        GUARD.check(expression, policy, where="where=")
    return str(raised.value)


# -- SQLAlchemy's own types -----------------------------------------------------------------------


def _builtin_type_classes() -> list[type[TypeEngine[Any]]]:
    modules = [sqltypes, postgresql]
    found = {
        value
        for module in modules
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, TypeEngine)
        and value.__module__.startswith(
            ("sqlalchemy.sql.sqltypes", "sqlalchemy.dialects.postgresql")
        )
        and not issubclass(value, UserDefinedType)
        and value is not TypeDecorator
    }
    instantiable = []
    for cls in sorted(found, key=lambda c: c.__qualname__):
        try:
            cls()
        except (TypeError, NotImplementedError):
            continue  # needs arguments (ARRAY, ENUM...): covered below
        instantiable.append(cls)
    return instantiable


# Some of SQLAlchemy's types declare no operator classes yet and say so when used; not ours.
@pytest.mark.filterwarnings("ignore:Type object.*operator_classes:DeprecationWarning")
@pytest.mark.parametrize("cls", _builtin_type_classes(), ids=lambda c: c.__qualname__)
def test_every_builtin_type_is_accepted_in_casts_and_values(cls: type[TypeEngine[Any]]) -> None:
    """R2: every one of SQLAlchemy's own types (sqltypes and the PostgreSQL dialect) is accepted
    as a CAST target and as a bound value's type: its DDL reads as a type name."""
    type_ = cls()
    GUARD.check(cast(p.name, type_).is_(None), GUARD.row, where="where=")
    GUARD.check(literal(None, type_=type_).is_(None), GUARD.row, where="where=")


ACCEPTED_TYPES: dict[str, TypeEngine[Any]] = {
    "string_length_collation": String(50, collation="C"),
    "collation_with_a_quote": String(collation='C" OR true --'),  # quoted as an identifier
    "numeric": Numeric(10, 2),
    "timestamp_precision": TIMESTAMP(timezone=True, precision=3),
    "interval_fields": INTERVAL(fields="DAY TO SECOND", precision=3),
    "array_dimensions": ARRAY(Integer, dimensions=2),
    "array_of_collated": ARRAY(String(10, collation="C")),
    "enum": ENUM("a", "b", name="mood", create_type=False),
    "enum_schema_quoted": ENUM("a", name="My Mood", schema="app data", create_type=False),
    "enum_unquoted_plain": ENUM("a", name=quoted_name("mood", quote=False), create_type=False),
    "non_native_enum": sqltypes.Enum("a", "b", native_enum=False),
    "bit": BIT(5),
    "bit_varying": BIT(varying=True),
    "jsonb": JSONB(),
    "variant_builtin": String().with_variant(Text(), "postgresql"),
    "decorator_without_sql": Trimmed(),
    "decorator_with_builtin_dialect_impl": DialectUuid(),
    "pickle": sqltypes.PickleType(),
    "generic_interval": sqltypes.Interval(second_precision=3),
}


@pytest.mark.parametrize("type_", ACCEPTED_TYPES.values(), ids=ACCEPTED_TYPES.keys())
def test_builtin_types_with_valid_parameters_are_accepted(type_: TypeEngine[Any]) -> None:
    """R2: SQLAlchemy's types with integer lengths/precisions, INTERVAL fields from the fixed
    set, names quoted as identifiers, and TypeDecorators adding no SQL of their own pass in a
    CAST, a literal and a type_coerce."""
    GUARD.check(cast(p.name, type_).is_(None), GUARD.row, where="where=")
    GUARD.check(literal(None, type_=type_).is_(None), GUARD.row, where="where=")
    GUARD.check(type_coerce(None, type_).is_(None), GUARD.row, where="where=")


@pytest.mark.parametrize("fields", sorted(INTERVAL_FIELDS))
def test_every_interval_field_phrase_is_accepted(fields: str) -> None:
    """R2: each of PostgreSQL's thirteen INTERVAL field phrases, in either case."""
    GUARD.check(cast("1", INTERVAL(fields=fields)).is_(None), GUARD.row, where="where=")
    GUARD.check(cast("1", INTERVAL(fields=fields.lower())).is_(None), GUARD.row, where="where=")


# -- what is refused ------------------------------------------------------------------------------


def _user_defined(spec: str) -> TypeEngine[Any]:
    cls = type(
        "Spec", (UserDefinedType,), {"cache_ok": True, "get_col_spec": lambda *_a, **_k: spec}
    )
    return cls()  # type: ignore[no-any-return]


REFUSED_TYPES: dict[str, tuple[TypeEngine[Any], str]] = {
    "bind_expression": (Hostile(), "overrides bind_expression"),
    "column_expression": (Selecting(), "overrides column_expression"),
    "literal_processor": (LiteralInjecting(), "overrides process_literal_param"),
    "user_defined": (RawSpec(), "UserDefinedType"),
    "decorator_over_user_defined": (OverRaw(), "its implementation"),
    "load_dialect_impl_user_defined": (DialectRaw(), "UserDefinedType"),
    "compiles_on_decorator": (Compiled(), "_compiler_dispatcher"),
    "subclass_of_builtin": (SubString(), "not one of SQLAlchemy's own types"),
    "numeric_precision_text": (Numeric(precision="10) OR (true"), "precision"),  # type: ignore[arg-type]
    "numeric_precision_bool": (Numeric(precision=True), "precision"),  # type: ignore[arg-type]
    "string_length_text": (String(length="10) OR (true"), "length"),  # type: ignore[arg-type]
    "string_length_negative": (String(length=-1), "length"),
    "interval_fields_text": (INTERVAL(fields="YEAR) IS NOT NULL) OR ((true"), "fields"),
    "array_dimensions_text": (ARRAY(Integer, dimensions="2) OR (true"), "dimensions"),  # type: ignore[arg-type]
    "array_of_user_defined": (ARRAY(RawSpec()), "item_type"),
    "jsonb_astext_user_defined": (JSONB(astext_type=RawSpec()), "astext_type"),
    "variant_user_defined": (String().with_variant(RawSpec(), "postgresql"), "_variant_mapping"),
    "collation_unquoted": (
        String(collation=quoted_name('"C") OR (true', quote=False)),
        "quote=False",
    ),
    "enum_name_unquoted": (
        ENUM("a", name=quoted_name("x) OR (true", quote=False), create_type=False),
        "quote=False",
    ),
    "tuple_of_user_defined": (sqltypes.TupleType(Integer(), RawSpec()), "types"),
}


@pytest.mark.parametrize(("type_", "why"), REFUSED_TYPES.values(), ids=REFUSED_TYPES.keys())
def test_types_that_carry_sql_are_refused_everywhere(type_: TypeEngine[Any], why: str) -> None:
    """R2: a type that can put SQL of its own into a statement (hooks, raw DDL, parameters
    rendered verbatim, nested or variant types) is refused as a CAST target, a literal's or a
    bind parameter's type and a type_coerce target, with the type and the fix named; so is
    it in a cross-tenant repository (R3), where it could write."""
    for expression in (
        cast(p.name, type_).is_(None),
        literal("x", type_=type_).is_(None),
        bindparam("v", "x", type_=type_).is_(None),
        type_coerce("x", type_).is_(None),
    ):
        message = _refused(expression)
        assert why in message
        assert "type" in message
        assert "Fix: use a SQLAlchemy built-in type" in message
        _refused(expression, cross=True)


def test_insert_and_update_values_are_judged_too() -> None:
    """R2: a value's type is judged in insert values (which read no column) as in a where."""
    with pytest.raises(UnsafeExpressionError, match="overrides bind_expression"):
        GUARD.check(literal("x", type_=Hostile()), GUARD.value, where="insert values['name']")
    with pytest.raises(UnsafeExpressionError, match="UserDefinedType"):
        GUARD.check(cast("x", OverRaw()), GUARD.row, where="update values['name']")


# -- the table's own declared types ---------------------------------------------------------------


def test_declared_column_types_are_trusted_where_sqlalchemy_applies_them() -> None:
    """R2: the table's declared column types are the schema: a Geometry column compared with a
    value, a literal of its type, and expressions over it pass; as the target of a caller's
    cast() or type_coerce() the same type is judged (and refused: raw DDL, SQL hooks)."""
    for expression in (
        p.at == "POINT(1 1)",
        p.at.is_not(None),
        literal("POINT(1 1)", type_=p.at.type) == p.at,
        p.label == " x ",
        cast(p.label, Text) == "x",
    ):
        GUARD.check(expression, GUARD.row, where="where=")
    assert "a CAST to the type" in _refused(cast("POINT(1 1)", p.at.type) == p.at)
    assert "a type_coerce to the type" in _refused(type_coerce("POINT(1 1)", p.at.type) == p.at)


# -- values and names -----------------------------------------------------------------------------


def test_literal_execute_parameters_and_sql_inside_values_are_refused() -> None:
    """R2: a literal_execute parameter is rendered into the statement by a literal processor
    (Numeric's writes str(value)); a SQL expression inside a bound value (a tuple IN list)
    would reach the driver as a value. Both are refused."""
    assert "literal_execute" in _refused(
        p.id == bindparam("n", "1 OR true", type_=Numeric(), literal_execute=True)
    )
    scalar = select(func.max(p.name)).scalar_subquery()
    assert "inside a bound value" in _refused(tuple_(p.id, p.name).in_([(1, scalar)]))


def test_cross_tenant_judges_names_and_types_of_every_node() -> None:
    """R3: a cross-tenant repository reads any FROM, but a name rendered verbatim (quote=False)
    on a label, a table or a column, and another table's column of a hostile type, are refused;
    plain names and SQLAlchemy's types pass."""
    assert "quote=False" in _refused(
        p.id.in_(select(p.id.label(quoted_name("x FROM places --", quote=False)))), cross=True
    )
    odd_table = Table(
        quoted_name("places) OR (true", quote=False), MetaData(), Column("id", Integer)
    )
    assert "quote=False" in _refused(p.id.in_(select(odd_table.c.id)), cross=True)
    assert "overrides bind_expression" in _refused(p.id.in_(select(other.c.odd)), cross=True)
    GUARD.check(p.id.in_(select(other.c.id.label("plain"))), GUARD.cross, where="where=")
    for selected in (Label("x", other.c.id, type_=Selecting()), func.lower("a", type_=Selecting())):
        assert "Selecting (it overrides column_expression" in _refused(
            p.id.in_(select(selected)), cross=True
        )


# -- key values -----------------------------------------------------------------------------------

KEY_VALUES: list[tuple[TypeEngine[Any], object, str | None]] = [
    (Integer(), 1, None),
    (Integer(), "1", "must be an int, got str"),
    (Integer(), True, "must be an int, got bool"),
    (Integer(), ("globex", 1), "got tuple"),
    (Integer(), None, None),
    (String(), "a", None),
    (String(), 1, "must be a str"),
    (String(), "a\x00b", "NUL"),
    (String(), "\ud800", "surrogate code point"),
    (Numeric(), decimal.Decimal("1.5"), None),
    (Numeric(), 2, None),
    (postgresql.UUID(), uuid.uuid4(), None),
    (postgresql.UUID(), "not-a-uuid", "must be a UUID"),
    (sqltypes.DateTime(), dt.datetime(2024, 1, 1, tzinfo=dt.UTC), None),
    (sqltypes.Date(), "2024-01-01", "must be a date"),
    (Trimmed(), object(), None),  # an application's type takes values of its own
    (Boolean(), True, None),
]


@pytest.mark.parametrize(("type_", "value", "why"), KEY_VALUES)
def test_key_values_are_checked_against_builtin_key_types(
    type_: TypeEngine[Any], value: object, why: str | None
) -> None:
    """R2: a key value of the wrong Python type for a built-in key column is named before any
    SQL (not left to the driver); an application type's values are its own business."""
    refusal = key_value_refusal(type_, value)
    if why is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert why in refusal


def test_refusal_messages_name_the_type_and_where() -> None:
    """R2: the error says where the expression entered, which type, why, and the fix."""
    message = _refused(literal("x", type_=Hostile()) == p.name)
    assert message.startswith(
        "SHIP_SQLA_UNSAFE_EXPRESSION: where= contains a bound value of the type"
    )
    assert "Hostile" in message
    assert "(R2)" in message
