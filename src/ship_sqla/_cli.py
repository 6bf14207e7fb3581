"""The ``ship-sqla`` command line (also ``python -m ship_sqla``).

Tables for people, ``--json`` for scripts. Exit codes are part of the interface:

- 0: success (for ``schema check``: the database matches the metadata);
- 1: the check found differences, or the operation failed (database unreachable, a command
  that is not built yet); the message on stderr says what happened and the fix;
- 2: bad input: a usage error, a malformed option, a ``MODULE:ATTR`` that cannot be loaded.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from sqlalchemy import MetaData
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._schema_check import SchemaCheckError, check_schema
from ship_sqla._schema_sql import schema_sql
from ship_sqla._server import NoServerError, to_async_url
from ship_sqla.kernel import ConfigurationError, NotYetImplementedError, ShipError

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.engine import URL

    from ship_sqla._schema_check import SchemaReport

if TYPE_CHECKING:
    _AnyParamType = click.ParamType[Any]
else:  # click < 8.4's ParamType is not generic at runtime
    _AnyParamType = click.ParamType

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "cli", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DATABASE_URL_ENV = "SHIP_SQLA_DATABASE_URL"
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

    def __init__(self, expected: type[Any], what: str) -> None:
        self.expected = expected
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:  # noqa: ANN401
        if isinstance(value, self.expected):
            return value
        module_name, _, attribute = str(value).partition(":")
        if not module_name or not attribute:
            self.fail(
                f"{value!r} is not MODULE:ATTR; name the {self.what} like myapp.db:metadata.",
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
        if not isinstance(found, self.expected):
            self.fail(
                f"{value} is a {type(found).__name__}, not a {self.what}"
                f" ({self.expected.__module__}.{self.expected.__qualname__}).",
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


METADATA = ObjectReference(MetaData, "SQLAlchemy MetaData")

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
    required=True,
    help="The MetaData holding the tables, as MODULE:ATTR (e.g. myapp.db:metadata).",
)
table_option = click.option(
    "--table",
    "tables",
    multiple=True,
    metavar="NAME",
    help="Limit to this table (its key in metadata.tables); repeatable.",
)


@click.group(cls=_ShipGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ship-sqla", prog_name="ship-sqla")
def cli() -> None:
    """ship_sqla operations: schema check and DDL, the demo, workers and job operations.

    Exit codes: 0 success; 1 the check found differences or the operation failed; 2 bad input
    (usage error, malformed option, MODULE:ATTR that cannot be loaded). The database URL may
    come from SHIP_SQLA_DATABASE_URL.
    """


@cli.group(short_help="Schema check (T3) and DDL of the tables' metadata.")
def schema() -> None:
    """Compare the database with the tables' metadata (T3), or print their DDL."""


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
    default=True,
    show_default=True,
    help="Report tables in the metadata's schemas that the metadata lacks.",
)
@json_option
@click.pass_context
def schema_check(
    ctx: click.Context,
    *,
    database_url: URL,
    metadata: MetaData,
    tables: tuple[str, ...],
    extra_tables: bool,
    as_json: bool,
) -> None:
    """Compare the live database with the metadata (T3): tables, columns, primary keys,
    constraints, and indexes including partial-index predicates, which `alembic check` does
    not compare. Exit 0 when they match, 1 when they differ."""
    selected = _resolve_tables(metadata, tables)
    try:
        report = asyncio.run(_check(database_url, metadata, selected, extra_tables))
    except SchemaCheckError as exc:
        _fail(str(exc), as_json=as_json, cause=exc)
    except (SQLAlchemyError, OSError) as exc:
        where = database_url.render_as_string(hide_password=True)
        _fail(
            f"cannot check {where}: {type(exc).__name__}: {str(exc).splitlines()[0]}."
            " Fix: check the URL, that the server is up and that the role may log in.",
            as_json=as_json,
            cause=exc,
        )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(report.format_text())
    ctx.exit(EXIT_OK if report.ok else EXIT_FAILED)


