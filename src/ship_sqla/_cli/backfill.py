"""``ship-sqla backfill status|verify|start|cancel``: the backfill ledger at the shell (C4, C5).

``verify`` is the deploy gate: exit 0 when every required backfill is completed, 1 naming each
one that is not (pending, running, stalled, failed, cancelled, or unknown: named with --id but
never started). ``start`` and ``cancel`` are operator actions (S1: audited in --audit-table);
``start`` enqueues a run of the backfill's job (its id) that a worker with the application's
definition executes.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click
from sqlalchemy import MetaData

from ship_sqla._backfills import create_backfill_ledger, ship_backfills_table
from ship_sqla._cli._database import command_engine, run_on_database
from ship_sqla._cli._exits import OperationFailedError
from ship_sqla._cli._operator import cli_actor
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
    name_option,
)
from ship_sqla.kernel._backfill_operations import create_backfill_operations
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from datetime import datetime

    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._backfill_operations import (
        BackfillBlocker,
        BackfillCancel,
        BackfillOperations,
        BackfillStart,
    )
    from ship_sqla.kernel._backfills import BackfillRecord

__all__ = ["backfill"]

T = TypeVar("T")

DEFAULT_BACKFILLS_TABLE: Final = "ship_backfills"

backfills_table_option = name_option(
    "--backfills-table",
    "table",
    envvar="SHIP_SQLA_BACKFILLS_TABLE",
    default=DEFAULT_BACKFILLS_TABLE,
    help="The backfill ledger's table name (in --schema), as given to ship_backfills_table.",
)


def _operate(
    database_url: URL,
    operation: Callable[[BackfillOperations], Awaitable[T]],
    tables: JobTables,
    backfills_table: str,
    *,
    audit_table: str | None = None,
    as_json: bool = False,
) -> T:
    """One backfill operation on the ledger (in the runs table's schema) and the job tables,
    audited in ``audit_table`` when given; a database error is exit 1 naming the tables."""
    try:
        table = ship_backfills_table(MetaData(), name=backfills_table, schema=tables.runs.schema)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--backfills-table") from exc

    async def call() -> T:
        async with command_engine(database_url) as engine:
            audit = None if audit_table is None else tables.audit_log(engine, audit_table)
            ops = create_backfill_operations(
                create_backfill_ledger(database=engine, table=table),
                await tables.backend(engine),
                authorizer=lambda *_: True,  # the operator holding the URL is trusted
                audit=audit,
                actor=cli_actor(),
            )
            return await operation(ops)

    return run_on_database(
        database_url,
        call(),
        failing="cannot reach the backfill ledger",
        fix=f"check the URL and that the ledger table exists (here: {table.name}; created by"
        " ship_backfills_table in your migrations, or `ship-sqla schema apply --only"
        " backfills`); name one created under another name with --backfills-table and"
        " --schema.",
        as_json=as_json,
    )


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _document(record: BackfillRecord, now: datetime) -> dict[str, Any]:
    stalled = record.stalled_since(now)
    return {
        "id": record.id,
        "state": record.state,
        "status": record.status(now),
        "pages": record.pages,
        "rows": record.rows,
        "last_key": None if record.last_key is None else list(record.last_key),
        "pace": record.pace,
        "required_by": record.required_by,
        "run_id": record.run_id,
        "started_at": _when(record.started_at),
        "finished_at": _when(record.finished_at),
        "updated_at": _when(record.updated_at),
        "stalled_since": _when(stalled),
        "error": record.error,
    }


def _line(record: BackfillRecord, now: datetime) -> str:
    status = record.status(now)
    pace = "-" if record.pace is None else f"{record.pace:g}/s"
    required = "" if record.required_by is None else f" required by {record.required_by}"
    stalled = record.stalled_since(now)
    since = "" if stalled is None else f" (no progress since {record.updated_at.isoformat()})"
    return (
        f"{record.id}  {status}{since}  pages {record.pages:,}  rows {record.rows:,}"
        f"  pace {pace}{required}"
    )


@click.group("backfill")
def backfill() -> None:
    """The backfill ledger (C4, C5): progress, the deploy gate, start and cancel."""


@backfill.command("status", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@backfills_table_option
@json_option
def backfill_status(
    database_url: URL, as_json: bool, tables: JobTables, backfills_table: str
) -> None:
    """List every backfill with its state, progress (pages, rows), pace and migration; a live
    one with no checkpoint for its stalled threshold shows as stalled."""

    async def call(ops: BackfillOperations) -> tuple[list[BackfillRecord], datetime]:
        return await ops.list_backfills(), ops.now()

    records, now = _operate(database_url, call, tables, backfills_table, as_json=as_json)
    if as_json:
        click.echo(json.dumps({"backfills": [_document(r, now) for r in records]}, indent=2))
    elif not records:
        click.echo("no backfills in the ledger.")
    else:
        for record in records:
            click.echo(_line(record, now))


@backfill.command("verify", epilog=OPERATOR_NOTE)
@click.option(
    "--id",
    "backfill_ids",
    multiple=True,
    help="A backfill that must be completed (repeatable), whether or not it is tied to a"
    " migration; one the ledger does not hold fails as unknown.",
)
@click.option(
    "--required-by",
    default=None,
    help="Only the backfills tied to this migration (its revision label).",
)
@database_url_option
@job_tables_options(with_state_table=False)
@backfills_table_option
@json_option
def backfill_verify(
    *,
    backfill_ids: tuple[str, ...],
    required_by: str | None,
    database_url: URL,
    as_json: bool,
    tables: JobTables,
    backfills_table: str,
) -> None:
    """The deploy gate (C5): exit 0 when every backfill tied to a migration (only
    --required-by's, when given) and every --id is completed; exit 1 naming each that is not:
    pending, running, stalled, failed, cancelled or unknown."""

    async def call(ops: BackfillOperations) -> list[BackfillBlocker]:
        return await ops.verify(backfill_ids=backfill_ids, required_by=required_by)

    blockers = _operate(database_url, call, tables, backfills_table, as_json=as_json)
    if as_json:
        body = {
            "ok": not blockers,
            "blocking": [
                {
                    "id": b.backfill_id,
                    "reason": b.reason,
                    "required_by": None if b.record is None else b.record.required_by,
                }
                for b in blockers
            ],
        }
        click.echo(json.dumps(body, indent=2))
    if not blockers:
        if not as_json:
            click.echo("every required backfill is completed.")
        return
    named = ", ".join(f"{b.backfill_id} ({b.reason})" for b in blockers)
    message = (
        f"{len(blockers)} required backfill(s) not completed: {named}. Fix: let them finish"
        " (`ship-sqla backfill status`; a worker must serve their jobs), `ship-sqla backfill"
        " start ID` to start or resume one."
    )
    if as_json:
        raise click.exceptions.Exit(1)
    raise OperationFailedError(message)


@backfill.command("start", epilog=OPERATOR_NOTE)
@click.argument("backfill_id")
@database_url_option
@job_tables_options(with_state_table=False)
@backfills_table_option
@audit_options
@json_option
def backfill_start(
    backfill_id: str,
    *,
    database_url: URL,
    as_json: bool,
    tables: JobTables,
    backfills_table: str,
    audit_table: str | None,
) -> None:
    """Start (or resume) a backfill: its ledger row pending and one run of its job enqueued,
    unless one is live already or it is completed (idempotent). A failed or cancelled one
    resumes from its last checkpoint. A worker serving the job (the application's
    define_backfill(...).job) runs it."""

    async def call(ops: BackfillOperations) -> BackfillStart:
        return await ops.start(backfill_id)

    result = _operate(
        database_url, call, tables, backfills_table, audit_table=audit_table, as_json=as_json
    )
    if as_json:
        click.echo(json.dumps({"id": backfill_id, "outcome": result.outcome}, indent=2))
    elif result.outcome == "enqueued":
        click.echo(f"backfill {backfill_id} started: a run of its job is waiting for a worker.")
    elif result.outcome == "running":
        click.echo(f"backfill {backfill_id} has a live run already: nothing added.")
    else:
        click.echo(f"backfill {backfill_id} is completed: nothing to do.")


@backfill.command("cancel", epilog=OPERATOR_NOTE)
@click.argument("backfill_id")
@database_url_option
@job_tables_options(with_state_table=False)
@backfills_table_option
@audit_options
def backfill_cancel(
    backfill_id: str,
    database_url: URL,
    tables: JobTables,
    backfills_table: str,
    audit_table: str | None,
) -> None:
    """Cancel a live backfill: its ledger row cancelled (its run's next checkpoint is refused)
    and its run cancelled (its pacer's wait ends at once). `backfill start` resumes it from
    its last checkpoint."""

    async def call(ops: BackfillOperations) -> BackfillCancel:
        return await ops.cancel(backfill_id)

    result = _operate(database_url, call, tables, backfills_table, audit_table=audit_table)
    record = result.record
    if result.changed:
        click.echo(
            f"backfill {backfill_id} is cancelled after {record.pages:,} pages;"
            f" `ship-sqla backfill start {backfill_id}` resumes it."
        )
    else:
        click.echo(f"backfill {backfill_id} is {record.state}: nothing changed.")
