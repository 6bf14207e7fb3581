"""Following the primary (J24), without a database: which errors mean a read-only server or no
writable host, what they become, and how the hosts of a multi-host URL are tried."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from asyncpg import exceptions as pg
from sqlalchemy.exc import DBAPIError, InternalError

import ship_sqla._failover as failover
from ship_sqla._failover import Hosts, connect_first_writable, multi_host
from ship_sqla._notify import WRITABLE_HEALTH_INTERVAL, Listener, _read_only
from ship_sqla._sql_errors import database_outage_translated, outage_reason, server_read_only
from ship_sqla.errors import DatabaseUnavailableError


def read_only_error(*, invalidated: bool) -> DBAPIError:
    orig = pg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction")
    return DBAPIError("INSERT", None, orig, connection_invalidated=invalidated)


class Driver:
    """An asyncpg connection as far as its reported server settings go."""

    def __init__(self, **settings: str) -> None:
        self._settings = SimpleNamespace(**settings)

    def get_settings(self) -> Any:
        return self._settings


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        (Driver(in_hot_standby="on", default_transaction_read_only="off"), True),
        (Driver(in_hot_standby="off", default_transaction_read_only="on"), True),
        (Driver(), True),  # a server before PostgreSQL 14 reports neither
        (None, True),
        (Driver(in_hot_standby="off", default_transaction_read_only="off"), False),
    ],
)
def test_a_read_only_server_is_told_from_the_applications_read_only_transaction(
    driver: Driver | None, expected: bool
) -> None:
    """J24: SQLSTATE 25006 is the server's (a standby, a demoted primary) when the server
    reports itself read-only, or reports nothing; with both settings reported off it is a
    transaction the application began READ ONLY."""
    assert server_read_only(read_only_error(invalidated=False), driver) is expected
    other = DBAPIError("INSERT", None, pg.UniqueViolationError("dup"))
    assert server_read_only(other, Driver(in_hot_standby="on")) is False


def test_a_read_only_server_is_database_unavailable_with_a_failover_fix() -> None:
    """J24: a 25006 whose connection was dropped (the server's) is DatabaseUnavailableError
    whose Fix names the multi-host URL; one whose connection was kept (the application's own
    READ ONLY transaction) passes unchanged."""
    with pytest.raises(DatabaseUnavailableError) as caught, database_outage_translated("op"):
        raise read_only_error(invalidated=True)
    assert "read-only" in caught.value.message
    assert "25006" in caught.value.message
    assert "target_session_attrs=read-write" in (caught.value.fix or "")
    assert outage_reason(read_only_error(invalidated=False)) is None


def test_no_host_matching_is_database_unavailable_with_a_failover_fix() -> None:
    """J24: asyncpg's "None of the hosts match the target attribute requirement", as
    SQLAlchemy wraps it (a raw InternalError before), is DatabaseUnavailableError."""
    orig = pg.TargetServerAttributeNotMatched(
        "None of the hosts match the target attribute requirement 'read-write'"
    )
    wrapped = InternalError("connect", None, orig)
    with pytest.raises(DatabaseUnavailableError) as caught, database_outage_translated("op"):
        raise wrapped
    assert "no host of the URL accepts writes" in caught.value.message
    assert "host=h1:5432&host=h2:5432" in (caught.value.fix or "")


class FakeConnect:
    """``asyncpg.connect`` for hosts that each answer one way: "hang", "read-only", "refuse",
    or "ok" (returns the host)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, float]] = []

    async def __call__(self, *, host: str, **options: Any) -> Connected:
        self.calls.append((host, options["timeout"]))
        answer = self.answers[host]
        if answer == "hang":
            raise TimeoutError
        if answer == "read-only":
            raise pg.TargetServerAttributeNotMatched("None of the hosts match")
        if answer == "refuse":
            raise ConnectionRefusedError(111, "refused")
        return Connected(host)


class Connected:
    """A connection :class:`FakeConnect` made (weakly held by the hosts, as asyncpg's are)."""

    def __init__(self, host: str) -> None:
        self.host = host

    def __eq__(self, other: object) -> bool:
        return other == self.host

    __hash__ = object.__hash__


def options(*hosts: str, timeout: float = 60) -> dict[str, Any]:
    return {
        "host": list(hosts),
        "port": [5432] * len(hosts),
        "timeout": timeout,
        "target_session_attrs": "read-write",
        "user": "u",
    }


async def test_each_host_gets_a_bounded_connect_and_the_last_good_one_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """J24: a hanging first host costs one ``host_connect_timeout``, not the whole connect
    timeout; the host that accepted is tried first next time, so a failover's hung old
    primary is not paid for again by every new connection."""
    fake = FakeConnect({"old": "hang", "new": "ok"})
    monkeypatch.setattr(failover.asyncpg, "connect", fake)
    hosts = Hosts(2.0)
    assert await connect_first_writable(options("old", "new"), hosts) == "new"
    assert fake.calls == [("old", 2.0), ("new", 2.0)]
    fake.calls.clear()
    assert await connect_first_writable(options("old", "new"), hosts) == "new"
    assert fake.calls == [("new", 2.0)]


