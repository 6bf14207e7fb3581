"""The PostgreSQL :class:`~ship_sqla.kernel.BackfillLedger` (C4), on one ledger table."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Table

from ship_sqla._backfills._sql import (
    BEGIN_BACKFILL,
    CANCEL_BACKFILL_IF_LIVE,
    CHECKPOINT_IF_HOLDER_CURRENT,
    FINISH_IF_HOLDER_CURRENT,
    GET_BACKFILL,
    LIST_BACKFILLS,
    REQUEST_BACKFILL,
)
from ship_sqla._backfills._tables import ship_backfills_table
from ship_sqla._naming import quoted_table
from ship_sqla._schema_probe import Needed, require_tables
from ship_sqla._scope import OWN, StoreConnections
from ship_sqla._sql import Statements
from ship_sqla._sql_time import now_bound
from ship_sqla.kernel._backfills import BackfillRecord, encode_key
from ship_sqla.kernel._clock import SystemClock
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ship_sqla._scope import Database
    from ship_sqla.kernel._clock import Clock

__all__ = ["PostgresBackfillLedger", "create_backfill_ledger"]


def _record(row: Any) -> BackfillRecord:  # noqa: ANN401 - a SQLAlchemy row
    key = row.last_key
    if isinstance(key, str):
        key = json.loads(key)
    return BackfillRecord(
        id=row.id,
        state=row.state,
        pages=row.pages,
        rows=row._mapping["rows"],  # noqa: SLF001 - Row.rows would not be the column
        last_key=None if key is None else tuple(key),
        pace=row.pace,
        stall_after=row.stall_after,
        required_by=row.required_by,
        run_id=row.run_id,
        token=row.token,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        updated_at=row.updated_at,
        error=row.error,
    )


def _one(rows: Sequence[Any]) -> BackfillRecord | None:
    return _record(rows[0]) if rows else None


class PostgresBackfillLedger:
    """A :class:`~ship_sqla.kernel.BackfillLedger` on one ledger table. Build with
    :func:`create_backfill_ledger`."""

    __slots__ = ("_clock", "_connections", "_s", "_tables_seen", "table")

    def __init__(self, *, database: Database, table: Table, clock: Clock) -> None:
        self.table = table
        self._tables_seen = False
        self._clock = clock
        self._connections = StoreConnections(database, name="backfill ledger")
        self._s = Statements({"{backfills}": quoted_table(table)})

    @property
    def clock(self) -> Clock:
        return self._clock

    async def require_tables(self, surface: str) -> None:
        """Return once the ledger table has been seen to exist (one probe, asked until it
        answers); else raise :class:`~ship_sqla.errors.MissingTablesError` naming it,
        ``surface`` and the ``ship-sqla schema apply --only backfills`` command."""
        if not self._tables_seen:
            self._tables_seen = await require_tables(
                self._connections, [Needed.table(self.table, "backfills")], surface=surface
            )

    async def _rows(self, what: str, template: Any, params: dict[str, Any], scope: Any) -> Any:  # noqa: ANN401
        params = {"now": now_bound(self._clock), **params}
        return await self._connections.rows(
            what, self._s[template], params, scope=scope, by_name=True
        )

    async def request(
        self,
        backfill_id: str,
        *,
        pace: float | None = None,
        stall_after: float | None = None,
        required_by: str | None = None,
    ) -> BackfillRecord:
        params = {
            "id": backfill_id,
            "pace": pace,
            "stall_after": stall_after,
            "required_by": required_by,
        }
        record = _one(await self._rows("request", REQUEST_BACKFILL, params, None))
        assert record is not None  # noqa: S101 - an upsert returns its row
        return record

    async def begin(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        pace: float,
        stall_after: float,
        required_by: str | None,
    ) -> BackfillRecord | None:
        params = {
            "id": backfill_id,
            "run_id": run_id,
            "token": token,
            "pace": pace,
            "stall_after": stall_after,
            "required_by": required_by,
        }
        return _one(await self._rows("begin", BEGIN_BACKFILL, params, OWN))

    async def checkpoint(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        pages_before: int,
        last_key: tuple[Any, ...],
        rows: int,
    ) -> BackfillRecord | None:
        params = {
            "id": backfill_id,
            "run_id": run_id,
            "token": token,
            "pages_before": pages_before,
            "last_key": encode_key(last_key, f"backfill {backfill_id!r}"),
            "rows": rows,
        }
        # None: joins the page's unit of work when there is one (C4: they commit together).
        return _one(await self._rows("checkpoint", CHECKPOINT_IF_HOLDER_CURRENT, params, None))

    async def finish(
        self,
        backfill_id: str,
        *,
        run_id: str,
        token: int,
        state: Literal["completed", "failed"],
        error: str | None = None,
    ) -> bool:
        params = {
            "now": now_bound(self._clock),
            "id": backfill_id,
            "run_id": run_id,
            "token": token,
            "state": state,
            "error": error,
        }
        changed = await self._connections.count(
            "finish", self._s[FINISH_IF_HOLDER_CURRENT], params, scope=OWN
        )
        return changed == 1

    async def cancel(self, backfill_id: str) -> BackfillRecord | None:
        params = {"id": backfill_id}
        record = _one(await self._rows("cancel", CANCEL_BACKFILL_IF_LIVE, params, None))
        return record if record is not None else await self.get(backfill_id)

    async def get(self, backfill_id: str) -> BackfillRecord | None:
        return _one(await self._rows("get", GET_BACKFILL, {"id": backfill_id}, None))

    async def list_backfills(self, *, limit: int) -> list[BackfillRecord]:
        return [
            _record(row) for row in await self._rows("list", LIST_BACKFILLS, {"limit": limit}, None)
        ]


def create_backfill_ledger(
    *, database: Database, table: Table | None = None, clock: Clock | None = None
) -> PostgresBackfillLedger:
    """The backfill ledger on ``table`` (default ``ship_backfills_table`` named ship_backfills),
    for :func:`~ship_sqla.backfills.define_backfill` and
    :func:`~ship_sqla.backfills.create_backfill_operations`. ``database``: an ``AsyncEngine``,
    or an ``AsyncConnection`` in a transaction (tests). ``clock``: what its times and the
    pacer's waits read (give the runtime's; a FrozenClock in tests)."""
    if table is None:
        from sqlalchemy import MetaData  # noqa: PLC0415 - only for the default table

        table = ship_backfills_table(MetaData())
    given: object = table
    if not isinstance(given, Table) or not {"last_key", "pages", "stall_after"} <= set(
        table.c.keys()
    ):
        raise ConfigurationError(
            f"table must be a backfill ledger table, got {table!r}.",
            fix="pass ship_backfills_table(metadata, name=...).",
        )
    return PostgresBackfillLedger(database=database, table=table, clock=clock or SystemClock())