def _fail(message: str, *, as_json: bool, cause: BaseException) -> NoReturn:
    """Exit 1 with ``message`` on stderr; with ``--json`` also as ``{"ok": false, "error"}``."""
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message}))
    raise OperationFailedError(message) from cause


@schema.command("sql")
@metadata_option
@table_option
def schema_sql_command(metadata: MetaData, tables: tuple[str, ...]) -> None:
    """Print the DDL (CREATE TYPE/TABLE/INDEX, partial predicates included) that creates the
    metadata's tables, for projects without Alembic."""
    click.echo(schema_sql(metadata, tables=_resolve_tables(metadata, tables)), nl=False)


@cli.command(short_help="Run the README demo.")
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Run the README demo (a unit of work, the outbox and a job, end to end)."""
    try:
        module = importlib.import_module(DEMO_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != DEMO_MODULE:
            raise
        raise NotYetImplementedError(
            "the demo is not built into this version of ship_sqla yet.",
            fix="run examples/quickstart.py from a source checkout.",
        ) from exc
    result = module.main()
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    ctx.exit(result if isinstance(result, int) else EXIT_OK)


async def _awaited(awaitable: Any) -> Any:  # noqa: ANN401 - whatever the demo returns
    return await awaitable


def _not_yet(command: str) -> NoReturn:
    raise NotYetImplementedError(
        f"`ship-sqla {command}` is not built yet; it arrives with the PostgreSQL job backend.",
        fix="use the job backend's Python API (create_job_backend / start_job_runtime) for now.",
    )


@cli.command(short_help="Run a job worker (not built yet).")
@click.argument("registry", metavar="APP:REGISTRY")
@database_url_option
def worker(registry: str, database_url: URL) -> None:  # noqa: ARG001 - placeholder
    """Run a job worker for the jobs registered at APP:REGISTRY until SIGTERM/SIGINT."""
    _not_yet("worker")


@cli.group(short_help="Operator operations on job runs (not built yet).")
def jobs() -> None:
    """Operator operations on job runs (need the ship.jobs:manage permission in the app)."""


@jobs.command("failed")
@database_url_option
@click.option("--job", "job_id", metavar="JOB_ID", help="Only runs of this job.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@json_option
def jobs_failed(database_url: URL, job_id: str | None, limit: int, as_json: bool) -> None:  # noqa: ARG001 - placeholder
    """List dead (failed) runs, newest first."""
    _not_yet("jobs failed")


@jobs.command("show")
@click.argument("run_id")
@database_url_option
@json_option
def jobs_show(run_id: str, database_url: URL, as_json: bool) -> None:  # noqa: ARG001 - placeholder
    """Show one run: state, attempts, history."""
    _not_yet("jobs show")


@jobs.command("retry")
@click.argument("run_id")
@database_url_option
def jobs_retry(run_id: str, database_url: URL) -> None:  # noqa: ARG001 - placeholder
    """Give a dead run one more attempt."""
    _not_yet("jobs retry")


@jobs.command("discard")
@click.argument("run_id")
@database_url_option
def jobs_discard(run_id: str, database_url: URL) -> None:  # noqa: ARG001 - placeholder
    """Discard a run that is not running."""
    _not_yet("jobs discard")


@jobs.command("stats")
@database_url_option
@json_option
def jobs_stats(database_url: URL, as_json: bool) -> None:  # noqa: ARG001 - placeholder
    """Queue depth and oldest waiting age per job."""
    _not_yet("jobs stats")


@jobs.command("cleanup")
@database_url_option
def jobs_cleanup(database_url: URL) -> None:  # noqa: ARG001 - placeholder
    """Delete finished runs past each job's retention, in bounded batches."""
    _not_yet("jobs cleanup")


def main(argv: list[str] | None = None) -> None:
    """The ``ship-sqla`` console script: ``[project.scripts] ship-sqla = "ship_sqla._cli:main"``."""
    cli.main(args=argv, prog_name="ship-sqla")
