"""What a repository lets into its statements: the expression guard behind R2 and R3.

A tenant-scoped repository ANDs ``tenant_column = T`` into its statements, but that filter only
restricts the rows the statement's own FROM reads. A caller's expression that reads another FROM
(a subquery, EXISTS, an alias of the table, another table's column, a function that could read
any table) or that the guard cannot read (raw SQL) would see past it, as a copied value or as a
yes/no oracle. So every expression and value a repository accepts passes this guard first,
before any SQL runs.

The guard is an allow-list: it walks the whole expression (``sqlalchemy.sql.visitors``) and
accepts a node only when its exact class is listed below and the node passes that class's
check. A class not listed (a new SQLAlchemy construct, an application's own ``@compiles``
element, a subclass of a listed class) is refused, never guessed at. The lists:

- the repository table's own ``Column`` objects (ORM-annotated ones too), never the tenant
  column; for insert values no column at all (there is no row to read yet);
- bind parameters and literal values (``literal``, expanding ``in_`` lists), ``null()``,
  ``true()``, ``false()``;
- the operators in ``_OPERATORS`` (comparisons, IS [NOT] NULL / DISTINCT FROM, IN / NOT IN,
  BETWEEN, [I]LIKE and its shortcuts, regular expressions, full-text MATCH, arithmetic,
  concatenation, COLLATE, JSON and array operators), NOT and unary minus, AND / OR;
- grouping, tuples, CASE, CAST, ``type_coerce``, labels, EXTRACT (named fields), ``any_`` /
  ``all_`` over a value;
- calls of the built-in functions named in ``PURE_FUNCTIONS``, unqualified (no schema).

A cross-tenant repository (R3) may also read any FROM: subqueries, EXISTS, scalar selects,
joins, aliases, LATERAL, CTEs, other tables' columns, the tenant column, and the aggregate and
window functions of ``AGGREGATE_FUNCTIONS`` / ``WINDOW_FUNCTIONS``. It still refuses raw SQL,
unknown functions, set-returning functions, statement prefixes and hints and row locks: those
are what could write (a user function, a fragment like ``'x', tenant_id = 'b'`` in update
values), and a row's tenant never changes (R2).

Types are SQL too: every type the guard meets (of a bind parameter, a literal, a ``cast`` or
``type_coerce``, a label, a function, a column of another FROM) is judged by
:mod:`ship_sqla._repository_types`: SQLAlchemy's own types with their rendered parameters
checked, application ``TypeDecorator`` s that add no SQL of their own, and the repository
table's declared column types (the schema) where SQLAlchemy applies them itself. Every node
is also refused when it would render an identifier verbatim (a ``quoted_name`` with
``quote=False``), a bound value as SQL text (``literal_execute``), or hides an expression
inside a bound value.

Function names are resolved by PostgreSQL through ``search_path``, with ``pg_catalog`` first
unless the ``search_path`` lists it elsewhere; the guard assumes the default. What is trusted
is what the repository was declared with: the table (its names and its columns' types) and the
declaration's own settings; everything passed at call time is judged.
"""

# ruff: noqa: ANN401 - a rule receives the visited nodes of the classes it is registered for

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import attrs
from sqlalchemy import Column, Table
from sqlalchemy.dialects.postgresql import array as pg_array
from sqlalchemy.dialects.postgresql import operators as pg_operators
from sqlalchemy.sql import elements, functions, operators, selectable, visitors
from sqlalchemy.sql.annotation import Annotated
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.types import TypeEngine

from ship_sqla._repository_types import TypeJudge, unquoted_name_refusal
from ship_sqla.kernel._errors import TenantViolationError

if TYPE_CHECKING:
    from sqlalchemy.sql.operators import OperatorType

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "PURE_FUNCTIONS",
    "WINDOW_FUNCTIONS",
    "ExpressionGuard",
    "GuardPolicy",
    "UnsafeExpressionError",
    "is_sql",
]


class UnsafeExpressionError(TenantViolationError):
    """A repository was given an expression that could read or write outside its row (R2).

    Raised before any SQL runs. A subclass of :class:`~ship_sqla.errors.TenantViolationError`:
    each refusal is a decision at the tenant boundary (an expression reading another FROM is a
    way around the tenant filter), so code that treats tenant violations as security events
    sees these too.
    """

    code = "SHIP_SQLA_UNSAFE_EXPRESSION"


