"""``ship-sqla jobs sync-definitions``: upsert the job definitions table SQL enqueuers read
(E8), and install the SQL enqueue functions where they are missing (E6). An install that
exists is left as it is: replacing it is ``schema apply``'s or a migration's (which know the
variant, E7, and the history table, J16); the schema check reports it if it is another
build."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import click
from sqlalchemy import MetaData, inspect

from ship_sqla._cli._database import command_engine, run_jobs_call
from ship_sqla._cli._options import database_url_option, job_tables_options
from ship_sqla._cli._params import REGISTRY
from ship_sqla._jobs import ship_job_history_table
from ship_sqla._jobs._sql_api import (
    install_sql_enqueue,
    ship_job_definitions_table,
    sql_enqueue_status,
    sync_job_definitions,
)

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.engine import URL, Connection

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._registry import JobRegistry

__all__ = ["COMMANDS"]


@click.command("sync-definitions")
@database_url_option
@job_tables_options(with_state_table=True)
@click.option(
    "--registry",
    type=REGISTRY,
    required=True,
    help="The jobs SQL callers may enqueue, as APP:REGISTRY (a JobRegistry or list of jobs).",
)
@click.option(
    "--definitions-table",
    default="ship_job_definitions",
    show_default=True,
    help="The job definitions table (ship_job_definitions_table), in --schema.",
)
@click.option(
    "--queue-depth-limit",
    type=click.IntRange(min=1),
    default=None,
    help="J2: the cap the workers' backend enqueues under (its queue_depth_limit); none: no cap.",
)
def jobs_sync_definitions(
    *,
    database_url: URL,
    tables: JobTables,
    registry: JobRegistry,
    definitions_table: str,
    queue_depth_limit: int | None,
) -> None:
    """Upsert one row per registered job into the definitions table that <runs>_enqueue_v1
    reads (E8), and install the SQL enqueue functions if they are missing (E6, with the default
    history table when it exists, as ``schema apply`` does), in one transaction."""
    definitions = ship_job_definitions_table(
        tables.runs.metadata, definitions_table, schema=tables.runs.schema
    )
    history = ship_job_history_table(MetaData(), schema=tables.runs.schema)
    jobs = list(registry)

    async def call() -> None:
        async with command_engine(database_url) as engine, engine.begin() as connection:
            await connection.run_sync(definitions.create, checkfirst=True)
            status = await sql_enqueue_status(connection, tables.runs, tables.state, definitions)
            if status == "missing":
                found = await connection.run_sync(_has_table, history)
                await install_sql_enqueue(
                    connection,
                    tables.runs,
                    tables.state,
                    definitions,
                    history=history if found else None,
                )
            await sync_job_definitions(
                connection, definitions, jobs, queue_depth_limit=queue_depth_limit
            )

    run_jobs_call(database_url, call(), tables=tables.names)
    click.echo(f"{len(jobs)} job definition(s) synced to {definitions_table}.")


def _has_table(connection: Connection, table: Table) -> bool:
    return inspect(connection).has_table(table.name, schema=table.schema)


COMMANDS: Final = (jobs_sync_definitions,)
