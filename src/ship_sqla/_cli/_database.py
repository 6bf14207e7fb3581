"""The database at the shell: one engine per command, and how a command's call ends when the
database fails it (exit 1, with what failed and the fix, whatever the driver raised)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, TypeVar

import click
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._cli._exits import fail
from ship_sqla._schema_probe import MissingTablesError
from ship_sqla._sql_errors import database_outage_translated
from ship_sqla.kernel._errors import DatabaseUnavailableError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Coroutine

    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "command_engine",
    "database_call",
    "database_error_text",
    "run_jobs_call",
    "run_on_database",
]

T = TypeVar("T")


@contextlib.asynccontextmanager
async def command_engine(url: URL) -> AsyncIterator[AsyncEngine]:
    """An engine for one command's few statements (``NullPool``: nothing kept between
    them), disposed on the way out."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        yield engine
    finally:
        await engine.dispose()


def database_call(database_url: URL, call: Coroutine[Any, Any, T], *, as_json: bool) -> T:
    """Run ``call``; a database outage, however the driver said it (the one rule of
    :mod:`ship_sqla._sql_errors`), is exit 1 printed with its code, what failed and the fix."""
    context = click.get_current_context(silent=True)
    command = context.command_path if context is not None else "ship-sqla"
    try:
        # driver_only: the commands run ship_sqla's own code (a worker's handlers never raise
        # through here: the runtime reports their errors), so an OSError is the driver's.
        with database_outage_translated(f"{command}'s call", driver_only=True):
            return asyncio.run(call)
    except MissingTablesError as exc:
        # The database answered, and lacks tables: a failed operation (exit 1) whose message
        # names them and the `schema apply` command, like every other database failure here.
        where = database_url.render_as_string(hide_password=True)
        fail(
            f"{exc.code}: {command} at {where}: {exc.message} Fix: {exc.fix}",
            as_json=as_json,
            cause=exc,
        )
    except DatabaseUnavailableError as exc:
        where = database_url.render_as_string(hide_password=True)
        fail(
            f"{exc.code}: {command} could not use the database at {where}: {exc.message}"
            f" Fix: {exc.fix}",
            as_json=as_json,
            cause=exc,
        )


def database_error_text(exc: BaseException) -> str:
    """A database error in one line for a message: ``<type>: <its first line>``."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def run_on_database(
    database_url: URL,
    call: Coroutine[Any, Any, T],
    *,
    failing: str,
    fix: str,
    as_json: bool = False,
) -> T:
    """Run ``call``; an outage is exit 1 (:func:`database_call`), and so is any other database
    error, printed as ``<failing> at <url>: <error>. Fix: <fix>``."""
    try:
        return database_call(database_url, call, as_json=as_json)
    except (SQLAlchemyError, OSError) as exc:
        where = database_url.render_as_string(hide_password=True)
        fail(
            f"{failing} at {where}: {database_error_text(exc)}. Fix: {fix}",
            as_json=as_json,
            cause=exc,
        )


def run_jobs_call(
    database_url: URL,
    call: Coroutine[Any, Any, T],
    *,
    tables: str,
    as_json: bool = False,
) -> T:
    """Run ``call``; a database that cannot be reached or lacks ``tables`` is exit 1."""
    return run_on_database(
        database_url,
        call,
        failing="cannot reach the job runs",
        fix="check the URL, that the server is up, and that the job tables exist (here:"
        f" {tables}; created by ship_job_runs_table / ship_job_state_table in your migrations,"
        " or by `ship-sqla schema apply`); name tables created under other names or in another"
        " schema with --runs-table and --schema (and --state-table for the worker).",
        as_json=as_json,
    )
