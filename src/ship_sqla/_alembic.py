"""Alembic's autogenerate beside the ship tables (J17): :func:`ship_include_object`.

The run history (``ship_job_history_table``) is a partitioned parent whose partitions are made
and dropped by maintenance, not declared in the metadata. PostgreSQL reports every partition as
a table, so ``alembic revision --autogenerate`` would propose dropping each one (and
``alembic check`` would fail). The filter leaves them out: a table the database has and the
metadata lacks is skipped when its name is a partition name of a history table the metadata
declares in the same schema (``<history>_<class>``, ``<history>_<class>_default``,
``<history>_<class>_<YYYYMMDD>``). Every other object is decided by the application's own
``include_object`` (or included).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ship_sqla._jobs._history_ddl import is_history_table
from ship_sqla.kernel._history_partitions import STATE_CLASSES

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy import MetaData

__all__ = ["ship_include_object"]


_CLASSES = "|".join(STATE_CLASSES)


def _partition_pattern(history: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(history)}_(?:{_CLASSES})(?:_default|_\d{{8}})?")


def ship_include_object(
    metadata: MetaData,
    include_object: Callable[[Any, str | None, str, bool, Any], bool] | None = None,
) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """An ``include_object`` for Alembic's ``context.configure(...)`` that leaves the history
    tables' partitions (J17) out of autogenerate and ``alembic check``; ``include_object``:
    the application's own filter, asked about everything else.

    ``context.configure(connection=..., target_metadata=metadata,
    include_object=ship_include_object(metadata))``.
    """
    patterns = [
        (table.schema, _partition_pattern(table.name))
        for table in metadata.tables.values()
        if is_history_table(table)
    ]

    def include(
        obj: Any,  # noqa: ANN401 - Alembic's schema item
        name: str | None,
        type_: str,
        reflected: bool,
        compare_to: Any,  # noqa: ANN401 - Alembic's schema item
    ) -> bool:
        if type_ == "table" and reflected and compare_to is None and name is not None:
            schema = getattr(obj, "schema", None)
            if any(s == schema and p.fullmatch(name) for s, p in patterns):
                return False
        if include_object is None:
            return True
        return include_object(obj, name, type_, reflected, compare_to)

    return include
