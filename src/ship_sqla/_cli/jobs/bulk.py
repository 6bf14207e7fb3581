"""``ship-sqla jobs retry-dead|discard-dead``: dead runs in bulk (issue 15, S1).

The operator at the shell is trusted: the verbs grant themselves ``ship.jobs:manage``. Every
change is written to the audit table (``--audit-table``, default ship_audit) as
``cli:<user>@<host>``, and nothing changes when that table is missing (``--no-audit`` to act
unaudited).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final, Literal

import click

from ship_sqla._cli._database import run_jobs_call
from ship_sqla._cli._operator import run_audited_operation
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
    tenant_option,
)
from ship_sqla.kernel._operations import MAX_BULK_BATCHES, MAX_BULK_IDS

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import BulkResult, JobOperations

__all__ = ["COMMANDS"]

_Verb = Literal["retry", "discard"]


def _report(verb: str, result: BulkResult, *, as_json: bool) -> None:
    if as_json:
        click.echo(
            json.dumps(
                {
                    "changed": list(result.changed),
                    "unchanged": list(result.unchanged),
                    "complete": result.complete,
                }
            )
        )
        return
    click.echo(f"{verb}: {len(result.changed)} run(s) changed, {len(result.unchanged)} unchanged.")
    if not result.complete:
        click.echo("More runs match: run the command again.")


def _check_selection(
    *, every: bool, run_ids: tuple[str, ...], job_id: str | None, tenant: str | None
) -> None:
    """Either --all (filtered by --job / --tenant) or --id RUN_ID ...; anything else is exit 2."""
    if every == bool(run_ids):
        raise click.UsageError("give either --all (with --job/--tenant) or --id RUN_ID ...")
    if len(run_ids) > MAX_BULK_IDS:
        raise click.UsageError(f"at most {MAX_BULK_IDS} --id per call; use --all.")
    if run_ids and (job_id or tenant):
        raise click.UsageError("--job and --tenant filter --all; with --id, name the runs.")


def _bulk_command(name: str, verb: _Verb, help_text: str) -> click.Command:
    @click.command(name, epilog=OPERATOR_NOTE, help=help_text)
    @database_url_option
    @job_tables_options(with_state_table=False)
    @click.option("--job", "job_id", metavar="JOB_ID", help="Only dead runs of this job.")
    @click.option("--tenant", metavar="TENANT", callback=tenant_option, help="Only this tenant's.")
    @click.option("--all", "every", is_flag=True, help="Every dead run matching --job/--tenant.")
    @click.option("--id", "run_ids", multiple=True, metavar="RUN_ID", help="A run (repeatable).")
    @click.option(
        "--max-batches",
        type=click.IntRange(1, MAX_BULK_BATCHES),
        default=100,
        show_default=True,
        help="With --all: batches of 500 runs at most (run again for the rest).",
    )
    @audit_options
    @json_option
    def command(
        *,
        database_url: URL,
        tables: JobTables,
        job_id: str | None,
        tenant: str | None,
        every: bool,
        run_ids: tuple[str, ...],
        max_batches: int,
        audit_table: str,
        no_audit: bool,
        as_json: bool,
    ) -> None:
        _check_selection(every=every, run_ids=run_ids, job_id=job_id, tenant=tenant)

        async def call(ops: JobOperations) -> BulkResult:
            if every:
                walk = ops.retry_dead_matching if verb == "retry" else ops.discard_dead_matching
                return await walk(job_id=job_id, tenant=tenant, max_batches=max_batches)
            many = ops.retry_many if verb == "retry" else ops.discard_many
            return await many(run_ids)

        audited = None if no_audit else audit_table
        result = run_jobs_call(
            database_url,
            run_audited_operation(database_url, call, tables, audit_table=audited),
            tables=f"{tables.runs_name} and the audit table {audit_table}",
            as_json=as_json,
        )
        _report(verb.capitalize(), result, as_json=as_json)

    return command


COMMANDS: Final = (
    _bulk_command(
        "retry-dead",
        "retry",
        "Retry dead runs in bulk: those named by --id, or --all matching --job / --tenant, in"
        " bounded batches. Written to the audit log.",
    ),
    _bulk_command(
        "discard-dead",
        "discard",
        "Discard dead runs in bulk: those named by --id, or --all matching --job / --tenant, in"
        " bounded batches. Written to the audit log.",
    ),
)
