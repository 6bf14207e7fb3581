"""U1, U2, U4: the one execution entry every ship store calls (``StoreConnections``): a call
given no scope joins the ambient unit of work, ``scope=OWN`` never does, and outside one the
connection layer picks the path itself (the direct asyncpg path for rows read by position,
SQLAlchemy's rows when they are read by name or someone watches the engine's statements)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg
import pytest
from sqlalchemy import Column, Integer, MetaData, Row, Table, Text, text
from statement_watch import watched

from ship_sqla import TransactionScope, create_unit_of_work
from ship_sqla._scope import OWN, StoreConnections

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
Table(
    "entry_probe",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("label", Text, nullable=False),
)

INSERT = text("INSERT INTO entry_probe (id, label) VALUES (:id, :label)")
READ = text("SELECT id, label FROM entry_probe ORDER BY id")


class BoomError(Exception):
    pass


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


async def test_u1_u2_a_call_joins_the_ambient_unit_of_work_and_own_never_does(
    engine: AsyncEngine,
) -> None:
    """U1/U2: inside a ``uow.run`` that raises, the insert given no scope rolls back with the
    run, the one given ``scope=OWN`` committed on its own; a block given the run's scope
    joins it too, and after_commit callbacks of joined calls never run (U4)."""
    connections = StoreConnections(engine, name="probe")
    uow = create_unit_of_work(engine, repositories=scope_only)
    ran: list[str] = []

    async def handler(scope: TransactionScope) -> None:
        await connections.execute("insert", INSERT, {"id": 1, "label": "ambient"}, scope=None)
        await connections.execute("insert", INSERT, {"id": 2, "label": "own"}, scope=OWN)
        async with connections.transaction("block", scope=scope) as tx:
            await tx.connection.execute(INSERT, {"id": 3, "label": "block"})
            tx.after_commit(lambda: ran.append("block"))
        await connections.after_commit(None, lambda: ran.append("ambient"))
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(handler)
    rows = await connections.rows("read", READ, scope=None)
    assert [tuple(row) for row in rows] == [(2, "own")]
    assert ran == []


async def test_the_connection_layer_picks_the_path_of_one_statement(engine: AsyncEngine) -> None:
    """Outside any unit of work, rows read by position come straight from a pooled asyncpg
    connection (its records), rows read by name as SQLAlchemy's rows, and every statement
    through SQLAlchemy while a listener watches the engine; after one autocommitted
    statement, after_commit runs at once (U4: it has committed)."""
    connections = StoreConnections(engine, name="probe")
    await connections.execute("insert", INSERT, {"id": 1, "label": "one"}, scope=None)
    [direct] = await connections.rows("read", READ, scope=OWN)
    assert isinstance(direct, asyncpg.Record)
    assert tuple(direct) == (1, "one")
    [named] = await connections.rows("read", READ, scope=None, by_name=True)
    assert isinstance(named, Row)
    assert named.label == "one"
    with watched(engine) as seen:
        [row] = await connections.rows("read", READ, scope=OWN)
        counted = await connections.count(
            "update", text("UPDATE entry_probe SET id = 2"), scope=OWN
        )
    assert isinstance(row, Row)
    assert counted == 1
    assert len(seen) == 2
    ran: list[str] = []
    await connections.after_commit(None, lambda: ran.append("now"))
    assert ran == ["now"]


async def test_own_blocks_on_a_connection_run_in_savepoints(engine: AsyncEngine) -> None:
    """The test path (a connection already in a transaction): a block of the store's own that
    raises rolls back only its SAVEPOINT; its after_commit callbacks run only when it ends
    cleanly."""
    async with engine.connect() as connection, connection.begin():
        connections = StoreConnections(connection, name="probe")
        ran: list[str] = []

        async def lost() -> None:
            async with connections.transaction("block", scope=OWN) as tx:
                await tx.connection.execute(INSERT, {"id": 1, "label": "lost"})
                tx.after_commit(lambda: ran.append("lost"))
                raise BoomError

        with pytest.raises(BoomError):
            await lost()
        async with connections.transaction("block", scope=None) as tx:
            await tx.connection.execute(INSERT, {"id": 2, "label": "kept"})
            tx.after_commit(lambda: ran.append("kept"))
        rows = await connections.rows("read", READ, scope=OWN)
        assert [tuple(row) for row in rows] == [(2, "kept")]
        assert ran == ["kept"]
