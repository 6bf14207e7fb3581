"""The ``ship-sqla`` command line (also ``python -m ship_sqla``).

Tables for people, ``--json`` for scripts. Exit codes are part of the interface:

- 0: success (for ``schema check``: the database matches the metadata);
- 1: the check found differences, or the operation failed (a run that does not exist, a
  missing table); the message on stderr says what happened and the fix. A database that is
  down or unreachable is ``SHIP_SQLA_DATABASE_UNAVAILABLE: <what failed and why> (database
  <url without password>). Fix: ...``, whatever the driver raised;
- 2: bad input: a usage error, a malformed option, a ``MODULE:ATTR`` that cannot be loaded;
- 130: interrupted by Ctrl-C (SIGINT); the worker drains first.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import logging
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar, cast

import attrs
import click
from sqlalchemy import MetaData
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._cli_enqueue import DEFAULT_MAX_ATTEMPTS, enqueue_run, stand_in_job
from ship_sqla._cli_jobs import (
    DEFAULT_RUNS_TABLE,
    DEFAULT_STATE_TABLE,
    DEFAULT_WORKERS_TABLE,
    MAX_STATS_GROUPS,
    JobTables,
    attempts_used,
    format_cancel,
    format_dead,
    format_demand,
    format_paused,
    format_run,
    format_stats,
    format_steps,
    format_workers,
    job_stats,
    job_tables,
    not_found,
    record_dict,
    run_operation,
    run_operation_on_run,
    run_worker,
    step_dict,
    worker_dict,
)
from ship_sqla._cli_logging import LOG_FORMATS, LOG_LEVELS, LogFormat, configure_logging
from ship_sqla._cli_outbox import purge_delivered
from ship_sqla._jobs._demand_app import demand_document
from ship_sqla._naming import MAX_IDENTIFIER_BYTES
from ship_sqla._outbox._admin import MAX_RETENTION
from ship_sqla._outbox._store import check_outbox_id
from ship_sqla._schema_apply import (
    COMPONENTS,
    ShipTableNames,
    apply_ship_schema,
    ship_tables_metadata,
)
from ship_sqla._schema_check import SchemaCheckError, check_schema
from ship_sqla._schema_sql import schema_sql
from ship_sqla._server import NoServerError, clean_embedded, embedded_dir, to_async_url
from ship_sqla._sql_errors import database_outage_translated
from ship_sqla.kernel._durations import (
    MAX_DRAIN_TIMEOUT,
    MAX_POLL_INTERVAL,
    MAX_SAMPLE_INTERVAL,
    require_duration,
)
from ship_sqla.kernel._errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    InvalidCursorError,
    ShipError,
    TenantViolationError,
)
from ship_sqla.kernel._jobs import InvalidPayloadError, JobDefinition
from ship_sqla.kernel._keys import InvalidKeyError
from ship_sqla.kernel._operations import (
    DEFAULT_DEMAND_CAP,
    MAX_CLEANUP_BATCH,
    MAX_DEMAND_CAP,
    MAX_PAGE_LIMIT,
    MAX_PAUSED_JOBS,
)
from ship_sqla.kernel._priority import MAX_PRIORITY, MIN_PRIORITY, InvalidPriorityError
from ship_sqla.kernel._registry import JobRegistry, UnknownJobError
from ship_sqla.kernel._tenancy import check_tenant
from ship_sqla.kernel._workers import MAX_WORKERS_LISTED
from ship_sqla.kernel._workflows import WorkflowsNotConfiguredError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from sqlalchemy import Table
    from sqlalchemy.engine import URL

    from ship_sqla._schema_apply import ApplyReport
    from ship_sqla._schema_check import SchemaReport
    from ship_sqla.kernel._operations import CancelResult, JobOperations, PauseResult
    from ship_sqla.kernel._page import Page
    from ship_sqla.kernel._ports import JobDemand, PausedJob, RunRecord
    from ship_sqla.kernel._workers import WorkerRecord
    from ship_sqla.kernel._workflows import StepRecord

if TYPE_CHECKING:
    _AnyParamType = click.ParamType[Any]
else:  # click < 8.4's ParamType is not generic at runtime
    _AnyParamType = click.ParamType

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "cli", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

T = TypeVar("T")

DATABASE_URL_ENV = "SHIP_SQLA_DATABASE_URL"
RUNS_TABLE_ENV = "SHIP_SQLA_JOB_RUNS_TABLE"
STATE_TABLE_ENV = "SHIP_SQLA_JOB_STATE_TABLE"
WORKERS_TABLE_ENV = "SHIP_SQLA_JOB_WORKERS_TABLE"
SCHEMA_ENV = "SHIP_SQLA_JOB_SCHEMA"
OUTBOX_TABLE_ENV = "SHIP_SQLA_OUTBOX_TABLE"
OUTBOX_SCHEMA_ENV = "SHIP_SQLA_OUTBOX_SCHEMA"
DEMO_MODULE = "ship_sqla._demo"


class OperationFailedError(click.ClickException):
    """Exit 1 with ``Error: <message>`` on stderr."""

    exit_code = EXIT_FAILED


class _ShipGroup(click.Group):
    """Turns ship errors raised by any command into exit codes: ConfigurationError is bad input
    (2), any other ShipError a failed operation (1). Both print the error's code, what happened
    and the fix; neither prints a traceback."""

    def invoke(self, ctx: click.Context) -> Any:  # noqa: ANN401 - click's signature
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # click's own answer is "Aborted!" and 1; the shell's convention is 130.
            click.echo("ship-sqla: interrupted (Ctrl-C).", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except ConfigurationError as exc:
            raise click.UsageError(str(exc), ctx) from exc
        except ShipError as exc:
            raise OperationFailedError(str(exc)) from exc


class ObjectReference(_AnyParamType):
    """``module:attr`` (``attr`` may be dotted) naming an object of ``expected`` type.

    The current directory is importable, as it is for ``python -m``, so ``ship-sqla`` finds the
    application's modules from its project root. Every failure is a usage error (exit 2).
    """

    name = "MODULE:ATTR"

    def __init__(self, expected: type[Any], what: str, example: str) -> None:
        self.expected = expected
        self.what = what
        self.example = example

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        if isinstance(value, self.expected):
            return value
        found = self._load(value, param, ctx)
        if not isinstance(found, self.expected):
            self.fail(
                f"{value} is a {type(found).__name__}, not a {self.what}"
                f" ({self.expected.__module__}.{self.expected.__qualname__}).",
                param,
                ctx,
            )
        return found

    def _load(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        module_name, _, attribute = str(value).partition(":")
        if not module_name or not attribute:
            self.fail(
                f"{value!r} is not MODULE:ATTR; name the {self.what} like {self.example}.",
                param,
                ctx,
            )
        module = self._import(module_name, param, ctx)
        found: Any = module
        for part in attribute.split("."):
            try:
                found = getattr(found, part)
            except AttributeError:
                public = sorted(n for n in vars(module) if not n.startswith("_"))
                self.fail(
                    f"module {module_name!r} has no attribute {attribute!r}"
                    f" (it defines: {', '.join(public[:20]) or 'nothing public'}).",
                    param,
                    ctx,
                )
        return found

    def _import(
        self, module_name: str, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:  # noqa: ANN401 - a module
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (
                module_name == exc.name or module_name.startswith(f"{exc.name}.")
            ):
                self.fail(
                    f"module {module_name!r} was not found (searched from {cwd} and the"
                    " installed packages); run from the project root or install the project.",
                    param,
                    ctx,
                )
            self.fail(
                f"importing {module_name!r} failed: it imports {exc.name!r}, which is not"
                " installed.",
                param,
                ctx,
            )
        except Exception as exc:  # noqa: BLE001 - any import-time error is the user's input problem
            self.fail(f"importing {module_name!r} raised {type(exc).__name__}: {exc}", param, ctx)


class DatabaseUrl(_AnyParamType):
    """A PostgreSQL URL; ``postgresql://`` and ``postgres://`` are used through asyncpg."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> URL:  # noqa: ANN401
        try:
            return to_async_url(str(value))
        except (ArgumentError, ValueError) as exc:
            self.fail(f"{value!r} is not a database URL ({exc}).", param, ctx)
        except NoServerError as exc:
            self.fail(exc.message, param, ctx)


