"""What a transactional handler's tests need on either backend (J13): a unit of work on the
backend's storage whose repositories write "effect" rows, the rows written, and an inbox store.

On PostgreSQL the effects table has NO unique constraint: exactly-once must come from the fence,
the inbox and the completion committing together, never from the table refusing a duplicate.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this module
by its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel import InMemoryInbox, InMemoryJobBackend, InMemoryUnitOfWork

if TYPE_CHECKING:
    from ship_sqla.kernel import InMemoryTransaction


@attrs.define
class Kit:
    """The unit of work (``uow``), the inbox store (``inbox``) and ``effects()``: the effect
    rows committed, in order."""

    uow: Any
    inbox: Any
    effects: Any
    outbox: Any = None
    outbox_messages: Any = None


class MemoryEffects:
    """The in-memory effects "table": rows added in a transaction are undone if it rolls back."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def repositories(self, tx: InMemoryTransaction) -> MemoryRepositories:
        return MemoryRepositories(self, tx)


class MemoryRepositories:
    def __init__(self, effects: MemoryEffects, tx: InMemoryTransaction) -> None:
        self._effects = effects
        self._tx = tx

    async def add_effect(self, key: str) -> None:
        rows = self._effects.rows
        rows.append(key)

        def undo() -> None:
            rows.reverse()
            rows.remove(key)
            rows.reverse()

        self._tx.on_rollback(undo)


class PostgresRepositories:
    def __init__(self, scope: Any) -> None:
        self.scope = scope

    async def add_effect(self, key: str) -> None:
        from sqlalchemy import text  # noqa: PLC0415 - the in-memory tests import this module

        await self.scope.connection.execute(
            text("INSERT INTO j13_effects (key) VALUES (:key)"), {"key": key}
        )


async def kit_for(backend: Any, clock: Any) -> Kit:
    """The kit on ``backend``'s storage (an in-memory backend, or the PostgreSQL one's
    database)."""
    inner = getattr(backend, "inner", backend)
    if isinstance(inner, InMemoryJobBackend):
        effects = MemoryEffects()
        return Kit(
            uow=InMemoryUnitOfWork(effects.repositories),
            inbox=InMemoryInbox(clock=clock),
            effects=lambda: _now(list(effects.rows)),
        )
    from sqlalchemy import MetaData, text  # noqa: PLC0415

    from ship_sqla import (  # noqa: PLC0415
        create_idempotency_store,
        create_unit_of_work,
        ship_idempotency_table,
    )

    engine = inner.database
    metadata = MetaData()
    table = ship_idempotency_table(metadata)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text("CREATE TABLE IF NOT EXISTS j13_effects (seq bigserial, key text NOT NULL)")
        )

    async def effects() -> list[str]:
        async with engine.connect() as connection:
            rows = await connection.execute(text("SELECT key FROM j13_effects ORDER BY seq"))
            return [row.key for row in rows]

    return Kit(
        uow=create_unit_of_work(engine, repositories=PostgresRepositories),
        inbox=create_idempotency_store(database=engine, table=table, clock=clock),
        effects=effects,
    )


async def _now(value: Any) -> Any:
    return value
