"""One seeded template database for the EXPLAIN tests (the rule: "EXPLAIN tests share one seeded
template database"); how to add a seed step: docs/dev/testing.md.

A test module declares its data as a :class:`SeedStep` in a module attribute ``SEED`` (its
tables, as a ``MetaData``, and the server-side ``INSERT ... SELECT ... generate_series``
statements that fill them) and requests the ``seeded_engine`` fixture
(tests/integration/conftest.py). Once per session, :func:`build_template` creates ONE database
holding every step the session collected, each in its own schema (``seed_<name>``, so every
step keeps its table and index names, ``ship_job_runs_due_idx`` and all), loads them, runs one
``VACUUM (ANALYZE)`` and marks it a template. Each module then gets a copy of it
(``CREATE DATABASE ... TEMPLATE``: a file copy, no replayed load) whose engine's
``search_path`` is its step's schema; the copy is dropped after the module, the template at the
end of the session. Nothing is cached across sessions: a run never reads what an earlier one
left (the template's name is fresh each session; one an interrupted session left behind is
recognisable by its prefix, ``ship_sqla_test_seeded_``, and is a template: unmark it
(``ALTER DATABASE ... IS_TEMPLATE false``) before dropping it).

The suite does not run under pytest-xdist (it is not installed): one session builds one
template. If it ever does, the build needs an advisory lock and a fixed name keyed by a hash of
the steps (:func:`steps_digest` gives one).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex

from ship_sqla._server import ResolvedServer, asyncpg_dsn
from ship_sqla.testing._databases import DatabaseFactory

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sqlalchemy import MetaData
    from sqlalchemy.engine import URL

__all__ = [
    "BUILD_CONNECTIONS",
    "CLONE_STRATEGY",
    "SeedStep",
    "build_template",
    "clone",
    "drop_template",
    "steps_digest",
    "steps_of",
]

BUILD_CONNECTIONS = 2
"""Steps loaded at once (each on its own connection, in its own schema): a load is one backend's
work, and CI machines have two cores or more."""

CLONE_STRATEGY = "FILE_COPY"
"""PostgreSQL 15's default (WAL_LOG) writes every block of the template to the WAL: for a
template of some gigabytes a file copy (one checkpoint, then a copy of the files) is faster."""


@dataclass(frozen=True)
class SeedStep:
    """A test module's data set: ``metadata``'s tables, filled by ``statements`` (run in
    order, in one transaction, with the step's schema as ``search_path``).

    ``name`` (lower-case letters, digits, ``_``) names the schema, ``seed_<name>``; two modules
    may share a step by declaring the same one (same name, same statements).
    ``defer_indexes``: the tables' secondary indexes (``Table.indexes``: partial, fair,
    version...) are dropped before the load and built after it (a sorted build, several times
    faster than a million inserts into each); the primary key and unique constraints stay.
    """

    name: str
    metadata: MetaData
    statements: Sequence[str]
    defer_indexes: bool = True

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum() or self.name.lower() != self.name:
            raise ValueError(f"a seed step's name is a lower-case identifier, not {self.name!r}")

    @property
    def schema(self) -> str:
        return f"seed_{self.name}"

    def fingerprint(self) -> str:
        tables = ",".join(sorted(self.metadata.tables))
        return "\n".join([self.name, tables, str(self.defer_indexes), *self.statements])


def steps_of(modules: Iterable[Any]) -> list[SeedStep]:
    """The distinct steps the modules declare (``SEED``: a step or a sequence of steps), by
    name; two different steps under one name are refused."""
    found: dict[str, SeedStep] = {}
    for module in modules:
        declared = getattr(module, "SEED", None)
        if declared is None:
            continue
        for step in (declared,) if isinstance(declared, SeedStep) else declared:
            known = found.setdefault(step.name, step)
            if known.fingerprint() != step.fingerprint():
                raise ValueError(
                    f"two seed steps are named {step.name!r}. Fix: give one another name."
                )
    return [found[name] for name in sorted(found)]


def steps_digest(steps: Sequence[SeedStep]) -> str:
    digest = hashlib.sha256("\n\n".join(s.fingerprint() for s in steps).encode())
    return digest.hexdigest()[:12]


async def _load(connection: AsyncConnection, step: SeedStep) -> None:
    await connection.execute(text(f'CREATE SCHEMA "{step.schema}"'))
    await connection.execute(text(f'SET LOCAL search_path = "{step.schema}"'))
    await connection.run_sync(step.metadata.create_all)
    deferred = (
        [index for table in step.metadata.sorted_tables for index in table.indexes]
        if step.defer_indexes
        else []
    )
    for index in deferred:
        await connection.execute(text(f'DROP INDEX "{index.name}"'))
    for statement in step.statements:
        await connection.execute(text(statement))
    for index in deferred:
        await connection.execute(CreateIndex(index))


async def build_template(factory: DatabaseFactory, name: str, steps: Sequence[SeedStep]) -> URL:
    """Create database ``name``, load every step into its schema, analyze it, mark it a
    template."""
    url = await factory.create(name)
    engine = create_async_engine(url, poolclass=NullPool)
    loaders = asyncio.Semaphore(BUILD_CONNECTIONS)

    async def load(step: SeedStep) -> None:
        async with loaders, engine.begin() as connection:
            await _load(connection, step)

    try:
        await asyncio.gather(*(load(step) for step in steps))
        async with engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(text("VACUUM (ANALYZE)"))
    finally:
        await engine.dispose()
    await _admin(factory.server, f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true')
    return url


async def drop_template(factory: DatabaseFactory, name: str) -> None:
    """Drop the template (a template cannot be dropped: unmark it first); no error when a
    failed build left none."""
    try:
        await _admin(factory.server, f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false')
    except asyncpg.InvalidCatalogNameError:
        return
    await factory.drop(name)


async def clone(factory: DatabaseFactory, name: str, template: str) -> URL:
    """A copy of the template (a file copy from PostgreSQL 15 on), named ``name``."""
    statement = f'CREATE DATABASE "{name}" TEMPLATE "{template}"'
    await _admin(factory.server, statement, strategy=f" STRATEGY {CLONE_STRATEGY}")
    return factory.server.database_url(name)


async def _admin(server: ResolvedServer, statement: str, *, strategy: str = "") -> None:
    connection = await asyncpg.connect(**asyncpg_dsn(server.url), timeout=30)
    try:
        # CREATE DATABASE's STRATEGY is PostgreSQL 15's; before, a file copy is the only way.
        version = connection.get_server_version()
        await connection.execute(statement + (strategy if version.major >= 15 else ""))
    finally:
        await connection.close()