class Identifier(_AnyParamType):
    """One PostgreSQL identifier (a table or a schema name), used as given and always quoted.

    A dotted name is refused: ``--schema`` names the schema, so ``app.runs`` is more likely a
    mistake than a table whose name contains a dot.
    """

    name = "NAME"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:  # noqa: ANN401
        text = str(value)
        if not text.strip():
            self.fail(
                f"the {self.what} name is empty; name one, or leave the option out.", param, ctx
            )
        if "\x00" in text:
            self.fail(f"the {self.what} name {text!r} contains a NUL character.", param, ctx)
        if "." in text:
            hint = " (pass the schema with --schema)" if self.what == "table" else ""
            self.fail(
                f"{text!r} is a dotted name; give the bare {self.what} name{hint}.", param, ctx
            )
        size = len(text.encode())
        if size > MAX_IDENTIFIER_BYTES:
            self.fail(
                f"the {self.what} name {text!r} is {size} bytes, over PostgreSQL's"
                f" {MAX_IDENTIFIER_BYTES}-byte identifier limit.",
                param,
                ctx,
            )
        return text


_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|[smhd]?)\s*")


class Duration(_AnyParamType):
    """Seconds, or a number with a unit: ``0.5``, ``250ms``, ``3600``, ``90m``, ``12h``, ``7d``;
    converted to a ``timedelta``.

    The one type of every duration option: the value must be finite, positive (or zero where
    ``allow_zero``) and at most ``maximum`` seconds, the bound the library applies to the same
    setting (:func:`ship_sqla.kernel._durations.require_duration`). Anything else, ``nan``,
    ``inf``, ``1e12``, ``-1`` or ``99999999999d``, is bad input (exit 2) naming the option.
    """

    name = "DURATION"

    def __init__(self, *, maximum: float, allow_zero: bool = False) -> None:
        self.maximum = maximum
        self.allow_zero = allow_zero

    def convert(
        self,
        value: Any,  # noqa: ANN401 - click's signature
        param: click.Parameter | None,
        ctx: click.Context | None,
    ) -> timedelta:
        if isinstance(value, timedelta):
            seconds: float = value.total_seconds()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            seconds = value
        else:
            found = _DURATION.fullmatch(str(value))
            if found is None:
                self.fail(
                    f"{value!r} is not a duration; write seconds or a number with a unit ms, s,"
                    " m, h or d, like 0.5, 250ms, 3600, 90m, 12h or 7d.",
                    param,
                    ctx,
                )
            amount, unit = found.groups()
            seconds = float(amount) * _UNITS[unit or "s"]
        option = param.opts[0] if param is not None and param.opts else "the duration"
        try:
            checked = require_duration(
                seconds, option, maximum=self.maximum, allow_zero=self.allow_zero
            )
        except ConfigurationError as exc:
            self.fail(f"{value!r}: {exc.message}", param, ctx)
        return timedelta(seconds=checked)


