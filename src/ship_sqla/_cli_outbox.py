"""``ship-sqla outbox purge``: the outbox's retention from the shell (the command is declared in
``_cli.py``; this module holds what it runs).

The operator at the shell is trusted: whoever holds the database URL can change the rows
directly, so the CLI goes through the outbox's permission gate with an authorizer that grants
``ship.outbox:manage`` to every operation, as the jobs CLI does with ``ship.jobs:manage``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._outbox import create_outbox, create_outbox_operations, ship_outbox_table
from ship_sqla._outbox._operations import allow_every_operation

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
    """Run ``purge_delivered`` through the outbox's operator gate on the named outbox table at
    ``url``, then dispose."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        table = ship_outbox_table(MetaData(), name=table_name, schema=schema)
        outbox = create_outbox(database=engine, table=table)
        operations = create_outbox_operations(outbox, authorizer=allow_every_operation)
        return await operations.purge_delivered(
            outbox_id, older_than=older_than, pages_per_statement=pages_per_statement
        )
    finally:
        await engine.dispose()
