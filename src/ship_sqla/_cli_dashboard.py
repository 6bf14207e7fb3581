"""``ship-sqla dashboard`` and the bulk verbs of ``ship-sqla jobs`` (issue 15, S1).

Registered on the command line by one import at the end of :mod:`ship_sqla._cli`. The operator
at the shell is trusted (see :mod:`ship_sqla._cli_jobs`): the bulk verbs grant themselves
``ship.jobs:manage``; ``dashboard`` grants whoever reaches its address manage (or read, with
``--read-only``), so it listens on 127.0.0.1 unless told otherwise. Every change is written to
the audit table (``--audit-table``, default ship_audit) as ``cli:<user>@<host>``, and nothing
changes when that table is missing (``--no-audit`` to act unaudited).
"""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._audit import create_audit_log, ship_audit_table
from ship_sqla._cli import (
    OPERATOR_NOTE,
    Identifier,
    _run_jobs_call,
    _tenant_option,
    cli,
    database_url_option,
    job_tables_options,
    jobs,
)
from ship_sqla._cli_jobs import JobTables, cli_actor, cli_cursor_secret
from ship_sqla._jobs import create_job_backend
from ship_sqla.kernel._operations import (
    MANAGE_PERMISSION,
    MAX_BULK_BATCHES,
    MAX_BULK_IDS,
    READ_PERMISSION,
    create_job_operations,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.engine import URL
    from starlette.requests import Request

    from ship_sqla.kernel._operations import BulkResult, JobOperations

__all__ = ["cli_actor"]

DEFAULT_AUDIT_TABLE = "ship_audit"


def _audit_options(command: Callable[..., None]) -> Callable[..., None]:
    command = click.option(
        "--no-audit", is_flag=True, help="Act without writing the audit log (S1)."
    )(command)
    return click.option(
        "--audit-table",
        type=Identifier("table"),
        default=DEFAULT_AUDIT_TABLE,
        show_default=True,
        envvar="SHIP_SQLA_AUDIT_TABLE",
        show_envvar=True,
        help="The audit table's name, as given to ship_audit_table(metadata, name=...).",
    )(command)


async def _bulk(
    url: URL,
    tables: JobTables,
    audit_table: str | None,
    call: Callable[[JobOperations], Awaitable[BulkResult]],
) -> BulkResult:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        backend = create_job_backend(
            database=engine,
            table=tables.runs,
            state_table=tables.state,
            workers_table=tables.workers,
        )
        audit = None
        if audit_table is not None:
            audit = create_audit_log(
                database=engine,
                table=ship_audit_table(MetaData(), name=audit_table, schema=tables.runs.schema),
            )
            await audit.check_table()  # nothing changes unaudited
        ops = create_job_operations(
            backend,
            authorizer=lambda permission, _operation: permission == MANAGE_PERMISSION,
            cursor_secret=cli_cursor_secret(url),
            audit=audit,
            actor=cli_actor(),
        )
        return await call(ops)
    finally:
        await engine.dispose()


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


def _bulk_command(name: str, verb: str, help_text: str) -> None:
    @jobs.command(name, epilog=OPERATOR_NOTE, help=help_text)
    @database_url_option
    @job_tables_options(with_state_table=False)
    @click.option("--job", "job_id", metavar="JOB_ID", help="Only dead runs of this job.")
    @click.option("--tenant", metavar="TENANT", callback=_tenant_option, help="Only this tenant's.")
    @click.option("--all", "every", is_flag=True, help="Every dead run matching --job/--tenant.")
    @click.option("--id", "run_ids", multiple=True, metavar="RUN_ID", help="A run (repeatable).")
    @click.option(
        "--max-batches",
        type=click.IntRange(1, MAX_BULK_BATCHES),
        default=100,
        show_default=True,
        help="With --all: batches of 500 runs at most (run again for the rest).",
    )
    @_audit_options
    @click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
    def command(
        *,
        database_url: URL,
        tables: JobTables,
        job_id: str | None,
        tenant: str | None,
        every: bool,
        run_ids: tuple[str, ...],
        max_batches: int,
        audit_table: str,
        no_audit: bool,
        as_json: bool,
    ) -> None:
        if every == bool(run_ids):
            raise click.UsageError("give either --all (with --job/--tenant) or --id RUN_ID ...")
        if len(run_ids) > MAX_BULK_IDS:
            raise click.UsageError(f"at most {MAX_BULK_IDS} --id per call; use --all.")
        if run_ids and (job_id or tenant):
            raise click.UsageError("--job and --tenant filter --all; with --id, name the runs.")

        async def call(ops: JobOperations) -> BulkResult:
            if every:
                walk = ops.retry_dead_matching if verb == "retry" else ops.discard_dead_matching
                return await walk(job_id=job_id, tenant=tenant, max_batches=max_batches)
            many = ops.retry_many if verb == "retry" else ops.discard_many
            return await many(run_ids)

        result = _run_jobs_call(
            database_url,
            _bulk(database_url, tables, None if no_audit else audit_table, call),
            tables=f"{tables.runs_name} and the audit table {audit_table}",
            as_json=as_json,
        )
        _report(verb.capitalize(), result, as_json=as_json)


_bulk_command(
    "retry-dead",
    "retry",
    "Retry dead runs in bulk: those named by --id, or --all matching --job / --tenant, in"
    " bounded batches. Written to the audit log.",
)
_bulk_command(
    "discard-dead",
    "discard",
    "Discard dead runs in bulk: those named by --id, or --all matching --job / --tenant, in"
    " bounded batches. Written to the audit log.",
)


@cli.command(short_help="Serve the operator dashboard locally (needs the dashboard extra).")
@database_url_option
@job_tables_options(with_state_table=True, with_workers_table=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port to listen on (0: any free port; the line printed names it).",
)
@click.option("--read-only", is_flag=True, help="Grant ship.jobs:read only: no action buttons.")
@_audit_options
def dashboard(
    *,
    database_url: URL,
    tables: JobTables,
    host: str,
    port: int,
    read_only: bool,
    audit_table: str,
    no_audit: bool,
) -> None:
    """Serve the dashboard on HOST:PORT until Ctrl-C. Whoever reaches the address may do what
    the operator at this shell may (or only read, with --read-only): keep it on 127.0.0.1, or
    mount create_dashboard(...) in an application with its own authentication. The address
    line is printed once the port is listening: a client may connect as soon as it reads it."""
    try:
        import uvicorn  # noqa: PLC0415 - an optional dependency, only for this command

        from ship_sqla._dashboard import create_dashboard  # noqa: PLC0415 - needs starlette
    except ImportError as exc:
        raise click.UsageError(
            f"the dashboard needs the dashboard extra ({exc.name} is missing):"
            " pip install 'ship-sqla[dashboard]'."
        ) from exc
    engine = create_async_engine(database_url)
    backend = create_job_backend(
        database=engine, table=tables.runs, state_table=tables.state, workers_table=tables.workers
    )
    audit = None
    if not no_audit:
        audit = create_audit_log(
            database=engine,
            table=ship_audit_table(MetaData(), name=audit_table, schema=tables.runs.schema),
        )
    granted = {READ_PERMISSION} if read_only else {READ_PERMISSION, MANAGE_PERMISSION}

    def authorizer(_request: Request, permission: str, _operation: str) -> bool:
        return permission in granted

    app: Any = create_dashboard(
        backend, authorizer=authorizer, actor=lambda _request: cli_actor(), audit=audit
    )
    listening = _listen(host, port)
    bound = listening.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"ship-sqla dashboard on http://{shown}:{bound}/ (Ctrl-C to stop)")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[listening])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (0: any free port): connections queue from now
    on, before uvicorn serves them, so the address line is printed only once it is true."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
        listening.listen(socket.SOMAXCONN)
    except OSError as exc:
        listening.close()
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}. Pick another --port (0:"
            " any free port) or --host."
        ) from exc
    return listening