class OutboxId(_AnyParamType):
    """An ``outbox_id``, checked by the outbox's own rule before any database work: a bad one is
    bad input (exit 2), not a failed operation."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:  # noqa: ANN401
        try:
            return check_outbox_id(value)
        except InvalidKeyError as exc:
            self.fail(exc.message, param, ctx)


METADATA = ObjectReference(MetaData, "SQLAlchemy MetaData", "myapp.db:metadata")

database_url_option = click.option(
    "--database-url",
    type=DatabaseUrl(),
    envvar=DATABASE_URL_ENV,
    show_envvar=True,
    required=True,
    help="PostgreSQL URL, e.g. postgresql://user@host:5432/app (driven through asyncpg).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
metadata_option = click.option(
    "--metadata",
    type=METADATA,
    default=None,
    help="The MetaData holding your tables, as MODULE:ATTR (e.g. myapp.db:metadata); default:"
    " the ship tables, named as the options below say.",
)
table_option = click.option(
    "--table",
    "tables",
    multiple=True,
    metavar="NAME",
    help="Limit to this table (its key in metadata.tables); repeatable.",
)

_Command = TypeVar("_Command", bound="Callable[..., None]")


def _name_option(
    flag: str,
    what: str,
    *,
    envvar: str,
    default: str | None,
    help: str,  # noqa: A002 - click's name for it
    dest: str | None = None,
) -> Callable[[_Command], _Command]:
    """An option naming one table or schema (an :class:`Identifier`), settable from the
    environment; ``dest`` names the command's parameter when the flag's own name will not do."""
    return click.option(
        *((flag, dest) if dest is not None else (flag,)),
        type=Identifier(what),
        envvar=envvar,
        show_envvar=True,
        default=default,
        show_default=default is not None,
        help=help,
    )


runs_table_option = _name_option(
    "--runs-table",
    "table",
    envvar=RUNS_TABLE_ENV,
    default=DEFAULT_RUNS_TABLE,
    help="The job runs table's name, as given to ship_job_runs_table(metadata, name=...).",
)
state_table_option = _name_option(
    "--state-table",
    "table",
    envvar=STATE_TABLE_ENV,
    default=DEFAULT_STATE_TABLE,
    help="The job state table's name (schedules), as given to ship_job_state_table.",
)
workers_table_option = _name_option(
    "--workers-table",
    "table",
    envvar=WORKERS_TABLE_ENV,
    default=DEFAULT_WORKERS_TABLE,
    help="The worker registry's table name (F6), as given to ship_job_workers_table.",
)
schema_option = _name_option(
    "--schema",
    "schema",
    envvar=SCHEMA_ENV,
    default=None,
    help="The schema holding the job tables, as given to the table factories' schema="
    " (default: none, the search_path decides).",
)


def job_tables_options(
    *, with_state_table: bool, with_workers_table: bool = False
) -> Callable[[_Command], _Command]:
    """Adds --runs-table, --schema (and --state-table, --workers-table where the command uses
    those tables) and hands the command ``tables``, a :class:`JobTables`, instead of the
    strings."""

    def decorate(command: _Command) -> _Command:
        @functools.wraps(command)
        def with_tables(
            *args: Any,  # noqa: ANN401 - click's arguments, passed on
            runs_table: str,
            schema: str | None,
            state_table: str = DEFAULT_STATE_TABLE,
            workers_table: str = DEFAULT_WORKERS_TABLE,
            **kwargs: Any,  # noqa: ANN401
        ) -> None:
            tables = _job_tables(runs_table, state_table, schema, workers_table)
            command(*args, tables=tables, **kwargs)

        options = [runs_table_option, state_table_option, workers_table_option, schema_option]
        if not with_state_table:
            options.remove(state_table_option)
        if not with_workers_table:
            options.remove(workers_table_option)
        decorated: Any = with_tables
        for option in reversed(options):
            decorated = option(decorated)
        return cast("_Command", decorated)

    return decorate


def _job_tables(
    runs: str, state: str, schema: str | None, workers: str = DEFAULT_WORKERS_TABLE
) -> JobTables:
    """The tables, or exit 2 naming the option whose name the table factory refused."""
    try:
        job_tables(runs=runs, schema=schema)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--runs-table") from exc
    try:
        job_tables(runs=runs, state=state, schema=schema)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--state-table") from exc
    try:
        return job_tables(runs=runs, state=state, schema=schema, workers=workers)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--workers-table") from exc


@click.group(cls=_ShipGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ship-sqla", prog_name="ship-sqla")
def cli() -> None:
    """ship_sqla operations: schema check and DDL, the demo, workers and job operations.

    Exit codes: 0 success; 1 the check found differences or the operation failed; 2 bad input
    (usage error, malformed option, MODULE:ATTR that cannot be loaded). The database URL may
    come from SHIP_SQLA_DATABASE_URL (a generic DATABASE_URL is not read). 130: interrupted
    (Ctrl-C).
    """


@cli.group(short_help="Create (apply), check (T3) and print (sql) the tables.")
def schema() -> None:
    """Create the ship tables without Alembic (apply), compare the database with the tables'
    metadata (check, T3), or print their DDL (sql). Without --metadata each works on the ship
    tables: the default names, or those the name options give."""


_SHIP_TABLE_NAMES: Final = (
    ("--runs-table", "runs", RUNS_TABLE_ENV, "jobs"),
    ("--state-table", "state", STATE_TABLE_ENV, "jobs"),
    ("--workers-table", "workers", WORKERS_TABLE_ENV, "jobs"),
    ("--steps-table", "steps", None, "workflows"),
    ("--events-table", "events", None, "workflows"),
    ("--outbox-table", "outbox", OUTBOX_TABLE_ENV, "outbox"),
    ("--idempotency-table", "idempotency", None, "idempotency"),
    ("--webhook-events-table", "webhook_events", None, "webhooks"),
    ("--lock-fences-table", "lock_fences", None, "locks"),
)
"""The name options of the ship tables: flag, ShipTableNames field, environment variable (the
one the job and outbox commands read, so apply creates what they look for), component."""


@attrs.frozen
class ShipTablesChoice:
    """The ship tables the name options describe, and which of those options were given on
    the command line (they make no sense with --metadata)."""

    names: ShipTableNames
    schema: str | None
    components: tuple[str, ...]
    given: tuple[str, ...]
    fair_claims: bool = False

    def metadata(self) -> MetaData:
        try:
            return ship_tables_metadata(
                self.names,
                schema=self.schema,
                components=self.components,
                fair_claims=self.fair_claims,
            )
        except ConfigurationError as exc:
            raise click.UsageError(str(exc)) from exc


def ship_tables_options(command: _Command) -> _Command:
    """Adds --only, --schema and the name options; hands the command ``ship_tables``, a
    :class:`ShipTablesChoice`."""

    @functools.wraps(command)
    def with_ship_tables(
        *args: Any,  # noqa: ANN401 - click's arguments, passed on
        only: tuple[str, ...],
        ship_schema: str | None,
        fair_claims: bool,
        **kwargs: Any,  # noqa: ANN401
    ) -> None:
        ctx = click.get_current_context()
        given = [
            flag
            for flag, field, _, _ in _SHIP_TABLE_NAMES
            if ctx.get_parameter_source(f"{field}_table") is click.core.ParameterSource.COMMANDLINE
        ]
        given += [
            flag
            for flag, name in (
                ("--only", "only"),
                ("--schema", "ship_schema"),
                ("--fair-claims", "fair_claims"),
            )
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        ]
        names = ShipTableNames(
            **{field: kwargs.pop(f"{field}_table") for _, field, _, _ in _SHIP_TABLE_NAMES}
        )
        choice = ShipTablesChoice(
            names,
            ship_schema,
            tuple(dict.fromkeys(only)) or COMPONENTS,
            tuple(given),
            fair_claims=fair_claims,
        )
        command(*args, ship_tables=choice, **kwargs)

    decorated: Any = with_ship_tables
    for flag, field, envvar, component in reversed(_SHIP_TABLE_NAMES):
        decorated = click.option(
            flag,
            f"{field}_table",
            type=Identifier("table"),
            envvar=envvar,
            show_envvar=envvar is not None,
            default=getattr(ShipTableNames(), field),
            show_default=True,
            help=f"The name of the {field.replace('_', ' ')} table ({component}).",
        )(decorated)
    decorated = click.option(
        "--fair-claims",
        is_flag=True,
        help="The runs table with the index fair claims read (<runs>_tenant_idx): give it when"
        " a job has fairness= (F2); every waiting run enters that index.",
    )(decorated)
    decorated = click.option(
        "--schema",
        "ship_schema",
        type=Identifier("schema"),
        default=None,
        help="The schema of the ship tables (default: none, the search_path decides); apply"
        " creates it when missing.",
    )(decorated)
    decorated = click.option(
        "--only",
        type=click.Choice(COMPONENTS),
        multiple=True,
        help="Only these ship tables (repeatable): jobs (runs, state, workers), workflows"
        " (steps, events; with jobs), outbox, idempotency, webhooks, locks. Default: all.",
    )(decorated)
    return cast("_Command", decorated)


def _chosen_metadata(metadata: MetaData | None, ship_tables: ShipTablesChoice) -> MetaData:
    """--metadata, or the ship tables; the ship tables' options with --metadata are bad input."""
    if metadata is None:
        return ship_tables.metadata()
    if ship_tables.given:
        raise click.UsageError(
            f"{', '.join(ship_tables.given)} name the ship tables, and --metadata names your own"
            " tables; give one or the other."
        )
    return metadata


