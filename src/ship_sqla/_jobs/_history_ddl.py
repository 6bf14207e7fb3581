"""J17: the DDL of the run history's partitions.

``ship_job_history_table()`` declares the partitioned parent (``PARTITION BY LIST (state)``);
its partitions are not in the metadata (they come and go by the day), so an ``after_create``
listener creates the first ones right after the parent's ``CREATE TABLE``: for each state class
the class partition (``PARTITION BY RANGE (finished_at)``), its DEFAULT partition and its day
partitions from today (UTC, the process's clock) to :data:`DAYS_AHEAD` days ahead. So
``metadata.create_all()``, ``ship-sqla schema apply``, :func:`schema_sql` and Alembic's
``op.create_table`` all create a history table that settles can write into at once; maintenance
(:mod:`ship_sqla._jobs._maintenance`) keeps the days coming and drops the expired ones.

Names are ``<history>_<class>``, ``<history>_<class>_default`` and
``<history>_<class>_<YYYYMMDD>``, each in the parent's schema; the statements are rendered by
the executing dialect's preparer, so a ``schema_translate_map`` (the schema check's scratch
copy, a schema per tenant) moves them with the parent.
"""

from __future__ import annotations

import weakref
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import MetaData, Table, event
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ExecutableDDLElement

from ship_sqla._naming import fill
from ship_sqla._storage_options import storage_options_sql
from ship_sqla.kernel._history_partitions import (
    DAYS_AHEAD,
    STATE_CLASSES,
    StateClass,
    class_states,
    day_of,
    day_suffix,
    default_suffix,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy.sql.compiler import DDLCompiler

    from ship_sqla.kernel._jobs import Retention

__all__ = [
    "HISTORY_INFO",
    "HISTORY_PARTITION_OPTIONS",
    "NO_PARTITIONS_OPTION",
    "PartitionDDL",
    "class_partition",
    "create_class_ddl",
    "create_day_ddl",
    "day_partition",
    "declare_history_retention",
    "default_partition",
    "drop_day_ddl",
    "history_retention",
    "initial_partitions_ddl",
    "is_history_table",
]

HISTORY_INFO: Final = "ship_sqla.history"
"""The ``Table.info`` key marking a history parent (its partitions are maintenance's)."""

_RETENTIONS: Final[weakref.WeakKeyDictionary[Table, Retention]] = weakref.WeakKeyDictionary()


def declare_history_retention(table: Table, retention: Retention | None) -> None:
    """Keep the retention a history table declares (``ship_job_history_table(...,
    retention=)``): the floor of every class's partition lifetime. Kept beside the table, not
    in ``Table.info``, which Alembic writes into migrations."""
    if retention is not None:
        _RETENTIONS[table] = retention


def history_retention(table: Table) -> Retention | None:
    """The retention ``table`` declares (None: the default :class:`Retention`)."""
    return _RETENTIONS.get(table)


NO_PARTITIONS_OPTION: Final = "ship_sqla_no_history_partitions"
"""An execution option: create the history parent without partitions (the schema check's
scratch copy compares the parent only)."""

HISTORY_PARTITION_OPTIONS: Final[Mapping[str, int | float]] = {
    "autovacuum_vacuum_insert_scale_factor": 0,
    "autovacuum_vacuum_insert_threshold": 10_000,
}
"""The storage options of every history leaf partition (J21): append-only, so only the insert
threshold matters (a vacuum marks new pages all-visible for index-only scans); a partitioned
parent takes none."""


class PartitionDDL(ExecutableDDLElement):
    """A DDL statement naming tables (``{parent}``, ``{part}``...), each rendered by the
    executing dialect's preparer (schema translation included)."""

    inherit_cache = False

    def __init__(self, template: str, tables: Mapping[str, Table]) -> None:
        self.template = template
        self.tables = dict(tables)


@compiles(PartitionDDL)
def _compile_partition_ddl(
    element: PartitionDDL,
    compiler: DDLCompiler,
    **_kw: Any,  # noqa: ANN401
) -> str:
    preparer = compiler.preparer
    names = {f"{{{k}}}": str(preparer.format_table(t)) for k, t in element.tables.items()}
    return fill(element.template, names)


def is_history_table(table: Table) -> bool:
    """Whether ``table`` is a history parent declared by ``ship_job_history_table``."""
    return bool(table.info.get(HISTORY_INFO))


def _sibling(parent: Table, name: str) -> Table:
    """A stand-in Table of ``name`` in ``parent``'s schema: what a partition's name renders as."""
    return Table(name, MetaData(), schema=parent.schema)


def class_partition(parent: Table, cls: StateClass) -> Table:
    """``<history>_<class>``."""
    return _sibling(parent, f"{parent.name}_{cls}")


def default_partition(parent: Table, cls: StateClass) -> Table:
    """``<history>_<class>_default``."""
    return _sibling(parent, parent.name + default_suffix(cls))


def day_partition(parent: Table, cls: StateClass, day: date) -> Table:
    """``<history>_<class>_<YYYYMMDD>``."""
    return _sibling(parent, parent.name + day_suffix(cls, day))


def _literal(moment: datetime) -> str:
    return f"'{moment.strftime('%Y-%m-%d %H:%M:%S')}+00'"


def create_class_ddl(parent: Table, cls: StateClass) -> list[PartitionDDL]:
    """The class partition of ``cls`` and its DEFAULT partition."""
    states = ", ".join(f"'{state}'" for state in class_states(cls))
    options = storage_options_sql(HISTORY_PARTITION_OPTIONS)
    return [
        PartitionDDL(
            "CREATE TABLE {part} PARTITION OF {parent} FOR VALUES IN ("
            + states
            + ") PARTITION BY RANGE (finished_at)",
            {"parent": parent, "part": class_partition(parent, cls)},
        ),
        PartitionDDL(
            "CREATE TABLE {part} PARTITION OF {parent} DEFAULT WITH " + options,
            {"parent": class_partition(parent, cls), "part": default_partition(parent, cls)},
        ),
    ]


def create_day_ddl(parent: Table, cls: StateClass, day: date) -> PartitionDDL:
    """The day partition of ``cls`` for the UTC ``day`` (``IF NOT EXISTS``: another
    maintainer may have made it)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    bounds = f"FROM ({_literal(start)}) TO ({_literal(start + timedelta(days=1))})"
    options = storage_options_sql(HISTORY_PARTITION_OPTIONS)
    return PartitionDDL(
        "CREATE TABLE IF NOT EXISTS {part} PARTITION OF {parent} FOR VALUES "
        + bounds
        + " WITH "
        + options,
        {"parent": class_partition(parent, cls), "part": day_partition(parent, cls, day)},
    )


def drop_day_ddl(parent: Table, cls: StateClass, day: date) -> PartitionDDL:
    """Drop the day partition of ``cls`` for ``day`` (its rows leave with it, J17)."""
    return PartitionDDL("DROP TABLE IF EXISTS {part}", {"part": day_partition(parent, cls, day)})


def initial_partitions_ddl(
    parent: Table, today: date, days_ahead: int = DAYS_AHEAD
) -> list[PartitionDDL]:
    """Every partition a new history table starts with: per class, the class and DEFAULT
    partitions and the days from ``today`` to ``today + days_ahead``."""
    statements: list[PartitionDDL] = []
    for cls in STATE_CLASSES:
        statements.extend(create_class_ddl(parent, cls))
        statements.extend(
            create_day_ddl(parent, cls, today + timedelta(days=i)) for i in range(days_ahead + 1)
        )
    return statements


@event.listens_for(Table, "after_create")
def _create_partitions(table: Table, connection: Any, **kw: Any) -> None:  # noqa: ANN401
    """After a history parent's CREATE TABLE: its first partitions, in the same transaction.
    Alembic hands its own DDL runner, which also renders ``--sql`` (offline) migrations."""
    if not is_history_table(table):
        return
    runner: Any = kw.get("_ddl_runner")
    alembic = type(runner).__module__.startswith("alembic.")
    # schema_sql's mock connection has no execution options (it prints the partitions too).
    options = getattr(connection, "get_execution_options", None)
    if not alembic and options is not None and options().get(NO_PARTITIONS_OPTION):
        return
    for statement in initial_partitions_ddl(table, day_of(datetime.now(UTC))):
        if alembic:
            runner._exec(statement)  # noqa: SLF001 - Alembic's one way to run (or print) DDL
        else:
            connection.execute(statement)
