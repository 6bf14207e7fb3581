"""``ship-sqla jobs stats|health|cleanup|events-purge``: counts by state, the database's storage
health (J22), and the retention of finished runs (J8) and of workflow events (D4)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import attrs
import click

from ship_sqla._cli._database import run_jobs_call
from ship_sqla._cli._operator import operate, run_operation
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    audit_options,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla._cli._output import RUN_STATES, format_stats
from ship_sqla._cli._params import REGISTRY, Duration
from ship_sqla._cli._serving import Serving, serving
from ship_sqla._outbox._admin import MAX_RETENTION
from ship_sqla.kernel._operations import MAX_CLEANUP_BATCH

if TYPE_CHECKING:
    from datetime import timedelta

    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._health import StorageHealth
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._ports import StateCount
    from ship_sqla.kernel._registry import JobRegistry

__all__ = ["COMMANDS", "MAX_STATS_GROUPS"]

MAX_STATS_GROUPS: Final = 6000
"""(job, state) groups read by ``jobs stats``: 1000 jobs of six states."""


async def job_stats(url: URL, tables: JobTables) -> tuple[list[dict[str, Any]], bool]:
    """Per job: counts by state, the age in seconds of its oldest due waiting run and how many
    live workers serve it (None: no workers table); and whether more than
    :data:`MAX_STATS_GROUPS` groups exist (the rest are not shown)."""

    async def counts(ops: JobOperations) -> tuple[list[StateCount], Serving | None]:
        groups = await ops.state_counts(limit=MAX_STATS_GROUPS + 1)
        return groups, await serving(lambda limit: ops.workers(limit=limit))

    groups, served = await run_operation(url, counts, tables)
    truncated = len(groups) > MAX_STATS_GROUPS
    jobs: dict[str, dict[str, Any]] = {}
    for group in groups[:MAX_STATS_GROUPS]:
        entry = jobs.setdefault(
            group.job_id,
            {
                "job_id": group.job_id,
                **dict.fromkeys(RUN_STATES, 0),
                "oldest_due_seconds": None,
                "live_workers": None if served is None else served.workers_for(group.job_id),
            },
        )
        entry[group.state] = group.runs
        if group.oldest_due_age is not None:
            entry["oldest_due_seconds"] = round(group.oldest_due_age, 3)
    return list(jobs.values()), truncated


@click.command("stats", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False, with_workers_table=True)
@json_option
def jobs_stats(database_url: URL, as_json: bool, tables: JobTables) -> None:
    """Runs per job by state, the age of each job's oldest due waiting run (seconds), and how
    many live workers serve it (WORKERS, from the worker registry; '-' without its table): a
    job with waiting runs and 0 workers waits until a worker serving it starts."""
    rows, truncated = run_jobs_call(
        database_url, job_stats(database_url, tables), tables=tables.runs_name, as_json=as_json
    )
    if as_json:
        click.echo(json.dumps({"jobs": rows, "truncated": truncated}, indent=2))
    else:
        click.echo(format_stats(rows))
    if truncated:
        click.echo(
            f"ship-sqla jobs stats: only the first {MAX_STATS_GROUPS} (job, state) groups are"
            " shown; clean up old runs (`ship-sqla jobs cleanup`).",
            err=True,
        )


HEALTH_ALARM_EXIT: Final = 3
"""``jobs health``'s exit status when a bound is crossed (1: could not read; 2: bad input)."""


def format_health(health: StorageHealth) -> str:
    """``jobs health`` for people: the status, one line per table, the oldest snapshot, the
    alarms with their fixes."""
    lines = [f"storage health: {health.status} (sessions seen: {health.horizon_scope})"]
    rows = [("TABLE", "LIVE", "DEAD", "SIZE", "LAST VACUUM")] + [
        (
            f"{t.table} {t.name}",
            f"{t.live_tuples:,}",
            f"{t.dead_tuples:,}",
            f"{t.size_bytes / 1024:,.0f} kB",
            "never" if t.vacuum_age is None else f"{t.vacuum_age:,.0f} s ago",
        )
        for t in health.tables
    ]
    if health.tables:
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    holder = health.horizon
    lines.append(
        "oldest held snapshot: none"
        if holder is None
        else f"oldest held snapshot: {holder.kind} pid {holder.pid}"
        f" ({holder.application_name!r}), {holder.age:,.0f} s"
    )
    lines += [f"ALARM {alarm.kind}: {alarm.message}" for alarm in health.alarms()]
    return "\n".join(line.rstrip() for line in lines)


