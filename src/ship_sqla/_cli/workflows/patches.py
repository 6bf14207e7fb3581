"""``ship-sqla workflows patches`` (D8): per patch, the live runs holding its marker and those
created before its first marker, each one bounded statement (docs/workflows-evolution.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import attrs
import click

from ship_sqla._cli._operator import operate
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla.kernel._evolution import MAX_PATCH_READ

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._evolution import PatchReport
    from ship_sqla.kernel._operations import JobOperations

__all__ = ["COMMANDS"]


@click.command("patches", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@click.option("--job", "job_id", metavar="JOB_ID", required=True, help="The workflow's job id.")
@click.option(
    "--patch",
    "patch_ids",
    metavar="PATCH_ID",
    multiple=True,
    help="Only this patch (repeatable); default: every patch id stored.",
)
@click.option(
    "--read",
    type=click.IntRange(1, MAX_PATCH_READ),
    default=MAX_PATCH_READ,
    show_default=True,
    help="The most live runs of the job each figure reads (past it, a lower bound: N+).",
)
@json_option
def workflows_patches(
    *,
    database_url: URL,
    job_id: str,
    patch_ids: tuple[str, ...],
    read: int,
    as_json: bool,
    tables: JobTables,
) -> None:
    """Per patch (ctx.patched) of a job: the live runs holding its marker (0: the patched()
    call can be deleted) and the live runs created before its first marker (0: it can be
    deprecated with ctx.deprecate_patch). Each figure is one bounded statement."""

    async def call(ops: JobOperations) -> list[PatchReport]:
        return await ops.patches(job_id, patch_ids or None, read=read)

    reports = operate(database_url, call, tables, as_json=as_json)
    if as_json:
        click.echo(json.dumps({"patches": [_report_dict(r) for r in reports]}, indent=2))
        return
    if not reports:
        click.echo(f"no patch markers stored for job {job_id!r}")
        return
    click.echo(
        f"{'PATCH':<32} {'FIRST MARKER':<26} {'HOLDING':>10} {'BEFORE FIRST':>14}  NEXT STEP"
    )
    for report in reports:
        first = "-" if report.first_marker_at is None else report.first_marker_at.isoformat()
        click.echo(
            f"{report.patch_id:<32} {first:<26} {report.holding!s:>10}"
            f" {report.before_first!s:>14}  {_next_step(report)}"
        )


def _next_step(report: PatchReport) -> str:
    if report.first_marker_at is None:
        return "no run took the new path yet: keep the patch"
    if report.deletable and report.deprecatable:
        return "the patched() call can be deleted"
    if report.deprecatable:
        return "can be deprecated (ctx.deprecate_patch); delete once HOLDING is 0"
    return "keep: live runs may still take the old path"


def _report_dict(report: PatchReport) -> dict[str, object]:
    first = report.first_marker_at
    return {
        "job_id": report.job_id,
        "patch_id": report.patch_id,
        "first_marker_at": None if first is None else first.isoformat(),
        "holding": attrs.asdict(report.holding),
        "before_first": attrs.asdict(report.before_first),
        "deletable": report.deletable and report.deprecatable,
        "deprecatable": report.deprecatable,
    }


COMMANDS: Final = (workflows_patches,)
