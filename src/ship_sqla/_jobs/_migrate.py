"""Issue 39 item 8: the upgrade of an existing database to the run history (J16, J17):
``ship-sqla jobs maintain --migrate`` (:func:`migrate_finished_runs`).

An existing runs table holds every finished run it kept. The migration:

1. refuses while a foreign key references the runs table (the workflow steps' ON DELETE
   CASCADE would take a finished workflow's steps with its run): the J16 schema drops it;
2. prepares, per state class, the day partitions its retention still keeps (today back to the
   class's retention), each DDL under the 1 s ``lock_timeout`` of maintenance;
3. moves the finished runs in batches, each ONE statement
   (:data:`~ship_sqla._jobs._sql.history.MIGRATE_FINISHED_BATCH`): a batch is all or nothing,
   so an interrupted migration (a stop, a crash, ``--max-batches`` reached) resumes where it
   stopped when run again, and a run is in exactly one of the two tables in every snapshot;
   runs already past their class's retention are deleted instead;
4. once no finished run is left, drops the runs table's finished-only indexes
   (``<runs>_finished_idx``, ``<runs>_browse_idx``, ``DROP INDEX CONCURRENTLY``) when the runs
   table the backend was given no longer declares them (the J16 runs table); otherwise keeps
   them and says so.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

import attrs
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._jobs._sql.history import MIGRATE_FINISHED_BATCH, RUNS_REFERENCED_BY
from ship_sqla._naming import derived_name, quoted_identifier, quoted_table
from ship_sqla._scope import OWN
from ship_sqla.kernel._errors import ConfigurationError
from ship_sqla.kernel._history_partitions import STATE_CLASSES, StateClass, day_of

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import date

    from ship_sqla._jobs._backend import PostgresJobBackend
    from ship_sqla.kernel._jobs import Retention

__all__ = ["FINISHED_INDEX_SUFFIXES", "HistoryMigration", "migrate_finished_runs"]

FINISHED_INDEX_SUFFIXES: Final = ("_finished_idx", "_browse_idx")
"""The runs table's indexes over finished runs only, dropped once history holds them."""


@attrs.frozen
class HistoryMigration:
    """What one ``--migrate`` run did: runs ``moved`` into history, ``deleted`` (past
    retention), in ``batches``; ``complete`` when no finished run is left in the runs table
    (else run it again: it resumes); the day partitions ``prepared`` and those ``deferred``
    (a lock not granted within 1 s); the finished-only indexes ``dropped`` and ``kept``."""

    moved: int = 0
    deleted: int = 0
    batches: int = 0
    complete: bool = False
    prepared: tuple[str, ...] = ()
    deferred: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return attrs.asdict(self)


async def refuse_references(backend: PostgresJobBackend) -> None:
    rows = await backend.store_connections.rows(
        "history_migration_references",
        backend.statements[RUNS_REFERENCED_BY],
        {"runs": quoted_table(backend.table)},
        scope=OWN,
    )
    if rows:
        names = ", ".join(f"{row[0]} on {row[1]}" for row in rows)
        raise ConfigurationError(
            f"the runs table {quoted_table(backend.table)} is referenced by foreign keys"
            f" ({names}): moving a finished run would delete what references it (a finished"
            " workflow's steps, ON DELETE CASCADE).",
            fix="drop the constraint (ALTER TABLE <steps> DROP CONSTRAINT <steps>_run_fkey;"
            " ship_job_steps_table declares none beside a history table), then start again.",
        )


async def _prepare(
    backend: PostgresJobBackend, retention: Mapping[StateClass, timedelta], deferred: list[str]
) -> list[str]:
    """The day partitions each class's retention still keeps, created when missing."""
    maintenance = backend.history_maintenance
    assert maintenance is not None  # noqa: S101 - checked by the caller
    existing = await maintenance.existing_days()
    today = day_of(maintenance.now())
    prepared: list[str] = []
    for cls in STATE_CLASSES:
        first = day_of(maintenance.now() - retention[cls])
        days: list[date] = [first + timedelta(days=i) for i in range((today - first).days + 1)]
        for day in days:
            if day in existing[cls]:
                continue
            if await maintenance.create_day(cls, day, deferred):
                prepared.append(maintenance.day_name(cls, day))
    return prepared


async def _drop_indexes(backend: PostgresJobBackend) -> tuple[list[str], list[str]]:
    """Drop the finished-only indexes the backend's runs table no longer declares."""
    declared = {str(index.name) for index in backend.table.indexes}
    dropped: list[str] = []
    kept: list[str] = []
    schema = backend.table.schema
    for suffix in FINISHED_INDEX_SUFFIXES:
        name = str(derived_name(backend.table.name, suffix))
        if name in declared:
            kept.append(name)
            continue
        qualified = quoted_identifier(name)
        if schema is not None:
            qualified = f"{quoted_identifier(schema)}.{qualified}"
        database = backend.database
        if isinstance(database, AsyncEngine):
            async with database.connect() as connection:
                auto = await connection.execution_options(isolation_level="AUTOCOMMIT")
                await auto.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {qualified}"))
        else:
            await database.execute(text(f"DROP INDEX IF EXISTS {qualified}"))
        dropped.append(name)
    return dropped, kept


async def migrate_finished_runs(
    backend: PostgresJobBackend,
    retentions: Sequence[Retention] = (),
    *,
    batch_size: int = 1000,
    max_batches: int | None = None,
) -> HistoryMigration:
    """Move the finished runs of ``backend``'s runs table into its history (see the module
    docstring); at most ``max_batches`` batches of ``batch_size`` (None: until done)."""
    maintenance = backend.history_maintenance
    if maintenance is None or not await maintenance.exists():
        raise ConfigurationError(
            "the run history table does not exist: there is nowhere to move finished runs.",
            fix="create it first (`ship-sqla schema apply`, or ship_job_history_table in your"
            " migrations), then run `ship-sqla jobs maintain --migrate`.",
        )
    await refuse_references(backend)
    retention = maintenance.retentions(retentions)
    deferred: list[str] = []
    prepared = await _prepare(backend, retention, deferred)
    now = maintenance.now()
    params = {
        "batch": batch_size,
        "completed_after": now - retention["completed"],
        "dead_after": now - retention["dead"],
        "ended_after": now - retention["ended"],
    }
    moved = deleted = batches = 0
    complete = False
    while max_batches is None or batches < max_batches:
        [row] = await backend.store_connections.rows(
            "history_migration",
            backend.statements[MIGRATE_FINISHED_BATCH],
            params,
            scope=OWN,
            by_name=True,
        )
        batches += 1
        moved += int(row.kept)
        deleted += int(row.taken) - int(row.kept)
        if int(row.taken) < batch_size:
            complete = True
            break
    dropped, kept = await _drop_indexes(backend) if complete else ([], [])
    return HistoryMigration(
        moved,
        deleted,
        batches,
        complete,
        tuple(prepared),
        tuple(deferred),
        tuple(dropped),
        tuple(kept),
    )
