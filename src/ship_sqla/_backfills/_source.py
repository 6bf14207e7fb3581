"""The default backfill source on PostgreSQL (C4): a SQLAlchemy ``Select`` read by keyset
pagination on its key columns, one statement per page."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from ship_sqla._scope import StoreConnections
from ship_sqla.kernel._backfills import BackfillPage
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ship_sqla._scope import Database

__all__ = ["SelectableSource", "selectable_source"]


class SelectableSource:
    """A :class:`~ship_sqla.kernel.BackfillSource` over ``select`` keyed on ``key``. Build with
    :func:`selectable_source`."""

    __slots__ = ("_connections", "_key", "_select")

    def __init__(
        self, database: Database, select: Select[Any], key: Sequence[ColumnElement[Any]]
    ) -> None:
        self._connections = StoreConnections(database, name="backfill source")
        self._select = select
        self._key = tuple(key)

    def statement(self, after: tuple[Any, ...] | None, limit: int) -> Select[Any]:
        """The page's one statement: ``WHERE (k1, k2) > (:a, :b) ORDER BY k1, k2 LIMIT
        :limit``, a range scan of an index on the key columns (declare one)."""
        statement = self._select
        if after is not None:
            if len(after) != len(self._key):
                raise ConfigurationError(
                    f"backfill source: the stored key {after!r} has {len(after)} values and the"
                    f" source is keyed on {len(self._key)} columns.",
                    fix="keep a backfill's key columns; declare a new backfill id to change them.",
                )
            statement = statement.where(tuple_(*self._key) > tuple_(*after))
        return statement.order_by(*self._key).limit(limit)

    async def page(self, after: tuple[Any, ...] | None, limit: int) -> BackfillPage:
        """The rows after ``after`` in key order (:meth:`statement`); read in the page's unit
        of work when there is one (with ``transaction=``), else on its own."""
        statement = self.statement(after, limit)
        rows = await self._connections.rows("page", statement, scope=None, by_name=True)
        if not rows:
            return BackfillPage((), None)
        last = rows[-1]._mapping  # noqa: SLF001 - SQLAlchemy's public row mapping
        return BackfillPage(tuple(rows), tuple(last[column] for column in self._key))


def selectable_source(
    database: Database, select: Select[Any], *, key: Sequence[ColumnElement[Any]]
) -> SelectableSource:
    """C4's default source: ``select`` (e.g. ``select(users.c.id, users.c.email).where(
    users.c.email_lower.is_(None))``) paged by ``key`` (columns it returns, unique together,
    with JSON-able values: ints, text; an index on them serves each page). ``database``: an
    ``AsyncEngine`` (or a connection in a transaction, in tests)."""
    given: object = select
    if not isinstance(given, Select):
        raise ConfigurationError(
            f"selectable_source needs a Select, got {type(given).__name__}.",
            fix="pass select(table.c.id, ...) and key=[table.c.id].",
        )
    columns = tuple(key)
    if not columns or not all(isinstance(c, ColumnElement) for c in columns):
        raise ConfigurationError(
            "selectable_source needs key=, one or more columns the select returns.",
            fix="pass key=[table.c.id] (a unique, indexed column or columns).",
        )
    return SelectableSource(database, select, columns)
