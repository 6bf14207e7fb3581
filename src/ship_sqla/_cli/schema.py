"""``ship-sqla schema apply|check|sql``: create, compare (T3) and print the ship tables, or the
application's own (``--metadata``), for projects with or without Alembic."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import attrs
import click
from sqlalchemy.exc import SQLAlchemyError

from ship_sqla._cli._database import command_engine, database_call, database_error_text
from ship_sqla._cli._exits import EXIT_FAILED, EXIT_OK, fail
from ship_sqla._cli._options import (
    OUTBOX_TABLE_ENV,
    RUNS_TABLE_ENV,
    STATE_TABLE_ENV,
    WORKERS_TABLE_ENV,
    database_url_option,
    json_option,
    metadata_option,
    table_option,
)
from ship_sqla._cli._params import Identifier
from ship_sqla._schema_apply import (
    COMPONENTS,
    ShipTableNames,
    apply_ship_schema,
    ship_tables_metadata,
)
from ship_sqla._schema_check import SchemaCheckError, check_schema
from ship_sqla._schema_sql import schema_sql
from ship_sqla.kernel._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from sqlalchemy import MetaData, Table
    from sqlalchemy.engine import URL

    from ship_sqla._schema_apply import ApplyReport
    from ship_sqla._schema_check import SchemaReport

__all__ = ["schema"]

T = TypeVar("T")
_Command = TypeVar("_Command", bound="Callable[..., None]")


@click.group(short_help="Create (apply), check (T3) and print (sql) the tables.")
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
    ("--backfills-table", "backfills", None, "backfills"),
    ("--webhook-endpoints-table", "webhook_endpoints", None, "webhooks_out"),
    ("--webhook-deliveries-table", "webhook_deliveries", None, "webhooks_out"),
    ("--definitions-table", "definitions", None, "jobs"),
)
"""The name options of the ship tables: flag, ShipTableNames field, environment variable (the
one the job and outbox commands read, so apply creates what they look for), component."""

_CHOICE_OPTIONS: Final = (
    ("--only", "only"),
    ("--schema", "ship_schema"),
    ("--fair-claims", "fair_claims"),
    ("--partitioned-claims", "partitioned_claims"),
    ("--partition-keys", "partition_keys"),
)
"""The other options that say which ship tables: flag, parameter."""


@attrs.frozen
class ShipTablesChoice:
    """The ship tables the name options describe, and which of those options were given on
    the command line (they make no sense with --metadata)."""

    names: ShipTableNames
    schema: str | None
    components: tuple[str, ...]
    given: tuple[str, ...]
    fair_claims: bool = False
    partitioned_claims: bool = False
    partition_keys: bool = False

    def metadata(self) -> MetaData:
        try:
            return ship_tables_metadata(
                self.names,
                schema=self.schema,
                components=self.components,
                fair_claims=self.fair_claims,
                partitioned_claims=self.partitioned_claims,
                partition_keys=self.partition_keys,
            )
        except ConfigurationError as exc:
            raise click.UsageError(str(exc)) from exc


def _given_on_the_command_line() -> tuple[str, ...]:
    """The flags of the ship tables' options that the command line gave."""
    ctx = click.get_current_context()
    parameters = [(flag, f"{field}_table") for flag, field, _, _ in _SHIP_TABLE_NAMES]
    return tuple(
        flag
        for flag, name in (*parameters, *_CHOICE_OPTIONS)
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    )


def _ship_tables_choice_options(command: Any) -> Any:  # noqa: ANN401 - click's decorated command
    """The options of :func:`ship_tables_options`, in the order --help lists them."""
    for flag, field, envvar, component in reversed(_SHIP_TABLE_NAMES):
        command = click.option(
            flag,
            f"{field}_table",
            type=Identifier("table"),
            envvar=envvar,
            show_envvar=envvar is not None,
            default=getattr(ShipTableNames(), field),
            show_default=True,
            help=f"The name of the {field.replace('_', ' ')} table ({component}).",
        )(command)
    command = click.option(
        "--fair-claims",
        is_flag=True,
        help="The runs table with the index fair claims read (<runs>_tenant_idx): give it when"
        " a job has fairness= (F2); every waiting run enters that index.",
    )(command)
    command = click.option(
        "--partition-keys",
        is_flag=True,
        help="The runs table with the indexes limits per partition key read (<runs>_part_idx,"
        " <runs>_part_run_idx): give it when a job has RateLimit(..., partition='key') or"
        " Concurrency(max=N, partition='key') (F8, F9).",
    )(command)
    command = click.option(
        "--partitioned-claims",
        is_flag=True,
        help="The runs table with the indexes per-tenant limits read (<runs>_tenant_idx,"
        " <runs>_running_idx): give it when a job has RateLimit(..., partition='tenant') or"
        " Concurrency(max=N, partition='tenant') (F8, F9).",
    )(command)
    command = click.option(
        "--schema",
        "ship_schema",
        type=Identifier("schema"),
        default=None,
        help="The schema of the ship tables (default: none, the search_path decides); apply"
        " creates it when missing.",
    )(command)
    return click.option(
        "--only",
        type=click.Choice(COMPONENTS),
        multiple=True,
        help="Only these ship tables (repeatable): jobs (runs, state, workers, history), workflows"
        " (steps, events; with jobs), outbox, idempotency, webhooks, locks, audit, backfills,"
        " webhooks_out (outbound webhook endpoints, deliveries). Default: all.",
    )(command)


