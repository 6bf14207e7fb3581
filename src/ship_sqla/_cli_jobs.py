"""What ``ship-sqla worker`` and ``ship-sqla jobs ...`` do, apart from click (see ``_cli``).

The operator at the shell is trusted: whoever holds the database URL can change the runs
directly, so the CLI's authorizer grants ``ship.jobs:manage`` (J8) to every operation. Every
operation goes through the one operator surface (:class:`~ship_sqla.kernel.JobOperations` over
the backend's admin port); the CLI runs no SQL of its own (the worker's table check is the
backend's ``PROBE_*_TABLE`` statements). ``jobs dead`` cursors are signed with a key derived
from the database URL, so a cursor printed by one invocation pages on in the next one against
the same database (and is worth nothing to anyone without that URL).
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import json
import logging
import signal
import socket
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
from sqlalchemy import MetaData
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._audit import PostgresAuditLog, create_audit_log, ship_audit_table
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_workers_table,
)
from ship_sqla._jobs._tables import RUN_STATES as TABLE_RUN_STATES
from ship_sqla._naming import quoted_table
from ship_sqla._sql_errors import sqlstate_of
from ship_sqla.kernel._errors import ShipError
from ship_sqla.kernel._operations import (
    MANAGE_PERMISSION,
    MAX_DEMAND_JOBS,
    MAX_PAUSED_JOBS,
    JobOperationRefusedError,
    create_job_operations,
)
from ship_sqla.kernel._ports import JobLeaseStaleError
from ship_sqla.kernel._runtime.runtime import start_job_runtime
from ship_sqla.kernel._workflows import CHILDREN_DONE, CHILDREN_WAIT

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from sqlalchemy import Table
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla._jobs import PostgresJobBackend
    from ship_sqla.kernel._audit import AuditEntry
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._operations import CancelResult, JobOperations
    from ship_sqla.kernel._page import Page
    from ship_sqla.kernel._ports import JobDemand, PausedJob, RunRecord, StateCount
    from ship_sqla.kernel._registry import JobRegistry
    from ship_sqla.kernel._runtime.runtime import JobRuntime
    from ship_sqla.kernel._workers import WorkerRecord
    from ship_sqla.kernel._workflows import StepRecord

__all__ = [
    "DEFAULT_RUNS_TABLE",
    "DEFAULT_STATE_TABLE",
    "DEFAULT_WORKERS_TABLE",
    "MAX_STATS_GROUPS",
    "RUN_STATES",
    "JobTables",
    "cli_cursor_secret",
    "format_cancel",
    "format_dead",
    "format_demand",
    "format_paused",
    "format_run",
    "format_stats",
    "format_workers",
    "job_stats",
    "job_tables",
    "record_dict",
    "run_operation",
    "run_worker",
    "worker_dict",
]

RUN_STATES: Final = TABLE_RUN_STATES
"""The states ``jobs stats`` counts, in its column order: the runs table's own."""
MAX_STATS_GROUPS: Final = 6000
"""(job, state) groups read by ``jobs stats``: 1000 jobs of six states."""

DEFAULT_RUNS_TABLE: Final = "ship_job_runs"
DEFAULT_STATE_TABLE: Final = "ship_job_state"
DEFAULT_WORKERS_TABLE: Final = "ship_job_workers"

T = TypeVar("T")


@attrs.frozen
class JobTables:
    """The job tables the commands work on: the defaults, or what the operator named."""

    runs: Table
    state: Table
    workers: Table

    @property
    def runs_name(self) -> str:
        """The runs table's quoted, schema-qualified name, for messages."""
        return quoted_table(self.runs)

    @property
    def workers_name(self) -> str:
        """The workers table's quoted, schema-qualified name, for messages."""
        return quoted_table(self.workers)

    @property
    def names(self) -> str:
        """Both tables' quoted, schema-qualified names, for messages."""
        return f"{self.runs_name} and {quoted_table(self.state)}"


