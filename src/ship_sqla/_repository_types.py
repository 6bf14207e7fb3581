"""Which SQL types a repository lets into its statements: the type half of the R2 guard.

A type is SQL too. Where a caller's expression brings a type, SQLAlchemy may render SQL that
no node of the expression shows:

- the type's DDL text, in ``CAST(x AS <type>)`` and in the casts the asyncpg dialect adds to
  bound parameters (``$1::NUMERIC(10, 2)``). SQLAlchemy writes some parameters into it
  verbatim (``Numeric(precision=...)``, ``INTERVAL(fields=...)``, ``String(length=...)``, a
  ``quoted_name`` with ``quote=False``) and a ``UserDefinedType`` is nothing but its
  ``get_col_spec()`` text;
- the type's ``bind_expression`` around a bound value and its ``column_expression`` around a
  selected expression: arbitrary SQL in the place of a value;
- its literal processor, for a parameter rendered into the statement's text.

So the guard judges every type it meets: of bind parameters and literals, of ``cast`` and
``type_coerce``, of labels and function results, and of the columns of other FROMs. A type is
accepted when it is

- one of SQLAlchemy's own types (its exact class defined in ``sqlalchemy.sql.sqltypes`` or
  the PostgreSQL dialect), every parameter SQLAlchemy renders being valid: lengths,
  precisions, scales and dimensions are ints, ``INTERVAL`` fields one of PostgreSQL's
  thirteen phrases, names (of collations, enums, domains) quoted as identifiers; its nested
  types (array items, JSON ``astext_type``, a tuple's types, ``with_variant`` variants) are
  judged the same way. Its DDL as SQLAlchemy renders it for PostgreSQL must then read as a
  type name (:func:`_ddl_refusal`): a second line for parameters these rules do not know;
- an application's ``TypeDecorator`` whose class overrides none of :data:`SQL_HOOKS` and whose
  ``impl`` (and ``load_dialect_impl``'s answer for PostgreSQL) is itself accepted;
- the declared type of one of the repository table's own columns, which is the schema, not
  input: accepted as it is wherever SQLAlchemy applies it itself (the column, a value bound
  against it, an expression derived from it), but judged like any other type as the target of
  a caller's ``cast()`` or ``type_coerce()``.

Anything else (a ``UserDefinedType``, a subclass of a built-in type, another library's type)
is refused. Verdicts are not cached: a type object, or its class, can change between calls.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from typing import TYPE_CHECKING, Any, Final

import attrs
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import quoted_name
from sqlalchemy.types import TypeDecorator, TypeEngine, UserDefinedType

from ship_sqla.kernel._json_text import unstorable_text

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

__all__ = [
    "DIALECT",
    "SQL_HOOKS",
    "TypeJudge",
    "is_plain_identifier",
    "key_value_refusal",
    "unquoted_name_refusal",
]

DIALECT: Final[Dialect] = pg_asyncpg.dialect()  # type: ignore[no-untyped-call]
"""The dialect the repositories' statements are compiled for: types render as it renders them."""

_BUILTIN_MODULES: Final = ("sqlalchemy.sql.sqltypes", "sqlalchemy.dialects.postgresql.")
"""Where SQLAlchemy's own types are defined (exact classes only: a subclass elsewhere is not
SQLAlchemy's)."""

SQL_HOOKS: Final = frozenset(
    {
        "bind_expression",
        "column_expression",
        "literal_processor",
        "process_literal_param",
        "get_col_spec",
        "type_engine",
        "dialect_impl",
        "_gen_dialect_impl",
        "_compiler_dispatch",
        "_compiler_dispatcher",
        "__visit_name__",
        "render_bind_cast",
        "render_literal_cast",
    }
)
"""What a TypeDecorator must not define: each puts SQL text of its own into a statement
(``@compiles`` on the class sets ``_compiler_dispatcher``). ``load_dialect_impl`` may be
overridden: its answer is judged."""

_INT_PARAMETERS: Final = frozenset(
    {"length", "precision", "scale", "dimensions", "second_precision", "day_precision"}
)
"""Parameters SQLAlchemy writes into DDL as numbers (some through ``%s`` or an f-string)."""

_NAME_PARAMETERS: Final = frozenset({"name", "schema", "collation", "collation_schema"})
"""Parameters SQLAlchemy writes into DDL as identifiers: quoted, unless a ``quoted_name`` with
``quote=False`` says not to."""

