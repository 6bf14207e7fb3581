"""``ship-sqla outbox purge``: the outbox's retention from the shell.

The operator at the shell is trusted: whoever holds the database URL can change the rows
directly, so the CLI goes through the outbox's permission gate with an authorizer that grants
``ship.outbox:manage`` to every operation, as the jobs CLI does with ``ship.jobs:manage``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from sqlalchemy import MetaData

from ship_sqla._cli._database import command_engine, run_on_database
from ship_sqla._cli._options import (
    OUTBOX_SCHEMA_ENV,
    OUTBOX_TABLE_ENV,
    database_url_option,
    json_option,
    name_option,
)
from ship_sqla._cli._params import Duration, OutboxId
from ship_sqla._outbox import create_outbox, create_outbox_operations, ship_outbox_table
from ship_sqla._outbox._admin import MAX_RETENTION
from ship_sqla._outbox._operations import allow_every_operation

if TYPE_CHECKING:
    from datetime import timedelta

    from sqlalchemy.engine import URL

__all__ = ["outbox", "purge_delivered"]


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
    async with command_engine(url) as engine:
        table = ship_outbox_table(MetaData(), name=table_name, schema=schema)
        outbox = create_outbox(database=engine, table=table)
        operations = create_outbox_operations(outbox, authorizer=allow_every_operation)
        return await operations.purge_delivered(
            outbox_id, older_than=older_than, pages_per_statement=pages_per_statement
        )


@click.group(short_help="Outbox maintenance: retention of delivered messages.")
def outbox() -> None:
    """Outbox maintenance from the shell."""


@outbox.command("purge")
@database_url_option
@click.option("--outbox-id", required=True, type=OutboxId(), help="The logical outbox (outbox_id).")
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_RETENTION, allow_zero=True),
    required=True,
    help="Delete messages delivered at least this long ago: 3600, 90m, 12h or 7d.",
)
@name_option(
    "--table",
    "table",
    dest="table_name",
    envvar=OUTBOX_TABLE_ENV,
    default="ship_outbox",
    help="The outbox table's name, as given to ship_outbox_table(metadata, name=...).",
)
@name_option(
    "--schema",
    "schema",
    envvar=OUTBOX_SCHEMA_ENV,
    default=None,
    help="The schema holding the outbox table (default: none, the search_path decides).",
)
@click.option(
    "--pages-per-statement",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Heap pages (8 kB) each DELETE reads: bounds every statement's cost.",
)
@json_option
def outbox_purge(
    *,
    database_url: URL,
    outbox_id: str,
    older_than: timedelta,
    table_name: str,
    schema: str | None,
    pages_per_statement: int,
    as_json: bool,
) -> None:
    """Delete the outbox's messages delivered at least --older-than ago. Pending,
    claimed and dead messages are never touched. One pass over the table, one short DELETE per
    range of pages; safe to run while relays work."""
    call = purge_delivered(
        database_url,
        outbox_id=outbox_id,
        older_than=older_than,
        table_name=table_name,
        schema=schema,
        pages_per_statement=pages_per_statement,
    )
    qualified = f"{schema}.{table_name}" if schema else table_name
    deleted = run_on_database(
        database_url,
        call,
        failing=f"cannot purge outbox table {qualified}",
        fix="check the URL, that the server is up, and the table's name (--table, --schema).",
        as_json=as_json,
    )
    if as_json:
        click.echo(json.dumps({"outbox_id": outbox_id, "deleted": deleted}))
    else:
        click.echo(f"{outbox_id}: deleted {deleted} delivered message(s) from {qualified}.")