def _resolve_tables(metadata: MetaData, names: tuple[str, ...]) -> list[Table] | None:
    if not names:
        return None
    unknown = [n for n in names if n not in metadata.tables]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown))} not in the metadata; it has:"
            f" {', '.join(sorted(metadata.tables)) or '(no tables)'}.",
            param_hint="--table",
        )
    return [metadata.tables[n] for n in names]


async def _check(
    url: URL, metadata: MetaData, tables: list[Table] | None, extra_tables: bool
) -> SchemaReport:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        return await check_schema(engine, metadata, tables=tables, extra_tables=extra_tables)
    finally:
        await engine.dispose()


@schema.command("check")
@database_url_option
@metadata_option
@table_option
@click.option(
    "--extra-tables/--no-extra-tables",
    default=None,
    help="Report tables in the metadata's schemas that the metadata lacks (default: yes with"
    " --metadata, no for the ship tables, which share their schema with yours).",
)
@ship_tables_options
@json_option
@click.pass_context
def schema_check(
    ctx: click.Context,
    *,
    database_url: URL,
    metadata: MetaData | None,
    tables: tuple[str, ...],
    extra_tables: bool | None,
    ship_tables: ShipTablesChoice,
    as_json: bool,
) -> None:
    """Compare the live database with the metadata (T3): tables, columns, primary keys,
    constraints, and indexes including partial-index predicates, which `alembic check` does
    not compare. Exit 0 when they match, 1 when they differ."""
    extra = (metadata is not None) if extra_tables is None else extra_tables
    chosen = _chosen_metadata(metadata, ship_tables)
    selected = _resolve_tables(chosen, tables)
    report = _schema_call(
        database_url, _check(database_url, chosen, selected, extra), "check", as_json=as_json
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(report.format_text())
    ctx.exit(EXIT_OK if report.ok else EXIT_FAILED)


def _schema_call(database_url: URL, call: Coroutine[Any, Any, T], verb: str, *, as_json: bool) -> T:
    """Run a schema command's call: an outage, a check that cannot run, or any other database
    error is exit 1 with what failed and the fix."""
    try:
        return _database_call(database_url, call, as_json=as_json)
    except SchemaCheckError as exc:
        _fail(str(exc), as_json=as_json, cause=exc)
    except (SQLAlchemyError, OSError) as exc:
        where = database_url.render_as_string(hide_password=True)
        _fail(
            f"cannot {verb} {where}: {type(exc).__name__}: {str(exc).splitlines()[0]}."
            " Fix: check the URL, that the server is up and that the role may log in"
            + (" and create tables." if verb == "apply the schema on" else "."),
            as_json=as_json,
            cause=exc,
        )


async def _apply(url: URL, metadata: MetaData) -> ApplyReport:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        return await apply_ship_schema(engine, metadata)
    finally:
        await engine.dispose()


@schema.command("apply")
@database_url_option
@ship_tables_options
@json_option
@click.pass_context
def schema_apply(
    ctx: click.Context, *, database_url: URL, ship_tables: ShipTablesChoice, as_json: bool
) -> None:
    """Create the ship tables that are missing (default names unless the name options say
    otherwise), for projects without Alembic, then check all of them (T3). Idempotent: existing
    tables are left as they are, never altered or dropped; one that differs from what this
    version expects is reported (exit 1) and needs a migration. Exit 0 when every table
    matches. `ship-sqla schema sql` prints the same DDL instead."""
    metadata = ship_tables.metadata()
    report = _schema_call(
        database_url, _apply(database_url, metadata), "apply the schema on", as_json=as_json
    )
    if as_json:
        body = {
            "created": list(report.created),
            "existing": list(report.existing),
            "created_schemas": list(report.created_schemas),
            "check": report.check.to_dict(),
        }
        click.echo(json.dumps({"ok": report.ok, **body}, indent=2))
    else:
        for schema_name in report.created_schemas:
            click.echo(f"created schema {schema_name}.")
        click.echo(f"created {len(report.created)} table(s): {', '.join(report.created) or '-'}.")
        if report.existing:
            click.echo(f"already there: {', '.join(report.existing)}.")
        click.echo(report.check.format_text())
        if not report.ok:
            click.echo(
                "ship-sqla schema apply: existing tables differ from what this version of"
                " ship_sqla expects; apply never alters a table: migrate them (Alembic"
                " autogenerate sees the same table factories).",
                err=True,
            )
    ctx.exit(EXIT_OK if report.ok else EXIT_FAILED)


def _fail(message: str, *, as_json: bool, cause: BaseException) -> NoReturn:
    """Exit 1 with ``message`` on stderr; with ``--json`` also as ``{"ok": false, "error"}``."""
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message}))
    raise OperationFailedError(message) from cause