def ship_tables_options(command: _Command) -> _Command:
    """Adds --only, --schema and the name options; hands the command ``ship_tables``, a
    :class:`ShipTablesChoice`."""

    @functools.wraps(command)
    def with_ship_tables(
        *args: Any,  # noqa: ANN401 - click's arguments, passed on
        only: tuple[str, ...],
        ship_schema: str | None,
        fair_claims: bool,
        partitioned_claims: bool,
        partition_keys: bool,
        **kwargs: Any,  # noqa: ANN401
    ) -> None:
        given = _given_on_the_command_line()
        names = ShipTableNames(
            **{field: kwargs.pop(f"{field}_table") for _, field, _, _ in _SHIP_TABLE_NAMES}
        )
        choice = ShipTablesChoice(
            names,
            ship_schema,
            tuple(dict.fromkeys(only)) or COMPONENTS,
            given,
            fair_claims=fair_claims,
            partitioned_claims=partitioned_claims,
            partition_keys=partition_keys,
        )
        command(*args, ship_tables=choice, **kwargs)

    return cast("_Command", _ship_tables_choice_options(with_ship_tables))


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


def _schema_call(database_url: URL, call: Coroutine[Any, Any, T], verb: str, *, as_json: bool) -> T:
    """Run a schema command's call: an outage, a check that cannot run, or any other database
    error is exit 1 with what failed and the fix."""
    try:
        return database_call(database_url, call, as_json=as_json)
    except SchemaCheckError as exc:
        fail(str(exc), as_json=as_json, cause=exc)
    except (SQLAlchemyError, OSError) as exc:
        where = database_url.render_as_string(hide_password=True)
        fail(
            f"cannot {verb} {where}: {database_error_text(exc)}."
            " Fix: check the URL, that the server is up and that the role may log in"
            + (" and create tables." if verb == "apply the schema on" else "."),
            as_json=as_json,
            cause=exc,
        )


async def _check(
    url: URL, metadata: MetaData, tables: list[Table] | None, extra_tables: bool
) -> SchemaReport:
    async with command_engine(url) as engine:
        return await check_schema(engine, metadata, tables=tables, extra_tables=extra_tables)


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
@click.option(
    "--extra-ship-tables",
    is_flag=True,
    help="With --metadata: also report the ship tables (their default names, or those the"
    " SHIP_SQLA_*_TABLE variables give) that the metadata does not declare; by default they"
    " are left out, as `schema apply` creates all of them.",
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
    extra_ship_tables: bool,
    ship_tables: ShipTablesChoice,
    as_json: bool,
) -> None:
    """Compare the live database with the metadata (T3): tables, columns, primary keys,
    constraints, and indexes including partial-index predicates, which `alembic check` does
    not compare. Exit 0 when they match, 1 when they differ. With --metadata, the ship tables
    the metadata does not declare are not reported as extra (`schema apply` creates all ten;
    an application may declare only those it uses) unless --extra-ship-tables."""
    extra = (metadata is not None) if extra_tables is None else extra_tables
    chosen = _chosen_metadata(metadata, ship_tables)
    selected = _resolve_tables(chosen, tables)
    report = _schema_call(
        database_url, _check(database_url, chosen, selected, extra), "check", as_json=as_json
    )
    left_out: tuple[str, ...] = ()
    if metadata is not None and not extra_ship_tables:
        report, left_out = _without_undeclared_ship_tables(report, ship_tables.names)
    if as_json:
        body = {**report.to_dict(), "ship_tables_left_out": list(left_out)}
        click.echo(json.dumps(body, indent=2))
    else:
        click.echo(report.format_text())
        if left_out:
            click.echo(
                f"left out: {len(left_out)} ship table(s) in the database that the metadata does"
                f" not declare ({', '.join(left_out)}); --extra-ship-tables reports them."
            )
    ctx.exit(EXIT_OK if report.ok else EXIT_FAILED)


def _without_undeclared_ship_tables(
    report: SchemaReport, names: ShipTableNames
) -> tuple[SchemaReport, tuple[str, ...]]:
    """``report`` without its ``table_extra`` lines of ship tables, and their names: the ship
    tables are ship_sqla's, created by `schema apply` all at once, not the application's."""
    ship = set(attrs.astuple(names))
    kept, left_out = [], []
    for difference in report.differences:
        bare = difference.table.rpartition(".")[2]
        if difference.kind == "table_extra" and bare in ship:
            left_out.append(difference.table)
        else:
            kept.append(difference)
    return attrs.evolve(report, differences=tuple(kept)), tuple(left_out)


async def _apply(url: URL, metadata: MetaData) -> ApplyReport:
    async with command_engine(url) as engine:
        return await apply_ship_schema(engine, metadata)


def _print_applied(report: ApplyReport, *, as_json: bool) -> None:
    if as_json:
        body = {
            "created": list(report.created),
            "existing": list(report.existing),
            "created_schemas": list(report.created_schemas),
            "options_set": list(report.options_set),
            "functions_installed": list(report.functions_installed),
            "check": report.check.to_dict(),
        }
        click.echo(json.dumps({"ok": report.ok, **body}, indent=2))
        return
    for schema_name in report.created_schemas:
        click.echo(f"created schema {schema_name}.")
    click.echo(f"created {len(report.created)} table(s): {', '.join(report.created) or '-'}.")
    if report.existing:
        click.echo(f"already there: {', '.join(report.existing)}.")
    if report.options_set:
        click.echo(f"storage options set (J21) on: {', '.join(report.options_set)}.")
    if report.functions_installed:
        names = ", ".join(report.functions_installed)
        click.echo(f"SQL enqueue functions installed (E6): {names}.")
    click.echo(report.check.format_text())
    if not report.ok:
        click.echo(
            "ship-sqla schema apply: existing tables differ from what this version of"
            " ship_sqla expects; apply never alters a table: migrate them (Alembic"
            " autogenerate sees the same table factories).",
            err=True,
        )


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
    _print_applied(report, as_json=as_json)
    ctx.exit(EXIT_OK if report.ok else EXIT_FAILED)


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