def job_tables(
    *,
    runs: str = DEFAULT_RUNS_TABLE,
    state: str = DEFAULT_STATE_TABLE,
    schema: str | None = None,
    workers: str = DEFAULT_WORKERS_TABLE,
) -> JobTables:
    """The tables ``create_job_backend`` gets, built by the same factories as the application's
    (so their index names match); a name too long for them raises ``ConfigurationError``."""
    metadata = MetaData()
    return JobTables(
        runs=ship_job_runs_table(metadata, name=runs, schema=schema),
        state=ship_job_state_table(metadata, name=state, schema=schema),
        workers=ship_job_workers_table(metadata, name=workers, schema=schema),
    )


DEFAULT_TABLES: Final = job_tables()


def _operator_at_the_shell(permission: str, operation: str) -> bool:  # noqa: ARG001 - all allowed
    """The CLI's authorizer: the operator holding the database URL is trusted (see module doc)."""
    return permission == MANAGE_PERMISSION


def _engine(url: URL) -> AsyncEngine:
    return create_async_engine(url, poolclass=NullPool)


def cli_cursor_secret(url: URL) -> bytes:
    """The key the shell's operator pages are signed with: derived from the database URL
    (password included), so every invocation against one database accepts the others' cursors;
    whoever could forge one holds the URL, and so every row, already."""
    raw = url.render_as_string(hide_password=False).encode()
    return hashlib.sha256(b"ship_sqla.cli.cursor\x00" + raw).digest()


async def run_operation(
    url: URL,
    operation: Callable[[JobOperations], Awaitable[T]],
    tables: JobTables = DEFAULT_TABLES,
) -> T:
    """Run one J8 operation against ``tables`` at ``url``, then dispose."""
    engine = _engine(url)
    try:
        backend = create_job_backend(
            database=engine,
            table=tables.runs,
            state_table=tables.state,
            workers_table=tables.workers,
        )
        ops = create_job_operations(
            backend,
            authorizer=_operator_at_the_shell,
            cursor_secret=cli_cursor_secret(url),
            audit=_audit_log(engine, tables),
            actor=cli_actor(),
        )
        return await operation(ops)
    finally:
        await engine.dispose()