@schema.command("sql")
@metadata_option
@table_option
@ship_tables_options
def schema_sql_command(
    metadata: MetaData | None, tables: tuple[str, ...], ship_tables: ShipTablesChoice
) -> None:
    """Print the DDL (CREATE TYPE/TABLE/INDEX, partial predicates included) that creates the
    metadata's tables (default: the ship tables), for projects without Alembic."""
    chosen = _chosen_metadata(metadata, ship_tables)
    click.echo(schema_sql(chosen, tables=_resolve_tables(chosen, tables)), nl=False)


@cli.command(short_help="Run the README demo (no configuration needed).")
@click.option(
    "--clean",
    is_flag=True,
    help="Run no demo: stop the embedded server and remove its data directory (its cache,"
    " about 40 MB) and runtime directory.",
)
@click.pass_context
def demo(ctx: click.Context, clean: bool) -> None:
    """Run the README demo: two tenants' rows through a unit of work, an outbox message relayed
    to a printing sink, a job run by a worker, and a rollback that leaves none of them, in a
    scratch database dropped afterwards. The server is SHIP_SQLA_DATABASE_URL when set, else
    the embedded one (the `embedded` extra; a local server is not probed, so the demo runs the
    same on every machine). The embedded server keeps its data in ~/.cache/ship_sqla/embedded
    (as root: under the temporary directory, after printing what pgserver changes outside it)
    for the next run; `ship-sqla demo --clean` removes it. A generic DATABASE_URL is not read."""
    if clean:
        done = clean_embedded()
        if not any(line.startswith("removed") for line in done):
            click.echo(f"nothing to remove: {embedded_dir()} does not exist.")
        for line in done:
            click.echo(line)
        ctx.exit(EXIT_OK)
    # Imported on use: the demo pulls in every store, which the other commands do not need.
    result = importlib.import_module(DEMO_MODULE).main()
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    ctx.exit(result if isinstance(result, int) else EXIT_OK)


async def _awaited(awaitable: Any) -> Any:  # noqa: ANN401 - whatever the demo returns
    return await awaitable


class JobsReference(ObjectReference):
    """``module:attr`` naming a :class:`JobRegistry`, one job definition, or a list or tuple of
    them; converted to a registry. Every failure is a usage error (exit 2)."""

    def __init__(self) -> None:
        super().__init__(JobRegistry, "job registry", "examples.worker:registry")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        if isinstance(value, JobRegistry):
            return value
        found = self._load(value, param, ctx)
        if isinstance(found, JobRegistry):
            return found
        if isinstance(found, JobDefinition):
            found = [found]
        registry: JobRegistry | None = None
        message = (
            f"{value} is a {type(found).__name__}, not a job registry: name a JobRegistry,"
            " a job definition (define_job) or a list of them, defined at module level, like"
            " examples.worker:registry."
        )
        if isinstance(found, list | tuple) and all(isinstance(d, JobDefinition) for d in found):
            try:
                registry = JobRegistry(found)
            except ConfigurationError as exc:
                message = f"{value}: {exc}"
        if registry is None:
            self.fail(message, param, ctx)
        return registry


REGISTRY = JobsReference()

OPERATOR_NOTE = (
    "The operator at the shell is trusted: these commands grant themselves ship.jobs:manage"
    " (J8); whoever holds the database URL could change the runs directly anyway."
)


def _database_call(database_url: URL, call: Coroutine[Any, Any, T], *, as_json: bool) -> T:
    """Run ``call``; a database outage, however the driver said it (the one rule of
    :mod:`ship_sqla._sql_errors`), is exit 1 printed with its code, what failed and the fix."""
    context = click.get_current_context(silent=True)
    command = context.command_path if context is not None else "ship-sqla"
    try:
        # driver_only: the commands run ship_sqla's own code (a worker's handlers never raise
        # through here: the runtime reports their errors), so an OSError is the driver's.
        with database_outage_translated(f"{command}'s call", driver_only=True):
            return asyncio.run(call)
    except DatabaseUnavailableError as exc:
        where = database_url.render_as_string(hide_password=True)
        _fail(
            f"{exc.code}: {command} could not use the database at {where}: {exc.message}"
            f" Fix: {exc.fix}",
            as_json=as_json,
            cause=exc,
        )


def _run_on_database(
    database_url: URL,
    call: Coroutine[Any, Any, T],
    *,
    failing: str,
    fix: str,
    as_json: bool = False,
) -> T:
    """Run ``call``; an outage is exit 1 (:func:`_database_call`), and so is any other database
    error, printed as ``<failing> at <url>: <error>. Fix: <fix>``."""
    try:
        return _database_call(database_url, call, as_json=as_json)
    except (SQLAlchemyError, OSError) as exc:
        where = database_url.render_as_string(hide_password=True)
        _fail(
            f"{failing} at {where}: {type(exc).__name__}: {str(exc).splitlines()[0]}. Fix: {fix}",
            as_json=as_json,
            cause=exc,
        )


