"""``ship-sqla outbox relay APP:SINK``: an outbox relay process (issue 27 item 5), with the
worker's signal handling, drain, ``--burst`` and log options (:mod:`._running`).

The relay is the library's own :class:`~ship_sqla.outbox.OutboxRelay`, built on the named
outbox table and driven through its public methods: ``run()`` in a task until the first
SIGTERM/SIGINT, then ``stop()`` (the message in the sink finishes, published messages are
completed, the batch's others released), bounded by ``--drain-timeout`` and cut short by a
second signal (the sink call is cancelled; its message stays claimed until its lease lapses).
``--burst`` drives ``run_once()`` instead, batch after batch, until a claim finds nothing (see
:func:`_burst`). The sink is ``APP:SINK`` or the one ``--lifespan APP:LIFESPAN`` yields; the
lifespan is entered before the first claim and exited after the drain.

The command's lines (started, stopping, publish failures, absorbed errors) are on
``ship_sqla.relay``: one line per failed publish naming the message id, topic and attempt and
the sink's error, never the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, cast

import click
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla._cli._database import run_on_database
from ship_sqla._cli._options import (
    database_url_option,
    name_option,
    outbox_schema_option,
    outbox_table_option,
)
from ship_sqla._cli._params import LIFESPAN, SINK, Duration, OutboxId
from ship_sqla._cli._running import (
    StopSignals,
    drain,
    logging_to_stderr,
    run_options,
    stop_signals,
)
from ship_sqla._jobs._stats import create_job_stats, ship_job_stats_table
from ship_sqla._outbox import (
    OutboxLeaseStaleError,
    OutboxPublishError,
    OutboxRelay,
    create_outbox,
    ship_outbox_table,
)
from ship_sqla._schema_probe import Needed, require_tables
from ship_sqla.kernel._durations import MAX_LEASE, MAX_POLL_INTERVAL
from ship_sqla.kernel._lifespan import enter_lifespan
from ship_sqla.kernel._on_error import error_line
from ship_sqla.kernel._runtime.run_log import RECORD_FIELD

if TYPE_CHECKING:
    from datetime import timedelta

    from sqlalchemy import Table
    from sqlalchemy.engine import URL

    from ship_sqla._cli._logging import LogFormat
    from ship_sqla._outbox import OutboxSink
    from ship_sqla.kernel._lifespan import Lifespan

__all__ = ["relay", "run_relay"]

relay_log = logging.getLogger("ship_sqla.relay")
"""The relay command's lines: started, stopping, publish failures and absorbed errors."""