def cli_actor() -> str:
    """Who the audit log names for the shell: ``cli:<login>@<host>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


class _AuditIfPresent:
    """S1 for the shell's verbs: the operator audit log (``ship_audit`` beside the runs table)
    records every state-changing verb when the database has it; on a database without it (it
    is created by ``ship-sqla schema apply``, or ``ship_audit_table`` in the migrations) the
    verb still runs, unaudited. Nothing is asked of the database before the verb's own input
    checks (bad input stays exit 2, whatever the server)."""

    __slots__ = ("_log",)

    def __init__(self, log: PostgresAuditLog) -> None:
        self._log = log

    async def record(self, entry: AuditEntry) -> None:
        try:
            await self._log.record(entry)
        except DBAPIError as exc:
            if sqlstate_of(exc) != "42P01":
                raise


def _audit_log(engine: AsyncEngine, tables: JobTables) -> _AuditIfPresent:
    return _AuditIfPresent(
        create_audit_log(
            database=engine, table=ship_audit_table(MetaData(), schema=tables.runs.schema)
        )
    )


async def job_stats(
    url: URL, tables: JobTables = DEFAULT_TABLES
) -> tuple[list[dict[str, Any]], bool]:
    """Per job: counts by state and the age in seconds of its oldest due waiting run; and
    whether more than :data:`MAX_STATS_GROUPS` groups exist (the rest are not shown)."""

    async def counts(ops: JobOperations) -> list[StateCount]:
        return await ops.state_counts(limit=MAX_STATS_GROUPS + 1)

    groups = await run_operation(url, counts, tables)
    truncated = len(groups) > MAX_STATS_GROUPS
    jobs: dict[str, dict[str, Any]] = {}
    for group in groups[:MAX_STATS_GROUPS]:
        entry = jobs.setdefault(
            group.job_id,
            {"job_id": group.job_id, **dict.fromkeys(RUN_STATES, 0), "oldest_due_seconds": None},
        )
        entry[group.state] = group.runs
        if group.oldest_due_age is not None:
            entry["oldest_due_seconds"] = round(group.oldest_due_age, 3)
    return list(jobs.values()), truncated


def _jsonable(value: Any) -> Any:  # noqa: ANN401 - any RunRecord field
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def record_dict(record: RunRecord) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in attrs.asdict(record, recurse=False).items()}


def _waits_for(wait_for: str | None) -> str:
    if wait_for is None or wait_for == CHILDREN_DONE:
        return "-"
    if wait_for == CHILDREN_WAIT:
        return "its child runs"
    name, _, key = wait_for.partition("\x1f")
    return f"event {name} [{key}]"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _first_line(error: str | None, width: int = 60) -> str:
    if not error:
        return "-"
    line = error.splitlines()[0]
    return line if len(line) <= width else f"{line[: width - 1]}…"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    body = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body
    )


def format_dead(page: Page[RunRecord]) -> str:
    if not page.items:
        return "no dead runs."
    lines = _table(
        ("RUN_ID", "JOB", "ATTEMPTS", "FINISHED_AT", "LAST_ERROR"),
        (
            (
                r.run_id,
                r.job_id,
                f"{r.attempt}/{r.max_attempts}",
                _when(r.finished_at),
                _first_line(r.last_error),
            )
            for r in page.items
        ),
    )
    more = "" if page.next_cursor is None else f"\nmore: --cursor {page.next_cursor}"
    return f"{lines}\n{len(page.items)} dead run(s).{more}"


def step_dict(step: StepRecord) -> dict[str, Any]:
    """A stored workflow step as ``jobs show --json`` prints it (D6)."""
    return {
        "name": step.name,
        "seq": step.seq,
        "kind": step.kind,
        "state": step.state,
        "result": step.result,
        "wake_at": _jsonable(step.wake_at),
        "event": None if step.event_name is None else [step.event_name, step.event_key],
        "created_at": _jsonable(step.created_at),
        "finished_at": _jsonable(step.finished_at),
    }


def format_steps(steps: Sequence[StepRecord]) -> str:
    """A workflow run's stored steps, one line each, in handler order (D6)."""
    lines = [f"steps ({len(steps)}):"]
    for step in steps:
        if step.state == "done":
            detail = f"done at {_when(step.finished_at)}"
        elif step.kind == "event":
            detail = f"waiting for {step.event_name} [{step.event_key}] until {_when(step.wake_at)}"
        elif step.kind == "sleep":
            detail = f"sleeping until {_when(step.wake_at)}"
        else:
            detail = "waiting for its child runs"
        lines.append(f"  {step.seq}. {step.name} ({step.kind}): {detail}")
    return "\n".join(lines)


def format_run(record: RunRecord) -> str:
    fields = [
        ("run", record.run_id),
        ("job", record.job_id),
        ("state", record.state),
        ("attempts", attempts_used(record)),
        ("snoozes", str(record.snoozes)),
        ("key", record.key or "-"),
        ("dedupe_key", record.dedupe_key or "-"),
        ("run_at", _when(record.run_at)),
        ("created_at", _when(record.created_at)),
        ("updated_at", _when(record.updated_at)),
        ("finished_at", _when(record.finished_at)),
        ("lease_expires_at", _when(record.lease_expires_at)),
        ("cancel_requested", _when(record.cancel_requested_at)),
        ("parent", record.parent_id or "-"),
        ("waits_for", _waits_for(record.wait_for)),
        ("last_error", record.last_error or "-"),
        ("payload", json.dumps(record.payload, sort_keys=True)),
    ]
    lines = [f"{name + ':':<18}{value}" for name, value in fields]
    lines.append(f"history ({len(record.history)}):")
    for entry in record.history:
        if isinstance(entry, dict):
            kind = f" [{entry['kind']}]" if "kind" in entry else ""
            lines.append(
                f"  attempt {entry.get('attempt')}{kind} at {entry.get('at')}: {entry.get('error')}"
            )
        else:
            lines.append(f"  {entry}")
    return "\n".join(lines)


