"""``ship-sqla worker`` (execute the runs of an application's jobs until a signal, or
``--burst``) and ``ship-sqla workers`` (list the worker registry, F6).

The worker's log lines about runs are the runtime's, on ``ship_sqla.jobs`` (S3); its own
(started, stopping, absorbed errors) are on ``ship_sqla.worker``; :mod:`._logging` prints both.
The worker's tables are checked at its start by the runtime's one probe (the backend's
``require_support``: :class:`~ship_sqla.errors.MissingTablesError` names the missing tables and
the ``schema apply`` command): the CLI runs no SQL of its own. ``--lifespan APP:LIFESPAN`` gives
the handlers the application's resources (``ctx.resources``), entered before the first claim
and exited after the drain.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Final

import click
from sqlalchemy.ext.asyncio import create_async_engine

from ship_sqla._cli._database import run_jobs_call, run_on_database
from ship_sqla._cli._operator import run_operation
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    database_url_option,
    job_tables_options,
    json_option,
    schema_option,
    tables_or_bad_parameter,
    workers_table_option,
)
from ship_sqla._cli._output import format_workers, worker_dict
from ship_sqla._cli._params import LIFESPAN, REGISTRY, Duration
from ship_sqla._cli._running import (
    StopSignals,
    drain,
    logging_to_stderr,
    run_options,
    stop_signals,
)
from ship_sqla._cli._tables import DEFAULT_RUNS_TABLE, DEFAULT_STATE_TABLE, JobTables
from ship_sqla.kernel._durations import MAX_POLL_INTERVAL, MAX_SAMPLE_INTERVAL
from ship_sqla.kernel._on_error import error_line
from ship_sqla.kernel._operations import MAX_DEMAND_JOBS, MAX_PAUSED_JOBS
from ship_sqla.kernel._ports import JobLeaseStaleError
from ship_sqla.kernel._runtime.runtime import start_job_runtime
from ship_sqla.kernel._workers import MAX_WORKERS_LISTED

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import timedelta

    from sqlalchemy.engine import URL

    from ship_sqla._cli._logging import LogFormat
    from ship_sqla._jobs import PostgresJobBackend
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._lifespan import Lifespan
    from ship_sqla.kernel._operations import JobOperations
    from ship_sqla.kernel._registry import JobRegistry
    from ship_sqla.kernel._runtime.runtime import JobRuntime
    from ship_sqla.kernel._workers import WorkerRecord

__all__ = ["run_worker", "worker", "workers"]

worker_log = logging.getLogger("ship_sqla.worker")
"""The command's own lines (started, stopping, absorbed errors); the runs' lines are the
runtime's, on ``ship_sqla.jobs`` (S3)."""

BURST_IDLE_CHECKS: Final = 2
"""``--burst`` stops after this many checks in a row found nothing due and nothing in flight:
one check could fall between a claim's answer and its runs' start."""