INTERVAL_FIELDS: Final = frozenset(
    {
        "YEAR",
        "MONTH",
        "DAY",
        "HOUR",
        "MINUTE",
        "SECOND",
        "YEAR TO MONTH",
        "DAY TO HOUR",
        "DAY TO MINUTE",
        "DAY TO SECOND",
        "HOUR TO MINUTE",
        "HOUR TO SECOND",
        "MINUTE TO SECOND",
    }
)
"""PostgreSQL's INTERVAL field phrases; SQLAlchemy renders ``fields`` verbatim."""

_KEYWORDS: Final = frozenset(
    {
        *" ".join(INTERVAL_FIELDS).split(),
        *[
            "BIGINT",
            "BINARY",
            "BIT",
            "BLOB",
            "BOOLEAN",
            "BYTEA",
            "CHAR",
            "CIDR",
            "CITEXT",
            "CLOB",
            "COLLATE",
            "DATE",
            "DATETIME",
            "DATEMULTIRANGE",
            "DATERANGE",
            "DECIMAL",
            "DOUBLE",
            "FLOAT",
            "HSTORE",
            "INET",
            "INT",
            "INT4MULTIRANGE",
            "INT4RANGE",
            "INT8MULTIRANGE",
            "INT8RANGE",
            "INTEGER",
            "INTERVAL",
            "JSON",
            "JSONB",
            "JSONPATH",
            "MACADDR",
            "MACADDR8",
            "MONEY",
            "NCHAR",
            "NUMERIC",
            "NUMMULTIRANGE",
            "NUMRANGE",
            "NVARCHAR",
            "OID",
            "PRECISION",
            "REAL",
            "REGCLASS",
            "REGCONFIG",
            "SMALLINT",
            "TEXT",
            "TIME",
            "TIMESTAMP",
            "TO",
            "TSMULTIRANGE",
            "TSQUERY",
            "TSRANGE",
            "TSTZMULTIRANGE",
            "TSTZRANGE",
            "TSVECTOR",
            "UUID",
            "VARBINARY",
            "VARCHAR",
            "VARYING",
            "WITH",
            "WITHOUT",
            "ZONE",
        ],
    }
)
"""Every word SQLAlchemy's PostgreSQL type compiler writes for its own types."""

_QUOTED: Final = r'"(?:[^"]|"")+"'
_IDENT: Final = r"[a-z_][a-z0-9_$]*"
_NAME: Final = rf"(?:{_QUOTED}|{_IDENT})(?:\.(?:{_QUOTED}|{_IDENT}))?"
_WORDS: Final = r"[A-Za-z][A-Za-z0-9]*(?: [A-Za-z][A-Za-z0-9]*)*"
_ARGS: Final = r"\(\d+(?:, \d+)?\)"
_KEYWORD_DDL: Final = re.compile(
    rf"{_WORDS}(?:{_ARGS})?(?: {_WORDS})?(?: ?{_ARGS})?(?:\[\])*(?: COLLATE {_NAME})?"
)
"""The shape of a built-in type's DDL: keywords, numbers in parentheses, array brackets, a
quoted collation; nothing that could close the CAST or start an expression. Every word outside
quotes must be one of :data:`_KEYWORDS` (INTERVAL fields may come in lower case)."""
_NAMED_DDL: Final = re.compile(rf"{_NAME}(?:\[\])*")
"""The DDL of a named type (an ENUM, a DOMAIN, an array of one): one identifier."""
_UNQUOTED_WORD: Final = re.compile(rf"{_QUOTED}|([A-Za-z][A-Za-z0-9]*)")

_PLAIN_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def is_plain_identifier(name: str) -> bool:
    """Whether ``name`` rendered unquoted is a single SQL identifier (and nothing more)."""
    return _PLAIN_IDENTIFIER.fullmatch(name) is not None


def unquoted_name_refusal(name: object) -> str | None:
    """Why an identifier SQLAlchemy would render verbatim is refused, or None."""
    if isinstance(name, quoted_name) and name.quote is False and not is_plain_identifier(name):
        return f"the name {str(name)!r} with quote=False (rendered verbatim)"
    return None


@attrs.frozen
class TypeRefusal:
    """A type the guard does not accept: what it is, and why."""

    type_name: str
    why: str


@attrs.define
class TypeJudge:
    """Judges the types met in one repository's expressions (see the module docstring).

    ``own``: the repository table's declared column types, by identity.
    """

    own: frozenset[int]

    def judge(
        self,
        type_: TypeEngine[Any],
        *,
        explicit: bool,
        rendered: bool,
    ) -> TypeRefusal | None:
        """The refusal of ``type_``, or None when it is accepted.

        ``explicit``: the caller applies the type to an expression of their choosing (the
        target of ``cast`` or ``type_coerce``), where even the table's own types are judged.
        ``rendered``: its DDL may be written into the statement (a CAST, a bind cast).
        """
        if not explicit and id(type_) in self.own:
            return None
        return _judge(type_, rendered=rendered, seen=set(), depth=0)