@click.command("relay", short_help="Run an outbox relay until SIGTERM/SIGINT, or --burst.")
@click.argument("sink", metavar="APP:SINK", type=SINK, required=False)
@database_url_option
@click.option("--outbox-id", required=True, type=OutboxId(), help="The logical outbox (outbox_id).")
@outbox_table_option("--table")
@outbox_schema_option("--schema")
@click.option(
    "--lifespan",
    type=LIFESPAN,
    default=None,
    metavar="APP:LIFESPAN",
    help="Instead of APP:SINK: a module-level async context manager factory (an"
    " @asynccontextmanager function) that opens the sink's resources and yields the sink;"
    " entered before the first claim and exited after the drain.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Messages claimed per batch.",
)
@click.option(
    "--lease",
    type=Duration(maximum=MAX_LEASE),
    default="30s",
    show_default=True,
    help="How long a claim holds its messages (heartbeaten every third of it).",
)
@click.option(
    "--poll-interval",
    type=Duration(maximum=MAX_POLL_INTERVAL),
    default="1s",
    show_default=True,
    help="Time between polls when idle: seconds or with a unit (250ms, 2s, 1m), at most 1h."
    " Enqueues anywhere wake the relay at once (LISTEN) unless --no-listen.",
)
@click.option("--ordered", is_flag=True, help="Per-key ordering (see docs/outbox.md).")
@click.option(
    "--no-listen",
    is_flag=True,
    help="Poll only, no LISTEN connection (behind a transaction-mode pooler such as PgBouncer).",
)
@name_option(
    "--stats-table",
    "table",
    envvar="SHIP_SQLA_STATS_TABLE",
    default=None,
    help="The job history table (in --schema; e.g. ship_job_stats): every 15 s the relay"
    " writes the messages it delivered and a sample of the pending ones there, the dashboard"
    " outbox page's trend.",
    dest="stats_table",
)
@run_options(
    verbose_help="failures' tracebacks too",
    drain_help="Time the sink call in flight may finish after SIGTERM before it is cancelled"
    " and its message left claimed until its lease lapses",
    burst_help="Deliver what is deliverable now, then exit 0 once a claim finds nothing: no"
    " pending message due now (messages due later, e.g. a failed one's retry after its"
    " backoff, are left for later) and no lapsed claim to retake.",
)
@click.pass_context
def relay(
    ctx: click.Context,
    *,
    sink: OutboxSink | None,
    database_url: URL,
    outbox_id: str,
    outbox_table: str,
    outbox_schema: str | None,
    lifespan: Lifespan | None,
    batch_size: int,
    lease: timedelta,
    poll_interval: timedelta,
    ordered: bool,
    no_listen: bool,
    stats_table: str | None,
    drain_timeout: timedelta,
    burst: bool,
    verbose: bool,
    log_level: str | None,
    log_format: LogFormat,
) -> None:
    """Publish the messages of outbox --outbox-id (in the outbox table, ship_outbox unless
    --table or --schema say otherwise) to APP:SINK, an async function taking the message
    defined at module level (e.g. myapp.relay:publish), or to the sink --lifespan yields,
    until SIGTERM or SIGINT (or, with --burst, until a claim finds nothing deliverable now).
    Then it stops claiming: the message in the sink finishes within --drain-timeout (else it
    is cancelled and stays claimed until its lease lapses), published messages are completed
    and the rest released for another relay. Exit 0 after SIGTERM or --burst, 130 after
    Ctrl-C; a second SIGTERM or Ctrl-C during the drain cancels the sink call at once.

    Delivery is at-least-once: make the sink idempotent (deduplicate on message.id). A sink
    that raises leaves the message for a retry after the outbox's backoff (dead after its
    attempts); each failure is one log line with the message id, topic, attempt and the
    sink's error, never the payload."""
    if (sink is None) == (lifespan is None):
        raise click.UsageError(
            "name the sink as APP:SINK, or a lifespan that yields it as --lifespan"
            " APP:LIFESPAN (one of the two).",
            ctx,
        )
    table = ship_outbox_table(MetaData(), name=outbox_table, schema=outbox_schema)
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "lease": lease.total_seconds(),
        "poll_interval": poll_interval.total_seconds(),
        "ordered": ordered,
        "listen": not no_listen,
    }
    with logging_to_stderr(verbose=verbose, log_level=log_level, log_format=log_format):
        code = run_on_database(
            database_url,
            run_relay(
                database_url,
                outbox_id,
                table,
                sink=sink,
                lifespan=lifespan,
                options=options,
                drain_timeout=drain_timeout.total_seconds(),
                burst=burst,
                stats_table=None
                if stats_table is None
                else ship_job_stats_table(MetaData(), name=stats_table, schema=outbox_schema),
            ),
            failing=f"cannot relay outbox {outbox_id!r}",
            fix="check the URL, that the server is up, and the outbox table's name (--table,"
            " --schema).",
        )
    ctx.exit(code)


async def run_relay(
    url: URL,
    outbox_id: str,
    table: Table,
    *,
    sink: OutboxSink | None,
    lifespan: Lifespan | None,
    options: dict[str, Any],
    drain_timeout: float,
    burst: bool,
    stats_table: Table | None = None,
) -> int:
    """Relay ``outbox_id``'s messages to ``sink`` (or the one ``lifespan`` yields) until
    SIGTERM or SIGINT (or, with ``burst``, until a claim finds nothing), then drain; a second
    signal cuts the drain short; with ``stats_table``, the relay writes the outbox's trend
    there (:mod:`ship_sqla._outbox._stats`). The exit code: 130 after a SIGINT, else 0."""
    engine = create_async_engine(url)
    try:
        async with stop_signals() as signals, contextlib.AsyncExitStack() as resources:
            # The one start-time probe: a missing table is MissingTablesError (exit 1) naming
            # it and the `schema apply` command, an unreachable database exit 1, at once.
            needed = [Needed.table(table, "outbox")]
            if stats_table is not None:
                needed.append(Needed.table(stats_table, "stats"))
                options = {**options, "stats": create_job_stats(engine, stats_table)}
            await require_tables(engine, needed, surface="the outbox relay", strict=True)
            if lifespan is not None:
                manager, sink = await enter_lifespan(lifespan, "the outbox relay")
                resources.push_async_exit(manager)
            outbox = create_outbox(database=engine, table=table)
            relay = OutboxRelay(outbox, outbox_id, _sink(sink), on_error=_report, **options)
            await _relay_until_stopped(relay, signals, drain_timeout=drain_timeout, burst=burst)
            relay_log.info("stopped: %d message(s) delivered.", relay.delivered)
    finally:
        await engine.dispose()
    return signals.exit_code