def _run_jobs_call(
    database_url: URL,
    call: Coroutine[Any, Any, T],
    *,
    tables: str,
    as_json: bool = False,
) -> T:
    """Run ``call``; a database that cannot be reached or lacks ``tables`` is exit 1."""
    return _run_on_database(
        database_url,
        call,
        failing="cannot reach the job runs",
        fix="check the URL, that the server is up, and that the job tables exist (here:"
        f" {tables}; created by ship_job_runs_table / ship_job_state_table in your migrations,"
        " or by `ship-sqla schema apply`); name tables created under other names or in another"
        " schema with --runs-table and --schema (and --state-table for the worker).",
        as_json=as_json,
    )


@cli.command(short_help="Run a job worker until SIGTERM/SIGINT (J12 drain), or --burst.")
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
    "--drain-timeout",
    type=Duration(maximum=MAX_DRAIN_TIMEOUT, allow_zero=True),
    default="30s",
    show_default=True,
    help="Time in-flight runs may finish after SIGTERM before they are cancelled (0: cancel at"
    " once), at most 1d.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Execute the due runs, then drain and exit 0 once nothing is due (paused jobs aside)"
    " and nothing is in flight; runs due later are left for later.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Log at debug level: every completion too, and failures' tracebacks.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="The log level (default: info; -v: debug). warning shows only retries, stale"
    " settles, drains and worse.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="text for people, json (one object per line) for log shippers.",
)
@click.option(
    "--summary-interval",
    type=Duration(maximum=MAX_SAMPLE_INTERVAL, allow_zero=True),
    default="60s",
    show_default=True,
    help="How often an info line sums up runs/s, failures and runs in flight (0: never).",
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
) -> None:
    """Execute the runs of the jobs registered at APP:REGISTRY (a JobRegistry, a job definition
    or a list of them, defined at module level, e.g. examples.worker:registry) from the job
    tables (the default names unless --runs-table, --state-table or --schema say otherwise),
    until SIGTERM or SIGINT (or, with --burst, until nothing is due). Then it stops claiming,
    lets in-flight runs finish within --drain-timeout, cancels the rest (they wait again
    without losing an attempt, J12) and exits: 0 after SIGTERM or --burst, 130 after Ctrl-C.

    It logs to stderr (S3): one line per retry, dead letter, timeout, stale settle, cancel and
    drain, with job id, run id, attempt and error (never payloads), and a summary every
    --summary-interval. The worker registers in the worker registry (F6, --workers-table;
    `ship-sqla workers` lists it) when that table exists, and runs unregistered, saying so,
    when it does not."""
    level = log_level or ("debug" if verbose else "info")
    handler = configure_logging(level, log_format)
    summary = summary_interval.total_seconds()
    try:
        code = _run_jobs_call(
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
            ),
            tables=tables.names,
        )
    finally:
        logging.getLogger("ship_sqla").removeHandler(handler)
    ctx.exit(code)


@cli.command(short_help="List the worker registry (F6).", epilog=OPERATOR_NOTE)
@database_url_option
@workers_table_option
@schema_option
@json_option
def workers(database_url: URL, workers_table: str, schema: str | None, as_json: bool) -> None:
    """List the worker runtimes registered in the worker registry (F6): id, host, pid, start,
    last heartbeat, runs in flight, running or draining, the fleet's queue sampler (F5), jobs.
    A worker that died stays listed until it is pruned (not seen for 30 s)."""
    tables = _job_tables(DEFAULT_RUNS_TABLE, DEFAULT_STATE_TABLE, schema, workers_table)

    async def call(ops: JobOperations) -> list[WorkerRecord]:
        return await ops.workers(limit=MAX_WORKERS_LISTED)

    records = _run_on_database(
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


def _tenant_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--tenant``: None, or a real tenant (the one check, R2); else a usage error (exit 2)."""
    try:
        return check_tenant(value, operation="--tenant")
    except TenantViolationError as exc:
        raise click.BadParameter(str(exc)) from exc


@cli.group(short_help="Operator operations on job runs (J8).", epilog=OPERATOR_NOTE)
def jobs() -> None:
    """Operator operations on job runs: list dead runs, show one, retry, discard, cancel (K2),
    pause / resume a job (K3), counts by state, retention cleanup (J8). Each works on the runs
    table ship_job_runs (pause, resume and paused also on ship_job_state) unless --runs-table /
    --state-table / --schema (or their environment variables) name others."""


@jobs.command("dead", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@click.option("--job", "job_id", metavar="JOB_ID", help="Only runs of this job.")
@click.option(
    "--tenant",
    metavar="TENANT",
    callback=_tenant_option,
    help="Only runs enqueued for this tenant (F2).",
)
@click.option("--limit", type=click.IntRange(1, MAX_PAGE_LIMIT), default=50, show_default=True)
@click.option("--cursor", metavar="CURSOR", help="The next page, as printed by the last one.")
@json_option
def jobs_dead(
    *,
    database_url: URL,
    job_id: str | None,
    tenant: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    tables: JobTables,
) -> None:
    """List dead runs (failed for good), newest first, a page at a time."""

    async def call(ops: JobOperations) -> Page[RunRecord]:
        return await ops.list_dead(job_id=job_id, limit=limit, cursor=cursor, tenant=tenant)

    try:
        page = _run_jobs_call(
            database_url,
            run_operation(database_url, call, tables),
            tables=tables.runs_name,
            as_json=as_json,
        )
    except InvalidCursorError as exc:
        raise click.BadParameter(str(exc), param_hint="--cursor") from exc
    if as_json:
        runs = [record_dict(r) for r in page.items]
        click.echo(json.dumps({"runs": runs, "next_cursor": page.next_cursor}, indent=2))
    else:
        click.echo(format_dead(page))


@jobs.command("show", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_show(run_id: str, database_url: URL, as_json: bool, tables: JobTables) -> None:
    """Show one run: state, attempts, payload, the history of its failed attempts and, for a
    workflow run, its stored steps (D6)."""

    async def call(ops: JobOperations) -> tuple[RunRecord, list[StepRecord]] | None:
        record = await ops.get_run(run_id)
        if record is None:
            return None
        try:
            steps = await ops.list_steps(run_id)
        except WorkflowsNotConfiguredError:
            steps = []  # a database without the workflow tables: nothing to show
        return record, steps

    found = _run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.runs_name,
        as_json=as_json,
    )
    if found is None:
        raise not_found(run_id, tables)
    record, steps = found
    if as_json:
        click.echo(
            json.dumps({**record_dict(record), "steps": [step_dict(s) for s in steps]}, indent=2)
        )
    else:
        click.echo(format_run(record))
        if steps:
            click.echo(format_steps(steps))


@jobs.command("rerun", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@click.option(
    "--from-step",
    "step",
    required=True,
    help="The stored step to run again: it and every later step are dropped (see jobs show).",
)
@database_url_option
@job_tables_options(with_state_table=False)
def jobs_rerun(run_id: str, step: str, database_url: URL, tables: JobTables) -> None:
    """Re-run a dead (or waiting) workflow run from a named step (D6): that step and every step
    after it are dropped, the run is due now (a dead one with one more attempt), and its
    handler replays the earlier steps."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.rerun_from_step(run_id, step)

    record = _run_jobs_call(
        database_url,
        run_operation_on_run(database_url, run_id, call, tables),
        tables=tables.runs_name,
    )
    click.echo(
        f"run {record.run_id} ({record.job_id}) is due again from step {step!r}: attempts"
        f" {attempts_used(record)}."
    )


@jobs.command("events-purge", epilog=OPERATOR_NOTE)
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_RETENTION, allow_zero=True),
    required=True,
    help="Delete workflow events published at least this long ago: 3600, 90m, 12h or 7d.",
)
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_events_purge(
    older_than: timedelta, database_url: URL, as_json: bool, tables: JobTables
) -> None:
    """Workflow events' retention (D4): delete events published at least --older-than ago, in
    bounded batches. Keep them longer than your longest event wait's timeout."""

    async def call(ops: JobOperations) -> int:
        return await ops.delete_events(older_than=older_than)

    deleted = _run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.runs_name,
        as_json=as_json,
    )
    if as_json:
        click.echo(json.dumps({"deleted": deleted}))
    else:
        click.echo(f"deleted {deleted} workflow event(s).")


