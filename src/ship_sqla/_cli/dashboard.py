"""``ship-sqla dashboard``: the operator dashboard served locally (S2).

The operator at the shell is trusted: the command grants whoever reaches its address manage (or
read, with ``--read-only``), so it listens on 127.0.0.1 unless told otherwise. Every change is
written to the audit table (``--audit-table``, default ship_audit) as ``cli:<user>@<host>``
(``--no-audit`` to act unaudited). uvicorn and the dashboard (starlette) are imported when the
command runs: they are the optional ``dashboard`` extra.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla._backfills import create_backfill_ledger, ship_backfills_table
from ship_sqla._cli._database import command_engine, run_jobs_call
from ship_sqla._cli._operator import cli_actor
from ship_sqla._cli._options import (
    audit_options,
    database_url_option,
    job_tables_options,
    name_option,
    outbox_schema_option,
    outbox_table_option,
)
from ship_sqla._cli._params import REGISTRY, OutboxId
from ship_sqla._jobs._stats import create_job_stats, ship_job_stats_table
from ship_sqla._outbox._operations import MANAGE_PERMISSION as OUTBOX_MANAGE
from ship_sqla._outbox._operations import READ_PERMISSION as OUTBOX_READ
from ship_sqla._webhooks._operations import MANAGE_PERMISSION as WEBHOOKS_MANAGE
from ship_sqla._webhooks._operations import READ_PERMISSION as WEBHOOKS_READ
from ship_sqla._webhooks._sender import DEFAULT_JOB_ID
from ship_sqla.kernel._operations import MANAGE_PERMISSION, READ_PERMISSION

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine
    from starlette.requests import Request

    from ship_sqla._cli._tables import JobTables
    from ship_sqla._outbox import OutboxOperations
    from ship_sqla._webhooks._sender import WebhookSender
    from ship_sqla.kernel._audit import AuditSink
    from ship_sqla.kernel._registry import JobRegistry

__all__ = ["dashboard"]


@click.command(short_help="Serve the operator dashboard locally (needs the dashboard extra).")
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
@click.option(
    "--read-only",
    is_flag=True,
    help="Grant ship.jobs:read (and ship.outbox:read, ship.webhooks:read) only: no action buttons.",
)
@click.option(
    "--registry",
    type=REGISTRY,
    default=None,
    metavar="APP:REGISTRY",
    help="The application's jobs (a JobRegistry, a job definition or a list of them, as"
    " `ship-sqla worker` takes): the schedules page shows their schedules' last and next"
    " occurrences, the overview their idle jobs.",
)
@click.option(
    "--outbox-id",
    "outbox_ids",
    type=OutboxId(),
    multiple=True,
    help="Show this outbox on the outbox page (pending, claimed, dead messages; redrive);"
    " repeatable.",
)
@outbox_table_option("--outbox-table")
@outbox_schema_option("--outbox-schema")
@name_option(
    "--backfills-table",
    "table",
    envvar="SHIP_SQLA_BACKFILLS_TABLE",
    default=None,
    help="Show the backfills of this ledger table (in --schema; e.g. ship_backfills) on the"
    " Consumers & backfills page, with start and cancel.",
    dest="backfills_table",
)
@name_option(
    "--stats-table",
    "table",
    envvar="SHIP_SQLA_STATS_TABLE",
    default=None,
    help="The job history table the workers flush into (in --schema; e.g. ship_job_stats):"
    " the job pages' charts and the overview's throughput chart read it.",
    dest="stats_table",
)
@click.option(
    "--webhooks",
    "show_webhooks",
    is_flag=True,
    help="Show the Webhooks page: endpoints and latest deliveries (never a secret), with"
    " disable, enable and redeliver.",
)
@name_option(
    "--webhook-endpoints-table",
    "table",
    envvar="SHIP_SQLA_WEBHOOK_ENDPOINTS_TABLE",
    default="ship_webhook_endpoints",
    help="With --webhooks: the endpoints table (in --schema).",
    dest="webhook_endpoints_table",
)
@name_option(
    "--webhook-deliveries-table",
    "table",
    envvar="SHIP_SQLA_WEBHOOK_DELIVERIES_TABLE",
    default="ship_webhook_deliveries",
    help="With --webhooks: the deliveries table (in --schema).",
    dest="webhook_deliveries_table",
)
@click.option(
    "--webhook-job-id",
    default=DEFAULT_JOB_ID,
    show_default=True,
    help="With --webhooks: the delivery job's id (create_webhook_sender's job_id), which a"
    " redeliver or an enable enqueues.",
)
@audit_options
def dashboard(
    *,
    database_url: URL,
    tables: JobTables,
    host: str,
    port: int,
    read_only: bool,
    registry: JobRegistry | None,
    outbox_ids: tuple[str, ...],
    outbox_table: str,
    outbox_schema: str | None,
    backfills_table: str | None,
    stats_table: str | None,
    show_webhooks: bool,
    webhook_endpoints_table: str,
    webhook_deliveries_table: str,
    webhook_job_id: str,
    audit_table: str | None,
) -> None:
    """Serve the dashboard on HOST:PORT until Ctrl-C. Whoever reaches the address may do what
    the operator at this shell may (or only read, with --read-only): keep it on 127.0.0.1, or
    mount create_dashboard(...) in an application with its own authentication. The address
    line is printed once the port is listening: a client may connect as soon as it reads it.

    --registry APP:REGISTRY gives it the job definitions (the schedules' details, idle jobs);
    --outbox-id (repeatable) adds the outbox page for those outboxes, in the outbox table
    --outbox-table (default ship_outbox) in --outbox-schema; --backfills-table the backfill
    ledger the Consumers & backfills page lists; --stats-table the job history the charts
    read; --webhooks the Webhooks page over the webhook tables."""
    try:
        import uvicorn  # noqa: PLC0415 - an optional dependency, only for this command

        from ship_sqla._dashboard import create_dashboard  # noqa: PLC0415 - needs starlette
    except ImportError as exc:
        raise click.UsageError(
            f"the dashboard needs the dashboard extra ({exc.name} is missing):"
            " pip install 'ship-sqla[dashboard]'."
        ) from exc
    history = _history_present(database_url, tables)
    engine = create_async_engine(database_url)
    audit = None if audit_table is None else tables.audit_log(engine, audit_table)
    outbox = _outbox_operations(engine, outbox_table, outbox_schema, audit) if outbox_ids else None
    app: Any = create_dashboard(
        tables.shaped_backend(engine, history=history),
        authorizer=_shell_authorizer(read_only=read_only),
        actor=lambda _request: cli_actor(),
        audit=audit,
        outbox=outbox,
        outbox_ids=outbox_ids,
        definitions=registry or (),
        backfills=None
        if backfills_table is None
        else create_backfill_ledger(
            database=engine,
            table=ship_backfills_table(MetaData(), name=backfills_table, schema=tables.runs.schema),
        ),
        webhooks=_webhook_sender(
            engine,
            tables,
            webhook_endpoints_table,
            webhook_deliveries_table,
            webhook_job_id,
            history=history,
        )
        if show_webhooks
        else None,
        stats=None
        if stats_table is None
        else create_job_stats(
            engine,
            ship_job_stats_table(MetaData(), name=stats_table, schema=tables.runs.schema),
        ),
    )
    listening = _listen(host, port)
    bound = listening.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"ship-sqla dashboard on http://{shown}:{bound}/ (Ctrl-C to stop)")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[listening])


def _shell_authorizer(*, read_only: bool) -> Callable[[Request, str, str], bool]:
    """What the operator at this shell may do on the dashboard: every read, and (unless
    ``--read-only``) every action. Payloads too: the shell's operator can read the tables."""
    from ship_sqla._dashboard._redact import PAYLOADS_PERMISSION  # noqa: PLC0415 - needs starlette

    granted = {READ_PERMISSION, PAYLOADS_PERMISSION, OUTBOX_READ, WEBHOOKS_READ}
    if not read_only:
        granted |= {MANAGE_PERMISSION, OUTBOX_MANAGE, WEBHOOKS_MANAGE}

    def authorizer(_request: Request, permission: str, _operation: str) -> bool:
        return permission in granted

    return authorizer


def _history_present(database_url: URL, tables: JobTables) -> bool:
    """J16: whether the database holds the history table (the dashboard's pages follow its
    shape), asked once before the server starts on its own engine (the server's loop is
    another); a database that cannot be reached is exit 1 here."""

    async def probe() -> bool:
        async with command_engine(database_url) as engine:
            return await tables.history_present(engine)

    return run_jobs_call(database_url, probe(), tables=tables.names)


def _webhook_sender(
    engine: AsyncEngine,
    tables: JobTables,
    endpoints: str,
    deliveries: str,
    job_id: str,
    *,
    history: bool,
) -> WebhookSender:
    """The Webhooks page's sender on the named tables (in --schema); it sends nothing here:
    a redeliver or an enable only enqueues the delivery job's runs."""
    from ship_sqla._webhooks import (  # noqa: PLC0415 - only when the page is shown
        create_webhook_delivery_store,
        create_webhook_sender,
        ship_webhook_deliveries_table,
        ship_webhook_endpoints_table,
    )

    metadata = MetaData()
    schema = tables.runs.schema
    store = create_webhook_delivery_store(
        database=engine,
        endpoints_table=ship_webhook_endpoints_table(metadata, name=endpoints, schema=schema),
        deliveries_table=ship_webhook_deliveries_table(metadata, name=deliveries, schema=schema),
    )
    backend = tables.shaped_backend(engine, history=history)
    return create_webhook_sender(store=store, backend=backend, job_id=job_id)


def _outbox_operations(
    engine: AsyncEngine, table_name: str, schema: str | None, audit: AuditSink | None
) -> OutboxOperations:
    """The outbox pages' operations on the named outbox table; the dashboard asks its own
    authorizer (``ship.outbox:read`` / ``manage``, as --read-only grants) per request."""
    from ship_sqla._outbox import (  # noqa: PLC0415 - only when an outbox is shown
        create_outbox,
        create_outbox_operations,
        ship_outbox_table,
    )
    from ship_sqla._outbox._operations import allow_every_operation  # noqa: PLC0415

    table = ship_outbox_table(MetaData(), name=table_name, schema=schema)
    outbox = create_outbox(database=engine, table=table)
    return create_outbox_operations(outbox, authorizer=allow_every_operation, audit=audit)


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
