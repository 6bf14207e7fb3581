"""Reading driver errors: PostgreSQL's SQLSTATE, and whether an error means the database is gone.

The outage rule lives here once (:func:`outage_reason`), and so does its translation
(:func:`database_outage_translated`), which the unit of work, every store, the job backend, the
advisory locks and the CLI wrap around their database calls: whatever the driver raised for a
refused connection, a closed connection or a server going down, callers see ONE error,
:class:`~ship_sqla.errors.DatabaseUnavailableError` (``SHIP_SQLA_DATABASE_UNAVAILABLE``), with
the driver's error chained as its cause.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from asyncpg.exceptions import InterfaceError as AsyncpgInterfaceError
from asyncpg.exceptions import PostgresError, TargetServerAttributeNotMatched
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ship_sqla.kernel._errors import DatabaseUnavailableError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "NO_WRITABLE_HOST",
    "OUTAGE_SQLSTATES",
    "READ_ONLY_SERVER",
    "READ_ONLY_SQLSTATE",
    "database_outage_translated",
    "database_unavailable",
    "outage_reason",
    "refused_value",
    "server_read_only",
    "sqlstate_of",
]

OUTAGE_SQLSTATES: Final = {
    "57P01": "the server is shutting down or ended the session (admin_shutdown)",
    "57P02": "the server crashed and is restarting (crash_shutdown)",
    "57P03": "the server is starting up or shutting down (cannot_connect_now)",
}
"""Operator-intervention SQLSTATEs that mean the server is going away or not there yet. With
them, SQLSTATE class 08 (connection exception) is an outage too."""

_FIX: Final = (
    "check that PostgreSQL is running and reachable (host, port, network, max_connections),"
    " then retry the work."
)

READ_ONLY_SQLSTATE: Final = "25006"
"""read_only_sql_transaction: a write on a read-only server (a standby, or a primary an
operator or a switchover made read-only) or in a transaction the application began READ ONLY.
Only the former is an outage (J24): :mod:`ship_sqla._failover` then invalidates the connection,
which marks the error ``connection_invalidated``."""

READ_ONLY_SERVER: Final = (
    "the server is read-only (a standby, or a primary demoted by a failover or a switchover);"
    " its connection was dropped and the pool connects again"
)
NO_WRITABLE_HOST: Final = (
    "no host of the URL accepts writes (target_session_attrs): each one is read-only, in"
    " recovery or unreachable"
)
_FAILOVER_FIX: Final = (
    "retry the work: a failover is under way or a standby is being promoted. List every host"
    " of the cluster in ONE URL, postgresql+asyncpg://user@/db?host=h1:5432&host=h2:5432"
    "&target_session_attrs=read-write (docs/production.md, Failover), so the pool follows"
    " the new primary."
)


REFUSED_VALUE_CLASSES: Final = ("22", "23", "54")
"""SQLSTATE classes that mean the database refused a VALUE of the statement (data exception:
bad text, a time out of range; integrity constraint violation; program limit exceeded, e.g. an
index row too large): sending it again fails again, unlike an outage or a conflict."""


def refused_value(exc: BaseException) -> bool:
    """Whether ``exc`` says the database (or the driver, encoding it) cannot store a value the
    statement carried (J23): a retry of the same statement would fail the same way."""
    if isinstance(exc, UnicodeError | OverflowError):
        return True  # the driver could not encode it (a lone surrogate; a time out of range)
    state = sqlstate_of(exc)
    return state is not None and state[:2] in REFUSED_VALUE_CLASSES


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, looking through SQLAlchemy's and asyncpg's wrappers."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for attribute in ("sqlstate", "pgcode"):
            value = getattr(current, attribute, None)
            if isinstance(value, str) and value:
                return value
        current = getattr(current, "orig", None) or current.__cause__
    return None


def outage_reason(
    exc: BaseException,
    *,
    driver_only: bool = False,
    connection: AsyncConnection | None = None,
) -> str | None:
    """Why ``exc`` means the database is unavailable, or None when it means something else.

    An outage is: a connection SQLAlchemy invalidated (its dialect saw the socket closed); a
    driver error of SQLSTATE class 08 or 57P01/57P02/57P03; a write refused by a read-only
    server (25006 on a connection :mod:`ship_sqla._failover` invalidated, J24); no host of a
    multi-host URL matching ``target_session_attrs`` (J24); asyncpg's "connection is closed";
    a SQLAlchemy error on a ``connection`` SQLAlchemy has invalidated; and, only when
    ``driver_only`` (the failing code is the driver's and ship_sqla's own: opening a connection,
    where asyncpg raises socket errors unwrapped, or a store's statements), any ``OSError``
    (refused, unreachable, DNS, connect timeout).

    Only driver errors are judged: an application's own exception is never re-typed, even when
    it chains a driver error, and without ``driver_only`` neither is a bare ``OSError`` (a
    handler's own network call may raise one).
    """
    if isinstance(exc, DatabaseUnavailableError):
        return str(exc.message)
    reason = _driver_reason(exc)
    invalidated = connection is not None and connection.invalidated
    if reason is None and invalidated and isinstance(exc, SQLAlchemyError):
        reason = "the connection was closed earlier in this transaction"
    if reason is None and driver_only and isinstance(exc, OSError):
        reason = "a network error: the connection could not be opened or was cut"
    return reason


def _driver_reason(exc: BaseException) -> str | None:
    if isinstance(exc, DBAPIError | PostgresError):
        state = sqlstate_of(exc) or ""
        if state in OUTAGE_SQLSTATES:
            return f"{OUTAGE_SQLSTATES[state]}, SQLSTATE {state}"
        if state.startswith("08"):
            return f"the connection failed (SQLSTATE {state})"
        if (
            state == READ_ONLY_SQLSTATE
            and isinstance(exc, DBAPIError)
            and exc.connection_invalidated
        ):
            return f"{READ_ONLY_SERVER}, SQLSTATE {state}"
    if _caused_by(exc, TargetServerAttributeNotMatched):
        return NO_WRITABLE_HOST
    closed = (isinstance(exc, DBAPIError) and exc.connection_invalidated) or (
        isinstance(exc, AsyncpgInterfaceError) and "connection is closed" in str(exc)
    )
    return "the connection was closed" if closed else None


def server_read_only(exc: BaseException, driver: object | None) -> bool:
    """Whether ``exc`` is a write refused because the SERVER is read-only (J24): SQLSTATE 25006
    while the server reports, to ``driver`` (an asyncpg connection), ``in_hot_standby`` or
    ``default_transaction_read_only`` on, or reports neither (a server older than PostgreSQL
    14, or no connection to ask). A 25006 while it reports both off is a transaction the
    application began READ ONLY: not the server's."""
    if sqlstate_of(exc) != READ_ONLY_SQLSTATE:
        return False
    get_settings = getattr(driver, "get_settings", None)
    if get_settings is None:
        return True
    settings = get_settings()
    reported = [
        getattr(settings, name, None)
        for name in ("in_hot_standby", "default_transaction_read_only")
    ]
    return "on" in reported or reported == [None, None]


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc``, or an error it wraps (SQLAlchemy's ``orig``, a ``__cause__``), is a
    ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = getattr(current, "orig", None) or current.__cause__
    return False


def database_unavailable(
    operation: str, exc: BaseException, reason: str
) -> DatabaseUnavailableError:
    """The typed error for ``exc``; raise it ``from exc``. A failover's reasons (a read-only
    server, no writable host: J24) say how to follow the primary."""
    first_line = (str(exc).splitlines() or [""])[0]
    failover = reason == NO_WRITABLE_HOST or reason.startswith(READ_ONLY_SERVER)
    return DatabaseUnavailableError(
        f"{operation} failed: the database is unavailable ({reason}):"
        f" {type(exc).__name__}: {first_line.rstrip('.')}.",
        fix=_FAILOVER_FIX if failover else _FIX,
    )


@contextmanager
def database_outage_translated(
    operation: str,
    *,
    driver_only: bool = False,
    connection: AsyncConnection | None = None,
) -> Iterator[None]:
    """Raise :class:`~ship_sqla.errors.DatabaseUnavailableError` ``from`` the driver's error
    when what the block raised is an outage (:func:`outage_reason`); anything else passes
    unchanged, and so does an outage already translated by an inner block.

    ``driver_only``: the block runs only the driver and ship_sqla's own code (opening a
    connection, a store's statements), so a bare ``OSError`` in it is the driver's. Never set
    it around an application's handler. Works around ``await`` too (a plain ``with`` in async code).
    """
    try:
        yield
    except DatabaseUnavailableError:
        raise
    except Exception as exc:
        reason = outage_reason(exc, driver_only=driver_only, connection=connection)
        if reason is None:
            raise
        raise database_unavailable(operation, exc, reason) from exc
