"""``ship-sqla jobs pause|resume|paused|demand|run-now``: the operator's verbs on a whole job
(K3), its demand (F5), what an autoscaler reads, and a scheduled job's run now (issue 36)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import click

from ship_sqla._cli._operator import operate
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla._cli._output import format_demand, format_paused
from ship_sqla._cli._params import REGISTRY
from ship_sqla._jobs._demand_app import demand_document
from ship_sqla.kernel._operations import DEFAULT_DEMAND_CAP, MAX_DEMAND_CAP, MAX_PAUSED_JOBS

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._operations import JobOperations, PauseResult
    from ship_sqla.kernel._ports import EnqueueResult, JobDemand, PausedJob
    from ship_sqla.kernel._registry import JobRegistry

__all__ = ["COMMANDS"]


def _not_known_note(job_id: str) -> str:
    """The warning of a pause of a job the database has no trace of (issue 25)."""
    return (
        f"warning: job {job_id} is not known to this database yet: no run of it, no schedule,"
        " no other state. The pause holds its runs from the first one (ahead of its deploy);"
        f" if the id is a typo, undo it: ship-sqla jobs resume {job_id}"
    )


@click.command("pause", epilog=OPERATOR_NOTE)
@click.argument("job_id")
@database_url_option
@job_tables_options(with_state_table=True)
@audit_options
@json_option
def jobs_pause(
    job_id: str, database_url: URL, as_json: bool, tables: JobTables, audit_table: str | None
) -> None:
    """Pause a job (K3): once this returns, no claim that starts in any worker takes its runs;
    running runs finish; enqueues and schedules still add runs, which wait. `jobs resume`
    undoes it. A job the database has no trace of yet (no run, schedule or other state) is
    paused too, ahead of its deploy, with a warning on stderr (a typo looks the same);
    --json says "known": false."""

    async def call(ops: JobOperations) -> PauseResult:
        return await ops.pause(job_id)

    result = operate(
        database_url,
        call,
        tables,
        with_state_table=True,
        as_json=as_json,
        audit_table=audit_table,
    )
    if as_json:
        body = {
            "job_id": result.job_id,
            "outcome": result.outcome,
            "changed": result.changed,
            "known": result.known,
        }
        click.echo(json.dumps(body, indent=2))
    elif result.changed:
        click.echo(
            f"job {job_id} is paused: no worker claims its runs until"
            f" `ship-sqla jobs resume {job_id}`."
        )
    else:
        click.echo(f"job {job_id} was paused already: nothing changed.")
    if not result.known:
        click.echo(_not_known_note(job_id), err=True)


@click.command("resume", epilog=OPERATOR_NOTE)
@click.argument("job_id")
@database_url_option
@job_tables_options(with_state_table=True)
@audit_options
def jobs_resume(job_id: str, database_url: URL, tables: JobTables, audit_table: str | None) -> None:
    """Resume a paused job (K3): its runs are claimable at once and listening workers are
    woken."""

    async def call(ops: JobOperations) -> bool:
        return await ops.resume(job_id)

    resumed = operate(database_url, call, tables, with_state_table=True, audit_table=audit_table)
    if resumed:
        click.echo(f"job {job_id} is resumed: its runs are claimable again.")
    else:
        click.echo(f"job {job_id} was not paused: nothing changed.")


@click.command("paused", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=True)
@json_option
def jobs_paused(database_url: URL, as_json: bool, tables: JobTables) -> None:
    """List the paused jobs, with when each was paused (K3)."""

    async def call(ops: JobOperations) -> list[PausedJob]:
        return await ops.paused(limit=MAX_PAUSED_JOBS)

    paused = operate(database_url, call, tables, with_state_table=True, as_json=as_json)
    if as_json:
        jobs_paused = [{"job_id": p.job_id, "paused_at": p.paused_at.isoformat()} for p in paused]
        click.echo(json.dumps({"paused": jobs_paused}, indent=2))
    else:
        click.echo(format_paused(paused))


@click.command("demand", epilog=OPERATOR_NOTE)
@click.option(
    "--job",
    "job_ids",
    multiple=True,
    help="A job to report (repeatable); default: every job with waiting or running runs.",
)
@click.option(
    "--cap",
    type=click.IntRange(1, MAX_DEMAND_CAP),
    default=DEFAULT_DEMAND_CAP,
    show_default=True,
    help="Count at most this many runs per job and kind (the query's cost).",
)
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_demand(
    job_ids: tuple[str, ...], cap: int, database_url: URL, as_json: bool, tables: JobTables
) -> None:
    """Demand per job (F5), what an autoscaler scales on: due, delayed and running runs (each
    counted up to --cap; "+" marks a count that reached it) and the oldest due run's age, in one
    bounded query."""

    async def call(ops: JobOperations) -> list[JobDemand]:
        return await ops.demand(list(job_ids) or None, cap=cap)

    demands = operate(database_url, call, tables, as_json=as_json)
    if as_json:
        click.echo(json.dumps(demand_document(demands, cap), indent=2))
    else:
        click.echo(format_demand(demands))


@click.command("run-now", epilog=OPERATOR_NOTE)
@click.argument("job_id")
@click.option(
    "--registry",
    type=REGISTRY,
    required=True,
    help="The jobs, as APP:REGISTRY (a JobRegistry or list of jobs): JOB_ID's definition.",
)
@database_url_option
@job_tables_options(with_state_table=True)
@audit_options
@json_option
def jobs_run_now(
    *,
    job_id: str,
    registry: JobRegistry,
    database_url: URL,
    as_json: bool,
    tables: JobTables,
    audit_table: str | None,
) -> None:
    """Run a scheduled job now (issue 36): one run, due at once, with the payload its
    schedule's ticks give; the schedule's next occurrence is unchanged. The job's idempotency
    policy and queue-depth limit apply, as on any enqueue."""
    job = registry.find(job_id)
    if job is None:
        known = ", ".join(sorted(d.id for d in registry)) or "none"
        raise click.BadParameter(
            f"{job_id!r} is not in that registry; it has: {known}.", param_hint="JOB_ID"
        )

    async def call(ops: JobOperations) -> EnqueueResult:
        return await ops.run_now(job)

    result = operate(
        database_url,
        call,
        tables,
        with_state_table=True,
        as_json=as_json,
        audit_table=audit_table,
    )
    if as_json:
        body = {
            "job_id": job_id,
            "run_id": result.run_id,
            "deduplicated": result.deduplicated,
            "rejected": result.rejected,
        }
        click.echo(json.dumps(body, indent=2))
    elif result.rejected is not None:
        click.echo(f"job {job_id}: the run was refused ({result.rejected}).")
        raise SystemExit(1)
    elif result.deduplicated:
        click.echo(f"job {job_id}: deduplicated onto run {result.run_id}.")
    else:
        click.echo(f"job {job_id}: run {result.run_id} is due now.")


COMMANDS: Final = (jobs_pause, jobs_resume, jobs_paused, jobs_demand, jobs_run_now)
