"""``ship-sqla jobs errors``: the dead runs grouped by job, exception type and normalised
message (issue 36, item 6; the dashboard's Errors page): at most 2,000 of the newest dead runs
read, a job at a time through its index (:mod:`ship_sqla.kernel._error_groups`). Each group
prints the ``--filter`` arguments that ``ship-sqla jobs retry-matching`` takes to retry it
(previewed, then confirmed)."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Final

import click

from ship_sqla._cli._operator import operate
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla.kernel._error_groups import (
    ERROR_GROUP_SCAN,
    ErrorGroup,
    ErrorGroups,
    error_groups,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import JobOperations

__all__ = ["COMMANDS"]


def _filter_args(group: ErrorGroup) -> str:
    fields = group.run_filter.as_fields()
    return " ".join(f"--filter {shlex.quote(f'{name}={value}')}" for name, value in fields)


def format_groups(found: ErrorGroups) -> str:
    """The groups as text: one block per group, most runs first, then the bound's note."""
    if not found.groups:
        return "No dead runs."
    lines = []
    for g in found.groups:
        seen = (
            f"{g.first_seen:%Y-%m-%d %H:%M:%S} .. {g.last_seen:%Y-%m-%d %H:%M:%S} UTC"
            if (g.first_seen and g.last_seen)
            else "-"
        )
        lines.append(f"{g.count:>6}  {g.job_id}  {g.exception or '-'}: {g.message or '-'}")
        lines.append(f"        seen {seen}; example run {g.example_run_id}")
        lines.append(f"        retry: ship-sqla jobs retry-matching {_filter_args(g)}")
    lines.append(found.note)
    return "\n".join(lines)


@click.command("errors", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@click.option("--job", "job_id", metavar="JOB_ID", help="Only dead runs of this job.")
@click.option(
    "--scan",
    type=click.IntRange(1, ERROR_GROUP_SCAN),
    default=ERROR_GROUP_SCAN,
    show_default=True,
    help="The most dead runs read (the bound; across jobs, a twentieth of it per job).",
)
@json_option
def jobs_errors(
    *, database_url: URL, job_id: str | None, scan: int, as_json: bool, tables: JobTables
) -> None:
    """List error groups: dead runs grouped by job, exception type and message (numbers,
    UUIDs and hex replaced), most runs first, from the newest --scan dead runs."""

    async def call(ops: JobOperations) -> ErrorGroups:
        return await error_groups(ops, job_id=job_id, scan=scan)

    found = operate(database_url, call, tables, as_json=as_json)
    if as_json:
        groups = [
            {
                "job_id": g.job_id,
                "exception": g.exception,
                "message": g.message,
                "count": g.count,
                "first_seen": None if g.first_seen is None else g.first_seen.isoformat(),
                "last_seen": None if g.last_seen is None else g.last_seen.isoformat(),
                "example_run_id": g.example_run_id,
                "example_error": g.example_error,
                "filter": [list(pair) for pair in g.run_filter.as_fields()],
            }
            for g in found.groups
        ]
        payload = {"groups": groups, "scanned": found.scanned, "complete": found.complete}
        click.echo(json.dumps(payload, indent=2))
    else:
        click.echo(format_groups(found))


COMMANDS: Final = (jobs_errors,)
