"""The one outage rule (``ship_sqla._sql_errors``), without a database: which driver errors
mean "the database is unavailable", and what the translation raises."""

from __future__ import annotations

import pytest
from asyncpg import exceptions as pg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from ship_sqla._sql_errors import database_outage_translated, outage_reason
from ship_sqla.errors import DatabaseUnavailableError


def wrapped(orig: BaseException, *, invalidated: bool = False) -> DBAPIError:
    """What SQLAlchemy raises for a driver error (asyncpg's error is its ``orig``)."""
    return DBAPIError("SELECT 1", None, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (wrapped(pg.AdminShutdownError("terminating connection")), "57P01"),
        (wrapped(pg.CrashShutdownError("crash")), "57P02"),
        (wrapped(pg.CannotConnectNowError("the database system is starting up")), "57P03"),
        (wrapped(pg.ConnectionDoesNotExistError("closed in the middle")), "08003"),
        (wrapped(pg.ConnectionFailureError("failure")), "08006"),
        (pg.AdminShutdownError("raw, unwrapped"), "57P01"),
        (wrapped(Exception("connection is closed"), invalidated=True), "closed"),
        (InterfaceError("SELECT 1", None, Exception("x"), connection_invalidated=True), "closed"),
        (pg.InterfaceError("connection is closed"), "closed"),
    ],
)
def test_driver_outages_are_recognised(error: BaseException, reason: str) -> None:
    """Outage (issue #10 item 7): server shutdown/startup SQLSTATEs (57P01-57P03), class 08,
    and connections SQLAlchemy invalidated or asyncpg reports closed are outages."""
    found = outage_reason(error)
    assert found is not None
    assert reason in found


@pytest.mark.parametrize(
    "error",
    [
        wrapped(pg.SerializationError("could not serialize")),  # 40001: U3 re-runs it
        wrapped(pg.InvalidCatalogNameError('database "x" does not exist')),  # 3D000: config
        wrapped(pg.UniqueViolationError("duplicate key")),
        pg.InterfaceError("cannot perform operation: another operation is in progress"),
        OperationalError("SELECT 1", None, Exception("timeout")),
        ValueError("application error"),
    ],
)
def test_other_errors_are_not_outages(error: BaseException) -> None:
    """Outage: misuse, constraint, configuration and U3-retryable errors are not outages."""
    assert outage_reason(error) is None
    assert outage_reason(error, driver_only=True) is None


def test_a_bare_oserror_is_an_outage_only_in_driver_code() -> None:
    """Outage: asyncpg raises socket errors unwrapped while connecting, so a bare OSError is
    an outage in ship_sqla's own code (driver_only), never in an application's handler."""
    refused = ConnectionRefusedError(111, "Connect call failed")
    assert outage_reason(refused) is None
    assert outage_reason(refused, driver_only=True) is not None
    assert outage_reason(TimeoutError(), driver_only=True) is not None


def test_an_application_error_chaining_an_outage_is_not_retyped() -> None:
    """Outage: only the driver's own errors are judged; an application's exception raised
    from one passes unchanged."""

    class AppError(Exception):
        pass

    app = AppError("gave up")
    app.__cause__ = wrapped(pg.AdminShutdownError("x"))
    assert outage_reason(app) is None
    assert outage_reason(app, driver_only=True) is None


def test_the_translation_chains_the_cause_and_passes_everything_else() -> None:
    """Outage: translated errors are DatabaseUnavailableError ``from`` the driver's error;
    other errors and already translated ones pass unchanged."""
    driver = wrapped(pg.AdminShutdownError("terminating connection"))
    with pytest.raises(DatabaseUnavailableError) as raised, database_outage_translated("probe"):
        raise driver
    assert raised.value.__cause__ is driver
    assert raised.value.code == "SHIP_SQLA_DATABASE_UNAVAILABLE"
    assert raised.value.message.startswith("probe failed: the database is unavailable")
    assert "57P01" in raised.value.message

    inner = raised.value
    with pytest.raises(DatabaseUnavailableError) as again, database_outage_translated("outer"):
        raise inner
    assert again.value is inner

    other = wrapped(pg.UniqueViolationError("duplicate key"))
    with pytest.raises(DBAPIError) as unchanged, database_outage_translated("probe"):
        raise other
    assert unchanged.value is other
