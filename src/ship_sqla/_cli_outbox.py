"""``ship-sqla outbox purge``: the outbox's retention from the shell (the command is declared in
``_cli.py``; this module holds what it runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._outbox import create_outbox, ship_outbox_table

if TYPE_CHECKING:
    from datetime import timedelta

    from sqlalchemy.engine import URL

__all__ = ["purge_delivered"]


async def purge_delivered(
    url: URL,
    *,
    outbox_id: str,
    older_than: timedelta,
    table_name: str,
    schema: str | None,
    pages_per_statement: int,
) -> int:
    """Run ``Outbox.purge_delivered`` on the named outbox table at ``url``, then dispose."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        table = ship_outbox_table(MetaData(), name=table_name, schema=schema)
        outbox = create_outbox(database=engine, table=table)
        return await outbox.purge_delivered(
            outbox_id, older_than=older_than, pages_per_statement=pages_per_statement
        )
    finally:
        await engine.dispose()
