"""Bounded, tenant-scoped repository primitives over a SQLAlchemy Core ``Table`` (R1-R4).

A :class:`TableRepository` is declared once per table (module level, next to the table); it
checks the declaration against the table and holds no connection. Binding it to a unit of
work's scope gives a :class:`BoundRepository` whose statements all run on ``scope.connection``,
so they commit or roll back with everything else in the run (U1).

Statements are built per call from the declaration (the table is the application's, so there is
no module of fixed SQL); their text depends only on the call's shape, never on its values, so
SQLAlchemy's compiled cache and asyncpg's prepared statements are reused.
"""

# ruff: noqa: SLF001 - a BoundRepository reads its own declaration's private, checked state

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, overload

from opentelemetry import trace
from sqlalchemy import (
    ColumnElement,
    Index,
    Integer,
    RowMapping,
    Table,
    UniqueConstraint,
    and_,
    any_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import Grouping

from ship_sqla._projection import Projection
from ship_sqla._repository_guard import ExpressionGuard, is_sql
from ship_sqla._repository_types import DIALECT, key_value_refusal
from ship_sqla.kernel._cursor import (
    KeysetPosition,
    decode_cursor,
    encode_cursor,
    query_fingerprint,
    resolve_secret,
)
from ship_sqla.kernel._errors import (
    BoundExceededError,
    ConfigurationError,
    ShipError,
    TenantRequiredError,
    TenantViolationError,
    UnknownProjectionError,
    UsageError,
    VersionConflictError,
)
from ship_sqla.kernel._page import Page

if TYPE_CHECKING:
    from sqlalchemy import Column, Result
    from sqlalchemy.sql import Executable

    from ship_sqla._scope import TransactionScope

__all__ = ["BoundRepository", "Page", "RepositoryUsageError", "TableRepository", "Where"]

logger = logging.getLogger("ship_sqla")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

Where: TypeAlias = Mapping[str, object] | ColumnElement[bool] | None
"""A filter: column name -> value (equality; ``None`` means IS NULL), or a boolean expression
over the table's own columns. The tenant filter is always ANDed to it, as a separate group, and
the expression guard checks it first (R2, see ``_repository_guard``)."""

_ONE: ColumnElement[int] = literal_column("1", Integer)
_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


class RepositoryUsageError(UsageError, ValueError):
    """A repository call was given arguments that cannot work (unknown column, bad key...)."""

    code = "SHIP_SQLA_REPOSITORY_USAGE"


_Term: TypeAlias = "tuple[Column[Any], bool]"  # (column, descending)


class TableRepository:
    """The declaration of how a table may be accessed: tenancy, key, bounds and projections.

    Made once per table; every column it names is checked against the table here, so a typo
    fails at import time. Tenancy is never implicit: exactly one of ``tenant_column=`` (rows
    belong to a tenant, R2) or ``untenanted="<why>"`` (a table shared by all tenants, R3) must
    be given.

    - ``key``: a column name, or a tuple of names for a composite key (key values are then
      tuples). The key must be unique (primary key, unique constraint or non-partial unique
      index) on its own or together with the tenant column, and must not include the tenant
      column: the tenant always comes from the scope.
    - ``version_column``: an integer NOT NULL column the repository owns: ``update`` increments
      it and checks ``expected_version=`` against it (optimistic concurrency).
    - ``max_page_size`` bounds ``find``/``project`` limits and ``get_many``/``insert_many``
      batches; ``max_count`` bounds ``count(up_to=)`` (R1). Exceeding a bound raises
      :class:`~ship_sqla.errors.BoundExceededError`; a result is never silently truncated.
    - ``default_order``: the page ordering when ``find``/``project`` get no ``order_by``:
      column names, ``"-name"`` for descending. The key columns are always appended (in the
      direction of the last term, unless named) so the order is total; every ordering column
      must be NOT NULL.
    - Indexes: key lookups use the unique index the key was checked against. A page ordered
      one way (all ascending or all descending) is a row comparison that an index on
      ``(tenant_column, *order columns, *key)`` serves directly; create the indexes your
      orderings need. Mixed directions page correctly but filter rather than seek.
    - ``cursor_secret``: signs page cursors (HMAC-SHA256). The default is random per process,
      so cursors are valid only in the process that issued them; pass the same secret to every
      process that serves the same pages to make cursors portable. Cursors are signed, not
      encrypted: the last row's ordering values are readable by whoever holds one.
    """

    def __init__(
        self,
        table: Table,
        *,
        tenant_column: str | None = None,
        untenanted: str | None = None,
        key: str | Sequence[str] = "id",
        version_column: str | None = None,
        max_page_size: int = 100,
        max_count: int = 10_000,
        projections: Iterable[Projection[Any]] = (),
        default_order: Sequence[str] = (),
        cursor_secret: bytes | str | None = None,
    ) -> None:
        if not isinstance(table, Table):
            raise ConfigurationError(
                f"TableRepository needs a sqlalchemy Table, got {type(table).__name__}.",
                fix="pass the Table object (for an ORM class: Model.__table__).",
            )
        self.table = table
        self._tenant_column = self._tenancy(tenant_column, untenanted)
        self.untenanted_reason = untenanted
        self.key: tuple[str, ...] = (key,) if isinstance(key, str) else tuple(key)
        self._key_columns = self._key(self.key)
        self._key_unique_alone = self._unique({c.name for c in self._key_columns})
        self._version_column = self._version(version_column)
        self.max_page_size = _positive(max_page_size, "max_page_size")
        self.max_count = _positive(max_count, "max_count")
        self._projections = self._declare_projections(projections)
        self._default_order = self._parse_order(default_order, error=ConfigurationError)
        self._secret = resolve_secret(cursor_secret)
        self._guard = ExpressionGuard(table, self._tenant_column)

    def __repr__(self) -> str:
        tenancy = (
            f"tenant_column={self.tenant_column!r}"
            if self.tenant_column
            else f"untenanted={self.untenanted_reason!r}"
        )
        return f"TableRepository({self.table.fullname!r}, {tenancy}, key={self.key!r})"

    @property
    def tenant_column(self) -> str | None:
        return None if self._tenant_column is None else self._tenant_column.name

    @property
    def projections(self) -> Mapping[str, Projection[Any]]:
        return dict(self._projections)

    # -- binding ------------------------------------------------------------------------------

    def for_scope(self, scope: TransactionScope) -> BoundRepository:
        """This table's repository inside ``scope``, restricted to ``scope.tenant`` (R2).

        Raises :class:`~ship_sqla.errors.TenantRequiredError` when the table is tenanted and
        the scope has no tenant: a tenanted table is never read without a tenant filter except
        through :meth:`cross_tenant`.
        """
        if self._tenant_column is None:
            return BoundRepository(self, scope, tenant=None, key_columns=self._key_columns)
        if scope.tenant is None:
            raise TenantRequiredError(
                f"table {self.table.fullname!r} is tenant-scoped (tenant_column="
                f"{self.tenant_column!r}) but the unit of work's scope has no tenant.",
                fix="run the handler with uow.run(handler, tenant=...), or, for deliberate"
                " access across tenants, bind with .cross_tenant(scope, reason='...').",
            )
        return BoundRepository(self, scope, tenant=scope.tenant, key_columns=self._key_columns)

    def cross_tenant(self, scope: TransactionScope, *, reason: str) -> BoundRepository:
        """The only way to reach every tenant's rows (R3): explicit, named, and recorded.

        Logs ``reason`` with the table and the scope's tenant (logger ``ship_sqla``) and adds a
        ``ship_sqla.cross_tenant`` event to the current span when it is recording. Reads see
        all tenants; inserts must name their tenant; a row's tenant still never changes. When
        the key is unique only per tenant, key values are ``(tenant, *key)``.
        """
        if self._tenant_column is None:
            raise ConfigurationError(
                f"table {self.table.fullname!r} is declared untenanted"
                f" ({self.untenanted_reason!r}); there is no tenant boundary to cross.",
                fix="use .for_scope(scope).",
            )
        if not _is_text(reason):
            raise ConfigurationError(
                "cross_tenant needs a reason: cross-tenant access is audited.",
                fix="say why, e.g. cross_tenant(scope, reason='nightly billing export').",
            )
        logger.info(
            "ship_sqla: cross-tenant access to %s from scope tenant %r: %s",
            self.table.fullname,
            scope.tenant,
            reason,
            extra={
                "ship_table": self.table.fullname,
                "ship_tenant": scope.tenant,
                "ship_cross_tenant_reason": reason,
            },
        )
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("ship.cross_tenant", True)  # noqa: FBT003 - attribute value
            span.add_event(
                "ship_sqla.cross_tenant",
                {
                    "ship.table": self.table.fullname,
                    "ship.tenant": scope.tenant or "",
                    "ship.cross_tenant.reason": reason,
                },
            )
        key_columns = self._key_columns
        if not self._key_unique_alone:
            key_columns = (self._tenant_column, *key_columns)
        return BoundRepository(self, scope, tenant=None, key_columns=key_columns, cross=True)

    # -- declaration checks -------------------------------------------------------------------

    def _column(self, name: object, what: str) -> Column[Any]:
        if not isinstance(name, str) or name not in self.table.c:
            raise ConfigurationError(
                f"{what} {name!r} is not a column of table {self.table.fullname!r}.",
                fix=f"use one of: {', '.join(sorted(self.table.c.keys()))}.",
            )
        return self.table.c[name]

    def _tenancy(self, tenant_column: str | None, untenanted: str | None) -> Column[Any] | None:
        if (tenant_column is None) == (untenanted is None):
            raise ConfigurationError(
                f"table {self.table.fullname!r}: tenancy must be an explicit choice; give exactly"
                " one of tenant_column= or untenanted= (R3).",
                fix="pass tenant_column='tenant_id' for per-tenant rows, or"
                " untenanted='<why every tenant may see these rows>' for shared ones.",
            )
        if untenanted is not None:
            if not _is_text(untenanted):
                raise ConfigurationError(
                    f"table {self.table.fullname!r}: untenanted= needs a reason.",
                    fix="say why the rows are shared, e.g. untenanted='currency reference data'.",
                )
            return None
        column = self._column(tenant_column, "tenant_column")
        if column.nullable:
            raise ConfigurationError(
                f"tenant column {column.name!r} of {self.table.fullname!r} is nullable; a row"
                " without a tenant would belong to nobody and be invisible to every scope.",
                fix="declare it nullable=False (and backfill before migrating).",
            )
        return column

    def _key(self, names: tuple[str, ...]) -> tuple[Column[Any], ...]:
        if not names or len(set(names)) != len(names):
            raise ConfigurationError(
                f"key={names!r} must name one or more distinct columns.",
                fix="pass key='id', or key=('a', 'b') for a composite key.",
            )
        columns = tuple(self._column(name, "key column") for name in names)
        for column in columns:
            if column is self._tenant_column:
                raise ConfigurationError(
                    f"key {names!r} includes the tenant column {column.name!r}; the tenant comes"
                    " from the scope, never from a key value.",
                    fix=f"declare the key without it, e.g. key={names[-1]!r}.",
                )
            if column.nullable:
                raise ConfigurationError(
                    f"key column {column.name!r} is nullable; keys identify one row and order"
                    " pages, so they must be NOT NULL.",
                    fix="declare it nullable=False or primary_key=True.",
                )
        key_set = {c.name for c in columns}
        with_tenant = key_set | (
            {self._tenant_column.name} if self._tenant_column is not None else set()
        )
        if not (self._unique(key_set) or self._unique(with_tenant)):
            raise ConfigurationError(
                f"key {names!r} of {self.table.fullname!r} is not unique: no primary key, unique"
                " constraint or non-partial unique index covers exactly these columns (or these"
                " plus the tenant column), so get/update/delete could touch several rows (R1).",
                fix="key the repository on the primary key, or add a unique constraint.",
            )
        return columns

    def _unique(self, names: set[str]) -> bool:
        unique_sets = [
            self.table.primary_key.columns,
            *(c.columns for c in self.table.constraints if isinstance(c, UniqueConstraint)),
            *(i.columns for i in self.table.indexes if _plain_unique(i)),
        ]
        return any(names == {c.name for c in columns} for columns in unique_sets)

    def _version(self, name: str | None) -> Column[Any] | None:
        if name is None:
            return None
        column = self._column(name, "version_column")
        if not isinstance(column.type, Integer) or column.nullable:
            raise ConfigurationError(
                f"version_column {name!r} must be an integer NOT NULL column.",
                fix=f"declare Column({name!r}, Integer, nullable=False, server_default='1').",
            )
        if column in self._key_columns or column is self._tenant_column:
            raise ConfigurationError(
                f"version_column {name!r} is also the key or tenant column.",
                fix="use a dedicated version column.",
            )
        return column

    def _declare_projections(
        self, projections: Iterable[Projection[Any]]
    ) -> dict[str, Projection[Any]]:
        declared: dict[str, Projection[Any]] = {}
        for projection in projections:
            if not isinstance(projection, Projection):
                raise ConfigurationError(
                    f"projections= must hold Projection objects, got {projection!r}.",
                    fix="declare Projection(name=..., columns=(...), into=...).",
                )
            if projection.name in declared:
                raise ConfigurationError(
                    f"two projections of {self.table.fullname!r} are named {projection.name!r}.",
                    fix="give each projection its own name.",
                )
            for column in projection.columns:
                self._column(column, f"projection {projection.name!r} column")
            declared[projection.name] = projection
        return declared

    def _parse_order(
        self, order_by: str | Sequence[str], *, error: type[ShipError] = ConfigurationError
    ) -> tuple[_Term, ...]:
        """``("-created_at", "status")`` as (column, descending) terms; columns NOT NULL."""
        specs: tuple[object, ...] = (order_by,) if isinstance(order_by, str) else tuple(order_by)
        terms: list[_Term] = []
        for spec in specs:
            name = spec[1:] if isinstance(spec, str) and spec.startswith("-") else spec
            if not isinstance(name, str) or name not in self.table.c:
                raise error(
                    f"order_by term {spec!r} does not name a column of {self.table.fullname!r}.",
                    fix="order by column names, '-name' for descending, e.g. ('-created_at',).",
                )
            column = self.table.c[name]
            if column.nullable:
                raise error(
                    f"cannot order pages by nullable column {name!r}: keyset paging compares"
                    " values, and NULLs would be skipped or repeated.",
                    fix="order by NOT NULL columns (declare the column nullable=False).",
                )
            if any(existing is column for existing, _ in terms):
                raise error(f"order_by names column {name!r} twice.", fix="name each column once.")
            terms.append((column, name != spec))
        return tuple(terms)

    def projection(self, which: Projection[T] | str) -> Projection[T]:
        """The declared projection ``which`` (by object or name); refuses undeclared ones."""
        name = which if isinstance(which, str) else which.name
        found = self._projections.get(name)
        if found is None or (not isinstance(which, str) and found != which):
            raise UnknownProjectionError(
                f"table {self.table.fullname!r} declares no projection {name!r}"
                f" (known: {sorted(self._projections) or 'none'}).",
                fix="select a declared projection, or add it to TableRepository(...,"
                " projections=(...)).",
            )
        return found

    # -- call checks shared by bound repositories ----------------------------------------------

    def _check_bound(self, requested: int, *, what: str, bound_name: str, bound: int) -> None:
        """R1: refuse, never truncate, a request above the declared bound."""
        if not _is_count(requested):
            raise RepositoryUsageError(
                f"{what} must be a positive integer, got {requested!r}.",
                fix=f"pass an integer between 1 and {bound_name}={bound}.",
            )
        if requested > bound:
            raise BoundExceededError(
                f"{what}={requested} exceeds {bound_name}={bound} declared for"
                f" {self.table.fullname!r}; results are never silently truncated (R1).",
                fix=f"ask for at most {bound} (page with the returned cursor, or split the batch),"
                f" or raise {bound_name} on the TableRepository if the larger bound is safe.",
            )


class BoundRepository:
    """A :class:`TableRepository` bound to one unit-of-work scope (and its tenant).

    Invariants:

    - Every statement runs on ``scope.connection``: it joins the run's transaction (U1), and is
      refused once the run has ended. Nothing else on the scope is used.
    - R1: no method reads or writes more rows than a declared bound; updates and deletes go by
      key only.
    - R2: a tenant-bound repository ANDs ``tenant_column = tenant`` into every read, update
      and delete (as its own group beside the caller's condition), stamps the tenant on every
      insert, refuses (TenantViolationError) a write naming another tenant, and never changes
      a row's tenant.
    - R2: every expression and value a call brings (where=, insert and update values, keys,
      expected_version) passes the expression guard before any SQL runs: it may read only the
      repository table's own row (cross-tenant: any FROM, never raw SQL); anything else raises
      UnsafeExpressionError. Keys and expected_version are plain values only.
    - Rows are immutable mappings (``RowMapping``) of every column.
    """

    __slots__ = (
        "_cross",
        "_declaration",
        "_insert_policy",
        "_key_columns",
        "_row_policy",
        "_scope",
        "_tenant",
    )

    def __init__(
        self,
        declaration: TableRepository,
        scope: TransactionScope,
        *,
        tenant: str | None,
        key_columns: tuple[Column[Any], ...],
        cross: bool = False,
    ) -> None:
        self._declaration = declaration
        self._scope = scope
        self._tenant = tenant
        self._key_columns = key_columns
        self._cross = cross
        guard = declaration._guard
        self._row_policy = guard.cross if cross else guard.row
        self._insert_policy = guard.cross if cross else guard.value

    def __repr__(self) -> str:
        mode = "cross-tenant" if self._cross else f"tenant={self._tenant!r}"
        return f"<BoundRepository {self._declaration.table.fullname!r} {mode}>"

    @property
    def declaration(self) -> TableRepository:
        return self._declaration

    @property
    def tenant(self) -> str | None:
        """The tenant every statement is restricted to (None: untenanted or cross-tenant)."""
        return self._tenant

    # -- reads --------------------------------------------------------------------------------

    async def get(self, key: Any) -> RowMapping | None:  # noqa: ANN401 - key values are column values
        """The row with ``key`` (a tuple for composite keys), or None."""
        table = self._declaration.table
        statement = select(*table.c).where(*self._tenant_filter(), *self._key_filter(key))
        return (await self._execute(statement)).mappings().one_or_none()

    async def get_many(self, keys: Iterable[Any]) -> dict[Any, RowMapping]:
        """The rows with these keys, by key value as stored, in key order; missing keys absent.

        At most ``max_page_size`` keys, duplicates included (R1): a sized collection is refused
        by its length, any other iterable after reading at most ``max_page_size + 1`` items, so
        an endless iterator is refused rather than read. Duplicates are then collapsed.
        """
        wanted = list(dict.fromkeys(self._key_tuple(key) for key in self._bounded_keys(keys)))
        if not wanted:
            return {}
        decl = self._declaration
        arrays = [
            bindparam(f"ship_keys_{i}", [k[i] for k in wanted], type_=postgresql.ARRAY(c.type))
            for i, c in enumerate(self._key_columns)
        ]
        if len(arrays) == 1:
            matches = self._key_columns[0] == any_(arrays[0])
        else:
            names = [f"k{i}" for i in range(len(arrays))]
            wanted_rows = func.unnest(*arrays).table_valued(*names).render_derived()
            matches = tuple_(*self._key_columns).in_(select(*wanted_rows.c))
        statement = (
            select(*decl.table.c)
            .where(*self._tenant_filter(), matches)
            .order_by(*self._key_columns)
        )
        rows = (await self._execute(statement)).mappings().all()
        return {self._row_key(row): row for row in rows}

    def _bounded_keys(self, keys: Iterable[Any]) -> list[Any]:
        decl = self._declaration
        bound = decl.max_page_size
        if isinstance(keys, str | bytes):  # iterating would yield characters, not keys
            raise RepositoryUsageError(
                f"get_many takes an iterable of keys, got the string {keys!r}.",
                fix=f"pass a list of keys, e.g. get_many([{keys!r}]).",
            )
        if isinstance(keys, Sized):
            if len(keys) > bound:
                decl._check_bound(
                    len(keys), what="len(keys)", bound_name="max_page_size", bound=bound
                )
            return list(keys)
        taken = list(itertools.islice(keys, bound + 1))
        if len(taken) > bound:
            raise BoundExceededError(
                f"get_many was given more than max_page_size={bound} keys (it stopped reading"
                f" after {bound + 1}) for {decl.table.fullname!r}; results are never silently"
                " truncated (R1).",
                fix=f"pass at most {bound} keys per call (split the batch), or raise"
                " max_page_size on the TableRepository if the larger bound is safe.",
            )
        return taken

    async def find(
        self,
        where: Where = None,
        *,
        order_by: str | Sequence[str] | None = None,
        limit: int,
        cursor: str | None = None,
    ) -> Page[RowMapping]:
        """One keyset page of rows matching ``where``, ordered by ``order_by`` then the key.

        ``order_by``: column names, ``"-name"`` for descending (default: the declaration's
        ``default_order``). ``limit`` must not exceed ``max_page_size`` (R1). Pass the page's
        ``next_cursor`` back with the same arguments for the next page; a cursor altered or
        presented to another query raises InvalidCursorError.
        """
        rows, next_cursor = await self._page(
            tuple(self._declaration.table.c), where, order_by, limit, cursor, kind="rows"
        )
        return Page(tuple(rows), next_cursor)

    async def count(self, where: Where = None, *, up_to: int) -> int:
        """How many rows match, counting at most ``up_to`` (<= ``max_count``, R1).

        A result equal to ``up_to`` means "at least ``up_to``".
        """
        decl = self._declaration
        decl._check_bound(up_to, what="up_to", bound_name="max_count", bound=decl.max_count)
        matching = (
            select(_ONE)
            .select_from(decl.table)
            .where(*self._filters(where))
            .limit(up_to)
            .subquery("ship_matching")
        )
        statement = select(func.count()).select_from(matching)
        return int((await self._execute(statement)).scalar_one())

    async def exists(self, where: Where = None) -> bool:
        """Whether any row matches."""
        probe = select(_ONE).select_from(self._declaration.table).where(*self._filters(where))
        return bool((await self._execute(select(probe.exists()))).scalar_one())

    @overload
    async def project(
        self,
        projection: Projection[T],
        where: Where = None,
        *,
        order_by: str | Sequence[str] | None = None,
        limit: int,
        cursor: str | None = None,
    ) -> Page[T]: ...
    @overload
    async def project(
        self,
        projection: str,
        where: Where = None,
        *,
        order_by: str | Sequence[str] | None = None,
        limit: int,
        cursor: str | None = None,
    ) -> Page[Any]: ...
    async def project(
        self,
        projection: Projection[Any] | str,
        where: Where = None,
        *,
        order_by: str | Sequence[str] | None = None,
        limit: int,
        cursor: str | None = None,
    ) -> Page[Any]:
        """Like :meth:`find`, but reading and returning only a declared projection (R4).

        The statement selects the projection's columns, plus any ordering column the keyset
        cursor needs that the projection lacks (never passed to ``into``).
        """
        chosen = self._declaration.projection(projection)
        table = self._declaration.table
        rows, next_cursor = await self._page(
            tuple(table.c[name] for name in chosen.columns),
            where,
            order_by,
            limit,
            cursor,
            kind=f"projection:{chosen.name}",
        )
        return Page(tuple(chosen.build(row) for row in rows), next_cursor)

    @overload
    async def get_projection(self, projection: Projection[T], key: Any) -> T | None: ...  # noqa: ANN401
    @overload
    async def get_projection(self, projection: str, key: Any) -> Any: ...  # noqa: ANN401
    async def get_projection(self, projection: Projection[Any] | str, key: Any) -> Any:
        """The projection of the row with ``key``, or None; reads only its columns (R4)."""
        chosen = self._declaration.projection(projection)
        table = self._declaration.table
        statement = select(*(table.c[name] for name in chosen.columns)).where(
            *self._tenant_filter(), *self._key_filter(key)
        )
        row = (await self._execute(statement)).mappings().one_or_none()
        return None if row is None else chosen.build(row)

    # -- writes -------------------------------------------------------------------------------

    async def insert(self, values: Mapping[str, object]) -> RowMapping:
        """Insert one row, stamped with the tenant (R2); returns the stored row."""
        row = self._insert_values(values, what="insert values")
        statement = (
            insert(self._declaration.table).values(row).returning(*self._declaration.table.c)
        )
        return (await self._execute(statement)).mappings().one()

    async def insert_many(self, rows: Sequence[Mapping[str, object]]) -> list[RowMapping]:
        """Insert up to ``max_page_size`` rows in one INSERT; returns them in input order.

        Every row must name the same columns (one statement has one column list).
        """
        if not rows:
            return []
        decl = self._declaration
        decl._check_bound(
            len(rows), what="len(rows)", bound_name="max_page_size", bound=decl.max_page_size
        )
        prepared = [
            self._insert_values(row, what=f"insert_many rows[{i}]") for i, row in enumerate(rows)
        ]
        for i, row in enumerate(prepared):
            computed = sorted(name for name, value in row.items() if is_sql(value))
            if computed:
                raise RepositoryUsageError(
                    f"insert_many rows[{i}] gives SQL expressions for {computed}; insert_many"
                    " binds plain values (one statement for every row).",
                    fix="compute the values in Python, or insert that row with insert().",
                )
        names = set(prepared[0])
        if any(set(row) != names for row in prepared):
            raise RepositoryUsageError(
                "insert_many rows name different columns; one INSERT has one column list.",
                fix="give every row the same keys (pass defaults explicitly), or insert the"
                " differing rows in a separate call.",
            )
        statement = insert(decl.table).returning(*decl.table.c, sort_by_parameter_order=True)
        return list((await self._execute(statement, prepared)).mappings().all())

    async def update(
        self,
        key: Any,  # noqa: ANN401 - key values are column values
        values: Mapping[str, object],
        *,
        expected_version: int | None = None,
    ) -> RowMapping | None:
        """Update the row with ``key``; returns it as stored, or None when there is none.

        With a ``version_column`` the version is incremented. ``expected_version`` makes the
        update conditional: when the row exists with another version, VersionConflictError is
        raised and nothing changes. The tenant column may appear only with the row's own tenant
        (then it is a no-op); any other value raises TenantViolationError (R2).
        """
        decl = self._declaration
        changes: dict[str, Any] = {}
        claimed_tenant: object = None
        for name, value in self._known(values, "update").items():
            column = decl.table.c[name]
            if column is decl._tenant_column:
                claimed_tenant = self._check_tenant_unchanged(
                    value, what=f"update values[{name!r}]"
                )
            elif column is decl._version_column:
                raise RepositoryUsageError(
                    f"the version column {name!r} is owned by the repository and cannot be set.",
                    fix="leave it out (it is incremented on every update) and pass"
                    " expected_version= to make the update conditional.",
                )
            else:
                self._guard.check(value, self._row_policy, where=f"update values[{name!r}]")
                changes[name] = value
        conditions = [*self._tenant_filter(), *self._key_filter(key)]
        conditions += self._version_condition(expected_version)
        if claimed_tenant is not None:  # cross-tenant: the row must already be that tenant's
            conditions.append(self._tenant_col == claimed_tenant)
        version = decl._version_column
        if version is not None:
            changes[version.name] = version + 1
        if not changes:  # nothing to set: still lock, check the version and return the row
            changes[self._key_columns[-1].name] = self._key_columns[-1]
        statement = update(decl.table).where(*conditions).values(changes).returning(*decl.table.c)
        row = (await self._execute(statement)).mappings().one_or_none()
        if row is None:
            await self._raise_if_row_differs(key, expected_version, claimed_tenant)
        return row

    async def delete(self, key: Any, *, expected_version: int | None = None) -> bool:  # noqa: ANN401
        """Delete the row with ``key``; True when a row was deleted.

        ``expected_version`` as in :meth:`update` (VersionConflictError, nothing deleted).
        """
        conditions = [*self._tenant_filter(), *self._key_filter(key)]
        conditions += self._version_condition(expected_version)
        statement = (
            delete(self._declaration.table).where(*conditions).returning(self._key_columns[0])
        )
        deleted = (await self._execute(statement)).first() is not None
        if not deleted:
            await self._raise_if_row_differs(key, expected_version, None)
        return deleted

    # -- statement parts ----------------------------------------------------------------------

    async def _execute(
        self, statement: Executable, parameters: list[dict[str, Any]] | None = None
    ) -> Result[Any]:
        return await self._scope.connection.execute(statement, parameters)

    @property
    def _tenant_col(self) -> Column[Any]:
        column = self._declaration._tenant_column
        if column is None:  # pragma: no cover - only reached on tenanted declarations
            raise AssertionError("tenant column used on an untenanted repository")
        return column

    def _tenant_filter(self) -> list[ColumnElement[bool]]:
        return [] if self._tenant is None else [self._tenant_col == self._tenant]

    @property
    def _guard(self) -> ExpressionGuard:
        return self._declaration._guard

    def _key_tuple(self, key: Any) -> tuple[Any, ...]:  # noqa: ANN401
        names = tuple(c.name for c in self._key_columns)
        if len(self._key_columns) == 1:
            values: tuple[Any, ...] = (key,)
        elif not isinstance(key, tuple | list) or len(key) != len(self._key_columns):
            raise RepositoryUsageError(
                f"key {key!r} does not match the composite key {names!r}.",
                fix=f"pass a tuple of {len(names)} values in the order {names!r}.",
            )
        else:
            values = tuple(key)
        for column, value in zip(self._key_columns, values, strict=True):
            self._guard.refuse_sql(
                value,
                where=f"the key value for {column.name!r}",
                fix="pass the key's value itself (look it up first if it must be computed).",
            )
            wrong = key_value_refusal(column.type, value)
            if wrong is not None:
                declared = column.type.compile(DIALECT)
                raise RepositoryUsageError(
                    f"the key value for {column.name!r} ({declared} of"
                    f" {self._declaration.table.fullname!r}) {wrong}.",
                    fix=f"pass one value per key column, in the order {names!r}"
                    f"{'' if self._tenant is None else ' (the tenant comes from the scope)'}.",
                )
        return values

    def _key_filter(self, key: Any) -> list[ColumnElement[bool]]:  # noqa: ANN401
        return [c == v for c, v in zip(self._key_columns, self._key_tuple(key), strict=True)]

    def _row_key(self, row: RowMapping) -> Any:  # noqa: ANN401
        values = tuple(row[c.name] for c in self._key_columns)
        return values[0] if len(values) == 1 else values

    def _version_condition(self, expected_version: int | None) -> list[ColumnElement[bool]]:
        if expected_version is None:
            return []
        self._guard.refuse_sql(
            expected_version,
            where="expected_version",
            fix="pass the version read with the row, as an int.",
        )
        if not _is_int(expected_version):
            raise RepositoryUsageError(
                f"expected_version must be an int, got {expected_version!r}.",
                fix="pass the version read with the row, e.g. expected_version=row['version'].",
            )
        version = self._declaration._version_column
        if version is None:
            raise RepositoryUsageError(
                f"expected_version= given, but {self._declaration!r} declares no version_column.",
                fix="declare version_column='version' on the TableRepository, or drop"
                " expected_version.",
            )
        return [version == expected_version]

    def _known(self, values: Mapping[str, object], what: str) -> Mapping[str, object]:
        unknown = sorted(str(name) for name in values if name not in self._declaration.table.c)
        if unknown:
            raise RepositoryUsageError(
                f"{what} names columns that {self._declaration.table.fullname!r} does not have:"
                f" {unknown}.",
                fix=f"use column names: {', '.join(sorted(self._declaration.table.c.keys()))}.",
            )
        return values

    def _filters(self, where: Where) -> list[ColumnElement[bool]]:
        return self._conditions(self._where(where))

    def _conditions(self, user: ColumnElement[bool] | None) -> list[ColumnElement[bool]]:
        """The tenant predicate and the caller's condition, as separate groups (R2).

        The explicit group keeps any operator inside the caller's condition from binding to
        the tenant predicate, whatever the expression renders as.
        """
        return [*self._tenant_filter(), *([] if user is None else [Grouping(user)])]

    def _where(self, where: Where) -> ColumnElement[bool] | None:
        """The caller's condition, checked by the expression guard (R2), or None."""
        if where is None:
            return None
        if isinstance(where, Mapping):
            table = self._declaration.table
            terms = []
            for name, value in self._known(where, "where").items():
                term = table.c[name].is_(None) if value is None else table.c[name] == value
                self._guard.check(term, self._row_policy, where=f"where[{name!r}]")
                terms.append(term)
            return and_(*terms) if terms else None
        if not is_sql(where):
            raise RepositoryUsageError(
                f"where={where!r} is neither a mapping of column -> value nor a SQL expression.",
                fix="pass {'status': 'open'} or table.c.status == 'open'.",
            )
        self._guard.check(where, self._row_policy, where="where=")
        if not isinstance(where, ColumnElement):
            raise RepositoryUsageError(
                f"where={where!r} is not a boolean SQL expression.",
                fix="pass a condition such as table.c.status == 'open'.",
            )
        return where

    def _insert_values(self, values: Mapping[str, object], *, what: str) -> dict[str, Any]:
        decl = self._declaration
        row = dict(self._known(values, "insert"))
        tenant_column = decl._tenant_column
        for name, value in row.items():
            if tenant_column is None or name != tenant_column.name:
                self._guard.check(value, self._insert_policy, where=f"{what}[{name!r}]")
        if tenant_column is not None:
            if self._cross:
                self._guard.refuse_sql(
                    row.get(tenant_column.name),
                    where=f"{what}[{tenant_column.name!r}]",
                    fix="give the row's tenant itself, as a string.",
                )
                if row.get(tenant_column.name) is None:
                    raise RepositoryUsageError(
                        f"a cross-tenant insert into {decl.table.fullname!r} must name the"
                        f" row's tenant ({tenant_column.name!r}).",
                        fix=f"include {tenant_column.name!r} in the values.",
                    )
            else:
                if tenant_column.name in row:
                    self._check_tenant_unchanged(
                        row[tenant_column.name], what=f"{what}[{tenant_column.name!r}]"
                    )
                row[tenant_column.name] = self._tenant
        version = decl._version_column
        if version is not None and version.name not in row and not _has_default(version):
            row[version.name] = 1
        return row

    def _check_tenant_unchanged(self, value: object, *, what: str) -> object:
        """The tenant named in write values: refused unless it is this repository's (R2).

        Returns the value a cross-tenant write names (to be matched against the row's own),
        None when the value is the scope's tenant and can simply be dropped. The value must be
        a plain value in every mode: an expression could compute another tenant.
        """
        table = self._declaration.table.fullname
        self._guard.refuse_sql(
            value,
            where=what,
            fix="leave the tenant column out (it is stamped from the scope), or give the"
            " tenant itself as a string.",
        )
        if self._cross:
            if value is None:
                raise TenantViolationError(
                    f"a cross-tenant write to {table!r} set the tenant column to NULL; every row"
                    " belongs to exactly one tenant and never changes tenant (R2).",
                    fix="leave the tenant column out of update values.",
                )
            return value
        if not _same_tenant(value, self._tenant):
            raise TenantViolationError(
                f"a write through the repository of tenant {self._tenant!r} named tenant"
                f" {value!r} for table {table!r}; a repository writes only its own tenant's rows"
                " and never moves a row to another tenant (R2).",
                fix="leave the tenant column out (it is stamped from the scope), or run the"
                " write in a unit of work for the other tenant.",
            )
        return None

    async def _raise_if_row_differs(
        self,
        key: Any,  # noqa: ANN401
        expected_version: int | None,
        claimed_tenant: object,
    ) -> None:
        """After a conditional write matched nothing: say why if the row exists."""
        if expected_version is None and claimed_tenant is None:
            return
        decl = self._declaration
        probe = [c for c in (decl._version_column, decl._tenant_column) if c is not None]
        statement = select(*probe).where(*self._tenant_filter(), *self._key_filter(key))
        current = (await self._execute(statement)).mappings().one_or_none()
        if current is None:
            return
        if claimed_tenant is not None and not _same_tenant(
            claimed_tenant, current[self._tenant_col.name]
        ):
            raise TenantViolationError(
                f"an update of {decl.table.fullname!r} key {key!r} named tenant"
                f" {claimed_tenant!r}, but the row belongs to another tenant; a row's tenant"
                " never changes (R2).",
                fix="leave the tenant column out of update values.",
            )
        if expected_version is not None and decl._version_column is not None:
            actual = current[decl._version_column.name]
            raise VersionConflictError(
                f"{decl.table.fullname!r} key {key!r} is at version {actual}, not the expected"
                f" {expected_version}: it changed since it was read.",
                fix="re-read the row, re-apply the change, and retry with its current version.",
            )

    # -- keyset paging ------------------------------------------------------------------------

    async def _page(
        self,
        columns: tuple[Column[Any], ...],
        where: Where,
        order_by: str | Sequence[str] | None,
        limit: int,
        cursor: str | None,
        *,
        kind: str,
    ) -> tuple[Sequence[RowMapping], str | None]:
        decl = self._declaration
        decl._check_bound(limit, what="limit", bound_name="max_page_size", bound=decl.max_page_size)
        terms = (
            decl._default_order
            if order_by is None
            else decl._parse_order(order_by, error=RepositoryUsageError)
        )
        named = {column for column, _ in terms}
        # Key columns follow the last term's direction, so ("-created_at",) stays one-directional
        # (a row comparison an index seeks) instead of silently becoming a mixed order.
        descending = terms[-1][1] if terms else False
        terms += tuple((c, descending) for c in self._key_columns if c not in named)
        user_where = self._where(where)
        fingerprint = self._fingerprint(kind, user_where, terms)
        conditions = self._conditions(user_where)
        if cursor is not None:
            after = decode_cursor(cursor, secret=decl._secret, query=fingerprint)
            conditions.append(_after(terms, after))
        selected = columns + tuple(c for c, _ in terms if c not in columns)
        statement = (
            select(*selected)
            .where(*conditions)
            .order_by(*(c.desc() if descending else c.asc() for c, descending in terms))
            .limit(limit + 1)  # one more than asked: says whether a next page exists
        )
        rows = (await self._execute(statement)).mappings().all()
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        last = tuple(rows[-1][c.name] for c, _ in terms)
        return rows, encode_cursor(KeysetPosition(fingerprint, last), decl._secret)

    def _fingerprint(
        self, kind: str, where: ColumnElement[bool] | None, terms: tuple[_Term, ...]
    ) -> str:
        if self._cross:
            tenancy = "cross-tenant"
        elif self._tenant is None:
            tenancy = "untenanted"
        else:
            tenancy = f"tenant={self._tenant}"
        parts = [
            self._declaration.table.fullname,
            tenancy,
            kind,
            ",".join(("-" if descending else "") + c.name for c, descending in terms),
        ]
        if where is not None:
            compiled = where.compile(dialect=_DIALECT)
            parts += [str(compiled), repr(sorted(compiled.params.items()))]
        return query_fingerprint(parts)


def _after(terms: tuple[_Term, ...], values: Sequence[object]) -> ColumnElement[bool]:
    """Rows strictly after ``values`` in the ``terms`` order (keyset predicate)."""
    bound = [literal(v, c.type) for (c, _), v in zip(terms, values, strict=True)]
    directions = {descending for _, descending in terms}
    if len(directions) == 1:
        # One direction: a row comparison, which a matching composite index serves directly.
        left, right = tuple_(*(c for c, _ in terms)), tuple_(*bound)
        return left < right if directions == {True} else left > right
    steps = []
    for i, (column, descending) in enumerate(terms):
        ties = [c == b for (c, _), b in zip(terms[:i], bound[:i], strict=True)]
        steps.append(and_(*ties, column < bound[i] if descending else column > bound[i]))
    return or_(*steps)


def _positive(value: int, name: str) -> int:
    if not _is_count(value):
        raise ConfigurationError(
            f"{name} must be a positive integer, got {value!r}.",
            fix=f"pass {name}= as a positive int (it is the largest request allowed, R1).",
        )
    return value


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _plain_unique(index: Index) -> bool:
    """A unique index over plain columns, without a predicate: uniqueness of those columns."""
    return bool(
        index.unique
        and len(index.expressions) == len(index.columns)
        and index.dialect_options["postgresql"].get("where") is None
    )


def _has_default(column: Column[Any]) -> bool:
    return column.default is not None or column.server_default is not None


def _same_tenant(value: object, tenant: object) -> bool:
    """Tenants compare as given or as text (a UUID column value against the scope's string)."""
    return value is not None and (value == tenant or str(value) == str(tenant))