_MAX_DEPTH: Final = 8
"""Nested types deeper than this are refused (no built-in type nests so deep)."""


def _judge(type_: object, *, rendered: bool, seen: set[int], depth: int) -> TypeRefusal | None:
    if id(type_) in seen:
        return None
    if not isinstance(type_, TypeEngine):
        return TypeRefusal(type(type_).__name__, "it is not a SQLAlchemy type")
    name = _type_name(type_)
    if depth > _MAX_DEPTH:
        return TypeRefusal(name, f"its types nest more than {_MAX_DEPTH} deep")
    seen.add(id(type_))
    cls = type(type_)
    if isinstance(type_, UserDefinedType):
        return TypeRefusal(name, "a UserDefinedType is its get_col_spec() text: raw SQL")
    if isinstance(type_, TypeDecorator) and not _is_builtin(cls):
        refusal = _decorator_refusal(type_, name, seen=seen, depth=depth)
    elif _is_builtin(cls):
        refusal = _parameters_refusal(type_, name, seen=seen, depth=depth)
    else:
        refusal = TypeRefusal(
            name,
            "it is not one of SQLAlchemy's own types (a subclass or another library's type"
            " can render any SQL)",
        )
    if refusal is None and rendered:
        refusal = _ddl_refusal(type_, name)
    return refusal


def _is_builtin(cls: type) -> bool:
    module = cls.__module__
    return (
        module == _BUILTIN_MODULES[0] or module.startswith(_BUILTIN_MODULES[1])
    ) and cls is not TypeDecorator


def _type_name(type_: TypeEngine[Any]) -> str:
    cls = type(type_)
    module = cls.__module__
    return cls.__qualname__ if module.startswith("sqlalchemy.") else f"{module}.{cls.__qualname__}"


def _decorator_refusal(
    type_: TypeDecorator[Any], name: str, *, seen: set[int], depth: int
) -> TypeRefusal | None:
    overridden = _overridden(type(type_))
    hooks = sorted(SQL_HOOKS.intersection(overridden))
    if hooks:
        return TypeRefusal(
            name, f"it overrides {', '.join(hooks)}, which put SQL of its own into a statement"
        )
    impl = type_.impl_instance
    refusal = _judge(impl, rendered=False, seen=seen, depth=depth + 1)
    if refusal is None and "load_dialect_impl" in overridden:
        refusal = _judge(
            type_.load_dialect_impl(DIALECT), rendered=False, seen=seen, depth=depth + 1
        )
    if refusal is not None:
        return TypeRefusal(name, f"its implementation {refusal.type_name}: {refusal.why}")
    return _nested_refusal(type_, name, seen=seen, depth=depth, skip=("impl",))


