"""``ship-sqla enqueue``: one run from the shell.

A run stores, besides its payload, what its job's definition decides at enqueue time: the
attempt budget (``retry.attempts``), the default priority, the dedupe key of an idempotency
policy, the single-runner key (``Concurrency.key``) and the payload's validation by its codec.
So the command enqueues in one of two ways:

- ``--registry APP:REGISTRY``: through the application's own definition of the job, exactly as
  ``backend.enqueue`` in the application would (its codec validates the JSON payload);
- without it, the job need not be importable: a stand-in definition with the job id, the JSON
  payload as given, ``--max-attempts`` (default: ``RetryPolicy``'s, 5), ``--priority`` (default
  0), no dedupe key but ``--dedupe-key``, the single-runner key ``--key`` when given, and,
  with ``--partition-key``, a job whose limits are per partition key (F8/F9). The
  worker runs the run with its real definition; only these enqueue-time values come from the
  stand-in, and the command prints them.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from ship_sqla._cli._database import command_engine, run_jobs_call
from ship_sqla._cli._exits import OperationFailedError
from ship_sqla._cli._options import (
    OPERATOR_NOTE,
    database_url_option,
    job_tables_options,
    json_option,
    tenant_option,
)
from ship_sqla._cli._params import REGISTRY, AnyParamType, Duration
from ship_sqla._cli._serving import Serving, serving, unserved_warning
from ship_sqla._outbox._admin import MAX_RETENTION
from ship_sqla.kernel._errors import ConfigurationError, InvalidPayloadError
from ship_sqla.kernel._jobs import Concurrency, RateLimit, RetryPolicy, define_job
from ship_sqla.kernel._keys import InvalidKeyError
from ship_sqla.kernel._priority import MAX_PRIORITY, MIN_PRIORITY, InvalidPriorityError
from ship_sqla.kernel._registry import UnknownJobError
from ship_sqla.kernel._tenancy import tenant_ambient

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ship_sqla._cli._tables import JobTables
    from ship_sqla.kernel._jobs import JobDefinition
    from ship_sqla.kernel._ports import EnqueueResult
    from ship_sqla.kernel._registry import JobRegistry
    from ship_sqla.kernel._workers import WorkerRecord

__all__ = ["DEFAULT_MAX_ATTEMPTS", "enqueue", "enqueue_run", "stand_in_job"]

DEFAULT_MAX_ATTEMPTS: Final = RetryPolicy().attempts


class RunAt(AnyParamType):
    """When a run is due: an ISO-8601 time with its offset (``2030-01-01T09:00:00+02:00``,
    ``...Z``), or ``+`` and a duration from now on this machine's clock (``+90s``, ``+10m``)."""

    name = "TIME"

    def convert(
        self,
        value: Any,  # noqa: ANN401 - click's signature
        param: click.Parameter | None,
        ctx: click.Context | None,
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        if text.startswith("+"):
            offset = Duration(maximum=MAX_RETENTION, allow_zero=True).convert(text[1:], param, ctx)
            return datetime.now(UTC) + offset
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is not a time; write ISO-8601 with an offset, like"
                " 2030-01-01T09:00:00Z, or a delay from now, like +10m.",
                param,
                ctx,
            )
        if when.tzinfo is None:
            self.fail(
                f"{text!r} has no UTC offset; add one (Z, +02:00) so the time is not guessed.",
                param,
                ctx,
            )
        return when


def _json_payload(_ctx: click.Context, _param: click.Parameter, value: str) -> Any:  # noqa: ANN401
    """``--payload``: JSON text, ``@FILE`` or ``-`` (stdin); bad JSON is bad input (exit 2)."""
    source = "the option"
    if value == "-":
        value, source = sys.stdin.read(), "stdin"
    elif value.startswith("@"):
        path = Path(value[1:])
        try:
            value, source = path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise click.BadParameter(f"cannot read {path}: {exc.strerror}.") from exc
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"the payload from {source} is not JSON ({exc.msg} at line {exc.lineno} column"
            f' {exc.colno}); quote it for the shell, e.g. --payload \'{{"to": "a@b.c"}}\'.'
        ) from exc


_STAND_IN_RATE: Final = RateLimit(1, 1.0, partition="key")
"""The stand-in's mark of a job partitioned by key (``--partition-key``); never enforced here."""