def _sink(sink: object) -> OutboxSink:
    if not callable(sink):
        raise click.UsageError(
            f"the relay's lifespan yielded a {type(sink).__name__}, not a sink: yield an async"
            " function taking the message."
        )
    return cast("OutboxSink", sink)


async def _relay_until_stopped(
    relay: OutboxRelay, signals: StopSignals, *, drain_timeout: float, burst: bool
) -> None:
    """Run ``relay`` until a signal (or, with ``burst``, until a claim finds nothing), then
    stop it and drain, cut short by a second signal."""
    until = "a claim finds nothing deliverable now (--burst)" if burst else "SIGTERM or Ctrl-C"
    relay_log.info(
        "relaying outbox %s as %s until %s; then it drains and stops.",
        relay.outbox_id,
        relay.worker,
        until,
    )
    work = asyncio.ensure_future(_burst(relay, signals) if burst else relay.run())
    asked = asyncio.ensure_future(signals.stop.wait())
    try:
        await asyncio.wait({work, asked}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        asked.cancel()
    if not work.done():
        relay_log.info(
            "stopping: draining for up to %gs (Ctrl-C again cancels the sink call in flight now).",
            drain_timeout,
        )

    async def hurry() -> None:
        relay_log.warning(
            "second signal: cancelling the sink call in flight now (its message stays claimed"
            " until its lease lapses; the batch's others are released)."
        )
        work.cancel()

    await drain(_stop(relay, work, drain_timeout), signals, hurry=hurry)


async def _stop(relay: OutboxRelay, work: asyncio.Future[Any], drain_timeout: float) -> None:
    """``relay.stop()`` (no more claims; the batch's unpublished messages released) while
    ``work`` ends; at ``drain_timeout`` the sink call still in flight is cancelled."""
    stopping = asyncio.ensure_future(relay.stop())
    try:
        done, _ = await asyncio.wait({work}, timeout=drain_timeout)
        if not done:
            relay_log.warning(
                "drain timeout (%gs): cancelling the sink call in flight (its message stays"
                " claimed until its lease lapses).",
                drain_timeout,
            )
            work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
    finally:
        await stopping


async def _burst(relay: OutboxRelay, signals: StopSignals) -> None:
    """``--burst``: one batch after another (``run_once``: claim, publish, settle) until a
    claim returns nothing, or a signal. A claim returns nothing when no message of the outbox
    is deliverable now: none pending and due, no claim whose lease lapsed, and (``--ordered``)
    none that an earlier undelivered message of its key holds back. Nothing is in flight
    then: each batch is settled before the next claim. A publish failure makes its message
    due again after the outbox's backoff: retried within the burst if that is already past
    at a claim, else left for later. A database error ends the burst (exit 1)."""
    try:
        while not signals.stop.is_set():
            if await relay.run_once() == 0:
                relay_log.info("nothing deliverable now and nothing in flight (--burst).")
                return
    finally:
        await relay.flush_stats()  # --stats-table: what the burst delivered


def _report(error: BaseException) -> None:
    """The relay's ``on_error``: every absorbed error is one line, its code and first line
    (never a payload, never a statement's text); a publish failure with the message's facts."""
    if isinstance(error, OutboxPublishError):
        message = error.outbox_message
        facts = {
            "event": "publish_failed",
            "outbox_id": message.outbox_id,
            "message_id": str(message.id),
            "topic": message.topic,
            "attempt": message.attempt,
            "max_attempts": message.max_attempts,
            "outcome": error.outcome,
            "error": error_line(error.__cause__ or error),
        }
        level = logging.ERROR if error.outcome in {"dead", None} else logging.WARNING
        relay_log.log(
            level,
            "%s",
            error_line(error),
            extra={RECORD_FIELD: facts},
            exc_info=error.__cause__ if relay_log.isEnabledFor(logging.DEBUG) else None,
        )
        return
    level = logging.WARNING if isinstance(error, OutboxLeaseStaleError) else logging.ERROR
    relay_log.log(level, "absorbed %s", error_line(error))
