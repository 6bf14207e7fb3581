"""One page type for every keyset-paged read: repository pages, operator pages of runs and of
outbox messages."""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs

__all__ = ["Page"]

T_co = TypeVar("T_co", covariant=True)


@attrs.frozen
class Page(Generic[T_co]):
    """One keyset page: its items, in query order, and the cursor of the next page.

    ``next_cursor`` is ``None`` exactly when no row follows ``items``, so paging never ends
    with an empty page; over an unchanged table it never skips or repeats a row. A cursor is
    signed (:mod:`ship_sqla.kernel._cursor`) and valid only for the query that produced it.
    """

    items: tuple[T_co, ...]
    next_cursor: str | None