async def _never_run_here(_ctx: object, _payload: object) -> None:
    """The stand-in's handler: the CLI process enqueues only; a worker runs the real one."""
    msg = "the ship-sqla enqueue stand-in job is never executed"
    raise RuntimeError(msg)


def stand_in_job(
    job_id: str, *, max_attempts: int, key: str | None, partition_key: str | None = None
) -> JobDefinition[Any]:
    """The definition ``enqueue`` uses without ``--registry`` (see the module docstring); a bad
    job id raises ``ConfigurationError``. With ``partition_key`` it is a job whose limits are
    per partition key (F8/F9), so the enqueue stores the key; the stand-in's limit itself is
    never used (the worker claims with the job's own definition)."""
    concurrency = (
        Concurrency(single_runner=True, key=lambda _payload: key) if key is not None else None
    )
    rate_limit = None if partition_key is None else _STAND_IN_RATE
    return define_job(
        job_id,
        _never_run_here,
        concurrency=concurrency,
        retry=RetryPolicy(attempts=max_attempts),
        rate_limit=rate_limit,
    )


async def enqueue_run(
    url: URL,
    job: JobDefinition[Any],
    payload: object,
    *,
    tables: JobTables,
    run_at: datetime | None,
    dedupe_key: str | None,
    priority: int | None,
    tenant: str | None,
    partition_key: str | None = None,
    check_served: bool = False,
) -> tuple[EnqueueResult, Serving | None]:
    """Enqueue one run of ``job`` at ``url`` (a committed enqueue wakes listening workers, K1),
    then dispose; with ``check_served``, also what the worker registry says of the job's live
    workers (None: not asked, or no workers table)."""
    async with command_engine(url) as engine:
        backend = await tables.backend(engine)
        with tenant_ambient(tenant):
            result = await backend.enqueue(
                job,
                payload,
                run_at=run_at,
                dedupe_key=dedupe_key,
                priority=priority,
                partition_key=partition_key,
            )
        if not check_served:
            return result, None

        async def list_workers(limit: int) -> list[WorkerRecord]:
            return await backend.workers.list_workers(limit=limit)

        return result, await serving(list_workers)


def _registered_job(
    registry: JobRegistry,
    job_id: str,
    payload: Any,  # noqa: ANN401 - JSON
) -> tuple[JobDefinition[Any], Any]:
    """JOB's definition in ``registry`` and the payload decoded by it, as a worker will: a job
    the registry lacks, or a payload it refuses, is bad input (exit 2)."""
    try:
        definition = registry.get(job_id)
    except UnknownJobError as exc:
        raise click.BadParameter(
            f"{job_id!r} is not in that registry; it has:"
            f" {', '.join(sorted(d.id for d in registry))}.",
            param_hint="JOB",
        ) from exc
    try:
        # The JSON as the job's payload type, as a worker will decode it: validated here.
        return definition, definition.decode(payload)
    except Exception as exc:  # any codec's refusal is bad input (exit 2)
        raise click.BadParameter(
            f"job {job_id} refuses the payload: {exc}", param_hint="--payload"
        ) from exc


def _job_to_enqueue(
    job_id: str,
    payload: Any,  # noqa: ANN401 - JSON
    *,
    registry: JobRegistry | None,
    max_attempts: int | None,
    key: str | None,
    partition_key: str | None = None,
) -> tuple[JobDefinition[Any], Any]:
    """The definition the run is enqueued through (see the module docstring), and its payload."""
    if registry is not None:
        if max_attempts is not None or key is not None:
            raise click.UsageError(
                "--max-attempts and --key are for the stand-in job; with --registry the job's"
                " definition decides them."
            )
        return _registered_job(registry, job_id, payload)
    try:
        definition = stand_in_job(
            job_id,
            max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
            key=key,
            partition_key=partition_key,
        )
    except ConfigurationError as exc:
        raise click.BadParameter(f"{exc.message} Fix: {exc.fix}", param_hint="JOB") from exc
    return definition, payload


