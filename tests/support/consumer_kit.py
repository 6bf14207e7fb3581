"""What a consumer's tests need on either backend (C1-C3): a table-like stream per key (items
``(id, body)`` in id order; the cursor is the last id handled), the cursor seam over a cursors
"table", a unit of work whose repositories write "effect" rows and cursors, and reads of what
committed.

In memory the stream is a list and the tables are lists/dicts whose writes a rolled-back
transaction undoes; on PostgreSQL they are tables (``c_stream``, ``c_effects`` with NO unique
constraint, ``c_cursors``) in the backend's database, written through ``create_unit_of_work``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ship_sqla.kernel import InMemoryJobBackend, InMemoryUnitOfWork

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from ship_sqla.kernel import InMemoryTransaction


@attrs.define
class ConsumerKit:
    """``uow``; ``cursors`` (the seam); ``append(key, *bodies)`` adds items to a key's stream;
    ``read(key, after)`` yields a key's items after a cursor; ``effects()`` the effect rows
    committed, in order; ``cursor_of(key)`` the committed cursor."""

    uow: Any
    cursors: Any
    append: Callable[..., Any]
    read: Callable[[str, int | None], AsyncIterator[tuple[int, str]]]
    effects: Callable[[], Any]
    cursor_of: Callable[[str], Any]


class MemoryTables:
    def __init__(self) -> None:
        self.stream: dict[str, list[tuple[int, str]]] = {}
        self.effects: list[str] = []
        self.cursors: dict[str, int] = {}
        self.next_id = 0


class MemoryRepositories:
    def __init__(self, tables: MemoryTables, tx: InMemoryTransaction) -> None:
        self._tables = tables
        self._tx = tx

    async def add_effect(self, body: str) -> None:
        rows = self._tables.effects
        rows.append(body)

        def undo() -> None:
            rows.reverse()
            rows.remove(body)
            rows.reverse()

        self._tx.on_rollback(undo)

    async def load_cursor(self, key: str) -> int | None:
        return self._tables.cursors.get(key)

    async def save_cursor(self, key: str, position: int) -> None:
        cursors = self._tables.cursors
        had = key in cursors
        before = cursors.get(key)
        cursors[key] = position

        def undo() -> None:
            if had:
                cursors[key] = before  # type: ignore[assignment]
            else:
                del cursors[key]

        self._tx.on_rollback(undo)


class PostgresRepositories:
    def __init__(self, scope: Any) -> None:
        self.scope = scope

    async def add_effect(self, body: str) -> None:
        from sqlalchemy import text  # noqa: PLC0415 - the in-memory tests import this module

        await self.scope.connection.execute(
            text("INSERT INTO c_effects (body) VALUES (:body)"), {"body": body}
        )

    async def load_cursor(self, key: str) -> int | None:
        from sqlalchemy import text  # noqa: PLC0415

        row = (
            await self.scope.connection.execute(
                text("SELECT position FROM c_cursors WHERE key = :key"), {"key": key}
            )
        ).first()
        return None if row is None else int(row.position)

    async def save_cursor(self, key: str, position: int) -> None:
        from sqlalchemy import text  # noqa: PLC0415

        await self.scope.connection.execute(
            text(
                "INSERT INTO c_cursors (key, position) VALUES (:key, :position)"
                " ON CONFLICT (key) DO UPDATE SET position = excluded.position"
            ),
            {"key": key, "position": position},
        )


class Cursors:
    """The cursor seam (ConsumerCursor) over the repositories' cursor table."""

    async def load(self, key: str, repositories: Any) -> int | None:
        return await repositories.load_cursor(key)  # type: ignore[no-any-return]

    async def save(self, key: str, cursor: int, repositories: Any) -> None:
        await repositories.save_cursor(key, cursor)


async def consumer_kit_for(backend: Any) -> ConsumerKit:
    """The kit on ``backend``'s storage (in memory, or the PostgreSQL backend's database)."""
    inner = getattr(backend, "inner", backend)
    if isinstance(inner, InMemoryJobBackend):
        return _memory_kit()
    return await _postgres_kit(inner.database)


def _memory_kit() -> ConsumerKit:
    tables = MemoryTables()

    def append(key: str, *bodies: str) -> None:
        for body in bodies:
            tables.next_id += 1
            tables.stream.setdefault(key, []).append((tables.next_id, body))

    async def read(key: str, after: int | None) -> AsyncIterator[tuple[int, str]]:
        for item in list(tables.stream.get(key, ())):
            if after is None or item[0] > after:
                yield item

    async def append_async(key: str, *bodies: str) -> None:
        append(key, *bodies)

    return ConsumerKit(
        uow=InMemoryUnitOfWork(lambda tx: MemoryRepositories(tables, tx)),
        cursors=Cursors(),
        append=append_async,
        read=read,
        effects=lambda: _now(list(tables.effects)),
        cursor_of=lambda key: _now(tables.cursors.get(key)),
    )


async def _postgres_kit(engine: Any) -> ConsumerKit:
    from sqlalchemy import text  # noqa: PLC0415

    from ship_sqla import create_unit_of_work  # noqa: PLC0415

    async with engine.begin() as connection:
        await connection.execute(
            text(
                "CREATE TABLE IF NOT EXISTS c_stream"
                " (id bigserial PRIMARY KEY, key text NOT NULL, body text NOT NULL)"
            )
        )
        await connection.execute(
            text("CREATE TABLE IF NOT EXISTS c_effects (seq bigserial, body text NOT NULL)")
        )
        await connection.execute(
            text(
                "CREATE TABLE IF NOT EXISTS c_cursors"
                " (key text PRIMARY KEY, position bigint NOT NULL)"
            )
        )

    async def append(key: str, *bodies: str) -> None:
        async with engine.begin() as connection:
            for body in bodies:
                await connection.execute(
                    text("INSERT INTO c_stream (key, body) VALUES (:key, :body)"),
                    {"key": key, "body": body},
                )

    async def read(key: str, after: int | None) -> AsyncIterator[tuple[int, str]]:
        # One page at a time, each read in its own short transaction: the stream holds no
        # snapshot open between batches.
        position = 0 if after is None else after
        while True:
            async with engine.connect() as connection:
                rows = (
                    await connection.execute(
                        text(
                            "SELECT id, body FROM c_stream WHERE key = :key AND id > :after"
                            " ORDER BY id LIMIT 50"
                        ),
                        {"key": key, "after": position},
                    )
                ).all()
            if not rows:
                return
            for row in rows:
                position = int(row.id)
                yield (position, row.body)

    async def effects() -> list[str]:
        async with engine.connect() as connection:
            rows = await connection.execute(text("SELECT body FROM c_effects ORDER BY seq"))
            return [row.body for row in rows]

    async def cursor_of(key: str) -> int | None:
        async with engine.connect() as connection:
            row = (
                await connection.execute(
                    text("SELECT position FROM c_cursors WHERE key = :key"), {"key": key}
                )
            ).first()
            return None if row is None else int(row.position)

    return ConsumerKit(
        uow=create_unit_of_work(engine, repositories=PostgresRepositories),
        cursors=Cursors(),
        append=append,
        read=read,
        effects=effects,
        cursor_of=cursor_of,
    )


async def _now(value: Any) -> Any:
    return value