def format_cancel(result: CancelResult) -> str:
    """What ``jobs cancel`` did, in one line (K2)."""
    record = result.record
    run = f"run {record.run_id} ({record.job_id})"
    if result.outcome == "cancelled":
        return f"{run} is cancelled; it will not run."
    if result.outcome == "requested":
        return (
            f"{run} is running: cancel requested. Its worker cancels the handler (at once when"
            " it listens, else at its next heartbeat) and the run ends cancelled."
        )
    return f"{run} had already finished ({record.state}): nothing changed."


def format_demand(demands: Sequence[JobDemand]) -> str:
    """``jobs demand`` as a table; a count that reached the cap is marked ``+``."""
    if not demands:
        return "no jobs with waiting or running runs."

    def count(value: int, cap: int) -> str:
        return f"{value}+" if value >= cap else str(value)

    return _table(
        ("JOB", "DUE", "DELAYED", "RUNNING", "OLDEST_DUE_S"),
        (
            (
                d.job_id,
                count(d.due, d.cap),
                count(d.delayed, d.cap),
                count(d.running, d.cap),
                "-" if d.oldest_due_age is None else f"{d.oldest_due_age:.1f}",
            )
            for d in demands
        ),
    )


def worker_dict(record: WorkerRecord) -> dict[str, Any]:
    """One registry entry for ``ship-sqla workers --json`` (F6)."""
    return {k: _jsonable(v) for k, v in attrs.asdict(record, recurse=False).items()}


def format_workers(records: Sequence[WorkerRecord]) -> str:
    """``ship-sqla workers`` as a table (F6); the fleet's queue sampler (F5) is marked."""
    if not records:
        return "no workers registered."
    table = _table(
        (
            "WORKER",
            "HOST",
            "PID",
            "STARTED_AT",
            "LAST_SEEN_AT",
            "IN_FLIGHT",
            "STATE",
            "SAMPLER",
            "JOBS",
        ),
        (
            (
                r.worker_id,
                r.host,
                str(r.pid),
                _when(r.started_at),
                _when(r.last_seen_at),
                str(r.in_flight),
                "draining" if r.draining else "running",
                "yes" if r.sampler else "-",
                _first_line(", ".join(r.job_ids)),
            )
            for r in records
        ),
    )
    return f"{table}\n{len(records)} worker(s)."


def format_paused(paused: Sequence[PausedJob]) -> str:
    if not paused:
        return "no paused jobs."
    return _table(("JOB", "PAUSED_AT"), ((p.job_id, _when(p.paused_at)) for p in paused))


def format_stats(jobs: Sequence[dict[str, Any]]) -> str:
    if not jobs:
        return "no runs."
    return _table(
        ("JOB", *(s.upper() for s in RUN_STATES), "OLDEST_DUE_S"),
        (
            (
                j["job_id"],
                *(str(j[s]) for s in RUN_STATES),
                "-" if j["oldest_due_seconds"] is None else f"{j['oldest_due_seconds']:.1f}",
            )
            for j in jobs
        ),
    )


class RunNotFoundError(ShipError, LookupError):
    """No run has the id an operator command named (exit 1)."""

    code = "SHIP_SQLA_RUN_NOT_FOUND"


def not_found(run_id: str, tables: JobTables = DEFAULT_TABLES) -> RunNotFoundError:
    return RunNotFoundError(
        f"no such run {run_id!r} in {tables.runs_name}.",
        fix="pass the id of an existing run (`ship-sqla jobs dead` lists the dead ones); name"
        " tables created under other names with --runs-table and --schema.",
    )


_CLI_WORDS: Final = (("list_dead", "`ship-sqla jobs dead`"),)
"""The operator surface's Python names that its messages may carry, and the CLI's verbs."""


def in_cli_words(error: JobOperationRefusedError) -> JobOperationRefusedError:
    """``error`` with the Python method names of its message and fix replaced by CLI verbs."""
    message, fix = error.message, error.fix
    for python, verb in _CLI_WORDS:
        message = message.replace(python, verb)
        fix = None if fix is None else fix.replace(python, verb)
    return JobOperationRefusedError(message, fix=fix)