def _print_enqueued(
    result: EnqueueResult,
    job_id: str,
    definition: JobDefinition[Any],
    *,
    dedupe_key: str | None,
    run_at: datetime | None,
    as_json: bool,
    served: Serving | None,
) -> None:
    warning = unserved_warning(served, job_id)
    if warning is not None and result.run_id is not None and not result.deduplicated:
        click.echo(warning, err=True)
    if as_json:
        body = {
            "run_id": result.run_id,
            "deduplicated": result.deduplicated,
            "rejected": result.rejected,
            "job_id": job_id,
            "max_attempts": definition.retry.attempts,
            "live_workers_serving": None if served is None else served.workers_for(job_id),
        }
        click.echo(json.dumps(body, indent=2))
    elif result.rejected is not None:
        raise OperationFailedError(
            f"job {job_id}'s queue is full ({result.rejected}): nothing was enqueued."
        )
    elif result.deduplicated:
        click.echo(
            f"run {result.run_id} of {job_id} already holds dedupe key {dedupe_key!r}:"
            " nothing was enqueued (J1)."
        )
    else:
        due = "now" if run_at is None else run_at.isoformat()
        click.echo(
            f"enqueued run {result.run_id} of {job_id}, due {due},"
            f" {definition.retry.attempts} attempt(s)."
        )


@click.command(short_help="Enqueue one run of a job, from the shell.", epilog=OPERATOR_NOTE)
@click.argument("job_id", metavar="JOB")
@click.option(
    "--payload",
    callback=_json_payload,
    default="{}",
    show_default=True,
    help="The payload as JSON text, @FILE, or - for stdin.",
)
@click.option("--run-at", type=RunAt(), help="When it is due: 2030-01-01T09:00:00Z or +10m.")
@click.option("--dedupe-key", help="J1: no second waiting or running run with this key.")
@click.option(
    "--priority",
    type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY),
    help="K6: -10..10, higher first (default: the job's).",
)
@click.option("--tenant", metavar="TENANT", callback=tenant_option, help="F2: the run's tenant.")
@click.option(
    "--partition-key",
    metavar="KEY",
    default=None,
    help="F8/F9: the run's partition key, for a job whose limits are per partition key"
    " (RateLimit or Concurrency with partition='key').",
)
@click.option(
    "--registry",
    type=REGISTRY,
    default=None,
    help="Enqueue through the application's definition of JOB (APP:REGISTRY): its attempts,"
    " priority, dedupe policy, single-runner key and payload type. Without it a stand-in"
    " with the options below is used.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=None,
    help=f"Without --registry: the run's attempts (default {DEFAULT_MAX_ATTEMPTS}, the"
    " RetryPolicy default).",
)
@click.option(
    "--key",
    default=None,
    help="Without --registry: the single-runner key of a single-runner job ('' for one"
    " without a key).",
)
@database_url_option
@job_tables_options(with_state_table=False, with_workers_table=True)
@json_option
def enqueue(
    *,
    job_id: str,
    payload: Any,  # noqa: ANN401 - JSON
    run_at: datetime | None,
    dedupe_key: str | None,
    priority: int | None,
    tenant: str | None,
    partition_key: str | None,
    registry: JobRegistry | None,
    max_attempts: int | None,
    key: str | None,
    database_url: URL,
    tables: JobTables,
    as_json: bool,
) -> None:
    """Enqueue one run of JOB with a JSON payload; a worker running JOB executes it. JOB need
    not be importable here: without --registry the run gets --max-attempts (default 5, the
    RetryPolicy default), --priority (default 0), --dedupe-key and --key as given, and the
    payload as given; with --registry APP:REGISTRY the job's own definition decides them and
    validates the payload, as the application's enqueue would. Exit 2 for a payload or option
    the job refuses. Without --registry, when workers are live (the worker registry,
    --workers-table) and none of them serves JOB, a warning on stderr says so, naming the jobs
    they serve (a mistyped id would wait forever); the run is enqueued all the same."""
    definition, payload = _job_to_enqueue(
        job_id,
        payload,
        registry=registry,
        max_attempts=max_attempts,
        key=key,
        partition_key=partition_key,
    )
    call = enqueue_run(
        database_url,
        definition,
        payload,
        tables=tables,
        run_at=run_at,
        dedupe_key=dedupe_key,
        priority=priority,
        tenant=tenant,
        partition_key=partition_key,
        check_served=registry is None,
    )
    try:
        result, served = run_jobs_call(database_url, call, tables=tables.runs_name, as_json=as_json)
    except (InvalidPayloadError, InvalidKeyError, InvalidPriorityError) as exc:
        raise click.UsageError(str(exc)) from exc
    _print_enqueued(
        result,
        job_id,
        definition,
        dedupe_key=dedupe_key,
        run_at=run_at,
        as_json=as_json,
        served=served,
    )
