"""What the backfill tests need on either backend (C4, C5): a source of items keyed by id, a
ledger, a unit of work whose repositories record each visited item, and those records.

On PostgreSQL the effects table has NO unique constraint: "each page's effect committed once"
must come from the checkpoint committing with the page, never from the table refusing a
duplicate. ``tests/support`` is on pytest's ``pythonpath``, so tests import this by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.backfills import BackfillPage
from ship_sqla.kernel import InMemoryBackfillLedger, InMemoryJobBackend, InMemoryUnitOfWork

if TYPE_CHECKING:
    from ship_sqla.kernel import InMemoryTransaction


@attrs.frozen
class Item:
    id: int


class ListSource:
    """A :class:`~ship_sqla.kernel.BackfillSource` over ids held in memory; ``reads`` counts
    its pages."""

    def __init__(self, ids: Sequence[int]) -> None:
        self._ids = sorted(ids)
        self.reads = 0

    async def page(self, after: tuple[Any, ...] | None, limit: int) -> BackfillPage:
        self.reads += 1
        rows = [Item(i) for i in self._ids if after is None or i > after[0]][:limit]
        return BackfillPage(rows, (rows[-1].id,) if rows else None)


class _MemoryEffects:
    def __init__(self) -> None:
        self.rows: list[int] = []

    def repositories(self, tx: InMemoryTransaction) -> _MemoryRepositories:
        return _MemoryRepositories(self, tx)


class _MemoryRepositories:
    def __init__(self, effects: _MemoryEffects, tx: InMemoryTransaction) -> None:
        self._effects = effects
        self._tx = tx

    async def visit(self, item_id: int) -> None:
        rows = self._effects.rows
        rows.append(item_id)
        self._tx.on_rollback(lambda: rows.remove(item_id))


class _PostgresRepositories:
    def __init__(self, scope: Any) -> None:
        self.scope = scope

    async def visit(self, item_id: int) -> None:
        from sqlalchemy import text  # noqa: PLC0415

        await self.scope.connection.execute(
            text("INSERT INTO bf_effects (item_id) VALUES (:id)"), {"id": item_id}
        )


@attrs.define
class BackfillKit:
    """``source``, ``ledger``, ``uow`` (repositories with ``visit(id)``), ``effects()``: the ids
    visited in committed transactions, in order; ``database``: the engine (None in memory)."""

    source: Any
    ledger: Any
    uow: Any
    effects: Any
    database: Any = None


async def backfill_kit(backend: Any, clock: Any, ids: Sequence[int]) -> BackfillKit:
    inner = getattr(backend, "inner", backend)
    if isinstance(inner, InMemoryJobBackend):
        effects = _MemoryEffects()

        async def memory_effects() -> list[int]:
            return list(effects.rows)

        return BackfillKit(
            source=ListSource(ids),
            ledger=InMemoryBackfillLedger(clock),
            uow=InMemoryUnitOfWork(effects.repositories),
            effects=memory_effects,
        )
    from sqlalchemy import Column, Integer, MetaData, Table, insert, select, text  # noqa: PLC0415

    from ship_sqla import create_unit_of_work  # noqa: PLC0415
    from ship_sqla.backfills import (  # noqa: PLC0415
        create_backfill_ledger,
        selectable_source,
        ship_backfills_table,
    )

    engine = inner.database
    metadata = MetaData()
    items = Table("bf_items", metadata, Column("id", Integer, primary_key=True))
    ledger_table = ship_backfills_table(metadata)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text("CREATE TABLE bf_effects (seq bigserial, item_id integer NOT NULL)")
        )
        if ids:
            # Inserted out of key order: the pages must come in key order all the same.
            await connection.execute(insert(items), [{"id": i} for i in reversed(ids)])

    async def postgres_effects() -> list[int]:
        async with engine.connect() as connection:
            rows = await connection.execute(text("SELECT item_id FROM bf_effects ORDER BY seq"))
            return [row.item_id for row in rows]

    return BackfillKit(
        source=selectable_source(engine, select(items.c.id), key=[items.c.id]),
        ledger=create_backfill_ledger(database=engine, table=ledger_table, clock=clock),
        uow=create_unit_of_work(engine, repositories=_PostgresRepositories),
        effects=postgres_effects,
        database=engine,
    )
