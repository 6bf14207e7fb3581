"""The PostgreSQL backend's storage health (J22): :class:`PostgresStorageHealth` reads the ship
tables' statistics and the oldest held snapshot (:mod:`ship_sqla._jobs._sql.health`) into the
kernel's :class:`~ship_sqla.kernel._health.StorageHealth`. Two statements on the store's own
autocommitted connection (never a caller's unit of work: its snapshot would be the horizon)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ship_sqla._jobs._sql.health import HORIZON_OLDEST, TABLE_HEALTH
from ship_sqla._scope import OWN
from ship_sqla.kernel._health import HealthBounds, HorizonHolder, StorageHealth, TableHealth
from ship_sqla.kernel._history_partitions import STATE_CLASSES, day_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ship_sqla._jobs._maintenance import PostgresHistoryMaintenance
    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections

__all__ = ["PostgresStorageHealth"]


class PostgresStorageHealth:
    """:class:`~ship_sqla.kernel._health.StorageHealthSource` over one backend's tables:
    ``tables`` maps each role (``runs``, ``state``, ``workers``, ``steps``, ``events``) to its
    quoted, schema-qualified name; ``bounds`` are the alarms' (:class:`HealthBounds`)."""

    __slots__ = ("_bounds", "_connections", "_history", "_s", "_tables")

    def __init__(
        self,
        statements: JobStatements,
        connections: StoreConnections,
        tables: Mapping[str, str],
        bounds: HealthBounds | None = None,
        *,
        history: PostgresHistoryMaintenance | None = None,
    ) -> None:
        self._history = history
        self._s = statements
        self._connections = connections
        self._tables = dict(tables)
        self._bounds = bounds if bounds is not None else HealthBounds()

    @property
    def bounds(self) -> HealthBounds:
        return self._bounds

    async def storage_health(self) -> StorageHealth:
        params = {"roles": list(self._tables), "names": list(self._tables.values())}
        rows = await self._connections.rows(
            "storage_health", self._s[TABLE_HEALTH], params, scope=OWN, by_name=True
        )
        tables = tuple(
            TableHealth(
                table=row.role,
                name=row.name,
                live_tuples=int(row.live_tuples),
                dead_tuples=int(row.dead_tuples),
                size_bytes=int(row.size_bytes),
                vacuum_age=None if row.vacuum_age is None else max(float(row.vacuum_age), 0.0),
                largest_index_bytes=(
                    None if row.largest_index_bytes is None else int(row.largest_index_bytes)
                ),
            )
            for row in rows
        )
        [horizon] = await self._connections.rows(
            "storage_horizon", self._s[HORIZON_OLDEST], None, scope=OWN, by_name=True
        )
        holder = (
            None
            if horizon.age is None
            else HorizonHolder(
                pid=horizon.pid,
                application_name=horizon.application_name,
                age=max(float(horizon.age), 0.0),
                kind=horizon.kind,
            )
        )
        ahead, strays = await self._history_health()
        return StorageHealth(
            tables=tables,
            horizon=holder,
            horizon_scope="all" if horizon.sees_all else "own-role",
            partitions_ahead=ahead,
            history_strays=strays,
            bounds=self._bounds,
            known=True,
        )

    async def _history_health(self) -> tuple[int | None, int | None]:
        """J17, J22: the fewest day partitions ready after today over the state classes, and
        the rows the DEFAULT partitions caught (None, None: no history table, or not created
        yet)."""
        history = self._history
        if history is None:
            return None, None
        days = await history.existing_days()
        if not any(days.values()):
            return None, None
        today = day_of(history.now())
        ahead = min(sum(1 for day in found if day > today) for found in days.values())
        strays = 0
        for cls in STATE_CLASSES:
            strays += await history.default_rows(cls)
        return ahead, strays
