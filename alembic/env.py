"""An async Alembic environment whose target metadata holds every ship table plus the example
application's tables (examples/schema.py). Applications copy this pattern: call the ship table
factories on their own MetaData and point ``target_metadata`` at it."""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig
from typing import TYPE_CHECKING

from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import async_engine_from_config

from examples.schema import metadata
from ship_sqla._server import to_async_url
from ship_sqla.schema import ship_include_object

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata


def _url() -> str:
    configured = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "SHIP_SQLA_DATABASE_URL"
    )
    if not configured:
        msg = (
            "alembic: no database URL. Set SHIP_SQLA_DATABASE_URL=postgresql+asyncpg://user@host/db"
            " or sqlalchemy.url in alembic.ini."
        )
        raise RuntimeError(msg)
    return to_async_url(configured).render_as_string(hide_password=False)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        include_object=ship_include_object(target_metadata),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # J17: the run history's partitions are maintenance's, never a migration's.
        include_object=ship_include_object(target_metadata),
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    section = config.get_section(config.config_ini_section, {})
    section["sqlalchemy.url"] = _url()
    connectable = async_engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    async with connectable.connect() as connection:
        await connection.run_sync(do_run_migrations)
    await connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
