"""The schema check (T3): does the live PostgreSQL database match the tables' metadata?

Alembic's ``alembic check`` does not compare partial-index predicates (``postgresql_where``,
alembic issue #750), so a changed predicate slips through and the claim queries that depend on
the index word for word silently fall back to sorting the whole backlog. This check compares,
per table of the metadata: the table itself (missing; extra tables in the same schemas), columns
(name, type, nullability, server default), the primary key, unique / check / foreign-key /
exclusion constraints by name, and indexes by name with their columns, uniqueness, method and
partial predicate.

How it avoids false alarms: both sides are printed by PostgreSQL. The live catalog is read
first; then, inside a transaction that is always rolled back, the metadata's own DDL (exactly
what ``create_all`` emits) is executed into the session's temporary schema (``pg_temp``, through
SQLAlchemy's ``schema_translate_map``), and the same catalog queries read those scratch
tables. Types come from ``format_type``, defaults and predicates from ``pg_get_expr``,
constraints from ``pg_get_constraintdef``, index columns from ``pg_get_indexdef``: formatting,
casts and parentheses are normalised by the server, not guessed by us. The check needs only the
``TEMPORARY`` privilege (granted to every role by default) and leaves nothing behind.

Storage options (J21) are compared with the metadata's declaration
(:func:`~ship_sqla._storage_options.storage_options`), not through the scratch copy: each
declared option must be set to its value on the live table; options set beyond those are the
operator's and are not reported.

The SQL enqueue functions (E6) a definitions table declares are looked up by their published
signatures, and each must carry this library's build hash in its COMMENT: a missing or
outdated function is reported with the fix.

Limits: column order, comments, triggers, grants and row-level security are not compared;
identity columns are compared as identity, not by their sequence options.
When two schemas of the metadata hold same-named tables (or indexes) each schema is copied
separately, and a foreign key between those schemas then cannot be copied (a temporary table
may reference only temporary tables): the check says so rather than guess.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs
from sqlalchemy import Index, MetaData, PrimaryKeyConstraint, Table, UniqueConstraint, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla._jobs._history_ddl import NO_PARTITIONS_OPTION
from ship_sqla._jobs._sql_api import SKIP_INSTALL_OPTION, sql_enqueue_installs, status_of
from ship_sqla._storage_options import OptionValue, storage_options, storage_options_ddl
from ship_sqla.kernel._errors import ConfigurationError, OutageError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator, Mapping

    from sqlalchemy.engine import Connection

    from ship_sqla._scope import Database

__all__ = [
    "DifferenceKind",
    "SchemaCheckError",
    "SchemaDifference",
    "SchemaReport",
    "check_schema",
]

DifferenceKind = Literal[
    "table_missing",
    "table_extra",
    "column_missing",
    "column_type",
    "column_nullable",
    "column_default",
    "column_extra",
    "primary_key",
    "constraint_missing",
    "constraint_definition",
    "constraint_extra",
    "index_missing",
    "index_columns",
    "index_unique",
    "index_predicate",
    "index_definition",
    "index_extra",
    "storage_option",
    "function_missing",
    "function_outdated",
]
"""What differs; reports list differences by table, then in this order."""

# Tables a migration tool keeps next to the application's: never reported as extra.
IGNORED_EXTRA_TABLES = frozenset({"alembic_version"})
TEMP_SCHEMA = "pg_temp"

# --- catalog statements ---------------------------------------------------------------------
# The check reads the system catalogs only, once per schema and side (live, scratch); catalog
# lookups by relnamespace / attrelid / conrelid / indrelid use the catalogs' own indexes.

NAMESPACE_OID = text(
    "SELECT n.oid, n.nspname FROM pg_catalog.pg_namespace n"
    " WHERE n.nspname = coalesce(CAST(:schema AS text), current_schema())"
)
TEMP_NAMESPACE = text(
    "SELECT n.oid, n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid = pg_my_temp_schema()"
)
TABLES_IN_NAMESPACE = text(
    "SELECT c.oid, c.relname, c.reloptions FROM pg_catalog.pg_class c"
    " WHERE c.relnamespace = :namespace AND c.relkind IN ('r', 'p')"
    # J17: a partition (a history day) is its parent's, which the metadata declares.
    " AND NOT c.relispartition"
)
COLUMNS = text(
    """
    SELECT a.attrelid AS table_oid,
           a.attname AS name,
           pg_catalog.format_type(a.atttypid, a.atttypmod) AS type,
           a.attnotnull AS not_null,
           pg_catalog.pg_get_expr(d.adbin, d.adrelid, true) AS default,
           a.attidentity::text AS identity,
           a.attgenerated::text AS generated
      FROM pg_catalog.pg_attribute a
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = ANY(CAST(:tables AS oid[])) AND a.attnum > 0 AND NOT a.attisdropped
    """
)
# NOT NULL constraints (contype 'n', PostgreSQL 18) are compared as column nullability.
CONSTRAINTS = text(
    """
    SELECT k.conrelid AS table_oid,
           k.conname AS name,
           k.contype::text AS kind,
           pg_catalog.pg_get_constraintdef(k.oid, true) AS definition
      FROM pg_catalog.pg_constraint k
     WHERE k.conrelid = ANY(CAST(:tables AS oid[])) AND k.contype IN ('p', 'u', 'c', 'f', 'x')
    """
)
# Indexes that back a primary key, unique or exclusion constraint are compared as constraints.
INDEXES = text(
    """
    SELECT x.indrelid AS table_oid,
           i.relname AS name,
           x.indisunique AS is_unique,
           am.amname AS method,
           ARRAY(SELECT pg_catalog.pg_get_indexdef(x.indexrelid, k, true)
                   FROM generate_series(1, x.indnkeyatts) AS k ORDER BY k) AS keys,
           ARRAY(SELECT pg_catalog.pg_get_indexdef(x.indexrelid, k, true)
                   FROM generate_series(x.indnkeyatts + 1, x.indnatts) AS k ORDER BY k)
               AS include,
           pg_catalog.pg_get_expr(x.indpred, x.indrelid, true) AS predicate,
           pg_catalog.pg_get_indexdef(x.indexrelid, 0, true) AS definition
      FROM pg_catalog.pg_index x
      JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
      JOIN pg_catalog.pg_am am ON am.oid = i.relam
     WHERE x.indrelid = ANY(CAST(:tables AS oid[]))
       AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_constraint k
            WHERE k.conindid = x.indexrelid AND k.conrelid = x.indrelid
              AND k.contype IN ('p', 'u', 'x'))
    """
)


class SchemaCheckError(OutageError, RuntimeError):
    """The schema check could not run (the metadata's DDL failed in the scratch schema, or the
    database could not be read); no comparison was made."""

    code = "SHIP_SQLA_SCHEMA_CHECK"


@attrs.frozen
class SchemaDifference:
    """One way the database differs from the metadata (T3).

    ``table`` is the metadata's key for the table (``schema.name`` or ``name``); ``name`` the
    column, constraint or index concerned (None for a whole table); ``database`` and
    ``metadata`` the two sides as PostgreSQL prints them (None where a side has nothing).
    """

    kind: DifferenceKind
    table: str
    name: str | None
    description: str
    database: str | None = None
    metadata: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "kind": self.kind,
            "table": self.table,
            "name": self.name,
            "description": self.description,
            "database": self.database,
            "metadata": self.metadata,
        }


@attrs.frozen
class SchemaReport:
    """What :func:`check_schema` found (T3): ``ok`` when there is no difference."""

    differences: tuple[SchemaDifference, ...]
    tables: tuple[str, ...]
    """The metadata tables that were compared."""

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tables": list(self.tables),
            "differences": [difference.to_dict() for difference in self.differences],
        }

    def format_text(self) -> str:
        """A table for people: one line per difference, then a summary line."""
        if self.ok:
            return f"schema check: OK, {len(self.tables)} table(s) match the metadata."
        rows = [("TABLE", "KIND", "OBJECT", "DIFFERENCE")] + [
            (d.table, d.kind, d.name or "-", d.description) for d in self.differences
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
            + "  "
            + row[3]
            for row in rows
        ]
        affected = len({d.table for d in self.differences})
        lines.append(
            f"schema check: {len(self.differences)} difference(s) in {affected} table(s)"
            f" of {len(self.tables)} compared."
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_text()


# --- catalog snapshots ----------------------------------------------------------------------


@attrs.frozen
class _Column:
    type: str
    not_null: bool
    default: str | None


@attrs.frozen
class _Constraint:
    kind: str
    definition: str


@attrs.frozen
class _Index:
    unique: bool
    method: str
    keys: tuple[str, ...]
    include: tuple[str, ...]
    predicate: str | None
    definition: str


@attrs.frozen
class _Table:
    columns: Mapping[str, _Column]
    constraints: Mapping[str, _Constraint]
    indexes: Mapping[str, _Index]
    options: Mapping[str, str] = attrs.field(factory=dict)
    """Storage options (``pg_class.reloptions``) by name, as PostgreSQL keeps their text."""


_NEXTVAL = re.compile(r"nextval\('[^']*'::regclass\)")


def _quoted(name: str) -> str:
    """``name`` as a quoted identifier, as PostgreSQL prints one that needs quoting."""
    return '"' + name.replace('"', '""') + '"'


class _Normalizer:
    """Strips the schema qualifiers PostgreSQL adds when an object is not on the search path.

    The scratch copy lives in ``pg_temp_N``; the live tables in their own schema. A name printed
    as ``pg_temp_3.status`` on one side and ``status`` on the other is the same object shape.
    """

    def __init__(self, schemas: Iterable[str]) -> None:
        names = sorted({s for s in schemas if s}, key=len, reverse=True)
        # A schema is printed bare, or quoted with its own double quotes doubled ("q""uote").
        alternatives = "|".join(
            rf"{re.escape(name)}|{re.escape(_quoted(name))}" for name in names if name
        )
        self._qualifier = re.compile(rf"(?<![\w\"$])(?:{alternatives})\.") if alternatives else None

    def __call__(self, value: str | None) -> str | None:
        if value is None or self._qualifier is None:
            return value
        return self._qualifier.sub("", value)


def _default_of(row: Any, normalize: _Normalizer) -> str | None:  # noqa: ANN401 - a Row
    if row.identity:
        return f"GENERATED {'ALWAYS' if row.identity == 'a' else 'BY DEFAULT'} AS IDENTITY"
    if row.generated:
        return f"GENERATED ALWAYS AS ({normalize(row.default)}) STORED"
    if row.default is None:
        return None
    # A serial's sequence is named after the table it was created for; a renamed table keeps
    # its old sequence name. The shape (a sequence default) is what matters.
    return _NEXTVAL.sub("nextval(<sequence>)", normalize(row.default) or "")


def _read_tables(
    connection: Connection, namespace: int, names: Collection[str], normalize: _Normalizer
) -> dict[str, _Table]:
    oids: dict[int, str] = {}
    options: dict[str, dict[str, str]] = {}
    for row in connection.execute(TABLES_IN_NAMESPACE, {"namespace": namespace}):
        if row.relname in names:
            oids[row.oid] = row.relname
            options[row.relname] = dict(
                option.split("=", 1) for option in (row.reloptions or ()) if "=" in option
            )
    columns: dict[str, dict[str, _Column]] = {name: {} for name in oids.values()}
    constraints: dict[str, dict[str, _Constraint]] = {name: {} for name in oids.values()}
    indexes: dict[str, dict[str, _Index]] = {name: {} for name in oids.values()}
    if oids:
        params = {"tables": list(oids)}
        for row in connection.execute(COLUMNS, params):
            columns[oids[row.table_oid]][row.name] = _Column(
                type=normalize(row.type) or "",
                not_null=bool(row.not_null),
                default=_default_of(row, normalize),
            )
        for row in connection.execute(CONSTRAINTS, params):
            constraints[oids[row.table_oid]][row.name] = _Constraint(
                kind=row.kind, definition=normalize(row.definition) or ""
            )
        for row in connection.execute(INDEXES, params):
            definition = row.definition.split(" USING ", 1)[-1]
            indexes[oids[row.table_oid]][row.name] = _Index(
                unique=bool(row.is_unique),
                method=row.method,
                keys=tuple(normalize(k) or "" for k in row.keys),
                include=tuple(normalize(k) or "" for k in row.include),
                predicate=normalize(row.predicate),
                definition=normalize(definition) or "",
            )
    return {
        name: _Table(
            columns=columns[name],
            constraints=constraints[name],
            indexes=indexes[name],
            options=options[name],
        )
        for name in oids.values()
    }


# --- comparison -----------------------------------------------------------------------------


def _compare_columns(
    key: str, live: Mapping[str, _Column], wanted: Mapping[str, _Column]
) -> list[SchemaDifference]:
    found: list[SchemaDifference] = []
    table = key.rsplit(".", 1)[-1]
    for name, column in wanted.items():
        if name not in live:
            found.append(
                SchemaDifference(
                    "column_missing",
                    key,
                    name,
                    f"column {table}.{name} ({column.type}) is in the metadata but not in the"
                    " database.",
                    metadata=column.type,
                )
            )
            continue
        have = live[name]
        if have.type != column.type:
            found.append(
                SchemaDifference(
                    "column_type",
                    key,
                    name,
                    f"column {table}.{name} has type {have.type} in the database,"
                    f" {column.type} in the metadata.",
                    database=have.type,
                    metadata=column.type,
                )
            )
        if have.not_null != column.not_null:
            database, metadata = (
                ("NOT NULL", "nullable") if have.not_null else ("nullable", "NOT NULL")
            )
            found.append(
                SchemaDifference(
                    "column_nullable",
                    key,
                    name,
                    f"column {table}.{name} is {database} in the database but {metadata} in the"
                    " metadata.",
                    database=database,
                    metadata=metadata,
                )
            )
        if have.default != column.default:
            found.append(
                SchemaDifference(
                    "column_default",
                    key,
                    name,
                    f"column {table}.{name} has server default"
                    f" {have.default or '(none)'} in the database,"
                    f" {column.default or '(none)'} in the metadata.",
                    database=have.default,
                    metadata=column.default,
                )
            )
    found.extend(
        SchemaDifference(
            "column_extra",
            key,
            name,
            f"column {table}.{name} ({column.type}) is in the database but not in the metadata.",
            database=column.type,
        )
        for name, column in live.items()
        if name not in wanted
    )
    return found


_CONSTRAINT_KINDS = {
    "p": "primary key",
    "u": "unique",
    "c": "check",
    "f": "foreign key",
    "x": "exclusion",
}


def _compare_constraints(
    key: str, live: Mapping[str, _Constraint], wanted: Mapping[str, _Constraint]
) -> list[SchemaDifference]:
    found: list[SchemaDifference] = []
    table = key.rsplit(".", 1)[-1]
    live_pk = {n: c for n, c in live.items() if c.kind == "p"}
    wanted_pk = {n: c for n, c in wanted.items() if c.kind == "p"}
    if live_pk != wanted_pk:
        have = ", ".join(f"{n}: {c.definition}" for n, c in live_pk.items()) or "(none)"
        want = ", ".join(f"{n}: {c.definition}" for n, c in wanted_pk.items()) or "(none)"
        found.append(
            SchemaDifference(
                "primary_key",
                key,
                next(iter(wanted_pk), None) or next(iter(live_pk), None),
                f"primary key of {table} is {have} in the database, {want} in the metadata.",
                database=have,
                metadata=want,
            )
        )

    live_named = {n: c for n, c in live.items() if c.kind != "p"}
    wanted_named = {n: c for n, c in wanted.items() if c.kind != "p"}
    for name, constraint in wanted_named.items():
        kind = _CONSTRAINT_KINDS[constraint.kind]
        have_constraint = live_named.get(name)
        if have_constraint is None:
            found.append(
                SchemaDifference(
                    "constraint_missing",
                    key,
                    name,
                    f"{kind} constraint {name} on {table} ({constraint.definition}) is in the"
                    " metadata but not in the database.",
                    metadata=constraint.definition,
                )
            )
        elif have_constraint != constraint:
            found.append(
                SchemaDifference(
                    "constraint_definition",
                    key,
                    name,
                    f"constraint {name} on {table} is {have_constraint.definition} in the"
                    f" database, {constraint.definition} in the metadata.",
                    database=have_constraint.definition,
                    metadata=constraint.definition,
                )
            )
    found.extend(
        SchemaDifference(
            "constraint_extra",
            key,
            name,
            f"{_CONSTRAINT_KINDS[constraint.kind]} constraint {name} on {table}"
            f" ({constraint.definition}) is in the database but not in the metadata.",
            database=constraint.definition,
        )
        for name, constraint in live_named.items()
        if name not in wanted_named
    )
    return found


def _columns_text(index: _Index) -> str:
    text_ = f"({', '.join(index.keys)})"
    if index.include:
        text_ += f" INCLUDE ({', '.join(index.include)})"
    return text_


def _compare_indexes(
    key: str, live: Mapping[str, _Index], wanted: Mapping[str, _Index]
) -> list[SchemaDifference]:
    found: list[SchemaDifference] = []
    table = key.rsplit(".", 1)[-1]
    for name, index in wanted.items():
        have = live.get(name)
        if have is None:
            found.append(
                SchemaDifference(
                    "index_missing",
                    key,
                    name,
                    f"index {name} on {table} ({index.definition}) is in the metadata but not"
                    " in the database.",
                    metadata=index.definition,
                )
            )
        else:
            found.extend(_index_differences(key, table, name, have, index))
    found.extend(
        SchemaDifference(
            "index_extra",
            key,
            name,
            f"index {name} on {table} ({index.definition}) is in the database but not in the"
            " metadata.",
            database=index.definition,
        )
        for name, index in live.items()
        if name not in wanted
    )
    return found


def _index_differences(
    key: str, table: str, name: str, have: _Index, index: _Index
) -> list[SchemaDifference]:
    """How index ``name`` in the database (``have``) differs from the metadata's (``index``):
    its columns, uniqueness and predicate each said apart; only when none of those differ, the
    rest of its definition (method, ordering, operator class, NULLS NOT DISTINCT, storage)."""
    found: list[SchemaDifference] = []
    if (have.keys, have.include) != (index.keys, index.include):
        found.append(
            SchemaDifference(
                "index_columns",
                key,
                name,
                f"index {name} on {table} covers {_columns_text(have)} in the database,"
                f" {_columns_text(index)} in the metadata.",
                database=_columns_text(have),
                metadata=_columns_text(index),
            )
        )
    if have.unique != index.unique:
        database, metadata = ("unique", "not unique") if have.unique else ("not unique", "unique")
        found.append(
            SchemaDifference(
                "index_unique",
                key,
                name,
                f"index {name} on {table} is {database} in the database but {metadata} in"
                " the metadata.",
                database=database,
                metadata=metadata,
            )
        )
    if have.predicate != index.predicate:
        found.append(
            SchemaDifference(
                "index_predicate",
                key,
                name,
                f"index {name} on {table} has predicate"
                f" {_predicate_text(have.predicate)} in the database,"
                f" {_predicate_text(index.predicate)} in the metadata (a query written for"
                " one predicate cannot use an index built for the other).",
                database=have.predicate,
                metadata=index.predicate,
            )
        )
    if not found and have.definition != index.definition:
        found.append(
            SchemaDifference(
                "index_definition",
                key,
                name,
                f"index {name} on {table} is USING {have.definition} in the database,"
                f" USING {index.definition} in the metadata.",
                database=have.definition,
                metadata=index.definition,
            )
        )
    return found


def _predicate_text(predicate: str | None) -> str:
    return f"WHERE {predicate}" if predicate is not None else "(none: a full index)"


# --- the check ------------------------------------------------------------------------------


def _selected(metadata: MetaData, tables: Iterable[str | Table] | None) -> list[Table]:
    if tables is None:
        return list(metadata.tables.values())
    chosen: list[Table] = []
    for item in tables:
        key = item.key if isinstance(item, Table) else item
        table = metadata.tables.get(key)
        if table is None:
            raise ConfigurationError(
                f"table {key!r} is not in the metadata given to the schema check.",
                fix=f"name one of: {', '.join(sorted(metadata.tables)) or '(no tables)'}.",
            )
        chosen.append(table)
    return chosen


def _scratch_groups(metadata: MetaData) -> list[set[str | None]]:
    """Which schemas share one scratch pass.

    All of them, normally: then foreign keys between schemas exist in the copy too (a temporary
    table may reference only temporary tables). When two schemas hold a table, index or
    key constraint of the same name they would collide in the one temporary schema, so each
    schema gets its own pass (and foreign keys across those schemas cannot be checked).
    """
    schemas = {t.schema for t in metadata.tables.values()}
    seen: set[str] = set()
    for table in metadata.tables.values():
        names = {
            table.name,
            *(str(i.name) for i in table.indexes),
            *(
                str(c.name)
                for c in table.constraints
                if isinstance(c, PrimaryKeyConstraint | UniqueConstraint) and c.name
            ),
        }
        if names & seen:
            return [{schema} for schema in schemas]
        seen |= names
    return [schemas]


@contextmanager
def _translated(connection: Connection, schemas: Collection[str | None]) -> Iterator[None]:
    """Render ``schemas`` as pg_temp while the block runs. ``Connection.execution_options``
    changes the connection in place (SQLAlchemy 2), so the caller's map is put back after."""
    previous = connection.get_execution_options().get("schema_translate_map")
    translate = {**(previous or {}), **dict.fromkeys(schemas, TEMP_SCHEMA)}
    connection.execution_options(schema_translate_map=translate)
    try:
        yield
    finally:
        connection.execution_options(schema_translate_map=previous)