@click.command(short_help="Run a job worker until SIGTERM/SIGINT (J12 drain), or --burst.")
@click.argument("registry", metavar="APP:REGISTRY", type=REGISTRY)
@database_url_option
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Runs this worker executes at once.",
)
@click.option(
    "--poll-interval",
    type=Duration(maximum=MAX_POLL_INTERVAL),
    default="1s",
    show_default=True,
    help="Time between polls for due runs: seconds or with a unit (250ms, 2s, 1m), at most 1h.",
)
@click.option(
    "--lifespan",
    type=LIFESPAN,
    default=None,
    metavar="APP:LIFESPAN",
    help="The application's resources for the handlers (ctx.resources): a module-level async"
    " context manager factory (an @asynccontextmanager function), entered before the first"
    " claim and exited after the drain. Default: the registry's lifespan, if it has one.",
)
@run_options(
    verbose_help="every completion too, and failures' tracebacks",
    drain_help="Time in-flight runs may finish after SIGTERM before they are cancelled",
    burst_help="Execute the due runs, then drain and exit 0 once nothing is due (paused jobs"
    " aside) and nothing is in flight; runs due later are left for later.",
)
@click.option(
    "--summary-interval",
    type=Duration(maximum=MAX_SAMPLE_INTERVAL, allow_zero=True),
    default="60s",
    show_default=True,
    help="How often an info line sums up runs/s, failures and runs in flight (0: never).",
)
@click.option(
    "--synchronous-claims",
    is_flag=True,
    default=False,
    help="Commit claims with the server's synchronous_commit instead of off, so that under"
    " synchronous replication no acknowledged claim is lost in a failover (J24; costs claim"
    " latency: docs/production.md, Failover).",
)
@job_tables_options(with_state_table=True, with_workers_table=True)
@click.pass_context
def worker(
    ctx: click.Context,
    *,
    registry: JobRegistry,
    database_url: URL,
    max_in_flight: int,
    poll_interval: timedelta,
    drain_timeout: timedelta,
    burst: bool,
    verbose: bool,
    log_level: str | None,
    log_format: LogFormat,
    summary_interval: timedelta,
    tables: JobTables,
    lifespan: Lifespan | None,
    synchronous_claims: bool,
) -> None:
    """Execute the runs of the jobs registered at APP:REGISTRY (a JobRegistry, a job definition
    or a list of them, defined at module level, e.g. examples.worker:registry) from the job
    tables (the default names unless --runs-table, --state-table or --schema say otherwise),
    until SIGTERM or SIGINT (or, with --burst, until nothing is due). Then it stops claiming,
    lets in-flight runs finish within --drain-timeout, cancels the rest (they wait again
    without losing an attempt, J12) and exits: 0 after SIGTERM or --burst, 130 after Ctrl-C.
    A second SIGTERM or Ctrl-C during the drain cancels the runs in flight at once.

    It logs to stderr (S3): one line per retry, dead letter, timeout, stale settle, cancel and
    drain, with job id, run id, attempt and error (never payloads), and a summary every
    --summary-interval. The worker registers in the worker registry (F6, --workers-table;
    `ship-sqla workers` lists it) when that table exists, and runs unregistered, saying so,
    when it does not."""
    summary = summary_interval.total_seconds()
    with logging_to_stderr(verbose=verbose, log_level=log_level, log_format=log_format):
        code = run_jobs_call(
            database_url,
            run_worker(
                database_url,
                registry,
                max_in_flight=max_in_flight,
                poll_interval=poll_interval.total_seconds(),
                drain_timeout=drain_timeout.total_seconds(),
                tables=tables,
                summary_interval=summary or None,
                burst=burst,
                lifespan=lifespan,
                synchronous_claims=synchronous_claims,
            ),
            tables=tables.names,
        )
    ctx.exit(code)


@click.command(short_help="List the worker registry (F6).", epilog=OPERATOR_NOTE)
@database_url_option
@workers_table_option
@schema_option
@json_option
def workers(database_url: URL, workers_table: str, schema: str | None, as_json: bool) -> None:
    """List the worker runtimes registered in the worker registry (F6): id, host, pid, start,
    last heartbeat, runs in flight, running or draining, the fleet's queue sampler (F5), jobs.
    A worker that died stays listed until it is pruned (not seen for 30 s)."""
    tables = tables_or_bad_parameter(DEFAULT_RUNS_TABLE, DEFAULT_STATE_TABLE, schema, workers_table)

    async def call(ops: JobOperations) -> list[WorkerRecord]:
        return await ops.workers(limit=MAX_WORKERS_LISTED)

    records = run_on_database(
        database_url,
        run_operation(database_url, call, tables),
        failing="cannot read the worker registry",
        fix="check the URL, that the server is up, and that the workers table exists (here:"
        f" {tables.workers_name}; created by ship_job_workers_table in your migrations, or"
        " `ship-sqla schema apply`); name a table created under another name or in another"
        " schema with --workers-table and --schema.",
        as_json=as_json,
    )
    if as_json:
        click.echo(json.dumps({"workers": [worker_dict(r) for r in records]}, indent=2))
    else:
        click.echo(format_workers(records))


def _report_error(error: BaseException) -> None:
    """The worker's on_error (J11): every absorbed error is one ERROR line, with its code and
    fix. A stale settle is DEBUG here: the runtime's own WARNING line for it (event "stale")
    already names the run."""
    level = logging.DEBUG if isinstance(error, JobLeaseStaleError) else logging.ERROR
    # Never the statement's text a database error's str carries (issue 27 item 7).
    worker_log.log(level, "absorbed %s", error_line(error))


async def _nothing_due(backend: PostgresJobBackend, job_ids: Sequence[str]) -> bool:
    """``--burst``: no run of these jobs is due, paused jobs aside (their runs wait anyway)."""
    admin = backend.admin
    paused = {p.job_id for p in await admin.paused(limit=MAX_PAUSED_JOBS)}
    wanted = [job_id for job_id in job_ids if job_id not in paused][:MAX_DEMAND_JOBS]
    if not wanted:
        return True
    demands = await admin.demand(wanted, cap=1, max_jobs=len(wanted))
    return all(d.due == 0 for d in demands)


