"""Names the ship table factories derive from a table's name (T1): ``<table><suffix>``,
explicit, and refused when PostgreSQL would silently truncate them."""

from __future__ import annotations

from sqlalchemy.sql.elements import conv

from ship_sqla.kernel import ConfigurationError

__all__ = ["MAX_IDENTIFIER_BYTES", "check_derived_names", "derived_name", "derived_names"]

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's identifier limit (NAMEDATALEN - 1); longer names are cut without an error."""


def derived_name(table: str, suffix: str) -> conv:
    """``<table><suffix>``, marked final so no naming convention rewrites it."""
    return conv(f"{table}{suffix}")


def check_derived_names(table: str, suffixes: tuple[str, ...], what: str) -> None:
    """Refuse ``table`` when its longest derived name would exceed the identifier limit:
    PostgreSQL would truncate it and it would stop matching the declared name."""
    longest = max(suffixes, key=len)
    size = len(f"{table}{longest}".encode())
    if size > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"{what} table name {table!r} is too long: its name {table}{longest} would be"
            f" {size} bytes, over PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte limit (it would be"
            " silently truncated and stop matching the declared name).",
            fix=f"use a table name of at most {MAX_IDENTIFIER_BYTES - len(longest)} bytes.",
        )


def derived_names(table: str, suffixes: tuple[str, ...], what: str) -> dict[str, conv]:
    """Every ``<table><suffix>`` by suffix, after :func:`check_derived_names`."""
    check_derived_names(table, suffixes, what)
    return {suffix: derived_name(table, suffix) for suffix in suffixes}