PURE_FUNCTIONS: Final = frozenset(
    {
        # text
        "lower",
        "upper",
        "initcap",
        "length",
        "char_length",
        "character_length",
        "octet_length",
        "trim",
        "btrim",
        "ltrim",
        "rtrim",
        "lpad",
        "rpad",
        "substr",
        "substring",
        "left",
        "right",
        "replace",
        "reverse",
        "repeat",
        "split_part",
        "strpos",
        "starts_with",
        "concat",
        "concat_ws",
        "md5",
        # NULL handling and choice
        "coalesce",
        "nullif",
        "greatest",
        "least",
        # numbers
        "abs",
        "sign",
        "round",
        "trunc",
        "floor",
        "ceil",
        "ceiling",
        "mod",
        "div",
        "power",
        "sqrt",
        # time (read the clock, never a table)
        "now",
        "current_date",
        "current_timestamp",
        "localtimestamp",
        "date_trunc",
        "date_part",
        "make_date",
        "to_char",
        # arrays and JSON values
        "array_length",
        "cardinality",
        "jsonb_typeof",
        "jsonb_array_length",
        "jsonb_extract_path",
        "jsonb_extract_path_text",
    }
)
"""Built-in scalar functions accepted everywhere: they read only their arguments (and the
clock) and write nothing. Any other function, which could be an application's function reading
any table, is refused."""

AGGREGATE_FUNCTIONS: Final = frozenset(
    {
        "count",
        "sum",
        "min",
        "max",
        "avg",
        "bool_and",
        "bool_or",
        "every",
        "array_agg",
        "string_agg",
        "jsonb_agg",
        "json_agg",
    }
)
"""Built-in aggregates, accepted only by cross-tenant repositories (inside their subqueries)."""

WINDOW_FUNCTIONS: Final = frozenset(
    {
        "row_number",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "ntile",
        "lag",
        "lead",
        "first_value",
        "last_value",
        "nth_value",
    }
)
"""Built-in window functions, accepted only by cross-tenant repositories."""

_EXTRACT_FIELDS: Final = frozenset(
    {
        "century",
        "day",
        "decade",
        "dow",
        "doy",
        "epoch",
        "hour",
        "isodow",
        "isoyear",
        "julian",
        "microseconds",
        "millennium",
        "milliseconds",
        "minute",
        "month",
        "quarter",
        "second",
        "timezone",
        "timezone_hour",
        "timezone_minute",
        "week",
        "year",
    }
)
"""EXTRACT renders its field verbatim, so only PostgreSQL's field names are accepted."""

_OPERATORS: Final[frozenset[Any]] = frozenset(
    {
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.getitem,
        operators.is_,
        operators.is_not,
        operators.is_distinct_from,
        operators.is_not_distinct_from,
        operators.in_op,
        operators.not_in_op,
        operators.between_op,
        operators.not_between_op,
        operators.like_op,
        operators.not_like_op,
        operators.ilike_op,
        operators.not_ilike_op,
        operators.startswith_op,
        operators.not_startswith_op,
        operators.istartswith_op,
        operators.not_istartswith_op,
        operators.endswith_op,
        operators.not_endswith_op,
        operators.iendswith_op,
        operators.not_iendswith_op,
        operators.contains_op,
        operators.not_contains_op,
        operators.icontains_op,
        operators.not_icontains_op,
        operators.regexp_match_op,
        operators.not_regexp_match_op,
        operators.regexp_replace_op,
        operators.match_op,
        operators.not_match_op,
        operators.concat_op,
        operators.collate,
        operators.json_getitem_op,
        operators.json_path_getitem_op,
        # PostgreSQL's built-in JSON, array and range operators (->>, @>, <@, ?, &&, ...)
        *(getattr(pg_operators, name) for name in dir(pg_operators) if name.isupper()),
    }
)
_LIST_OPERATORS: Final[frozenset[Any]] = frozenset(
    {operators.and_, operators.or_, operators.comma_op}
)
_UNARY_OPERATORS: Final[frozenset[Any]] = frozenset({operators.inv, operators.neg})

# -- policies -------------------------------------------------------------------------------------

Kind: TypeAlias = Literal["raw", "from", "tenant", "function", "construct", "type"]
"""Why a node was refused: each kind has its own fix."""


