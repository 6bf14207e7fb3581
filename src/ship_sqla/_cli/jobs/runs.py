"""``ship-sqla jobs dead|show|retry|discard|rerun``: the operator's verbs on one run (J8, D6);
a run that does not exist is exit 1 ("no such run"). ``jobs cancel`` (one run or many) is in
:mod:`.bulk`. The verbs that change a run are audited (S1: ``--audit-table``, ``--no-audit``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import click

from ship_sqla._cli._operator import not_found, operate
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
    tenant_option,
)
from ship_sqla._cli._output import (
    attempts_used,
    format_dead,
    format_run,
    format_steps,
    record_dict,
    step_dict,
)
from ship_sqla.kernel._errors import InvalidCursorError
from ship_sqla.kernel._operations import MAX_PAGE_LIMIT
from ship_sqla.kernel._workflows import WorkflowsNotConfiguredError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._page import Page
    from ship_sqla.kernel._ports import RunRecord
    from ship_sqla.kernel._workflows import StepRecord

__all__ = ["COMMANDS"]


@click.command("dead", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@click.option("--job", "job_id", metavar="JOB_ID", help="Only runs of this job.")
@click.option(
    "--tenant",
    metavar="TENANT",
    callback=tenant_option,
    help="Only runs enqueued for this tenant (F2).",
)
@click.option("--limit", type=click.IntRange(1, MAX_PAGE_LIMIT), default=50, show_default=True)
@click.option("--cursor", metavar="CURSOR", help="The next page, as printed by the last one.")
@json_option
def jobs_dead(
    *,
    database_url: URL,
    job_id: str | None,
    tenant: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    tables: JobTables,
) -> None:
    """List dead runs (failed for good), newest first, a page at a time."""

    async def call(ops: JobOperations) -> Page[RunRecord]:
        return await ops.list_dead(job_id=job_id, limit=limit, cursor=cursor, tenant=tenant)

    try:
        page = operate(database_url, call, tables, as_json=as_json)
    except InvalidCursorError as exc:
        raise click.BadParameter(str(exc), param_hint="--cursor") from exc
    if as_json:
        runs = [record_dict(r) for r in page.items]
        click.echo(json.dumps({"runs": runs, "next_cursor": page.next_cursor}, indent=2))
    else:
        click.echo(format_dead(page))


@click.command("show", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_show(run_id: str, database_url: URL, as_json: bool, tables: JobTables) -> None:
    """Show one run: state, attempts, payload, the history of its failed attempts and, for a
    workflow run, its stored steps (D6)."""

    async def call(ops: JobOperations) -> tuple[RunRecord, list[StepRecord]] | None:
        record = await ops.get_run(run_id)
        if record is None:
            return None
        try:
            steps = await ops.list_steps(run_id)
        except WorkflowsNotConfiguredError:
            steps = []  # a database without the workflow tables: nothing to show
        return record, steps

    found = operate(database_url, call, tables, as_json=as_json)
    if found is None:
        raise not_found(run_id, tables)
    record, steps = found
    if as_json:
        click.echo(
            json.dumps({**record_dict(record), "steps": [step_dict(s) for s in steps]}, indent=2)
        )
    else:
        click.echo(format_run(record))
        if steps:
            click.echo(format_steps(steps))


@click.command("rerun", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@click.option(
    "--from-step",
    "step",
    required=True,
    help="The stored step to run again: it and every later step are dropped (see jobs show).",
)
@database_url_option
@job_tables_options(with_state_table=False)
@audit_options
def jobs_rerun(
    run_id: str, step: str, database_url: URL, tables: JobTables, audit_table: str | None
) -> None:
    """Re-run a dead (or waiting) workflow run from a named step (D6): that step and every step
    after it are dropped, the run is due now (a dead one with one more attempt), and its
    handler replays the earlier steps."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.rerun_from_step(run_id, step)

    record = operate(database_url, call, tables, on_run=run_id, audit_table=audit_table)
    click.echo(
        f"run {record.run_id} ({record.job_id}) is due again from step {step!r}: attempts"
        f" {attempts_used(record)}."
    )


@click.command("retry", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
@audit_options
def jobs_retry(run_id: str, database_url: URL, tables: JobTables, audit_table: str | None) -> None:
    """Give a dead run exactly one more attempt, due now (refused unless it is dead)."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.retry(run_id)

    record = operate(database_url, call, tables, on_run=run_id, audit_table=audit_table)
    click.echo(
        f"run {record.run_id} ({record.job_id}) is {record.state} again, due now: attempts"
        f" {attempts_used(record)}."
    )


@click.command("discard", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
@audit_options
def jobs_discard(
    run_id: str, database_url: URL, tables: JobTables, audit_table: str | None
) -> None:
    """Discard a waiting or dead run (refused for running and finished runs)."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.discard(run_id)

    record = operate(database_url, call, tables, on_run=run_id, audit_table=audit_table)
    click.echo(f"run {record.run_id} ({record.job_id}) is {record.state}.")


COMMANDS: Final = (jobs_dead, jobs_show, jobs_rerun, jobs_retry, jobs_discard)