@contextmanager
def _without_concurrently(tables: Iterable[Table]) -> Iterator[None]:
    """CREATE INDEX CONCURRENTLY cannot run inside the check's transaction, and the scratch copy
    does not need it. The flag is restored: the metadata is the caller's."""
    concurrent: list[Index] = [
        index
        for table in tables
        for index in table.indexes
        if index.dialect_options["postgresql"].get("concurrently")
    ]
    for index in concurrent:
        index.dialect_options["postgresql"]["concurrently"] = False
    try:
        yield
    finally:
        for index in concurrent:
            index.dialect_options["postgresql"]["concurrently"] = True


def _read_scratch(
    connection: Connection,
    metadata: MetaData,
    schemas: Collection[str | None],
    names: Collection[str],
    live_schemas: Collection[str],
) -> dict[str, _Table]:
    """Create the metadata's tables of ``schemas`` in pg_temp, read them, roll them back."""
    tables = [t for t in metadata.sorted_tables if t.schema in schemas]
    savepoint = connection.begin_nested()
    try:
        with _translated(connection, schemas), _without_concurrently(tables):
            try:
                # J17: the history parent is compared, never its partitions (the option
                # changes the connection in place: it is unset after).
                # E6: nor are the SQL enqueue functions installed from the scratch copy.
                connection.execution_options(
                    **{NO_PARTITIONS_OPTION: True, SKIP_INSTALL_OPTION: True}
                )
                try:
                    metadata.create_all(connection, tables=tables, checkfirst=False)
                finally:
                    connection.execution_options(
                        **{NO_PARTITIONS_OPTION: False, SKIP_INSTALL_OPTION: False}
                    )
            except SQLAlchemyError as exc:
                raise SchemaCheckError(
                    "the metadata's own DDL failed in a scratch (temporary) schema, so nothing"
                    f" was compared: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                    fix="make sure metadata.create_all() works on an empty database (missing"
                    " extensions, types, or foreign keys to tables outside the metadata). Tables"
                    " of the same name in two schemas cannot be checked with foreign keys"
                    " between those schemas.",
                ) from exc
        temp = connection.execute(TEMP_NAMESPACE).one()
        normalize = _Normalizer({*live_schemas, temp.nspname, TEMP_SCHEMA})
        return _read_tables(connection, temp.oid, names, normalize)
    finally:
        savepoint.rollback()


def _check_sync(
    connection: Connection,
    metadata: MetaData,
    tables: Iterable[str | Table] | None,
    extra_tables: bool,
) -> SchemaReport:
    selected = _selected(metadata, tables)
    by_schema: dict[str | None, list[Table]] = {}
    for table in selected:
        by_schema.setdefault(table.schema, []).append(table)

    live_namespaces: dict[str | None, tuple[int, str] | None] = {}
    for schema, members in by_schema.items():
        # The caller's own schema_translate_map (say, a schema per tenant) says where they live.
        effective = connection.schema_for_object(members[0])
        row = connection.execute(NAMESPACE_OID, {"schema": effective}).first()
        live_namespaces[schema] = (row.oid, row.nspname) if row is not None else None
    schema_names = {ns[1] for ns in live_namespaces.values() if ns is not None}

    differences: list[SchemaDifference] = []
    live: dict[str | None, dict[str, _Table]] = {}
    live_normalize = _Normalizer(schema_names)
    for schema, members in by_schema.items():
        namespace = live_namespaces[schema]
        if namespace is None:
            live[schema] = {}
            continue
        everything = {
            row.relname
            for row in connection.execute(TABLES_IN_NAMESPACE, {"namespace": namespace[0]})
        }
        live[schema] = _read_tables(
            connection, namespace[0], {t.name for t in members}, live_normalize
        )
        if extra_tables and tables is None:
            known = {t.name for t in metadata.tables.values() if t.schema == schema}
            differences.extend(
                SchemaDifference(
                    "table_extra",
                    f"{schema}.{name}" if schema else name,
                    None,
                    f"table {name} is in the database (schema {namespace[1]}) but not in the"
                    " metadata.",
                )
                for name in sorted(everything - known - IGNORED_EXTRA_TABLES)
            )

    for group in _scratch_groups(metadata):
        members = [t for t in selected if t.schema in group]
        if not members:
            continue
        scratch = _read_scratch(
            connection, metadata, group, {t.name for t in members}, schema_names
        )
        for table in members:
            differences.extend(
                _compare_table(table, live[table.schema].get(table.name), scratch[table.name])
            )

    differences.extend(_compare_functions(connection, metadata, selected))
    order = {kind: i for i, kind in enumerate(get_args(DifferenceKind))}
    differences.sort(key=lambda d: (d.table, order[d.kind], d.name or ""))
    return SchemaReport(differences=tuple(differences), tables=tuple(t.key for t in selected))


def _compare_table(table: Table, live: _Table | None, wanted: _Table) -> list[SchemaDifference]:
    if live is None:
        return [
            SchemaDifference(
                "table_missing",
                table.key,
                None,
                f"table {table.key} is in the metadata but not in the database.",
            )
        ]
    return [
        *_compare_columns(table.key, live.columns, wanted.columns),
        *_compare_constraints(table.key, live.constraints, wanted.constraints),
        *_compare_indexes(table.key, live.indexes, wanted.indexes),
        *_compare_options(table, live.options),
    ]


def _compare_functions(
    connection: Connection, metadata: MetaData, selected: Collection[Table]
) -> list[SchemaDifference]:
    """E6: the SQL enqueue functions each checked definitions table declares
    (:func:`~ship_sqla._jobs._sql_api.ship_job_definitions_table` with ``runs`` and ``state``)
    exist and carry this library's build hash in their COMMENT."""
    found: list[SchemaDifference] = []
    for install in sql_enqueue_installs(metadata):
        if not any(table is install.definitions for table in selected):
            continue
        status = status_of(connection, install)
        if status == "current":
            continue
        fix = (
            "Fix: `ship-sqla schema apply` (CREATE OR REPLACE, never a DROP: callers keep"
            " working, E5), or run sql_enqueue_ddl(...)'s statements in a migration."
        )
        found.append(
            SchemaDifference(
                "function_missing" if status == "missing" else "function_outdated",
                install.definitions.key,
                install.function,
                (
                    f"the SQL enqueue function {install.function} is not installed (E6). "
                    if status == "missing"
                    else f"the SQL enqueue function {install.function} is another build than"
                    " this library's (the build hash in its COMMENT differs, E6). "
                )
                + fix,
                database=status,
                metadata="current",
            )
        )
    return found


def _same_option(live: str, declared: OptionValue) -> bool:
    try:
        return float(live) == float(declared)
    except ValueError:
        return live == str(declared)


def _compare_options(table: Table, live: Mapping[str, str]) -> list[SchemaDifference]:
    """J21: each storage option the metadata declares (:mod:`ship_sqla._storage_options`) is
    set on the live table to the same value. Options the operator set beyond them are theirs
    and not reported."""
    found: list[SchemaDifference] = []
    for name, value in storage_options(table).items():
        current = live.get(name)
        if current is not None and _same_option(current, value):
            continue
        fix = storage_options_ddl(table, {name: value})
        state = "not set" if current is None else current
        found.append(
            SchemaDifference(
                "storage_option",
                table.key,
                name,
                f"storage option {name} is {state} on the table; the metadata declares"
                f" {name}={value} (J21). Fix: {fix}"
                + (
                    "; or `ship-sqla schema apply`, which sets missing ones."
                    if current is None
                    else "."
                ),
                database=None if current is None else f"{name}={current}",
                metadata=f"{name}={value}",
            )
        )
    return found


async def check_schema(
    connection_or_engine: Database,
    metadata: MetaData,
    *,
    tables: Iterable[str | Table] | None = None,
    extra_tables: bool = True,
) -> SchemaReport:
    """Compare the live PostgreSQL database with ``metadata`` (T3).

    ``tables`` limits the check to some of the metadata's tables (``Table`` objects or their
    ``metadata.tables`` keys); extra tables are then not looked for. With ``extra_tables=True``
    (and no ``tables``), tables present in the metadata's schemas but absent from the metadata
    are reported too (``alembic_version`` never is).

    Given an ``AsyncEngine`` the check uses one connection of it; given an ``AsyncConnection``
    it runs in a SAVEPOINT (inside a transaction) or its own transaction, rolled back either
    way: the check changes nothing. Raises :class:`SchemaCheckError` when the metadata's DDL
    cannot even be created in a scratch schema.
    """
    if isinstance(connection_or_engine, AsyncEngine):
        async with connection_or_engine.connect() as connection:
            return await _check_on(connection, metadata, tables, extra_tables)
    if not isinstance(connection_or_engine, AsyncConnection):
        raise ConfigurationError(
            f"check_schema needs an AsyncEngine or AsyncConnection,"
            f" got {type(connection_or_engine).__name__}.",
            fix="pass create_async_engine('postgresql+asyncpg://...') or a connection of it.",
        )
    return await _check_on(connection_or_engine, metadata, tables, extra_tables)


async def _check_on(
    connection: AsyncConnection,
    metadata: MetaData,
    tables: Iterable[str | Table] | None,
    extra_tables: bool,
) -> SchemaReport:
    if connection.dialect.name != "postgresql":
        raise ConfigurationError(
            f"the schema check reads PostgreSQL's catalogs; this is {connection.dialect.name}.",
            fix="point it at the PostgreSQL database the metadata describes.",
        )
    transaction = (
        await connection.begin_nested() if connection.in_transaction() else await connection.begin()
    )
    try:
        return await connection.run_sync(_check_sync, metadata, tables, extra_tables)
    finally:
        await transaction.rollback()