@attrs.frozen
class GuardPolicy:
    """What one position of one repository accepts.

    ``columns`` holds the ids of the Column objects a row expression may read; ``any_from``
    (cross-tenant) accepts every table's columns and subqueries instead.
    """

    name: str
    columns: frozenset[int]
    any_from: bool
    functions: frozenset[str]


@attrs.frozen
class _Refusal:
    kind: Kind
    construct: str


_Rule: TypeAlias = Callable[["ExpressionGuard", Any, GuardPolicy], "_Refusal | None"]


class ExpressionGuard:
    """Checks expressions against one repository table; built once per declaration."""

    def __init__(self, table: Table, tenant_column: Column[Any] | None) -> None:
        self.table = table
        self.tenant_column = tenant_column
        own = frozenset(id(c) for c in table.c if c is not tenant_column)
        self.row = GuardPolicy("row", own, any_from=False, functions=PURE_FUNCTIONS)
        """Where conditions and update values of a tenant-bound or untenanted repository."""
        self.value = GuardPolicy("value", frozenset(), any_from=False, functions=PURE_FUNCTIONS)
        """Insert values: there is no row to read yet."""
        self.cross = GuardPolicy(
            "cross",
            frozenset(id(c) for c in table.c),
            any_from=True,
            functions=PURE_FUNCTIONS | AGGREGATE_FUNCTIONS | WINDOW_FUNCTIONS,
        )
        """Everything a cross-tenant repository accepts (R3)."""
        self.types = TypeJudge(frozenset(id(c.type) for c in table.c))
        """The table's declared column types are the schema: trusted where SQLAlchemy applies
        them itself."""

    def check(self, value: object, policy: GuardPolicy, *, where: str) -> None:
        """Accept a plain value, or an expression every node (and type) of which ``policy``
        accepts.

        Raises UnsafeExpressionError naming ``where`` and the refused construct otherwise.
        """
        if not is_sql(value):
            return
        pending = [_clause_of(value)]
        walked: set[int] = set()
        while pending:
            for node in visitors.iterate(pending.pop()):
                rule = _rule_for(type(node))
                refusal = (
                    _Refusal("construct", f"the construct {type(node).__name__}")
                    if rule is None
                    else rule(self, node, policy) or self._typed_refusal(node, policy)
                )
                if refusal is not None:
                    raise self._error(refusal, policy, where)
                # A column's FROM is not among its children: a column of a subquery would
                # bring the subquery into the statement unvisited. (Row policies accept only
                # the table's own columns, whose FROM is the statement's own.)
                owner = getattr(node, "table", None) if policy.any_from else None
                if isinstance(owner, ClauseElement) and id(owner) not in walked:
                    walked.add(id(owner))
                    pending.append(owner)

    def _typed_refusal(self, node: Any, policy: GuardPolicy) -> _Refusal | None:  # noqa: PLR0911 - one answer per kind of node
        """What a node of an accepted class still brings: its type, and the names it renders.

        A type puts SQL into a statement only where SQLAlchemy renders it: a bound value (its
        bind_expression, its bind cast), a CAST (its DDL), a type_coerce (the hooks of the
        value it wraps), and, in a SELECT list, any expression (its column_expression). Only
        a cross-tenant repository lets a caller's expression into a SELECT list (a subquery's),
        or a name into the statement (a label, another table, an alias); there every node's
        type and names are judged. The table's own nodes are its declaration, trusted.
        """
        plain = _PLAIN[type(node)]
        if plain in _BIND_CLASSES:
            if node.literal_execute:
                return _Refusal("raw", "a literal_execute bind parameter (rendered as SQL text)")
            if _holds_sql(node.value):
                return _Refusal("raw", "a SQL expression inside a bound value")
            return self._type_refusal(node.type, plain, explicit=False, rendered=True)
        if plain is elements.Cast or plain is elements.TypeCoerce:
            return self._type_refusal(node.type, plain, explicit=True, rendered=True)
        if not policy.any_from or node is self.table or id(node) in policy.columns:
            return None
        for attribute in ("name", "schema"):
            unquoted = unquoted_name_refusal(getattr(node, attribute, None))
            if unquoted is not None:
                return _Refusal("raw", unquoted)
        type_ = getattr(node, "type", None)
        if not isinstance(type_, TypeEngine):
            return None
        return self._type_refusal(type_, plain, explicit=False, rendered=False)

    def _type_refusal(
        self, type_: TypeEngine[Any], plain: type, *, explicit: bool, rendered: bool
    ) -> _Refusal | None:
        verdict = self.types.judge(type_, explicit=explicit, rendered=rendered)
        if verdict is None:
            return None
        what = _TYPED_NODE_NAMES.get(plain, "an expression of")
        return _Refusal("type", f"{what} the type {verdict.type_name} ({verdict.why})")

    def refuse_sql(self, value: object, *, where: str, fix: str) -> None:
        """Refuse any SQL expression in a position that takes only plain values (keys...)."""
        if is_sql(value):
            raise UnsafeExpressionError(
                f"{where} is a SQL expression ({type(value).__name__}); it takes a plain value"
                " only, which can never read past the tenant filter (R2).",
                fix=fix,
            )

    def _error(self, refusal: _Refusal, policy: GuardPolicy, where: str) -> UnsafeExpressionError:
        table = self.table.fullname
        head = f"{where} contains {refusal.construct}, which a {self._mode(policy)}"
        why = {
            "raw": "cannot accept: raw SQL cannot be checked, and could read or write anything",
            "tenant": "does not accept: the tenant comes from the scope, and every statement is"
            " already restricted to it",
            "function": "does not accept: only built-in functions known to read no table and"
            " write nothing are allowed",
            "from": "does not accept: it could read rows other than the one the statement"
            " filters or writes, past the tenant filter",
            "construct": "does not accept: it is not on the guard's allow-list",
            "type": "does not accept: a type can put SQL of its own into the statement, and"
            " only SQLAlchemy's built-in types, TypeDecorators adding no SQL and the table's"
            " declared column types are accepted",
        }[refusal.kind]
        return UnsafeExpressionError(f"{head} {why} (R2).", fix=self._fix(refusal, policy, table))

    def _mode(self, policy: GuardPolicy) -> str:
        if policy.any_from:
            return "cross-tenant repository"
        if self.tenant_column is None:
            return "repository of an untenanted table"
        return "tenant-scoped repository"

    def _fix(self, refusal: _Refusal, policy: GuardPolicy, table: str) -> str:  # noqa: PLR0911 - one fix per kind of refusal
        if refusal.kind == "raw":
            return (
                f"build the expression from {table}'s columns, values and SQLAlchemy operators;"
                " run hand-written SQL on scope.connection yourself."
            )
        if refusal.kind == "tenant":
            name = self.tenant_column.name if self.tenant_column is not None else "tenant"
            return (
                f"leave {name!r} out: to filter across tenants, bind with"
                " .cross_tenant(scope, reason='...')."
            )
        if refusal.kind == "type":
            return (
                f"use a SQLAlchemy built-in type with plain parameters (String(50),"
                f" Numeric(10, 2), INTERVAL(fields='DAY')), or compare {table}'s column with a"
                " plain value (SQLAlchemy applies the column's declared type itself); run SQL"
                " the guard cannot read on scope.connection yourself."
            )
        if refusal.kind == "function":
            return (
                f"use one of {', '.join(sorted(policy.functions))}, or compute the value in"
                " Python and pass it."
            )
        listed = "values, and the operators and functions listed in docs/repositories.md"
        if policy.any_from:
            return f"build the expression from columns of Tables, {listed}, and plain subqueries."
        if self.tenant_column is None:
            return (
                f"use only {table}'s own columns (table.c.<name>), {listed}; run a statement"
                " that reads other tables on scope.connection yourself."
            )
        return (
            f"use only {table}'s own columns (table.c.<name>), {listed}; for deliberate access"
            " to other tenants' rows or other tables, bind with"
            " .cross_tenant(scope, reason='...')."
        )