async def test_no_host_accepting_says_what_each_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """J24: when no host accepts, a host that answered read-only makes the error asyncpg's
    TargetServerAttributeNotMatched (hence DatabaseUnavailableError), naming each host; when
    none answered at all, the last host's own error is raised."""
    monkeypatch.setattr(
        failover.asyncpg, "connect", FakeConnect({"a": "hang", "b": "read-only", "c": "refuse"})
    )
    with pytest.raises(pg.TargetServerAttributeNotMatched) as caught:
        await connect_first_writable(options("a", "b"), Hosts(1.0))
    assert "a:5432 timed out" in str(caught.value)
    assert "b:5432 TargetServerAttributeNotMatched" in str(caught.value)
    with pytest.raises(ConnectionRefusedError):
        await connect_first_writable(options("a", "c"), Hosts(1.0))


async def test_the_total_connect_timeout_still_bounds_every_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """J24: a host never gets more than what is left of the engine's total connect timeout."""
    fake = FakeConnect({"a": "hang", "b": "ok"})
    monkeypatch.setattr(failover.asyncpg, "connect", fake)
    await connect_first_writable(options("a", "b", timeout=0.5), Hosts(3.0))
    assert fake.calls[0][0] == "a"
    assert 0.4 < fake.calls[0][1] <= 0.5
    assert fake.calls[1][1] <= 0.5


def test_only_several_hosts_take_the_bounded_path() -> None:
    """J24: a one-host URL keeps asyncpg's own connect."""
    assert multi_host(options("a", "b"))
    assert not multi_host({"host": "a", "port": 5432})
    assert not multi_host({"host": ["a"], "port": [5432]})


def test_a_listener_for_a_writable_server_leaves_one_that_turned_read_only() -> None:
    """J24, K1: a listener whose URL asks for a writable server probes every
    WRITABLE_HEALTH_INTERVAL seconds and counts a server that reports itself read-only (a
    standby, a demoted primary) as lost, so it reconnects to the new primary."""
    assert _read_only(Driver(in_hot_standby="on"))  # type: ignore[arg-type]
    assert _read_only(Driver(default_transaction_read_only="on"))  # type: ignore[arg-type]
    assert not _read_only(Driver(in_hot_standby="off", default_transaction_read_only="off"))  # type: ignore[arg-type]
    assert not _read_only(None)

    async def never() -> Any:
        raise AssertionError

    writable = Listener(never, name="l", report_error=print, writable_only=True)
    plain = Listener(never, name="l", report_error=print)
    assert writable._health_interval == WRITABLE_HEALTH_INTERVAL
    assert plain._health_interval > WRITABLE_HEALTH_INTERVAL


class FakeConnection:
    """An asyncpg connection as far as the hang check's drop goes."""

    def __init__(self) -> None:
        self.terminated = False

    def is_closed(self) -> bool:
        return self.terminated

    def terminate(self) -> None:
        self.terminated = True


def test_a_hung_host_is_tried_last_until_it_accepts_a_connection_again() -> None:
    """J24: the host that last accepted a connection is tried first; a host found hung
    (:meth:`Hosts.drop`) is tried after every other, until a connection to it is made again."""
    a, b, c = ("a", 1), ("b", 2), ("c", 3)
    hosts = Hosts()
    assert hosts.order([a, b, c]) == [a, b, c]
    hosts.opened(b, FakeConnection(), {})  # type: ignore[arg-type]
    assert hosts.order([a, b, c]) == [b, a, c]
    hosts.drop(b)
    assert hosts.last_good is None
    assert hosts.order([a, b, c]) == [a, c, b]
    hosts.opened(b, FakeConnection(), {})  # type: ignore[arg-type]
    assert hosts.suspect == set()
    assert hosts.order([a, b, c]) == [b, a, c]


def test_dropping_a_hung_host_terminates_its_connections_only() -> None:
    """J24: a hung host's connections are all terminated at once (no graceful close waits on
    the hung server), the engine's pool is invalidated (``on_drop``), and the connections to
    the other hosts are left alone."""
    hosts = Hosts()
    invalidated: list[bool] = []
    hosts.on_drop.append(lambda: invalidated.append(True))
    on_hung = [FakeConnection(), FakeConnection()]
    elsewhere = FakeConnection()
    for connection in on_hung:
        hosts.opened(("hung", 1), connection, {})  # type: ignore[arg-type]
    hosts.opened(("other", 2), elsewhere, {})  # type: ignore[arg-type]
    assert sorted(hosts.connected_to()) == [("hung", 1), ("other", 2)]
    assert hosts.drop(("hung", 1)) == 2
    assert all(connection.terminated for connection in on_hung)
    assert not elsewhere.terminated
    assert invalidated == [True]
    assert hosts.connected_to() == [("other", 2)]


async def test_no_operation_is_watched_before_a_multi_host_connection() -> None:
    """J24: an engine of a one-host URL (no connection made through the multi-host connect)
    watches nothing: its operations pay no timer."""
    hosts = Hosts()
    assert hosts.watch() is None
    hosts.opened(("a", 1), FakeConnection(), {})  # type: ignore[arg-type]
    overdue = hosts.watch()
    assert overdue is not None
    overdue.cancel()
