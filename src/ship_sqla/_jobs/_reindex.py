"""J16, J17: the runs table's index rebuild, one step of the maintenance pass
(:class:`~ship_sqla._jobs._maintenance.PostgresHistoryMaintenance`).

J16 keeps only live runs in the runs table, so its heap shrinks back with each vacuum; its
btree indexes do not: a page is reused only once wholly empty and recycled, and the primary
key's ids only grow (issue 39: +5.5 MiB over 2M runs with an empty queue; ~96 MiB of indexes
beside a 5.3 MiB heap after a held snapshot). As River and Oban reindex daily, the pass
rebuilds each index that :func:`~ship_sqla.kernel._history_partitions.index_needs_rebuild`
calls bloated, with ``REINDEX INDEX CONCURRENTLY``:

- outside any transaction (it cannot run in one), on a connection of the store's own whose
  session ``lock_timeout`` is :data:`~ship_sqla.kernel._history_partitions.LOCK_TIMEOUT` (1 s)
  for the rebuild and reset after; one not granted in time is deferred to the next pass;
- it never makes a settle wait: every lock it takes on the table and its indexes is SHARE
  UPDATE EXCLUSIVE (the old index too is dropped under it), which a settle's ROW EXCLUSIVE does
  not conflict with; it waits for the settles already running, never the reverse;
- not while another session of this database holds a snapshot older than the lock timeout:
  the rebuild would wait for that snapshot's end, give up, and leave its INVALID copy behind;
  the pass reports the skip and the next one tries again;
- an INVALID index an interrupted rebuild left (``<name>_ccnew``, ``<name>_ccold``) is dropped
  (``DROP INDEX CONCURRENTLY``, same timeout: PostgreSQL's documented recovery) and nothing is
  rebuilt in that pass; an INVALID index of any other name is the operator's, reported only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ship_sqla._jobs._sql.history import (
    RUNS_INDEXES,
    SESSION_LOCK_TIMEOUT,
    SESSION_LOCK_TIMEOUT_RESET,
)
from ship_sqla._naming import quoted_table, text_name
from ship_sqla._scope import OWN
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._history_partitions import (
    LOCK_TIMEOUT,
    index_needs_rebuild,
    is_rebuild_leftover,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy import Table
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ship_sqla._jobs._sql import JobStatements
    from ship_sqla._scope import StoreConnections

__all__ = ["IndexRebuild", "RunsIndexRebuild"]

_LOCK_NOT_AVAILABLE: Final = "55P03"

SKIPPED_SNAPSHOT: Final = (
    "a snapshot held for {age:.0f} s by another session (the rebuild would wait for it)"
)
SKIPPED_LEFTOVERS: Final = (
    "an INVALID copy left by an interrupted rebuild (or one still running elsewhere) was found:"
    " dropped first (or deferred), the rebuild is left to the next pass"
)
SKIPPED_NO_ENGINE: Final = "the backend runs on one connection (REINDEX CONCURRENTLY needs a pool)"


@attrs.frozen
class IndexRebuild:
    """What the rebuild step did (see :class:`~ship_sqla.kernel.HistoryMaintenance`)."""

    rebuilt: tuple[str, ...] = ()
    leftovers_dropped: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    skipped: str | None = None


class RunsIndexRebuild:
    """The rebuild of one runs table's bloated indexes (see the module docstring)."""

    __slots__ = ("_connections", "_runs", "_s")

    def __init__(
        self, runs: Table, statements: JobStatements, connections: StoreConnections
    ) -> None:
        self._runs = runs
        self._s = statements
        self._connections = connections

    async def indexes(self) -> Sequence[Any]:
        """The runs table's indexes as :data:`RUNS_INDEXES` reads them."""
        return await self._connections.rows(
            "runs_indexes",
            self._s[RUNS_INDEXES],
            {"runs": quoted_table(self._runs)},
            scope=OWN,
            by_name=True,
        )

    async def run(self, deferred: list[str]) -> IndexRebuild:
        """One rebuild step; a statement whose lock was not granted in time is appended to
        ``deferred`` (the pass is then retried sooner)."""
        rows = await self.indexes()
        leftovers = [r for r in rows if not r.valid and is_rebuild_leftover(r.name)]
        invalid = tuple(r.name for r in rows if not r.valid and not is_rebuild_leftover(r.name))
        bloated = [
            r
            for r in rows
            if r.valid and index_needs_rebuild(int(r.size_bytes), int(r.live_entries))
        ]
        if not leftovers and not bloated:
            return IndexRebuild(invalid=invalid)
        age = rows[0].snapshot_age
        if age is not None and float(age) > LOCK_TIMEOUT:
            return IndexRebuild(invalid=invalid, skipped=SKIPPED_SNAPSHOT.format(age=float(age)))
        done: list[str] = []
        dropped: list[str] = []
        async with self._connections.outside_transaction("runs_index_rebuild") as connection:
            if connection is None:
                return IndexRebuild(invalid=invalid, skipped=SKIPPED_NO_ENGINE)
            timeout = f"{int(LOCK_TIMEOUT * 1000)}ms"
            await connection.execute(self._s[SESSION_LOCK_TIMEOUT], {"timeout": timeout})
            try:
                for row in leftovers:
                    statement = f"DROP INDEX CONCURRENTLY IF EXISTS {row.qualified}"
                    if await self._concurrently(
                        connection, statement, f"drop {row.name}", deferred
                    ):
                        dropped.append(row.name)
                for row in [] if leftovers else bloated:
                    statement = f"REINDEX INDEX CONCURRENTLY {row.qualified}"
                    if await self._concurrently(
                        connection, statement, f"rebuild {row.name}", deferred
                    ):
                        done.append(row.name)
            finally:
                await connection.execute(self._s[SESSION_LOCK_TIMEOUT_RESET])
        return IndexRebuild(
            rebuilt=tuple(done),
            leftovers_dropped=tuple(dropped),
            invalid=invalid,
            skipped=SKIPPED_LEFTOVERS if leftovers else None,
        )

    @staticmethod
    async def _concurrently(
        connection: AsyncConnection, statement: str, what: str, deferred: list[str]
    ) -> bool:
        """Run ``statement`` (a name the server quoted) on its own; False (and ``what``
        deferred) when a lock or an older snapshot was not waited out within the lock timeout."""
        try:
            await connection.execute(text(text_name(statement)))
        except DBAPIError as exc:
            await connection.rollback()
            if sqlstate_of(exc) != _LOCK_NOT_AVAILABLE:
                raise
            deferred.append(what)
            return False
        return True
