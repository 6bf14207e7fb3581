"""The ship_sqla pytest plugin (auto-loaded through the ``pytest11`` entry point).

Fixtures:

- ``ship_server`` (session): the PostgreSQL server tests use — ``SHIP_SQLA_DATABASE_URL``,
  else 127.0.0.1:5432 if it answers, else an embedded server (``embedded`` extra), else a
  clear error (a generic ``DATABASE_URL`` is never read).
- ``ship_metadata`` (session): the ``MetaData`` whose tables every test database starts with.
  Override it in your ``conftest.py`` to return your application's metadata.
- ``ship_connection``: an ``AsyncConnection`` in a transaction that is rolled back after the test.
  Cheap; use it for anything that needs neither commits nor several connections.
- ``ship_engine`` / ``ship_engine_url``: an ``AsyncEngine`` (and its URL) on a private database
  cloned from the template and dropped after the test: for commits, locks, LISTEN, several
  connections and subprocesses.
- ``ship_clock``: a :class:`~ship_sqla.testing.FrozenClock` that moves only when the test says.

Async fixtures are plain async functions: run tests with anyio's plugin (mark ``anyio``, with an
``anyio_backend`` of ``"asyncio"``) or pytest-asyncio in auto mode.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._server import ResolvedServer, resolve_server, stop_embedded
from ship_sqla.kernel._clock import FrozenClock
from ship_sqla.testing._databases import DatabaseFactory, new_database_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from sqlalchemy.engine import URL


@pytest.fixture(scope="session")
def ship_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResolvedServer]:
    server = resolve_server(
        embedded_dir=Path(tmp_path_factory.mktemp("ship_sqla_pg")), embedded_cleanup="delete"
    )
    try:
        yield server
    finally:
        stop_embedded(server)


@pytest.fixture(scope="session")
def ship_metadata() -> MetaData:
    """Override to return the metadata whose tables every test database starts with."""
    return MetaData()


@pytest.fixture(scope="session")
def _ship_databases(
    ship_server: ResolvedServer, ship_metadata: MetaData
) -> Iterator[tuple[DatabaseFactory, str, URL]]:
    """The session's template database, and one shared clone for rolled-back tests."""
    factory = DatabaseFactory(ship_server)
    template = new_database_name("tpl")
    shared = new_database_name("shared")
    asyncio.run(factory.create_template(template, ship_metadata))
    try:
        shared_url = asyncio.run(factory.create(shared, template=template))
        try:
            yield factory, template, shared_url
        finally:
            asyncio.run(factory.drop(shared))
    finally:
        asyncio.run(factory.drop(template))


@pytest.fixture
async def ship_connection(
    _ship_databases: tuple[DatabaseFactory, str, URL],
) -> AsyncIterator[AsyncConnection]:
    _, _, url = _ship_databases
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            transaction = await connection.begin()
            try:
                yield connection
            finally:
                if transaction.is_active:
                    await transaction.rollback()
    finally:
        await engine.dispose()


@pytest.fixture
async def _ship_private(
    _ship_databases: tuple[DatabaseFactory, str, URL],
) -> AsyncIterator[tuple[URL, AsyncEngine]]:
    factory, template, _ = _ship_databases
    async with factory.private(template) as private:
        yield private


@pytest.fixture
def ship_engine(_ship_private: tuple[URL, AsyncEngine]) -> AsyncEngine:
    return _ship_private[1]


@pytest.fixture
def ship_engine_url(_ship_private: tuple[URL, AsyncEngine]) -> str:
    return _ship_private[0].render_as_string(hide_password=False)


@pytest.fixture
def ship_clock() -> FrozenClock:
    return FrozenClock()
