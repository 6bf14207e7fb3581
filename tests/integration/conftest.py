"""Fixtures the integration tests share: a real PgBouncer (tests/support/pgbouncer.py), and the
EXPLAIN tests' one seeded template database (tests/support/seeded_template.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from pgbouncer import PgBouncer, running_pgbouncer
from seeded_template import build_template, clone, drop_template, steps_of
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla.testing._databases import DatabaseFactory, new_database_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla.testing import ResolvedServer


@pytest.fixture(scope="session")
def pgbouncer(ship_server: ResolvedServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test server, for the whole session (F7);
    skipped when it is not installed, unless SHIP_SQLA_REQUIRE_PGBOUNCER is set."""
    with running_pgbouncer(ship_server) as bouncer:
        yield bouncer


SEEDED_TIMEOUT = 900
"""Seconds a test asking for the seeded template may take (pytest-timeout's default is 120): the
first such test of a session builds the template (every module's 1M-row steps, two minutes or
more on a 2-core machine), and a timeout there would error every EXPLAIN test of the session."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the seeded template get :data:`SEEDED_TIMEOUT` (any of them may build it)."""
    for item in items:
        if "seeded_template" not in getattr(item, "fixturenames", ()):
            continue
        own = item.get_closest_marker("timeout")
        if own is None or (own.args and own.args[0] < SEEDED_TIMEOUT):
            item.add_marker(pytest.mark.timeout(SEEDED_TIMEOUT), append=False)


@pytest.fixture(scope="session")
def seeded_template(
    request: pytest.FixtureRequest, ship_server: ResolvedServer
) -> Iterator[tuple[DatabaseFactory, str]]:
    """The session's one seeded template: every ``SEED`` step of the collected modules, loaded
    once, analyzed, marked a template; dropped at the end of the session."""
    modules = {item.module for item in request.session.items if isinstance(item, pytest.Function)}
    steps = steps_of(sorted(modules, key=lambda module: module.__name__))
    factory = DatabaseFactory(ship_server)
    name = new_database_name("seeded")
    try:
        asyncio.run(build_template(factory, name, steps))
        yield factory, name
    finally:
        asyncio.run(drop_template(factory, name))


@pytest.fixture(scope="module")
def seeded_database(
    request: pytest.FixtureRequest, seeded_template: tuple[DatabaseFactory, str]
) -> Iterator[tuple[URL, str]]:
    """The module's copy of the seeded template (dropped after the module), and the
    ``search_path`` of the module's ``SEED`` step(s): their schemas."""
    steps = steps_of([request.module])
    if not steps:
        raise pytest.UsageError(f"{request.module.__name__} requests seeded_engine without SEED")
    factory, template = seeded_template
    name = new_database_name("db")
    url = asyncio.run(clone(factory, name, template))
    try:
        yield url, ", ".join(f'"{step.schema}"' for step in steps)
    finally:
        asyncio.run(factory.drop(name))


@pytest.fixture
async def seeded_engine(seeded_database: tuple[URL, str]) -> AsyncIterator[AsyncEngine]:
    """An engine on the module's copy, its ``search_path`` the module's steps' schemas (the
    tables keep their names)."""
    url, search_path = seeded_database
    engine = create_async_engine(
        url,
        pool_size=5,
        max_overflow=10,
        connect_args={"server_settings": {"search_path": search_path}},
    )
    try:
        yield engine
    finally:
        await engine.dispose()