def is_sql(value: object) -> bool:
    """Whether SQLAlchemy would render ``value`` as SQL rather than bind it as a value."""
    return isinstance(value, ClauseElement) or hasattr(type(value), "__clause_element__")


_MAX_CLAUSE_UNWRAP: Final = 8
_MAX_VALUE_NESTING: Final = 4


def _holds_sql(value: object, depth: int = 0) -> bool:
    """Whether a bound value (a tuple IN list, say) holds a SQL expression, which SQLAlchemy
    would hand the driver as a value."""
    if is_sql(value):
        return True
    if isinstance(value, list | tuple) and depth < _MAX_VALUE_NESTING:
        return any(_holds_sql(item, depth + 1) for item in value)
    return False


_BIND_CLASSES: Final = frozenset({elements.BindParameter, selectable._OffsetLimitParam})  # noqa: SLF001
_TYPED_NODE_NAMES: Final[dict[type, str]] = {
    elements.BindParameter: "a bound value of",
    selectable._OffsetLimitParam: "a bound value of",  # noqa: SLF001
    elements.Cast: "a CAST to",
    elements.TypeCoerce: "a type_coerce to",
    Column: "a column of",
    elements.Label: "a label of",
}


def _clause_of(value: object) -> ClauseElement:
    seen = 0
    while not isinstance(value, ClauseElement):
        seen += 1
        if seen > _MAX_CLAUSE_UNWRAP or not hasattr(
            type(value), "__clause_element__"
        ):  # pragma: no cover
            raise UnsafeExpressionError(
                f"{type(value).__name__} does not resolve to a SQL expression.",
                fix="pass a SQLAlchemy expression or a plain value.",
            )
        value = value.__clause_element__()  # type: ignore[attr-defined]
    return value


