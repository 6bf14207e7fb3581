"""``ship-sqla jobs find`` and ``jobs retry-matching|cancel-matching|discard-matching``: find
runs by any filter, and act on what matches (issue 36, S1, S2).

``--filter NAME=VALUE`` (repeatable) takes the fields of :class:`~ship_sqla.jobs.RunFilter`:
``id``, ``job``, ``tenant``, ``state``, ``from``, ``to``, ``worker``, ``error``,
``payload=PATH=VALUE``. A bad one is exit 2 naming the field and the fix.

An action first previews (how many runs, and a confirmation token bound to the action, the
filter and that count), then asks on a terminal (unless ``--yes``), then acts on at most that
count in batches of ``--batch-size`` (at most 1,000), each batch one transaction, printing
progress on stderr. ``--preview`` stops after the preview; ``--token`` acts on an earlier
preview's token (the token is the confirmation). Audited like every verb (S1).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import click

from ship_sqla._cli._database import command_engine, run_jobs_call
from ship_sqla._cli._operator import _operations
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    confirm_or_abort,
    database_url_option,
    job_tables_options,
    json_option,
    yes_option,
)
from ship_sqla._cli._output import record_dict
from ship_sqla._uow import create_unit_of_work
from ship_sqla.kernel._search import (
    DEFAULT_SCAN,
    MAX_BULK_BATCH,
    MAX_PAGE_SIZE,
    MAX_SCAN,
    MIN_PAGE_SIZE,
    BulkAction,
    BulkProgress,
    RunFilter,
    RunFilterError,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import BulkResult, JobOperations

__all__ = ["COMMANDS"]


def _parse_filter(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> RunFilter:
    try:
        return RunFilter.parse(value)
    except RunFilterError as exc:
        raise click.BadParameter(f"{exc.message} Fix: {exc.fix}", param_hint="--filter") from exc


filter_option = click.option(
    "--filter",
    "run_filter",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_parse_filter,
    help="id, job, tenant, state, from, to (ISO 8601), worker, error (text in the last error),"
    " payload=PATH=VALUE (repeatable). All given must match.",
)


async def _with_operations(
    url: URL,
    tables: JobTables,
    audit_table: str | None,
    call: Callable[[JobOperations, Any], Awaitable[Any]],
) -> Any:  # noqa: ANN401 - the call's answer
    async with command_engine(url) as engine:
        audit = None if audit_table is None else tables.audit_log(engine, audit_table)
        uow = create_unit_of_work(engine, repositories=lambda scope: scope)

        async def transaction(work: Callable[[], Awaitable[None]]) -> None:
            async def handler(_scope: object) -> None:
                await work()

            await uow.run(handler)

        return await call(await _operations(engine, url, tables, audit), transaction)


@click.command("find", epilog=OPERATOR_NOTE)
@filter_option
@click.option(
    "--limit",
    type=click.IntRange(MIN_PAGE_SIZE, MAX_PAGE_SIZE),
    default=50,
    show_default=True,
    help="Runs per page.",
)
@click.option("--cursor", default=None, help="The next or previous page's cursor, as printed.")
@click.option(
    "--scan",
    type=click.IntRange(1, MAX_SCAN),
    default=DEFAULT_SCAN,
    show_default=True,
    help="Index entries a page reads past at most (then it stops and says so).",
)
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_find(
    *,
    run_filter: RunFilter,
    limit: int,
    cursor: str | None,
    scan: int,
    database_url: URL,
    tables: JobTables,
    as_json: bool,
) -> None:
    """Find runs matching --filter (every state, live first; with a history table, there
    too). Each page reads at most --scan entries past runs that do not match, then stops and
    prints "scanned N, stopped" with a cursor to go on."""

    async def call(ops: JobOperations, _transaction: object) -> Any:  # noqa: ANN401
        return await ops.search_runs(run_filter, limit=limit, cursor=cursor, scan=scan)

    page = run_jobs_call(
        database_url,
        _with_operations(database_url, tables, None, call),
        tables=tables.runs_name,
        as_json=as_json,
    )
    if as_json:
        body = {
            "runs": [record_dict(record) for record in page.items],
            "next_cursor": page.next_cursor,
            "previous_cursor": page.previous_cursor,
            "scanned": page.scanned,
            "stopped": page.stopped,
        }
        click.echo(json.dumps(body, indent=2))
        return
    for record in page.items:
        error = "" if record.last_error is None else f"  {record.last_error[:80]}"
        click.echo(f"{record.run_id}  {record.job_id}  {record.state}{error}")
    click.echo(f"{len(page.items)} run(s); scanned {page.scanned:,}.")
    if page.note is not None:
        click.echo(f"{page.note}: narrow the filter, or go on with the next cursor.")
    if page.next_cursor is not None:
        click.echo(f"next: --cursor {page.next_cursor}")
    if page.previous_cursor is not None:
        click.echo(f"previous: --cursor {page.previous_cursor or '(none: first page)'}")


def _progress(step: BulkProgress) -> None:
    click.echo(
        f"batch {step.batches}: {step.done:,} of {step.total:,} done, {step.changed:,} changed",
        err=True,
    )


def _action_command(action: BulkAction, what: str) -> click.Command:
    @click.command(f"{action}-matching", epilog=OPERATOR_NOTE)
    @filter_option
    @click.option("--preview", is_flag=True, help="Print the count and the token; change nothing.")
    @click.option("--token", default=None, help="Act on an earlier preview's token.")
    @click.option(
        "--batch-size",
        type=click.IntRange(1, MAX_BULK_BATCH),
        default=MAX_BULK_BATCH,
        show_default=True,
        help="Runs per transaction.",
    )
    @database_url_option
    @job_tables_options(with_state_table=False)
    @yes_option
    @audit_options
    @json_option
    def command(
        *,
        run_filter: RunFilter,
        preview: bool,
        token: str | None,
        batch_size: int,
        database_url: URL,
        tables: JobTables,
        yes: bool,
        audit_table: str | None,
        as_json: bool,
    ) -> None:
        async def call(ops: JobOperations, transaction: Any) -> Any:  # noqa: ANN401
            confirmed = token
            if confirmed is None:
                seen = await ops.preview_matching(action, run_filter)
                more = "+" if seen.capped or seen.stopped else ""
                click.echo(f"{seen.count:,}{more} run(s) match; token {seen.token}", err=True)
                if preview or seen.count == 0:
                    return seen
                confirm_or_abort(
                    f"{action.capitalize()} {seen.count:,} run(s) matching"
                    f" {run_filter.describe()}?",
                    yes=yes,
                )
                confirmed = seen.token
            act = getattr(ops, f"{action}_filtered")
            result: BulkResult = await act(
                run_filter,
                token=confirmed,
                batch_size=batch_size,
                transaction=transaction,
                progress=_progress,
            )
            return result

        answer = run_jobs_call(
            database_url,
            _with_operations(database_url, tables, audit_table, call),
            tables=tables.runs_name,
            as_json=as_json,
        )
        _report(answer, as_json=as_json)

    command.help = (
        f"{what} matching --filter: preview (count and token), confirm on a terminal"
        " (unless --yes), then up to 100,000 runs in transactions of --batch-size, with progress"
        " on stderr. Written to the audit log with the filter, the count and links."
    )
    return command


def _report(answer: Any, *, as_json: bool) -> None:  # noqa: ANN401 - a preview or a result
    if hasattr(answer, "token"):  # a preview
        if as_json:
            click.echo(json.dumps({"count": answer.count, "token": answer.token}))
        return
    if as_json:
        body = {"changed": len(answer.changed), "unchanged": len(answer.unchanged)}
        click.echo(json.dumps({**body, "complete": answer.complete}))
        return
    click.echo(f"{len(answer.changed):,} run(s) changed, {len(answer.unchanged):,} unchanged.")
    if not answer.complete:
        click.echo("Stopped before the end: preview again for the rest.")


COMMANDS: Final[tuple[click.Command, ...]] = (
    jobs_find,
    _action_command("retry", "Retry the dead runs"),
    _action_command("cancel", "Cancel (K2) the waiting and running runs"),
    _action_command("discard", "Discard the waiting and dead runs"),
)
