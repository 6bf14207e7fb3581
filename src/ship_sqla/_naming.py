"""Names the ship table factories derive from a table's name (T1): ``<table><suffix>``,
explicit, and refused when PostgreSQL would silently truncate them; and the one way a table's
name is quoted into a statement's text (:func:`quoted_table`, :func:`text_name`, :func:`fill`).

Every factory checks its ``name=`` and ``schema=`` here: an empty or blank table name, a name
that is not valid Unicode text, or ``schema=""`` (which is not "no schema": it would render as
the quoted empty identifier ``""``), is a :class:`~ship_sqla.errors.ConfigurationError` when the
table is declared, not a syntax error at the first statement.

Any other name works, whatever it holds (``--``, ``/*``, quotes, ``;``, ``:``, ``%``, braces,
non-ASCII; issue 25 D3), because a quoted name is never altered on its way into a statement:

- it is quoted by PostgreSQL's rules and nothing else (no ``%`` doubled for a ``format``
  paramstyle: the statements run on asyncpg, and SQLAlchemy doubles what its driver needs);
- a statement template is compacted (comments and indentation dropped) BEFORE any name is put
  in (:mod:`ship_sqla._jobs._sql`), never after: ``"jobs--v2"`` is not a comment;
- names are put into a template in ONE pass (:func:`fill`), so a name holding ``{state}`` is
  never substituted again;
- in a ``text()`` statement its colons are escaped (:func:`text_name`): ``":bind"`` is not a
  bind parameter.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import conv

from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy import Table

__all__ = [
    "MAX_IDENTIFIER_BYTES",
    "check_derived_names",
    "check_identifier",
    "derived_name",
    "derived_names",
    "fill",
    "quoted_identifier",
    "quoted_table",
    "text_name",
]

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's identifier limit (NAMEDATALEN - 1); longer names are cut without an error."""

# A paramstyle that is not "format": the default PostgreSQL dialect's (psycopg2, pyformat)
# preparer writes "a%b" as "a%%b", which asyncpg sends as it is: another table's name.
_PREPARER = postgresql.dialect(paramstyle="named").identifier_preparer  # type: ignore[no-untyped-call]


def quoted_table(table: Table) -> str:
    """``table``'s schema-qualified name, each part quoted as PostgreSQL needs it (and nothing
    more): for messages, lock keys, channel names and bind parameters (``to_regclass(:runs)``).
    Inside a ``text()`` statement use :func:`text_name`. A table name is configuration, never
    user input."""
    return str(_PREPARER.format_table(table))


def quoted_identifier(name: str) -> str:
    """``name`` always quoted, its own double quotes doubled (and nothing else altered): for DDL
    handed to the application (:func:`~ship_sqla.schema.tenant_policy_ddl`)."""
    return str(_PREPARER.quote_identifier(name))


def text_name(quoted: str) -> str:
    """``quoted`` (from :func:`quoted_table`) as it must be written into the text of a
    ``text()`` statement so that SQLAlchemy sends it unchanged: every ``:`` escaped as ``\\:``
    (which SQLAlchemy turns back into ``:``), else ``":bind"`` would be read as the bind
    parameter ``:bind``. Escaping every colon (not only those before a word) is what keeps
    the escape exact: no colon of the name is then preceded by anything but its own escape."""
    return quoted.replace(":", "\\:") if ":" in quoted else quoted


_PLACEHOLDER = re.compile(r"\{[a-z]+\}")


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every ``{placeholder}`` of ``values`` replaced, in ONE pass: a value
    (a table's name) is never scanned again, so a name holding ``{state}`` or ``{now}`` stays
    as it is. A placeholder not in ``values`` stays too (a statement's own braces)."""
    return _PLACEHOLDER.sub(lambda match: values.get(match.group(), match.group()), template)


def derived_name(table: str, suffix: str) -> conv:
    """``<table><suffix>``, marked final so no naming convention rewrites it."""
    return conv(f"{table}{suffix}")


def _utf8_size(value: str) -> int | None:
    """``value``'s size in UTF-8, or None when it is not valid Unicode text (a surrogate code
    point, such as a lone ``"\\ud800"``, has no UTF-8 encoding and PostgreSQL cannot hold it)."""
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        return None


def check_identifier(value: object, what: str) -> None:
    """Refuse a table or schema name PostgreSQL cannot hold as given: not text, empty, blank,
    with a NUL, not encodable as UTF-8 (a surrogate code point), or over the identifier limit
    (it would be truncated). Every other name must work (see the module docstring)."""
    problem = None
    if not isinstance(value, str):
        problem = f"is a {type(value).__name__}, not text"
    elif not value.strip():
        problem = "is empty or blank"
    elif "\x00" in value:
        problem = "contains a NUL character"
    elif (size := _utf8_size(value)) is None:
        problem = "is not valid Unicode text (a surrogate code point, not encodable as UTF-8)"
    elif size > MAX_IDENTIFIER_BYTES:
        problem = f"is {size} bytes, over PostgreSQL's {MAX_IDENTIFIER_BYTES}"
    if problem is not None:
        shown = value[:80] if isinstance(value, str) else value
        none_hint = " (or None for the search_path's schema)" if "schema" in what else ""
        raise ConfigurationError(
            f"{what} {shown!r} {problem}.",
            fix=f"pass a name of 1 to {MAX_IDENTIFIER_BYTES} bytes of UTF-8 text{none_hint}.",
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
