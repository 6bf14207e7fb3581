"""J17: the run history's maintenance on PostgreSQL (:class:`PostgresHistoryMaintenance`).

One pass (:meth:`PostgresHistoryMaintenance.maintain`): read the history's partitions
(:data:`~ship_sqla._jobs._sql.history.HISTORY_PARTITIONS`); per state class, create the days
from today to ``DAYS_AHEAD`` ahead that are missing and drop the days past the class's
retention (the kernel's :func:`plan_history`); ``ANALYZE`` the parent when anything changed
(autovacuum never analyzes a partitioned parent, so history-wide estimates would go stale);
count the rows each DEFAULT partition caught (strays: reported).

Every DDL is its own short transaction under ``lock_timeout`` = :data:`LOCK_TIMEOUT` (1 s): a
CREATE, ATTACH or DROP of a partition takes an ACCESS EXCLUSIVE lock on its class partition,
so while it waits behind a long reader every settle into that class queues behind it. It gives
up after 1 s (SQLSTATE 55P03), is reported as deferred and retried at the next pass: no settle
waits longer than that for maintenance.

A day whose rows are already in the DEFAULT partition (maintenance stopped for more than
``DAYS_AHEAD`` days) cannot be created by ``PARTITION OF`` (PostgreSQL refuses while the DEFAULT
holds rows of its range); it is created as a table, the day's rows moved into it from the
DEFAULT and attached, in one transaction under the same timeout.

Last, the runs table's bloated indexes are rebuilt (J16, J17:
:class:`~ship_sqla._jobs._reindex.RunsIndexRebuild`, ``REINDEX CONCURRENTLY`` under the same
1 s ``lock_timeout``); that step also runs alone
(:meth:`PostgresHistoryMaintenance.rebuild_indexes`) when the fleet's sampler sees a held
snapshot released or the indexes far past the rule (:mod:`ship_sqla.kernel._early_rebuild`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ship_sqla._jobs._history_ddl import (
    HISTORY_PARTITION_OPTIONS,
    PartitionDDL,
    class_partition,
    create_day_ddl,
    day_partition,
    default_partition,
    drop_day_ddl,
    history_retention,
)
from ship_sqla._jobs._reindex import IndexRebuild, RunsIndexRebuild
from ship_sqla._jobs._sql.history import HISTORY_EXISTS, HISTORY_PARTITIONS, LOCK_TIMEOUT_LOCAL
from ship_sqla._naming import quoted_table, text_name
from ship_sqla._scope import OWN
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla._storage_options import storage_options_sql
from ship_sqla.kernel._history_partitions import (
    LOCK_TIMEOUT,
    STATE_CLASSES,
    HistoryMaintenance,
    HistoryPlan,
    StateClass,
    class_retentions,
    parse_day_suffix,
    plan_history,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from datetime import date

    from sqlalchemy import Table
    from sqlalchemy.sql.expression import Executable

    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections
    from ship_sqla.kernel._jobs import Retention

__all__ = ["STRAYS_COUNTED", "PostgresHistoryMaintenance"]

STRAYS_COUNTED: Final = 100_000
"""Rows counted in a DEFAULT partition at most (the report says "at least" past it)."""

_LOCK_NOT_AVAILABLE: Final = "55P03"
_CHECK_VIOLATION: Final = "23514"


class PostgresHistoryMaintenance:
    """The maintenance of one history table (J17) on a store's own connections; ``now`` is the
    backend's clock (injected in tests)."""

    __slots__ = ("_connections", "_history", "_now", "_rebuild", "_s")

    def __init__(
        self,
        history: Table,
        statements: JobStatements,
        connections: StoreConnections,
        now: Callable[[], datetime],
        runs: Table | None = None,
    ) -> None:
        self._history = history
        self._s = statements
        self._connections = connections
        self._now = now
        self._rebuild = None if runs is None else RunsIndexRebuild(runs, statements, connections)

    @property
    def table(self) -> Table:
        return self._history

    def now(self) -> datetime:
        """The backend's clock's time."""
        return self._now()

    def retentions(self, jobs: Iterable[Retention]) -> dict[StateClass, timedelta]:
        """Each class's partition lifetime: the longest of the table's declared retention (the
        default :class:`Retention` when it declares none) and ``jobs``'."""
        from ship_sqla.kernel._jobs import Retention  # noqa: PLC0415 - the kernel's job model

        declared = history_retention(self._history) or Retention()
        return class_retentions([declared, *jobs])

    async def exists(self) -> bool:
        """Whether the history table exists in the database."""
        [row] = await self._connections.rows(
            "history_exists",
            self._s[HISTORY_EXISTS],
            {"history": quoted_table(self._history)},
            scope=OWN,
        )
        return bool(row[0])

    async def existing_days(self) -> dict[StateClass, set[date]]:
        """The day partitions of each class (partitions named otherwise are left alone)."""
        rows = await self._connections.rows(
            "history_partitions",
            self._s[HISTORY_PARTITIONS],
            {"history": quoted_table(self._history)},
            scope=OWN,
            by_name=True,
        )
        days: dict[StateClass, set[date]] = {cls: set() for cls in STATE_CLASSES}
        prefix = self._history.name
        for row in rows:
            for cls in STATE_CLASSES:
                if row.class_name == f"{prefix}_{cls}" and row.name.startswith(prefix):
                    day = parse_day_suffix(cls, row.name[len(prefix) :])
                    if day is not None:
                        days[cls].add(day)
        return days

    async def maintain(
        self, jobs: Iterable[Retention] = (), *, analyze: bool | None = None
    ) -> HistoryMaintenance:
        """One pass (see the module docstring). ``analyze``: None analyzes the parent when a
        partition was created or dropped; True or False always or never."""
        if not await self.exists():
            return HistoryMaintenance()
        now = self._now()
        retention = self.retentions(jobs)
        existing = await self.existing_days()
        created: list[str] = []
        dropped: list[str] = []
        deferred: list[str] = []
        ahead: list[int] = []
        for cls in STATE_CLASSES:
            plan = plan_history(cls, existing[cls], retention[cls], now)
            ok = await self._apply(plan, created, dropped, deferred)
            ahead.append(plan.ahead - (len(plan.create) - ok))
        analyzed = False
        if analyze or (analyze is None and (created or dropped)):
            analyzed = await self._ddl(
                "analyze", [text(f"ANALYZE {self._name(self._history)}")], deferred
            )
        strays = tuple([(cls, await self.default_rows(cls)) for cls in STATE_CLASSES])
        rebuild = IndexRebuild() if self._rebuild is None else await self._rebuild.run(deferred)
        return HistoryMaintenance(
            created=tuple(created),
            dropped=tuple(dropped),
            deferred=tuple(deferred),
            analyzed=analyzed,
            default_rows=strays,
            partitions_ahead=min(ahead),
            rebuilt=rebuild.rebuilt,
            leftovers_dropped=rebuild.leftovers_dropped,
            invalid=rebuild.invalid,
            rebuild_skipped=rebuild.skipped,
        )

    async def rebuild_indexes(self) -> HistoryMaintenance:
        """The pass's last step alone: the runs table's bloated indexes rebuilt (J16, J17;
        the fleet sampler's early rebuild, :mod:`ship_sqla.kernel._early_rebuild`), as the
        pass does it and only when the pass would (the history table exists)."""
        if self._rebuild is None or not await self.exists():
            return HistoryMaintenance()
        deferred: list[str] = []
        rebuild = await self._rebuild.run(deferred)
        return HistoryMaintenance(
            deferred=tuple(deferred),
            rebuilt=rebuild.rebuilt,
            leftovers_dropped=rebuild.leftovers_dropped,
            invalid=rebuild.invalid,
            rebuild_skipped=rebuild.skipped,
        )

    async def _apply(
        self, plan: HistoryPlan, created: list[str], dropped: list[str], deferred: list[str]
    ) -> int:
        """Run ``plan``'s DDL, each under the lock timeout; the count of days created."""
        made = 0
        for day in plan.create:
            name = day_partition(self._history, plan.state_class, day).name
            if await self.create_day(plan.state_class, day, deferred):
                created.append(name)
                made += 1
        for day in plan.drop:
            statement = drop_day_ddl(self._history, plan.state_class, day)
            name = day_partition(self._history, plan.state_class, day).name
            if await self._ddl(name, [statement], deferred):
                dropped.append(name)
        return made

    def day_name(self, cls: StateClass, day: date) -> str:
        """The name of ``cls``'s partition of ``day``."""
        return day_partition(self._history, cls, day).name

    async def create_day(self, cls: StateClass, day: date, deferred: list[str]) -> bool:
        """Create ``cls``'s partition of ``day`` (moving its rows out of the DEFAULT when it
        holds some) under the lock timeout; False (and deferred) when a lock was not granted."""
        name = day_partition(self._history, cls, day).name
        try:
            return await self._ddl(name, [create_day_ddl(self._history, cls, day)], deferred)
        except DBAPIError as exc:
            if sqlstate_of(exc) != _CHECK_VIOLATION:
                raise
        # The DEFAULT partition holds rows of that day: create, move them, attach.
        return await self._ddl(name, self._move_from_default(cls, day), deferred)

    def _move_from_default(self, cls: StateClass, day: date) -> Sequence[Executable]:
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + timedelta(days=1)
        low, high = f"'{start:%Y-%m-%d} 00:00:00+00'", f"'{end:%Y-%m-%d} 00:00:00+00'"
        bounds = f"FROM ({low}) TO ({high})"
        where = f"finished_at >= {low} AND finished_at < {high}"
        tables = {
            "parent": class_partition(self._history, cls),
            "part": day_partition(self._history, cls, day),
            "default": default_partition(self._history, cls),
        }
        options = storage_options_sql(HISTORY_PARTITION_OPTIONS)
        return [
            PartitionDDL(
                "CREATE TABLE {part} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH "
                + options,
                tables,
            ),
            PartitionDDL(
                f"WITH moved AS (DELETE FROM {{default}} WHERE {where} RETURNING *)"  # noqa: S608
                " INSERT INTO {part} SELECT * FROM moved",
                tables,
            ),
            PartitionDDL(
                "ALTER TABLE {parent} ATTACH PARTITION {part} FOR VALUES " + bounds, tables
            ),
        ]

    async def _ddl(self, what: str, statements: Sequence[Executable], deferred: list[str]) -> bool:
        """Run ``statements`` in one transaction under the lock timeout; False (and ``what``
        deferred) when a lock was not granted in time."""
        try:
            async with self._connections.transaction("history_maintenance", scope=OWN) as block:
                timeout = f"{int(LOCK_TIMEOUT * 1000)}ms"
                await block.connection.execute(self._s[LOCK_TIMEOUT_LOCAL], {"timeout": timeout})
                for statement in statements:
                    await block.connection.execute(statement)
        except DBAPIError as exc:
            if sqlstate_of(exc) != _LOCK_NOT_AVAILABLE:
                raise
            deferred.append(what)
            return False
        return True

    async def default_rows(self, cls: StateClass) -> int:
        """The rows in ``cls``'s DEFAULT partition, counted up to :data:`STRAYS_COUNTED`."""
        name = self._name(default_partition(self._history, cls))
        statement = text(
            f"SELECT count(*) FROM (SELECT 1 FROM {name} LIMIT {STRAYS_COUNTED}) AS strays"  # noqa: S608 - a quoted name
        )
        [row] = await self._connections.rows("history_strays", statement, None, scope=OWN)
        return int(row[0])

    def _name(self, table: Table) -> str:
        return text_name(quoted_table(table))
