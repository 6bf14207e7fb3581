"""The operator surface at the shell: how ``ship-sqla jobs ...``, ``workers`` and ``dashboard``
reach :class:`~ship_sqla.kernel.JobOperations`.

The operator at the shell is trusted: whoever holds the database URL can change the runs
directly, so the CLI's authorizer grants ``ship.jobs:manage`` (J8) to every operation. Every
operation goes through the one operator surface (``JobOperations`` over the backend's admin
port); the CLI runs no SQL of its own. ``jobs dead`` cursors are signed with a key derived from
the database URL, so a cursor printed by one invocation pages on in the next one against the
same database (and is worth nothing to anyone without that URL).

S1's one audit rule holds at the shell: every state-changing verb writes its entry to the
audit table (``--audit-table``, default ship_audit beside the runs table) as
``cli:<user>@<host>``, and changes nothing when that table is missing (exit 1 naming it and
how to create it); ``--no-audit`` is the explicit opt-out.
"""

from __future__ import annotations

import getpass
import hashlib
import socket
from typing import TYPE_CHECKING, Final, TypeVar

from ship_sqla._cli._database import command_engine, run_jobs_call
from ship_sqla._cli._tables import DEFAULT_TABLES, JobTables
from ship_sqla.kernel._errors import ShipError
from ship_sqla.kernel._operations import (
    MANAGE_PERMISSION,
    JobOperationRefusedError,
    create_job_operations,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla.kernel._audit import AuditSink
    from ship_sqla.kernel._operations import JobOperations

__all__ = [
    "RunNotFoundError",
    "cli_actor",
    "cli_cursor_secret",
    "not_found",
    "operate",
    "run_operation",
    "run_operation_on_run",
]

T = TypeVar("T")


def _operator_at_the_shell(permission: str, operation: str) -> bool:  # noqa: ARG001 - all allowed
    """The CLI's authorizer: the operator holding the database URL is trusted (see module doc)."""
    return permission == MANAGE_PERMISSION


def cli_cursor_secret(url: URL) -> bytes:
    """The key the shell's operator pages are signed with: derived from the database URL
    (password included), so every invocation against one database accepts the others' cursors;
    whoever could forge one holds the URL, and so every row, already."""
    raw = url.render_as_string(hide_password=False).encode()
    return hashlib.sha256(b"ship_sqla.cli.cursor\x00" + raw).digest()


def cli_actor() -> str:
    """Who the audit log names for the shell: ``cli:<login>@<host>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


async def _operations(
    engine: AsyncEngine, url: URL, tables: JobTables, audit: AuditSink | None
) -> JobOperations:
    return create_job_operations(
        await tables.operator_backend(engine),
        authorizer=_operator_at_the_shell,
        cursor_secret=cli_cursor_secret(url),
        audit=audit,
        actor=cli_actor(),
    )


async def run_operation(
    url: URL,
    operation: Callable[[JobOperations], Awaitable[T]],
    tables: JobTables = DEFAULT_TABLES,
    *,
    audit_table: str | None = None,
) -> T:
    """Run one J8 operation against ``tables`` at ``url``, then dispose; a state-changing one
    is audited in ``audit_table`` (in the runs table's schema), which must exist: otherwise the
    operation raises :class:`~ship_sqla.errors.AuditUnavailableError` before its first change
    (S1). ``audit_table=None``: no audit (the reads, and a verb given ``--no-audit``)."""
    async with command_engine(url) as engine:
        audit = None if audit_table is None else tables.audit_log(engine, audit_table)
        return await operation(await _operations(engine, url, tables, audit))


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
    *,
    audit_table: str | None = None,
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

    return await run_operation(url, guarded, tables, audit_table=audit_table)


def operate(
    database_url: URL,
    operation: Callable[[JobOperations], Awaitable[T]],
    tables: JobTables,
    *,
    on_run: str | None = None,
    with_state_table: bool = False,
    as_json: bool = False,
    audit_table: str | None = None,
) -> T:
    """A ``jobs`` verb's one operation, run from its command: :func:`run_operation` (or, for a
    verb ``on_run``, :func:`run_operation_on_run`), audited in ``audit_table`` (a
    state-changing verb passes its ``--audit-table``, None for ``--no-audit``); a database
    that cannot be reached or lacks the runs table (and, ``with_state_table``, the state
    table) is exit 1 naming them, and so is a missing audit table (nothing changed)."""
    call = (
        run_operation(database_url, operation, tables, audit_table=audit_table)
        if on_run is None
        else run_operation_on_run(database_url, on_run, operation, tables, audit_table=audit_table)
    )
    names = tables.names if with_state_table else tables.runs_name
    return run_jobs_call(database_url, call, tables=names, as_json=as_json)