# -- the rules, by exact class -------------------------------------------------------------------

_RULES: dict[type, _Rule] = {}
_PLAIN: dict[type, type] = {}


def _rule_for(cls: type) -> _Rule | None:
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = cls
        # ORM annotations wrap a node in a generated subclass whose last base is the original.
        while issubclass(plain, Annotated):
            plain = plain.__bases__[-1]
        _PLAIN[cls] = plain
    rule = _RULES.get(plain)
    if rule is None and _is_builtin_function(plain):
        return _function
    return rule


def _is_builtin_function(cls: type) -> bool:
    return issubclass(cls, functions.FunctionElement) and cls.__module__ == functions.__name__


def _rule(*classes: type) -> Callable[[_Rule], _Rule]:
    def register(rule: _Rule) -> _Rule:
        for cls in classes:
            _RULES[cls] = rule
        return rule

    return register


@_rule(
    elements.BindParameter,
    selectable._OffsetLimitParam,  # noqa: SLF001 - LIMIT/OFFSET values of a subquery
    elements.Null,
    elements.True_,
    elements.False_,
    elements.Grouping,
    elements.Tuple,
    elements.Case,
    elements.Cast,  # its type is judged as every node's is (_typed_refusal)
    elements.TypeCoerce,
    elements.Label,
    elements.CollationClause,  # the name is quoted as an identifier
    elements.CollectionAggregate,  # any_() / all_(): its operand is checked as a child
    elements.AsBoolean,  # a boolean expression used as a condition (IS true / NOT)
)
def _accepted(_guard: ExpressionGuard, _node: Any, _policy: GuardPolicy) -> _Refusal | None:
    return None


@_rule(elements.Extract)
def _extract(
    _guard: ExpressionGuard, node: elements.Extract, _policy: GuardPolicy
) -> _Refusal | None:
    if str(node.field).lower() not in _EXTRACT_FIELDS:
        return _Refusal("raw", f"EXTRACT of the field {node.field!r} (rendered verbatim)")
    return None


@_rule(Column)
def _column(guard: ExpressionGuard, node: Column[Any], policy: GuardPolicy) -> _Refusal | None:
    column = node._deannotate()  # noqa: SLF001 - the Column an ORM attribute stands for
    owner: Any = getattr(column, "table", None)
    if id(column) in policy.columns or (policy.any_from and owner is not None):
        return None
    if column is guard.tenant_column:
        return _Refusal("tenant", f"the tenant column {column.name!r}")
    if owner is None:
        where = "which belongs to no table"
    elif policy is guard.value:
        where = "(an insert has no row to read)"
    elif isinstance(owner, selectable.Alias) and owner.original is guard.table:
        where = f"of an alias of {guard.table.fullname!r}"
    else:
        where = f"of {owner.description!r}, another FROM"
    return _Refusal("from", f"the column {column.name!r} {where}")


@_rule(elements.ColumnClause)
def _column_clause(
    _guard: ExpressionGuard, node: elements.ColumnClause[Any], policy: GuardPolicy
) -> _Refusal | None:
    owner = node.table
    if node.is_literal:
        if policy.any_from and node.name == "*":  # count(*), EXISTS (SELECT * ...)
            return None
        return _Refusal("raw", f"literal_column({node.name!r})")
    if owner is None:
        return _Refusal("raw", f"column({node.name!r}) without a table")
    if isinstance(owner, selectable.TableValuedAlias):
        return _Refusal("from", "a set-returning (table-valued) function")
    if isinstance(owner, selectable.AliasedReturnsRows):  # a computed column of a subquery
        return (
            None if policy.any_from else _Refusal("from", f"the column {node.name!r} of a subquery")
        )
    return _Refusal("raw", f"column {node.name!r} of a lightweight table() construct")


