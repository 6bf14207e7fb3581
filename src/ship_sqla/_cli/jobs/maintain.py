"""``ship-sqla jobs maintain [--migrate]``: the run history's maintenance (J17) and the one-shot
upgrade of an existing runs table into it (issue 39 item 8)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import click
from sqlalchemy import MetaData

from ship_sqla._cli._database import command_engine, run_jobs_call
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    database_url_option,
    job_tables_options,
    json_option,
)
from ship_sqla._cli._params import REGISTRY
from ship_sqla._jobs import create_job_backend, ship_job_history_table
from ship_sqla._jobs._migrate import migrate_finished_runs

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._registry import JobRegistry

__all__ = ["COMMANDS", "MAINTAIN_ATTENTION_EXIT"]

MAINTAIN_ATTENTION_EXIT: Final = 3
"""Exit status when a DDL was deferred (a lock not granted within 1 s: run again later), the
DEFAULT partitions hold runs or the runs table has an INVALID index not a rebuild's."""


async def _maintain(
    url: URL,
    tables: JobTables,
    history: str,
    registry: JobRegistry | None,
    migrate: dict[str, Any] | None,
) -> dict[str, Any]:
    async with command_engine(url) as engine:
        backend = create_job_backend(
            database=engine,
            table=tables.runs,
            state_table=tables.state,
            workers_table=tables.workers,
            listen=False,
            history_table=ship_job_history_table(MetaData(), history, schema=tables.runs.schema),
        )
        retentions = [job.retention for job in registry or ()]
        answer: dict[str, Any] = {}
        if migrate is not None:
            done = await migrate_finished_runs(backend, retentions, **migrate)
            answer["migration"] = done.to_dict()
        answer["maintenance"] = (await backend.maintain_history(retentions)).to_dict()
        return answer


def _echo(answer: dict[str, Any]) -> None:
    migration = answer.get("migration")
    if migration is not None:
        click.echo(
            f"migration: {migration['moved']} run(s) moved into history,"
            f" {migration['deleted']} past retention deleted, in {migration['batches']} batch(es)."
        )
        if not migration["complete"]:
            click.echo("finished runs are left in the runs table: run --migrate again.")
        for name in migration["dropped"]:
            click.echo(f"dropped index {name}.")
        for name in migration["kept"]:
            click.echo(f"kept index {name}: the runs table still declares it.")
    done = answer["maintenance"]
    for verb in ("created", "dropped"):
        for name in done[verb]:
            click.echo(f"{verb} {name}.")
    for name in done["deferred"]:
        click.echo(f"deferred {name}: a lock was not granted within 1 s; run again later.")
    if done["analyzed"]:
        click.echo("analyzed the history table.")
    strays = sum(done["default_rows"].values())
    if strays:
        click.echo(f"{strays} run(s) in the DEFAULT partitions (days with no partition).")
    click.echo(f"{done['partitions_ahead']} day(s) ready ahead.")
    _echo_rebuild(done)


def _echo_rebuild(done: dict[str, Any]) -> None:
    """The runs table's index rebuild (J17) of the pass ``done``."""
    for name in done["rebuilt"]:
        click.echo(f"rebuilt index {name} (it was bloated).")
    for name in done["leftovers_dropped"]:
        click.echo(f"dropped {name}: an interrupted rebuild's INVALID index.")
    for name in done["invalid"]:
        click.echo(f"index {name} is INVALID: rebuild it (REINDEX INDEX CONCURRENTLY) or drop it.")
    if done["rebuild_skipped"]:
        click.echo(f"no index rebuilt: {done['rebuild_skipped']}.")


@click.command("maintain", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=True, with_workers_table=True)
@click.option("--history-table", default="ship_job_history", show_default=True, help="In --schema.")
@click.option(
    "--registry",
    type=REGISTRY,
    default=None,
    help="The jobs whose retention applies, as APP:REGISTRY (each state class keeps the"
    " longest of theirs and the default Retention).",
)
@click.option("--migrate", is_flag=True, help="First move finished runs into history.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=1000, show_default=True)
@click.option("--max-batches", type=click.IntRange(min=1), default=None, help="Default: all.")
@json_option
def jobs_maintain(
    *,
    database_url: URL,
    tables: JobTables,
    history_table: str,
    registry: JobRegistry | None,
    migrate: bool,
    batch_size: int,
    max_batches: int | None,
    as_json: bool,
) -> None:
    """The run history's maintenance (J17): create each state class's day partitions up to 3
    days ahead, drop the days past the class's retention, analyze the table, report the runs
    in the DEFAULT partitions, rebuild the runs table's bloated indexes (REINDEX CONCURRENTLY;
    an interrupted rebuild's INVALID leftover is dropped first). Every DDL waits at most 1 s
    for its lock (so settles never wait longer); one not granted is deferred (exit 3: run again
    later). Run it daily (cron) when no worker exports metrics (the fleet's sampler runs it
    otherwise).

    --migrate first moves the finished runs of an existing runs table into history in batches
    of --batch-size (at most --max-batches): resumable, run it again until it says it is done;
    then drops the runs table's finished-only indexes once your runs table stops declaring
    them."""
    plan = None if not migrate else {"batch_size": batch_size, "max_batches": max_batches}
    answer = run_jobs_call(
        database_url,
        _maintain(database_url, tables, history_table, registry, plan),
        tables=tables.runs_name,
        as_json=as_json,
    )
    click.echo(json.dumps(answer, indent=2, default=str) if as_json else "", nl=as_json)
    if not as_json:
        _echo(answer)
    done = answer["maintenance"]
    if done["deferred"] or done["invalid"] or sum(done["default_rows"].values()):
        raise SystemExit(MAINTAIN_ATTENTION_EXIT)


COMMANDS: Final = (jobs_maintain,)
