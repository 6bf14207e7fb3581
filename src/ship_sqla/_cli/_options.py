"""The options several commands share, each declared once: the database URL, ``--json``, the
table and schema names (read from the environment too), ``--tenant`` and the audit options."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import click

from ship_sqla._cli._exits import OperationFailedError
from ship_sqla._cli._params import METADATA, DatabaseUrl, Identifier
from ship_sqla._cli._tables import (
    DEFAULT_AUDIT_TABLE,
    DEFAULT_RUNS_TABLE,
    DEFAULT_STATE_TABLE,
    DEFAULT_WORKERS_TABLE,
    JobTables,
    job_tables,
)
from ship_sqla.kernel._errors import ConfigurationError, TenantViolationError
from ship_sqla.kernel._tenancy import check_tenant

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DATABASE_URL_ENV",
    "OPERATOR_NOTE",
    "OUTBOX_SCHEMA_ENV",
    "OUTBOX_TABLE_ENV",
    "RUNS_TABLE_ENV",
    "SCHEMA_ENV",
    "STATE_TABLE_ENV",
    "WORKERS_TABLE_ENV",
    "audit_options",
    "confirm_or_abort",
    "database_url_option",
    "job_tables_options",
    "json_option",
    "metadata_option",
    "name_option",
    "outbox_schema_option",
    "outbox_table_option",
    "schema_option",
    "table_option",
    "tables_or_bad_parameter",
    "tenant_option",
    "workers_table_option",
    "yes_option",
]

DATABASE_URL_ENV: Final = "SHIP_SQLA_DATABASE_URL"
RUNS_TABLE_ENV: Final = "SHIP_SQLA_JOB_RUNS_TABLE"
STATE_TABLE_ENV: Final = "SHIP_SQLA_JOB_STATE_TABLE"
WORKERS_TABLE_ENV: Final = "SHIP_SQLA_JOB_WORKERS_TABLE"
SCHEMA_ENV: Final = "SHIP_SQLA_JOB_SCHEMA"
OUTBOX_TABLE_ENV: Final = "SHIP_SQLA_OUTBOX_TABLE"
OUTBOX_SCHEMA_ENV: Final = "SHIP_SQLA_OUTBOX_SCHEMA"
AUDIT_TABLE_ENV: Final = "SHIP_SQLA_AUDIT_TABLE"

OPERATOR_NOTE: Final = (
    "The operator at the shell is trusted: these commands grant themselves ship.jobs:manage"
    " (J8); whoever holds the database URL could change the runs directly anyway."
)

_Command = TypeVar("_Command", bound="Callable[..., None]")

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


def name_option(
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


runs_table_option = name_option(
    "--runs-table",
    "table",
    envvar=RUNS_TABLE_ENV,
    default=DEFAULT_RUNS_TABLE,
    help="The job runs table's name, as given to ship_job_runs_table(metadata, name=...).",
)
state_table_option = name_option(
    "--state-table",
    "table",
    envvar=STATE_TABLE_ENV,
    default=DEFAULT_STATE_TABLE,
    help="The job state table's name (schedules), as given to ship_job_state_table.",
)
workers_table_option = name_option(
    "--workers-table",
    "table",
    envvar=WORKERS_TABLE_ENV,
    default=DEFAULT_WORKERS_TABLE,
    help="The worker registry's table name (F6), as given to ship_job_workers_table.",
)
schema_option = name_option(
    "--schema",
    "schema",
    envvar=SCHEMA_ENV,
    default=None,
    help="The schema holding the job tables, as given to the table factories' schema="
    " (default: none, the search_path decides).",
)


def outbox_table_option(flag: str) -> Callable[[_Command], _Command]:
    """The outbox table's name (``outbox_table``), under ``flag``; default ship_outbox."""
    return name_option(
        flag,
        "table",
        dest="outbox_table",
        envvar=OUTBOX_TABLE_ENV,
        default="ship_outbox",
        help="The outbox table's name, as given to ship_outbox_table(metadata, name=...).",
    )


def outbox_schema_option(flag: str) -> Callable[[_Command], _Command]:
    """The schema holding the outbox table (``outbox_schema``), under ``flag``."""
    return name_option(
        flag,
        "schema",
        dest="outbox_schema",
        envvar=OUTBOX_SCHEMA_ENV,
        default=None,
        help="The schema holding the outbox table (default: none, the search_path decides).",
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
            tables = tables_or_bad_parameter(runs_table, state_table, schema, workers_table)
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


def tables_or_bad_parameter(
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


def tenant_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--tenant``: None, or a real tenant (the one check, R2); else a usage error (exit 2)."""
    try:
        return check_tenant(value, operation="--tenant")
    except TenantViolationError as exc:
        raise click.BadParameter(str(exc)) from exc


def audit_options(command: _Command) -> _Command:
    """Adds --audit-table and --no-audit, and hands the command ``audit_table``: the audit
    table's name, or None with --no-audit. Every state-changing verb (and the dashboard) takes
    them (S1's one audit rule: a verb whose audit table is missing changes nothing; the parity
    test, tests/unit/test_operator_parity.py, checks every declared verb has them)."""

    @functools.wraps(command)
    def with_audit(
        *args: Any,  # noqa: ANN401 - click's arguments, passed on
        audit_table: str,
        no_audit: bool,
        **kwargs: Any,  # noqa: ANN401
    ) -> None:
        command(*args, audit_table=None if no_audit else audit_table, **kwargs)

    decorated: Any = click.option(
        "--no-audit",
        is_flag=True,
        help="Act without writing the audit log (S1): the explicit opt-out; without it, a"
        " missing audit table refuses the change.",
    )(with_audit)
    return cast(
        "_Command",
        click.option(
            "--audit-table",
            type=Identifier("table"),
            default=DEFAULT_AUDIT_TABLE,
            show_default=True,
            envvar=AUDIT_TABLE_ENV,
            show_envvar=True,
            help="The audit table's name (in the tables' schema), as given to"
            " ship_audit_table(metadata, name=...); create it with `ship-sqla schema apply`.",
        )(decorated),
    )


yes_option = click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask for confirmation (asked only when stdin is a terminal).",
)


def confirm_or_abort(question: str, *, yes: bool) -> None:
    """A bulk change's confirmation: on a terminal, ``question`` is asked on stderr unless
    ``--yes``; any answer but yes ends the command with exit 1, nothing changed. Off a terminal
    (a script, a pipe) nothing is asked: the command line is the decision."""
    if yes or not sys.stdin.isatty():
        return
    if not click.confirm(question, default=False, err=True):
        raise OperationFailedError("not confirmed: nothing was changed (--yes skips the question).")
