"""``ship-sqla jobs retry-dead|discard-dead|cancel``: runs in bulk (issues 15 and 33, S1).

The operator at the shell is trusted: the verbs grant themselves ``ship.jobs:manage``. Every
change is written to the audit table (``--audit-table``, default ship_audit) as
``cli:<user>@<host>``, and nothing changes when that table is missing (``--no-audit`` to act
unaudited). A bulk change (several runs, or ``--all`` with a filter) asks for confirmation on a
terminal unless ``--yes``, runs in batches of at most 500 runs, and prints how many it changed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Literal

import click

from ship_sqla._cli._operator import operate
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    confirm_or_abort,
    database_url_option,
    job_tables_options,
    json_option,
    tenant_option,
    yes_option,
)
from ship_sqla._cli._output import format_cancel, record_dict
from ship_sqla._cli._params import Duration
from ship_sqla.kernel._operations import LIVE_STATES, MAX_BULK_BATCHES, MAX_BULK_IDS

if TYPE_CHECKING:
    from datetime import timedelta

    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import BulkResult, CancelResult, JobOperations

__all__ = ["COMMANDS"]

_Verb = Literal["retry", "discard"]

MAX_AGE: Final = 100 * 365 * 24 * 3600.0
"""Seconds: the longest ``--older-than`` (a century)."""


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
    *, every: bool, run_ids: tuple[str, ...], filters: dict[str, object], what: str
) -> None:
    """Either --all (filtered by ``filters``) or run ids; anything else is exit 2."""
    named = ", ".join(f"--{name}" for name in filters)
    if every == bool(run_ids):
        raise click.UsageError(f"give either --all (with {named}) or the run ids of the {what}.")
    if len(run_ids) > MAX_BULK_IDS:
        raise click.UsageError(f"at most {MAX_BULK_IDS} run ids per call; use --all.")
    given = [f"--{name}" for name, value in filters.items() if value is not None]
    if run_ids and given:
        raise click.UsageError(
            f"{', '.join(given)} filter --all; with run ids, name the runs (or drop the ids and"
            " add --all)."
        )


def _filter_words(**filters: object) -> str:
    """The filter of an --all, in words, for the confirmation question."""
    words = [f"{name} {value}" for name, value in filters.items() if value is not None]
    return " (" + ", ".join(words) + ")" if words else " (every job)"


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
    @yes_option
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
        yes: bool,
        audit_table: str | None,
        as_json: bool,
    ) -> None:
        filters: dict[str, object] = {"job": job_id, "tenant": tenant}
        _check_selection(every=every, run_ids=run_ids, filters=filters, what="dead runs")
        if every:
            question = f"{verb.capitalize()} every dead run{_filter_words(**filters)}?"
        else:
            question = f"{verb.capitalize()} {len(set(run_ids))} dead run(s)?"
        confirm_or_abort(question, yes=yes)

        async def call(ops: JobOperations) -> BulkResult:
            if every:
                walk = ops.retry_dead_matching if verb == "retry" else ops.discard_dead_matching
                return await walk(job_id=job_id, tenant=tenant, max_batches=max_batches)
            many = ops.retry_many if verb == "retry" else ops.discard_many
            return await many(run_ids)

        result = operate(database_url, call, tables, as_json=as_json, audit_table=audit_table)
        _report(verb.capitalize(), result, as_json=as_json)

    return command


def _cancel_one(
    database_url: URL, run_id: str, tables: JobTables, audit_table: str | None, *, as_json: bool
) -> None:
    """``jobs cancel RUN_ID``: one run, its outcome said (K2); an unknown run is exit 1."""

    async def call(ops: JobOperations) -> CancelResult:
        return await ops.cancel(run_id)

    result = operate(
        database_url, call, tables, on_run=run_id, as_json=as_json, audit_table=audit_table
    )
    if as_json:
        body = {"outcome": result.outcome, "changed": result.changed}
        click.echo(json.dumps({**body, "run": record_dict(result.record)}, indent=2))
    else:
        click.echo(format_cancel(result))


@click.command("cancel", epilog=OPERATOR_NOTE)
@click.argument("run_id_args", metavar="[RUN_ID]...", nargs=-1)
@click.option("--id", "run_id_options", multiple=True, metavar="RUN_ID", help="A run (repeatable).")
@click.option("--all", "every", is_flag=True, help="Every live run matching the filters below.")
@click.option("--job", "job_id", metavar="JOB_ID", help="With --all: only runs of this job.")
@click.option(
    "--tenant", metavar="TENANT", callback=tenant_option, help="With --all: only this tenant's."
)
@click.option(
    "--state",
    type=click.Choice(LIVE_STATES),
    default=None,
    help="With --all: only waiting or only running runs (default: both).",
)
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_AGE, allow_zero=True),
    default=None,
    help="With --all: only runs created at least this long ago (3600, 90m, 12h, 7d).",
)
@click.option(
    "--max-batches",
    type=click.IntRange(1, MAX_BULK_BATCHES),
    default=100,
    show_default=True,
    help="With --all: pages of 500 runs at most (run again for the rest).",
)
@database_url_option
@job_tables_options(with_state_table=False)
@yes_option
@audit_options
@json_option
def jobs_cancel(
    *,
    run_id_args: tuple[str, ...],
    run_id_options: tuple[str, ...],
    every: bool,
    job_id: str | None,
    tenant: str | None,
    state: Literal["waiting", "running"] | None,
    older_than: timedelta | None,
    max_batches: int,
    database_url: URL,
    tables: JobTables,
    yes: bool,
    audit_table: str | None,
    as_json: bool,
) -> None:
    """Cancel runs (K2): a waiting run at once; a running run's worker is told to cancel its
    handler, and the run ends cancelled (not retried). Name the runs (RUN_ID ... or --id,
    repeatable), or cancel every live run matching --job / --tenant / --state / --older-than
    with --all, in pages of 500. One run: its outcome is said; a finished run is left as it is
    (exit 0, and the message says so); an unknown run exits 1. Several: asks on a terminal
    (unless --yes), then prints how many changed."""
    run_ids = tuple(dict.fromkeys(run_id_args + run_id_options))
    filters: dict[str, object] = {
        "job": job_id,
        "tenant": tenant,
        "state": state,
        "older-than": older_than,
    }
    _check_selection(every=every, run_ids=run_ids, filters=filters, what="runs to cancel")
    if len(run_ids) == 1:
        _cancel_one(database_url, run_ids[0], tables, audit_table, as_json=as_json)
        return
    cutoff = None if older_than is None else datetime.now(UTC) - older_than
    if every:
        which = state or "waiting or running"
        question = f"Cancel every {which} run{_filter_words(**filters)}?"
    else:
        question = f"Cancel {len(run_ids)} run(s)?"
    confirm_or_abort(question, yes=yes)

    async def call(ops: JobOperations) -> BulkResult:
        if every:
            return await ops.cancel_matching(
                job_id=job_id,
                tenant=tenant,
                state=state,
                created_before=cutoff,
                max_batches=max_batches,
            )
        return await ops.cancel_many(run_ids)

    result = operate(database_url, call, tables, as_json=as_json, audit_table=audit_table)
    _report("Cancel", result, as_json=as_json)


COMMANDS: Final[tuple[click.Command, ...]] = (
    _bulk_command(
        "retry-dead",
        "retry",
        "Retry dead runs in bulk: those named by --id, or --all matching --job / --tenant, in"
        " bounded batches. Asks on a terminal unless --yes. Written to the audit log.",
    ),
    _bulk_command(
        "discard-dead",
        "discard",
        "Discard dead runs in bulk: those named by --id, or --all matching --job / --tenant, in"
        " bounded batches. Asks on a terminal unless --yes. Written to the audit log.",
    ),
    jobs_cancel,
)