@jobs.command("retry", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
def jobs_retry(run_id: str, database_url: URL, tables: JobTables) -> None:
    """Give a dead run exactly one more attempt, due now (refused unless it is dead)."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.retry(run_id)

    record = _run_jobs_call(
        database_url,
        run_operation_on_run(database_url, run_id, call, tables),
        tables=tables.runs_name,
    )
    click.echo(
        f"run {record.run_id} ({record.job_id}) is {record.state} again, due now: attempts"
        f" {attempts_used(record)}."
    )


@jobs.command("discard", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
def jobs_discard(run_id: str, database_url: URL, tables: JobTables) -> None:
    """Discard a waiting or dead run (refused for running and finished runs)."""

    async def call(ops: JobOperations) -> RunRecord:
        return await ops.discard(run_id)

    record = _run_jobs_call(
        database_url,
        run_operation_on_run(database_url, run_id, call, tables),
        tables=tables.runs_name,
    )
    click.echo(f"run {record.run_id} ({record.job_id}) is {record.state}.")


@jobs.command("cancel", epilog=OPERATOR_NOTE)
@click.argument("run_id")
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_cancel(run_id: str, database_url: URL, as_json: bool, tables: JobTables) -> None:
    """Cancel a run (K2): a waiting run at once; a running run's worker is told to cancel its
    handler, and the run ends cancelled (not retried). A finished run is left as it is (exit 0,
    and the message says so); an unknown run exits 1."""

    async def call(ops: JobOperations) -> CancelResult:
        return await ops.cancel(run_id)

    result = _run_jobs_call(
        database_url,
        run_operation_on_run(database_url, run_id, call, tables),
        tables=tables.runs_name,
        as_json=as_json,
    )
    if as_json:
        body = {"outcome": result.outcome, "changed": result.changed}
        click.echo(json.dumps({**body, "run": record_dict(result.record)}, indent=2))
    else:
        click.echo(format_cancel(result))


def _not_known_note(job_id: str) -> str:
    """The warning of a pause of a job the database has no trace of (issue 25)."""
    return (
        f"warning: job {job_id} is not known to this database yet: no run of it, no schedule,"
        " no other state. The pause holds its runs from the first one (ahead of its deploy);"
        f" if the id is a typo, undo it: ship-sqla jobs resume {job_id}"
    )


@jobs.command("pause", epilog=OPERATOR_NOTE)
@click.argument("job_id")
@database_url_option
@job_tables_options(with_state_table=True)
@json_option
def jobs_pause(job_id: str, database_url: URL, as_json: bool, tables: JobTables) -> None:
    """Pause a job (K3): once this returns, no claim that starts in any worker takes its runs;
    running runs finish; enqueues and schedules still add runs, which wait. `jobs resume`
    undoes it. A job the database has no trace of yet (no run, schedule or other state) is
    paused too, ahead of its deploy, with a warning on stderr (a typo looks the same);
    --json says "known": false."""

    async def call(ops: JobOperations) -> PauseResult:
        return await ops.pause(job_id)

    result = _run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.names,
        as_json=as_json,
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


@jobs.command("resume", epilog=OPERATOR_NOTE)
@click.argument("job_id")
@database_url_option
@job_tables_options(with_state_table=True)
def jobs_resume(job_id: str, database_url: URL, tables: JobTables) -> None:
    """Resume a paused job (K3): its runs are claimable at once and listening workers are
    woken."""

    async def call(ops: JobOperations) -> bool:
        return await ops.resume(job_id)

    resumed = _run_jobs_call(
        database_url, run_operation(database_url, call, tables), tables=tables.names
    )
    if resumed:
        click.echo(f"job {job_id} is resumed: its runs are claimable again.")
    else:
        click.echo(f"job {job_id} was not paused: nothing changed.")


@jobs.command("paused", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=True)
@json_option
def jobs_paused(database_url: URL, as_json: bool, tables: JobTables) -> None:
    """List the paused jobs, with when each was paused (K3)."""

    async def call(ops: JobOperations) -> list[PausedJob]:
        return await ops.paused(limit=MAX_PAUSED_JOBS)

    paused = _run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.names,
        as_json=as_json,
    )
    if as_json:
        jobs_paused = [{"job_id": p.job_id, "paused_at": p.paused_at.isoformat()} for p in paused]
        click.echo(json.dumps({"paused": jobs_paused}, indent=2))
    else:
        click.echo(format_paused(paused))


@jobs.command("demand", epilog=OPERATOR_NOTE)
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

    demands = _run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.runs_name,
        as_json=as_json,
    )
    if as_json:
        click.echo(json.dumps(demand_document(demands, cap), indent=2))
    else:
        click.echo(format_demand(demands))


@jobs.command("stats", epilog=OPERATOR_NOTE)
@database_url_option
@job_tables_options(with_state_table=False)
@json_option
def jobs_stats(database_url: URL, as_json: bool, tables: JobTables) -> None:
    """Runs per job by state, and the age of each job's oldest due waiting run (seconds)."""
    rows, truncated = _run_jobs_call(
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


@jobs.command("cleanup", epilog=OPERATOR_NOTE)
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
@json_option
def jobs_cleanup(
    *,
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

    deleted = _run_jobs_call(
        database_url,
        run_operation(database_url, call, tables),
        tables=tables.runs_name,
        as_json=as_json,
    )
    capped = sorted(j for j, n in deleted.items() if n >= batch_size * max_batches)
    if as_json:
        click.echo(json.dumps({"deleted": deleted, "more_to_delete": capped}, indent=2))
    else:
        for job_id, count in sorted(deleted.items()):
            click.echo(f"{job_id}: deleted {count} run(s).")
        click.echo(f"{sum(deleted.values())} run(s) deleted.")
        if capped:
            click.echo(f"more may be past retention for {', '.join(capped)}: run again.")


@cli.group(short_help="Outbox maintenance: retention of delivered messages.")
def outbox() -> None:
    """Outbox maintenance from the shell."""


@outbox.command("purge")
@database_url_option
@click.option("--outbox-id", required=True, type=OutboxId(), help="The logical outbox (outbox_id).")
@click.option(
    "--older-than",
    type=Duration(maximum=MAX_RETENTION, allow_zero=True),
    required=True,
    help="Delete messages delivered at least this long ago: 3600, 90m, 12h or 7d.",
)
@_name_option(
    "--table",
    "table",
    dest="table_name",
    envvar=OUTBOX_TABLE_ENV,
    default="ship_outbox",
    help="The outbox table's name, as given to ship_outbox_table(metadata, name=...).",
)
@_name_option(
    "--schema",
    "schema",
    envvar=OUTBOX_SCHEMA_ENV,
    default=None,
    help="The schema holding the outbox table (default: none, the search_path decides).",
)
@click.option(
    "--pages-per-statement",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Heap pages (8 kB) each DELETE reads: bounds every statement's cost.",
)
@json_option
def outbox_purge(
    *,
    database_url: URL,
    outbox_id: str,
    older_than: timedelta,
    table_name: str,
    schema: str | None,
    pages_per_statement: int,
    as_json: bool,
) -> None:
    """Delete the outbox's messages delivered at least --older-than ago. Pending,
    claimed and dead messages are never touched. One pass over the table, one short DELETE per
    range of pages; safe to run while relays work."""
    call = purge_delivered(
        database_url,
        outbox_id=outbox_id,
        older_than=older_than,
        table_name=table_name,
        schema=schema,
        pages_per_statement=pages_per_statement,
    )
    qualified = f"{schema}.{table_name}" if schema else table_name
    deleted = _run_on_database(
        database_url,
        call,
        failing=f"cannot purge outbox table {qualified}",
        fix="check the URL, that the server is up, and the table's name (--table, --schema).",
        as_json=as_json,
    )
    if as_json:
        click.echo(json.dumps({"outbox_id": outbox_id, "deleted": deleted}))
    else:
        click.echo(f"{outbox_id}: deleted {deleted} delivered message(s) from {qualified}.")


class RunAt(_AnyParamType):
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


@cli.command(short_help="Enqueue one run of a job, from the shell.", epilog=OPERATOR_NOTE)
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
@click.option("--tenant", metavar="TENANT", callback=_tenant_option, help="F2: the run's tenant.")
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
@job_tables_options(with_state_table=False)
@json_option
def enqueue(
    *,
    job_id: str,
    payload: Any,  # noqa: ANN401 - JSON
    run_at: datetime | None,
    dedupe_key: str | None,
    priority: int | None,
    tenant: str | None,
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
    the job refuses."""
    if registry is not None:
        if max_attempts is not None or key is not None:
            raise click.UsageError(
                "--max-attempts and --key are for the stand-in job; with --registry the job's"
                " definition decides them."
            )
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
            payload = definition.decode(payload)
        except Exception as exc:  # any codec's refusal is bad input (exit 2)
            raise click.BadParameter(
                f"job {job_id} refuses the payload: {exc}", param_hint="--payload"
            ) from exc
    else:
        try:
            definition = stand_in_job(
                job_id, max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS, key=key
            )
        except ConfigurationError as exc:
            raise click.BadParameter(f"{exc.message} Fix: {exc.fix}", param_hint="JOB") from exc
    call = enqueue_run(
        database_url,
        definition,
        payload,
        tables=tables,
        run_at=run_at,
        dedupe_key=dedupe_key,
        priority=priority,
        tenant=tenant,
    )
    try:
        result = _run_jobs_call(database_url, call, tables=tables.runs_name, as_json=as_json)
    except (InvalidPayloadError, InvalidKeyError, InvalidPriorityError) as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        body = {
            "run_id": result.run_id,
            "deduplicated": result.deduplicated,
            "rejected": result.rejected,
            "job_id": job_id,
            "max_attempts": definition.retry.attempts,
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


def main(argv: list[str] | None = None) -> None:
    """The ``ship-sqla`` console script: ``[project.scripts] ship-sqla = "ship_sqla._cli:main"``."""
    cli.main(args=argv, prog_name="ship-sqla")


import ship_sqla._cli_dashboard  # noqa: E402, F401 - registers `dashboard` and the bulk `jobs` verbs
