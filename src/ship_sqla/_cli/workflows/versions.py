"""``ship-sqla workflows versions | parked | unpark | move-version``: the deploy gate of
pinned handler versions (D9: exit 1 when deploying a registry would strand live runs), and the
runs parked on a divergence (D10: list them, unpark one, move one to a version it replays
cleanly on; audited)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import click

from ship_sqla._cli._database import run_jobs_call
from ship_sqla._cli._exits import OperationFailedError
from ship_sqla._cli._operator import operate, run_operation
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla._cli._params import REGISTRY
from ship_sqla.kernel._versions import (
    MAX_VERSION_ROWS,
    describe_stranded,
    served_by_jobs,
    stranded_runs,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._ports import RunRecord
    from ship_sqla.kernel._registry import JobRegistry
    from ship_sqla.kernel._versions import VersionCount

__all__ = ["COMMANDS"]


async def _counts(url: URL, tables: JobTables) -> list[VersionCount]:
    async def call(ops: JobOperations) -> list[VersionCount]:
        return await ops.version_counts(limit=MAX_VERSION_ROWS)

    return await run_operation(url, call, tables)


@click.command("versions", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@click.option(
    "--registry",
    type=REGISTRY,
    required=True,
    help="The registry about to be deployed, as APP:REGISTRY (a JobRegistry or list of jobs).",
)
@json_option
def workflows_versions(
    database_url: URL, registry: JobRegistry, as_json: bool, tables: JobTables
) -> None:
    """Live runs per job and handler version, and whether REGISTRY serves each version. Exits 1
    when deploying REGISTRY would strand live runs (a version that neither a job's version= nor
    its previous= keeps), naming the job, the version and the count; 0 otherwise. Runs of
    unversioned jobs, and runs stored before versions existed (they run on a job's lowest
    version), never strand."""
    counts = run_jobs_call(
        database_url, _counts(database_url, tables), tables=tables.runs_name, as_json=as_json
    )
    served = served_by_jobs(registry)
    stranded = stranded_runs(counts, served)
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for count in counts:
        row = rows.setdefault(
            (count.job_id, count.version),
            {
                "job_id": count.job_id,
                "version": count.version,
                "waiting": 0,
                "running": 0,
                "served": count.version in served.get(count.job_id, frozenset()),
            },
        )
        row[count.state] = count.runs
    if as_json:
        document = {
            "versions": list(rows.values()),
            "stranded": [
                {"job_id": s.job_id, "version": s.version, "runs": s.runs} for s in stranded
            ],
        }
        click.echo(json.dumps(document, indent=2))
    else:
        for row in rows.values():
            served_text = "served" if row["served"] else "NOT SERVED"
            click.echo(
                f"{row['job_id']} v{row['version']}: {row['waiting']} waiting,"
                f" {row['running']} running ({served_text})"
            )
        if not rows:
            click.echo("no live runs of versioned jobs.")
    if stranded:
        raise OperationFailedError(
            f"deploying this registry would strand live runs: {describe_stranded(stranded)}."
            " Fix: keep each such version's handler in define_job(..., previous={version:"
            " handler}) until these runs end, then deploy."
        )


@click.command("parked", epilog=OPERATOR_NOTE)
@click.option("--job", "job_id", default=None, help="Only this job's parked runs.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def workflows_parked(
    job_id: str | None, limit: int, database_url: URL, as_json: bool, tables: JobTables
) -> None:
    """Workflow runs parked because their handler diverged from their history (D10), by job
    then run id: each with where it diverged. Unpark one with `ship-sqla workflows unpark
    RUN_ID` once the fix is deployed (a new build's first worker unparks them by itself)."""

    async def call(ops: JobOperations) -> list[RunRecord]:
        return await ops.list_parked(job_id=job_id, limit=limit)

    records = operate(database_url, call, tables, as_json=as_json)
    rows = [
        {"run_id": r.run_id, "job_id": r.job_id, "divergence": _divergence_line(r)} for r in records
    ]
    if as_json:
        click.echo(json.dumps({"parked": rows}, indent=2))
        return
    for row in rows:
        click.echo(f"{row['run_id']} ({row['job_id']}): {row['divergence']}")
    if not rows:
        click.echo("no parked runs.")


def _divergence_line(record: RunRecord) -> str:
    """The first line of the run's last ``diverged`` history entry (the D7 message)."""
    for entry in reversed(record.history):
        if isinstance(entry, dict) and entry.get("kind") == "diverged":
            return str(entry.get("error", "")).split("\n", 1)[0]
    return ""


@click.command("unpark", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
@audit_options
def workflows_unpark(
    run_id: str, database_url: URL, tables: JobTables, audit_table: str | None
) -> None:
    """Make a parked run due now (D10): it replays on the deployed code, and parks again if it
    still diverges. Refused unless the run is parked."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.unpark(run_id)

    record = operate(database_url, call, tables, on_run=run_id, audit_table=audit_table)
    click.echo(f"run {record.run_id} ({record.job_id}) is unparked, due now.")


@click.command("move-version", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@click.option("--version", "version", type=click.IntRange(min=1), required=True)
@click.option(
    "--registry",
    type=REGISTRY,
    required=True,
    help="The registry whose handlers will run it, as APP:REGISTRY: its history is replayed on"
    " the named version first.",
)
@database_url_option
@job_tables_options(with_state_table=False)
@audit_options
def workflows_move_version(
    *,
    run_id: str,
    version: int,
    registry: JobRegistry,
    database_url: URL,
    tables: JobTables,
    audit_table: str | None,
) -> None:
    """Move a parked run to handler VERSION of REGISTRY and unpark it (D10), only when its
    history replays cleanly on that version (no effect runs); refused otherwise, saying where
    it diverges."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.move_version(run_id, version, registry=registry)

    record = operate(database_url, call, tables, on_run=run_id, audit_table=audit_table)
    click.echo(f"run {record.run_id} ({record.job_id}) moved to version {version}, due now.")


COMMANDS: Final = (workflows_versions, workflows_parked, workflows_unpark, workflows_move_version)
