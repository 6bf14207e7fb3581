"""``ship-sqla outbox purge|redrive``: the outbox's retention and its dead letters from the shell.

The operator at the shell is trusted: whoever holds the database URL can change the rows
directly, so the CLI goes through the outbox's permission gate with an authorizer that grants
``ship.outbox:manage`` to every operation, as the jobs CLI does with ``ship.jobs:manage``. Each
verb is audited (S1) in ``--audit-table`` (default ship_audit, in the outbox table's schema) as
``cli:<user>@<host>`` and changes nothing when that table is missing; ``--no-audit`` is the
explicit opt-out.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click
from sqlalchemy import MetaData

from ship_sqla._audit import create_audit_log, ship_audit_table
from ship_sqla._cli._database import command_engine, run_on_database
from ship_sqla._cli._operator import cli_actor
from ship_sqla._cli._options import (
    OUTBOX_SCHEMA_ENV,
    OUTBOX_TABLE_ENV,
    audit_options,
    confirm_or_abort,
    database_url_option,
    json_option,
    name_option,
    tenant_option,
    yes_option,
)
from ship_sqla._cli._params import Duration, OutboxId
from ship_sqla._outbox import create_outbox, create_outbox_operations, ship_outbox_table
from ship_sqla._outbox._admin import MAX_RETENTION
from ship_sqla._outbox._operations import (
    MAX_DEAD_PAGE,
    MAX_REDRIVE_BATCHES,
    allow_every_operation,
)

if TYPE_CHECKING:
    import uuid
    from collections.abc import Awaitable, Callable
    from datetime import timedelta

    from sqlalchemy.engine import URL

    from ship_sqla._outbox._operations import OutboxOperations, RedriveResult

__all__ = ["outbox", "purge_delivered"]

T = TypeVar("T")


async def _on_outbox(
    url: URL,
    operation: Callable[[OutboxOperations], Awaitable[T]],
    *,
    table_name: str,
    schema: str | None,
    audit_table: str | None,
) -> T:
    """Run ``operation`` through the outbox's operator gate on the named outbox table at
    ``url``, audited in ``audit_table`` (None: ``--no-audit``), then dispose."""
    async with command_engine(url) as engine:
        table = ship_outbox_table(MetaData(), name=table_name, schema=schema)
        audit = None
        if audit_table is not None:
            audit = create_audit_log(
                database=engine, table=ship_audit_table(MetaData(), name=audit_table, schema=schema)
            )
        operations = create_outbox_operations(
            create_outbox(database=engine, table=table),
            authorizer=allow_every_operation,
            audit=audit,
            actor=cli_actor(),
        )
        return await operation(operations)


async def purge_delivered(
    url: URL,
    *,
    outbox_id: str,
    older_than: timedelta,
    table_name: str,
    schema: str | None,
    pages_per_statement: int,
    audit_table: str | None = None,
) -> int:
    """Run ``purge_delivered`` through the outbox's operator gate on the named outbox table at
    ``url``, then dispose."""

    async def call(operations: OutboxOperations) -> int:
        return await operations.purge_delivered(
            outbox_id, older_than=older_than, pages_per_statement=pages_per_statement
        )

    return await _on_outbox(
        url, call, table_name=table_name, schema=schema, audit_table=audit_table
    )


_table_options: Final = (
    name_option(
        "--table",
        "table",
        dest="table_name",
        envvar=OUTBOX_TABLE_ENV,
        default="ship_outbox",
        help="The outbox table's name, as given to ship_outbox_table(metadata, name=...).",
    ),
    name_option(
        "--schema",
        "schema",
        envvar=OUTBOX_SCHEMA_ENV,
        default=None,
        help="The schema holding the outbox table (default: none, the search_path decides).",
    ),
)


def _outbox_tables(command: Any) -> Any:  # noqa: ANN401 - a click command function
    for option in reversed(_table_options):
        command = option(command)
    return command


@click.group(short_help="Outbox operations: re-drive dead messages, purge delivered ones.")
def outbox() -> None:
    """Outbox operations from the shell: re-drive dead messages (redrive), delete delivered
    ones past their retention (purge). Both are audited (S1)."""


@outbox.command("purge")
@database_url_option
@click.option("--outbox-id", required=True, type=OutboxId(), help="The logical outbox (outbox_id).")
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_RETENTION, allow_zero=True),
    required=True,
    help="Delete messages delivered at least this long ago: 3600, 90m, 12h or 7d.",
)
@_outbox_tables
@click.option(
    "--pages-per-statement",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Heap pages (8 kB) each DELETE reads: bounds every statement's cost.",
)
@audit_options
@json_option
def outbox_purge(
    *,
    audit_table: str | None,
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
        audit_table=audit_table,
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


def _redrive_selection(
    *, every: bool, ids: tuple[uuid.UUID, ...], outbox_id: str | None, filters: dict[str, object]
) -> None:
    """Either --all (of --outbox-id, filtered) or message ids; anything else is exit 2."""
    if every == bool(ids):
        raise click.UsageError(
            "give either --all with --outbox-id (and --tenant / --older-than) or the ids of the"
            " dead messages to re-drive."
        )
    if every and outbox_id is None:
        raise click.UsageError("--all needs --outbox-id: the logical outbox to re-drive.")
    if len(ids) > MAX_DEAD_PAGE:
        raise click.UsageError(f"at most {MAX_DEAD_PAGE} message ids per call; use --all.")
    given = [f"--{name}" for name, value in filters.items() if value is not None]
    if ids and given:
        raise click.UsageError(
            f"{', '.join(given)} filter --all; with message ids, name the messages (or drop the"
            " ids and add --all)."
        )


@outbox.command("redrive")
@click.argument("id_args", metavar="[MESSAGE_ID]...", nargs=-1, type=click.UUID)
@click.option("--id", "id_options", multiple=True, type=click.UUID, help="A message (repeatable).")
@click.option("--all", "every", is_flag=True, help="Every dead message of --outbox-id (filtered).")
@click.option("--outbox-id", type=OutboxId(), default=None, help="With --all: the logical outbox.")
@click.option(
    "--tenant", metavar="TENANT", callback=tenant_option, help="With --all: only this tenant's."
)
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_RETENTION, allow_zero=True),
    default=None,
    help="With --all: only messages created at least this long ago (3600, 90m, 12h, 7d).",
)
@click.option(
    "--max-batches",
    type=click.IntRange(1, MAX_REDRIVE_BATCHES),
    default=10,
    show_default=True,
    help="With --all: pages of 1,000 dead messages at most (run again for the rest).",
)
@database_url_option
@_outbox_tables
@yes_option
@audit_options
@json_option
def outbox_redrive(
    *,
    id_args: tuple[uuid.UUID, ...],
    id_options: tuple[uuid.UUID, ...],
    every: bool,
    outbox_id: str | None,
    tenant: str | None,
    older_than: timedelta | None,
    max_batches: int,
    database_url: URL,
    table_name: str,
    schema: str | None,
    yes: bool,
    audit_table: str | None,
    as_json: bool,
) -> None:
    """Re-drive dead messages (O4): back to pending, due now, with a fresh attempt budget; the
    relays deliver them again. Name the messages (MESSAGE_ID ... or --id), or re-drive every
    dead message of --outbox-id with --all (only --tenant's, only those created at least
    --older-than ago), in pages of 1,000. Asks on a terminal unless --yes; prints how many
    moved (a message that is not dead, or unknown, is left alone)."""
    ids = tuple(dict.fromkeys(id_args + id_options))
    filters: dict[str, object] = {"tenant": tenant, "older-than": older_than}
    _redrive_selection(every=every, ids=ids, outbox_id=outbox_id, filters=filters)
    cutoff = None if older_than is None else datetime.now(UTC) - older_than
    if every:
        words = ", ".join(f"{name} {value}" for name, value in filters.items() if value is not None)
        question = f"Re-drive every dead message of {outbox_id}{f' ({words})' if words else ''}?"
    else:
        question = f"Re-drive {len(ids)} dead message(s)?"
    confirm_or_abort(question, yes=yes)

    async def call(operations: OutboxOperations) -> RedriveResult | list[uuid.UUID]:
        if every:
            assert outbox_id is not None  # noqa: S101 - _redrive_selection refused --all without
            return await operations.retry_dead_matching(
                outbox_id, tenant=tenant, created_before=cutoff, max_batches=max_batches
            )
        return await operations.retry(ids)

    qualified = f"{schema}.{table_name}" if schema else table_name
    done = run_on_database(
        database_url,
        _on_outbox(
            database_url, call, table_name=table_name, schema=schema, audit_table=audit_table
        ),
        failing=f"cannot re-drive from outbox table {qualified}",
        fix="check the URL, that the server is up, and the table's name (--table, --schema).",
        as_json=as_json,
    )
    moved, complete = (done, True) if isinstance(done, list) else (list(done.moved), done.complete)
    _redrive_report(moved, complete, of=len(ids) if ids else None, as_json=as_json)


def _redrive_report(
    moved: list[uuid.UUID], complete: bool, *, of: int | None, as_json: bool
) -> None:
    if as_json:
        click.echo(json.dumps({"moved": [str(i) for i in moved], "complete": complete}))
        return
    if of is None:
        click.echo(f"Re-drove {len(moved)} dead message(s).")
    else:
        rest = "" if len(moved) == of else "; the others were not dead (or not found)"
        click.echo(f"Re-drove {len(moved)} of {of} message(s){rest}.")
    if not complete:
        click.echo("More dead messages may match: run the command again.")