@_rule(elements.TextClause, selectable.TextualSelect)
def _text(_guard: ExpressionGuard, node: Any, _policy: GuardPolicy) -> _Refusal | None:
    return _Refusal("raw", f"raw SQL text() {str(node)[:60]!r}")


@_rule(elements.BinaryExpression)
def _binary(
    _guard: ExpressionGuard, node: elements.BinaryExpression[Any], _policy: GuardPolicy
) -> _Refusal | None:
    if node.operator in _OPERATORS:
        return None
    return _operator_refusal(node.operator)


@_rule(elements.UnaryExpression)
def _unary(
    _guard: ExpressionGuard, node: elements.UnaryExpression[Any], _policy: GuardPolicy
) -> _Refusal | None:
    if node.modifier is None and node.operator in _UNARY_OPERATORS:
        return None
    return _operator_refusal(node.operator if node.operator is not None else node.modifier)


@_rule(elements.BooleanClauseList, elements.ExpressionClauseList, elements.ClauseList, pg_array)
def _clause_list(
    _guard: ExpressionGuard,
    node: Any,
    _policy: GuardPolicy,
) -> _Refusal | None:
    if node.operator in _LIST_OPERATORS:
        return None
    return _Refusal("construct", f"a list joined by {_operator_name(node.operator)}")


def _function(
    _guard: ExpressionGuard, node: functions.FunctionElement[Any], policy: GuardPolicy
) -> _Refusal | None:
    name = getattr(node, "name", None)
    packages = tuple(getattr(node, "packagenames", ()) or ())
    if not packages and name in policy.functions:
        return None
    qualified = ".".join((*packages, str(name)))
    return _Refusal("function", f"the function {qualified}()")


_rule(functions.Function)(_function)


_WINDOW_NAMES: Final[dict[type, str]] = {
    elements.Over: "a window function (OVER)",
    elements.FunctionFilter: "an aggregate FILTER",
    elements.WithinGroup: "an ordered-set aggregate (WITHIN GROUP)",
}


@_rule(*_WINDOW_NAMES)
def _window(_guard: ExpressionGuard, node: Any, policy: GuardPolicy) -> _Refusal | None:
    if policy.any_from:
        return None
    return _Refusal("from", _WINDOW_NAMES[_PLAIN[type(node)]])


_FROM_NAMES: Final[dict[type, str]] = {
    selectable.Select: "a SELECT",
    selectable.ScalarSelect: "a scalar subquery",
    selectable.Exists: "EXISTS",
    selectable.Subquery: "a subquery",
    selectable.Alias: "an alias",
    selectable.Lateral: "LATERAL",
    selectable.Join: "a JOIN",
    selectable.CTE: "a CTE",
    Table: "a table",
}
_HIDDEN_TEXT: Final = ("_prefixes", "_suffixes", "_hints", "_statement_hints", "_with_options")
"""Select/CTE attributes rendered verbatim (or applied by the ORM) that visitors do not visit."""


@_rule(*_FROM_NAMES)
def _from(_guard: ExpressionGuard, node: Any, policy: GuardPolicy) -> _Refusal | None:
    if not policy.any_from:
        return _Refusal("from", _FROM_NAMES[_PLAIN[type(node)]])
    if any(getattr(node, attribute, None) for attribute in _HIDDEN_TEXT):
        return _Refusal("raw", f"{_FROM_NAMES[_PLAIN[type(node)]]} with prefixes, hints or options")
    return None


@_rule(selectable.TableValuedAlias, elements.TableValuedColumn, functions.ScalarFunctionColumn)
def _set_returning(_guard: ExpressionGuard, _node: Any, _policy: GuardPolicy) -> _Refusal | None:
    return _Refusal("from", "a set-returning (table-valued) function")


def _operator_refusal(op: OperatorType | None) -> _Refusal:
    if isinstance(op, operators.custom_op):  # op("...") renders its text verbatim
        return _Refusal("raw", f"the custom operator op({op.opstring!r})")
    return _Refusal("construct", f"the operator {_operator_name(op)}")


def _operator_name(op: OperatorType | None) -> str:
    return getattr(op, "__name__", repr(op))
