"""Reading PostgreSQL's SQLSTATE off whatever SQLAlchemy and asyncpg raised."""

from __future__ import annotations

__all__ = ["sqlstate_of"]


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, looking through SQLAlchemy's and asyncpg's wrappers."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for attribute in ("sqlstate", "pgcode"):
            value = getattr(current, attribute, None)
            if isinstance(value, str) and value:
                return value
        current = getattr(current, "orig", None) or current.__cause__
    return None