async def run_worker(
    url: URL,
    jobs: JobRegistry | Sequence[JobDefinition[Any]],
    *,
    max_in_flight: int,
    poll_interval: float,
    drain_timeout: float,
    tables: JobTables,
    summary_interval: float | None = None,
    burst: bool = False,
    lifespan: Lifespan | None = None,
    synchronous_claims: bool = False,
) -> int:
    """Execute ``jobs``' runs until SIGTERM or SIGINT (or, with ``burst``, until nothing is due
    and nothing in flight), then stop claiming and drain (J12); a second signal cuts the drain
    short. The exit code: 130 after a SIGINT, else 0."""
    engine = create_async_engine(url)
    try:
        # The handlers are installed before the runtime starts, so a signal is never the
        # default (abrupt) exit once a run may be executing.
        async with stop_signals() as stop:
            backend = await tables.backend(
                engine, on_error=_report_error, synchronous_claims=synchronous_claims
            )
            # Checked at start, not in the loop (which would retry forever): an unreachable
            # database or a missing table (MissingTablesError, naming the `schema apply`
            # command) is exit 1 at once. The runtime's own start asks the same probe.
            fair = any(job.fairness is not None for job in jobs)
            await backend.require_tables("the job worker", fair_claims=fair, strict=True)
            runtime = await start_job_runtime(
                jobs,
                backend=backend,
                mode="worker",
                poll_interval=poll_interval,
                max_in_flight=max_in_flight,
                drain_timeout=drain_timeout,
                summary_interval=summary_interval,
                lifespan=lifespan,
            )
            await _execute_until_stopped(
                backend,
                runtime,
                stop,
                jobs=jobs,
                poll_interval=poll_interval,
                drain_timeout=drain_timeout,
                burst=burst,
            )
            worker_log.info("stopped.")
    finally:
        await engine.dispose()
    return stop.exit_code


async def _stop_runtime(runtime: JobRuntime, signals: StopSignals) -> None:
    """Drain (J12) for the runtime's ``drain_timeout``, cut short by a second signal: the runs
    in flight are then cancelled at once (they wait again, no attempt lost)."""

    async def hurry() -> None:
        worker_log.warning(
            "second signal: cancelling the %d run(s) in flight now (they wait again, no"
            " attempt lost).",
            runtime.in_flight,
        )
        await runtime.stop(drain_timeout=0)

    await drain(runtime.stop(), signals, hurry=hurry)


async def _execute_until_stopped(
    backend: PostgresJobBackend,
    runtime: JobRuntime,
    stop: StopSignals,
    *,
    jobs: JobRegistry | Sequence[JobDefinition[Any]],
    poll_interval: float,
    drain_timeout: float,
    burst: bool,
) -> None:
    """Let the started ``runtime`` execute until a signal (or, with ``burst``, until idle),
    then stop it: it stops claiming and drains (J12)."""
    ids = ", ".join(d.id for d in jobs)
    until = "nothing is due (--burst)" if burst else "SIGTERM or Ctrl-C"
    worker_log.info(
        "executing %s as worker %s until %s; then it drains and stops.",
        ids,
        runtime.worker_id,
        until,
    )
    try:
        if burst:
            await _until_idle(backend, runtime, stop.stop, [d.id for d in jobs], poll_interval)
        else:
            await stop.stop.wait()
        worker_log.info(
            "stopping: draining for up to %gs (Ctrl-C again cancels the runs in flight now).",
            drain_timeout,
        )
    finally:
        await _stop_runtime(runtime, stop)


async def _until_idle(
    backend: PostgresJobBackend,
    runtime: JobRuntime,
    stop: asyncio.Event,
    job_ids: Sequence[str],
    poll_interval: float,
) -> None:
    """``--burst``: return once :data:`BURST_IDLE_CHECKS` checks in a row found no due run of
    these jobs and none in flight here, or at a signal."""
    every = min(poll_interval, 0.25)
    idle = 0
    while idle < BURST_IDLE_CHECKS:
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except TimeoutError:
            pass
        else:
            return
        busy = runtime.in_flight > 0 or not await _nothing_due(backend, job_ids)
        idle = 0 if busy else idle + 1
    worker_log.info("nothing due and nothing in flight (--burst).")
