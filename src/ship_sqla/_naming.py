"""Names the ship table factories derive from a table's name (T1): ``<table><suffix>``,
explicit, and refused when PostgreSQL would silently truncate them; and the one way a table's
name is quoted into a statement's text (:func:`quoted_table`).

Every factory checks its ``name=`` and ``schema=`` here: an empty or blank table name, or
``schema=""`` (which is not "no schema": it would render as the quoted empty identifier ``""``),
is a :class:`~ship_sqla.kernel.ConfigurationError` when the table is declared, not a syntax
error at the first statement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import conv

from ship_sqla.kernel import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy import Table

__all__ = [
    "MAX_IDENTIFIER_BYTES",
    "check_derived_names",
    "check_identifier",
    "derived_name",
    "derived_names",
    "quoted_table",
]

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's identifier limit (NAMEDATALEN - 1); longer names are cut without an error."""

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def quoted_table(table: Table) -> str:
    """``table``'s schema-qualified name, each part quoted as PostgreSQL needs it, for the text of
    a statement rendered once per table. A table name is configuration, never user input."""
    return str(_PREPARER.format_table(table))


def derived_name(table: str, suffix: str) -> conv:
    """``<table><suffix>``, marked final so no naming convention rewrites it."""
    return conv(f"{table}{suffix}")


def check_identifier(value: object, what: str) -> None:
    """Refuse a table or schema name PostgreSQL cannot hold as given: not text, empty, blank,
    with a NUL, or over the identifier limit (it would be truncated)."""
    problem = None
    if not isinstance(value, str):
        problem = f"is a {type(value).__name__}, not text"
    elif not value.strip():
        problem = "is empty or blank"
    elif "\x00" in value:
        problem = "contains a NUL character"
    elif len(value.encode()) > MAX_IDENTIFIER_BYTES:
        problem = f"is {len(value.encode())} bytes, over PostgreSQL's {MAX_IDENTIFIER_BYTES}"
    if problem is not None:
        shown = value[:80] if isinstance(value, str) else value
        none_hint = " (or None for the search_path's schema)" if "schema" in what else ""
        raise ConfigurationError(
            f"{what} {shown!r} {problem}.",
            fix=f"pass a name of 1 to {MAX_IDENTIFIER_BYTES} bytes{none_hint}.",
        )


def check_derived_names(
    table: str, suffixes: tuple[str, ...], what: str, *, schema: str | None = None
) -> None:
    """Refuse an unusable ``table`` or ``schema`` name (:func:`check_identifier`), and ``table``
    when its longest derived name would exceed the identifier limit: PostgreSQL would truncate
    it and it would stop matching the declared name."""
    check_identifier(table, f"{what} table name")
    if schema is not None:
        check_identifier(schema, f"{what} table schema")
    longest = max(suffixes, key=len)
    size = len(f"{table}{longest}".encode())
    if size > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"{what} table name {table!r} is too long: its name {table}{longest} would be"
            f" {size} bytes, over PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte limit (it would be"
            " silently truncated and stop matching the declared name).",
            fix=f"use a table name of at most {MAX_IDENTIFIER_BYTES - len(longest)} bytes.",
        )


def derived_names(
    table: str, suffixes: tuple[str, ...], what: str, *, schema: str | None = None
) -> dict[str, conv]:
    """Every ``<table><suffix>`` by suffix, after :func:`check_derived_names`."""
    check_derived_names(table, suffixes, what, schema=schema)
    return {suffix: derived_name(table, suffix) for suffix in suffixes}