@click.command("health", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=True, with_workers_table=True)
@click.option(
    "--horizon-alarm",
    type=Duration(maximum=MAX_RETENTION),
    default="300",
    show_default=True,
    help="How long a snapshot may be held before it is an alarm: 300, 5m, 1h.",
)
@json_option
def jobs_health(
    database_url: URL, as_json: bool, tables: JobTables, horizon_alarm: timedelta
) -> None:
    """The database's storage health (J22): live and dead tuples, size and last vacuum of the
    job tables; the oldest held snapshot (pid, application name, age; never its query); the
    alarms crossed, each with its fix. Exit status 3 when an alarm holds. Reading other roles'
    sessions needs pg_read_all_stats (or pg_monitor); without it only the role's own are seen."""

    async def call(ops: JobOperations) -> StorageHealth:
        return await ops.storage_health()

    health = run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.runs_name,
        as_json=as_json,
    )
    bounds = attrs.evolve(health.bounds, horizon_alarm=horizon_alarm.total_seconds())
    health = attrs.evolve(health, bounds=bounds)
    click.echo(json.dumps(health.to_dict(), indent=2) if as_json else format_health(health))
    if health.status == "alarm":
        raise SystemExit(HEALTH_ALARM_EXIT)


@click.command("cleanup", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@click.option(
    "--registry",
    type=REGISTRY,
    required=True,
    help="The jobs whose retention applies, as APP:REGISTRY (a JobRegistry or list of jobs).",
)
@click.option(
    "--batch-size", type=click.IntRange(1, MAX_CLEANUP_BATCH), default=1000, show_default=True
)
@click.option("--max-batches", type=click.IntRange(min=1), default=100, show_default=True)
@audit_options
@json_option
def jobs_cleanup(
    *,
    audit_table: str | None,
    database_url: URL,
    registry: JobRegistry,
    batch_size: int,
    max_batches: int,
    as_json: bool,
    tables: JobTables,
) -> None:
    """Delete completed, dead and discarded runs past each registered job's retention, in
    DELETEs of at most --batch-size rows, at most --max-batches per job."""

    async def call(ops: JobOperations) -> dict[str, int]:
        return await ops.cleanup(registry, batch_size=batch_size, max_batches=max_batches)

    deleted = operate(database_url, call, tables, as_json=as_json, audit_table=audit_table)
    capped = sorted(j for j, n in deleted.items() if n >= batch_size * max_batches)
    if as_json:
        click.echo(json.dumps({"deleted": deleted, "more_to_delete": capped}, indent=2))
    else:
        for job_id, count in sorted(deleted.items()):
            click.echo(f"{job_id}: deleted {count} run(s).")
        click.echo(f"{sum(deleted.values())} run(s) deleted.")
        if capped:
            click.echo(f"more may be past retention for {', '.join(capped)}: run again.")


@click.command("events-purge", epilog=OPERATOR_NOTE)
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_RETENTION, allow_zero=True),
    required=True,
    help="Delete workflow events published at least this long ago: 3600, 90m, 12h or 7d.",
)
@database_url_option
@job_tables_options(with_state_table=False)
@audit_options
@json_option
def jobs_events_purge(
    older_than: timedelta,
    database_url: URL,
    as_json: bool,
    tables: JobTables,
    audit_table: str | None,
) -> None:
    """Workflow events' retention (D4): delete events published at least --older-than ago, in
    bounded batches. Keep them longer than your longest event wait's timeout."""

    async def call(ops: JobOperations) -> int:
        return await ops.delete_events(older_than=older_than)

    deleted = operate(database_url, call, tables, as_json=as_json, audit_table=audit_table)
    if as_json:
        click.echo(json.dumps({"deleted": deleted}))
    else:
        click.echo(f"deleted {deleted} workflow event(s).")


COMMANDS: Final = (jobs_stats, jobs_health, jobs_cleanup, jobs_events_purge)