def _overridden(cls: type) -> set[str]:
    """The names ``cls`` and its bases define below TypeDecorator or a built-in type."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base is TypeDecorator or _is_builtin(base):
            break
        names.update(vars(base))
    return names


def _parameters_refusal(
    type_: TypeEngine[Any], name: str, *, seen: set[int], depth: int
) -> TypeRefusal | None:
    for parameter, value in vars(type_).items():
        if parameter in _INT_PARAMETERS:
            if value is not None and (type(value) is not int or value < 0):
                return TypeRefusal(
                    name, f"its {parameter}={value!r} is not a non-negative int (it is rendered)"
                )
        elif parameter in _NAME_PARAMETERS:
            if value is not None and not isinstance(value, str):
                return TypeRefusal(name, f"its {parameter}={value!r} is not a string")
            unquoted = unquoted_name_refusal(value)
            if unquoted is not None:
                return TypeRefusal(name, f"its {parameter} is {unquoted}")
        elif parameter == "fields" and not _is_interval_fields(value):
            return TypeRefusal(
                name,
                f"its fields={value!r} is not one of PostgreSQL's INTERVAL fields"
                f" ({', '.join(sorted(INTERVAL_FIELDS))}); it is rendered verbatim",
            )
    return _nested_refusal(type_, name, seen=seen, depth=depth, skip=())


def _is_interval_fields(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.upper() in INTERVAL_FIELDS)


def _nested_refusal(
    type_: TypeEngine[Any], name: str, *, seen: set[int], depth: int, skip: tuple[str, ...]
) -> TypeRefusal | None:
    """Judge the types a type holds: array items, JSON's astext_type, a tuple's types, the
    variants of ``with_variant`` (PostgreSQL's is what renders)."""
    for parameter, value in vars(type_).items():
        if parameter in skip:
            continue
        if isinstance(value, dict):
            nested: list[object] = list(value.values())
        elif isinstance(value, list | tuple):
            nested = list(value)
        else:
            nested = [value]
        for item in nested:
            if isinstance(item, TypeEngine):
                refusal = _judge(item, rendered=False, seen=seen, depth=depth + 1)
                if refusal is not None:
                    return TypeRefusal(
                        name, f"it holds {refusal.type_name} ({parameter}): {refusal.why}"
                    )
    return None


_DDL_VERDICTS: dict[tuple[object, ...], TypeRefusal | None] = {}
"""Verdicts of :func:`_ddl_refusal` by class and attribute values, for types whose attributes
are all plain (the common ``Integer()``, ``String(50)``): the key is read afresh at each call, so
a type changed since is judged again."""
_MAX_DDL_VERDICTS: Final = 4096
_PLAIN_VALUES: Final = (int, bool, str, float, type(None))


def _ddl_refusal(type_: TypeEngine[Any], name: str) -> TypeRefusal | None:
    """Refuse a type whose PostgreSQL DDL does not read as a type name (memoised by value)."""
    parts: list[object] = [type(type_)]
    for attribute, value in vars(type_).items():
        if type(value) not in _PLAIN_VALUES and not isinstance(value, type):
            return _render_refusal(type_, name)  # a nested type, a list, a quoted_name...
        parts += (attribute, value)
    key = tuple(parts)
    if key not in _DDL_VERDICTS:
        if len(_DDL_VERDICTS) >= _MAX_DDL_VERDICTS:
            _DDL_VERDICTS.clear()
        _DDL_VERDICTS[key] = _render_refusal(type_, name)
    return _DDL_VERDICTS[key]


def _render_refusal(type_: TypeEngine[Any], name: str) -> TypeRefusal | None:
    """Refuse a type whose PostgreSQL DDL does not read as a type name.

    A type SQLAlchemy cannot render for PostgreSQL (NullType, a JSON index type) is never
    written into a statement as DDL: no text, nothing to judge.
    """
    try:
        ddl = DIALECT.type_compiler_instance.process(type_)
    except (SQLAlchemyError, NotImplementedError, AttributeError):
        # AttributeError: a type with no compiler visit at all (JSON's index types)
        return None
    if _NAMED_DDL.fullmatch(ddl) is not None:
        return None
    words = {match.group(1).upper() for match in _UNQUOTED_WORD.finditer(ddl) if match.group(1)}
    if _KEYWORD_DDL.fullmatch(ddl) is None or not words <= _KEYWORDS:
        return TypeRefusal(name, f"its DDL {ddl[:80]!r} does not read as a type name")
    return None


_KEY_VALUE_KINDS: Final[dict[type, tuple[type, ...]]] = {
    int: (int,),
    str: (str,),
    decimal.Decimal: (int, float, decimal.Decimal),
    float: (int, float, decimal.Decimal),
    uuid.UUID: (uuid.UUID, str),
    dt.datetime: (dt.datetime,),
    dt.date: (dt.date,),
    bytes: (bytes,),
}
"""The Python values a key column of a built-in type takes (as the driver encodes them), by
the type's ``python_type``; a UUID column also takes its text form."""


def key_value_refusal(type_: TypeEngine[Any], value: object) -> str | None:
    """Why ``value`` cannot be a value of the key column of ``type_``, or None.

    Judged only for SQLAlchemy's own types, whose Python values are known: an application's
    TypeDecorator may take values of its own (a domain id object, say). None is left to the
    statement (it matches no row).
    """
    kinds = _key_value_kinds(type_) if value is not None else None
    if kinds is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        return f"must be {_article_for(names)} {names}, got {type(value).__name__} {value!r:.60}"
    if not isinstance(value, str):
        return None
    unstorable = unstorable_text(value)
    if unstorable is not None:
        return f"holds {unstorable}, which PostgreSQL text cannot hold"
    if uuid.UUID in kinds and not _is_uuid_text(value):
        return f"must be a UUID, got the text {value!r:.60}, which is not one"
    return None


def _key_value_kinds(type_: TypeEngine[Any]) -> tuple[type, ...] | None:
    if not _is_builtin(type(type_)) or isinstance(type_, TypeDecorator):
        return None
    try:
        return _KEY_VALUE_KINDS.get(type_.python_type)
    except NotImplementedError:
        return None


def _is_uuid_text(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _article_for(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