async def run_operation_on_run(
    url: URL,
    run_id: str,
    operation: Callable[[JobOperations], Awaitable[T]],
    tables: JobTables = DEFAULT_TABLES,
) -> T:
    """:func:`run_operation` for an operation on one run: a refusal of a run that does not
    exist is :class:`RunNotFoundError` ("no such run"), any other is said in CLI words."""

    async def guarded(ops: JobOperations) -> T:
        try:
            return await operation(ops)
        except JobOperationRefusedError as exc:
            if await ops.get_run(run_id) is None:
                raise not_found(run_id, tables) from exc
            raise in_cli_words(exc) from exc

    return await run_operation(url, guarded, tables)


def attempts_used(record: RunRecord) -> str:
    """How ``jobs show``, ``retry`` and ``rerun`` all say a run's attempts: started of allowed."""
    return f"{record.attempt} of {record.max_attempts} used"


worker_log = logging.getLogger("ship_sqla.worker")
"""The command's own lines (started, stopping, absorbed errors); the runs' lines are the
runtime's, on ``ship_sqla.jobs`` (S3)."""

EXIT_INTERRUPTED: Final = 130
"""The shell's code for a process ended by SIGINT (128 + 2): ``ship-sqla worker`` exits with it
after the drain a Ctrl-C started; SIGTERM (a deployment's stop) exits 0."""

BURST_IDLE_CHECKS: Final = 2
"""``--burst`` stops after this many checks in a row found nothing due and nothing in flight:
one check could fall between a claim's answer and its runs' start."""


def _report_error(error: BaseException) -> None:
    """The worker's on_error (J11): every absorbed error is one ERROR line, with its code and
    fix. A stale settle is DEBUG here: the runtime's own WARNING line for it (event "stale")
    already names the run."""
    level = logging.DEBUG if isinstance(error, JobLeaseStaleError) else logging.ERROR
    worker_log.log(level, "absorbed %s: %s", type(error).__name__, error)


async def _check_tables(engine: AsyncEngine, backend: PostgresJobBackend) -> None:
    """Fail at start, not in the loop (which would retry forever), when the tables are absent."""
    statements = backend.statements
    for probe in (statements.probe_runs_table, statements.probe_state_table):
        async with engine.connect() as connection:
            await connection.execute(probe)


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
    tables: JobTables = DEFAULT_TABLES,
    summary_interval: float | None = None,
    burst: bool = False,
) -> int:
    """Execute ``jobs``' runs until SIGTERM or SIGINT (or, with ``burst``, until nothing is due
    and nothing in flight), then stop claiming and drain (J12). The exit code: 130 after a
    SIGINT, else 0."""
    engine = create_async_engine(url)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[int] = []

    def on_signal(number: int) -> None:
        received.append(number)
        stop.set()

    signals = (signal.SIGTERM, signal.SIGINT)
    # Installed before the runtime starts, so a signal is never the default (abrupt) exit once
    # a run may be executing.
    for number in signals:
        loop.add_signal_handler(number, on_signal, number)
    try:
        backend = create_job_backend(
            database=engine,
            table=tables.runs,
            state_table=tables.state,
            poll_interval=poll_interval,
            max_in_flight=max_in_flight,
            on_error=_report_error,
            workers_table=tables.workers,
        )
        await _check_tables(engine, backend)
        runtime = await start_job_runtime(
            jobs,
            backend=backend,
            mode="worker",
            drain_timeout=drain_timeout,
            summary_interval=summary_interval,
        )
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
                await _until_idle(backend, runtime, stop, [d.id for d in jobs], poll_interval)
            else:
                await stop.wait()
            worker_log.info("stopping: draining for up to %gs.", drain_timeout)
        finally:
            await runtime.stop()
        worker_log.info("stopped.")
    finally:
        for number in signals:
            loop.remove_signal_handler(number)
        await engine.dispose()
    return EXIT_INTERRUPTED if signal.SIGINT in received else 0


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
