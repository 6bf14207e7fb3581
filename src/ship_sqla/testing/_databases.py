"""Test databases: one template per test session, cheap clones of it per test.

The template holds the schema (``ship_metadata``'s tables); a private database is
``CREATE DATABASE ... TEMPLATE``, which copies files instead of replaying DDL. Every database this
module creates is named ``ship_sqla_test_*`` and dropped when its owner is done.
"""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._notify import announcements_sent
from ship_sqla._server import ResolvedServer, asyncpg_dsn

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy import MetaData
    from sqlalchemy.engine import URL

__all__ = ["DatabaseFactory", "new_database_name"]

PREFIX = "ship_sqla_test_"


def new_database_name(kind: str) -> str:
    return f"{PREFIX}{kind}_{secrets.token_hex(6)}"


def _quote(name: str) -> str:
    if not name.replace("_", "").isalnum():
        msg = f"refusing to quote database name {name!r}"
        raise ValueError(msg)
    return f'"{name}"'


class DatabaseFactory:
    """Creates and drops test databases on one server (async; one event loop per call site)."""

    def __init__(self, server: ResolvedServer) -> None:
        self.server = server

    async def _admin(self) -> asyncpg.Connection:
        return await asyncpg.connect(**asyncpg_dsn(self.server.url), timeout=30)

    async def create(self, name: str, *, template: str | None = None) -> URL:
        admin = await self._admin()
        try:
            clause = f" TEMPLATE {_quote(template)}" if template else ""
            await admin.execute(f"CREATE DATABASE {_quote(name)}{clause}")
        finally:
            await admin.close()
        return self.server.database_url(name)

    async def drop(self, name: str) -> None:
        # Announcements the test's backends still send (K8: after their enqueues committed)
        # would find the database gone and report it: let them go out first.
        await announcements_sent()
        admin = await self._admin()
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
        finally:
            await admin.close()

    async def create_template(self, name: str, metadata: MetaData) -> URL:
        url = await self.create(name)
        engine = create_async_engine(url, poolclass=NullPool)
        try:
            async with engine.begin() as connection:
                await connection.run_sync(metadata.create_all)
        finally:
            await engine.dispose()
        return url

    @asynccontextmanager
    async def private(
        self, template: str | None = None, *, name: str | None = None
    ) -> AsyncIterator[tuple[URL, AsyncEngine]]:
        """A database (empty, or cloned from ``template``) with an engine; both gone on exit.

        ``name`` picks a fixed name (a leftover of that name from an interrupted run is dropped
        first); by default it is a fresh ``ship_sqla_test_db_*``.
        """
        if name is None:
            name = new_database_name("db")
        else:
            await self.drop(name)
        url = await self.create(name, template=template)
        engine = create_async_engine(url, pool_size=5, max_overflow=10)
        try:
            yield url, engine
        finally:
            await engine.dispose()
            await self.drop(name)
