"""A hung host is left within seconds, a slow one is not (J24, issue #34), on the shared server.

The first host of the multi-host URL is a :class:`~pausable_proxy.PausableProxy` in front of the
shared server, the second the server itself: ``pause()`` makes the first host hang (every
socket kept open, nothing answered: a SIGSTOPped node or a network partition), ``resume()``
ends the pause. The real primary + standby cluster (SIGSTOP, promote) is test_failover.py's.

What is checked: an operation that waits ``hang_check_after`` has the hosts probed with a new
connection; a host that gives no answer within ``hang_probe_timeout`` has every connection to it
dropped at once (the waiting statement fails as a lost connection, long before its operation
timeout), and the next connects go to the other host first; a slow statement or a pause the
probe outlives drops nothing; a stall of the process's own event loop is not taken for the
server's silence.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from pausable_proxy import PausableProxy, silent_port
from sqlalchemy import Column, Integer, MetaData, Table, insert, text
from sqlalchemy.engine import make_url
from test_failover_follow import multi_host_url, server_of
from wake_helpers import Errors

from ship_sqla import (
    TransactionScope,
    create_engine,
    create_job_backend,
    create_unit_of_work,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._failover import HANG_CHECK_AFTER, HANG_PROBE_TIMEOUT, Hosts, answers, hosts_of
from ship_sqla._notify import ListenerLostError, listener_for
from ship_sqla.errors import DatabaseUnavailableError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
hang_notes = Table("hang_notes", metadata, Column("id", Integer, primary_key=True))
jobs_metadata = MetaData()
runs = ship_job_runs_table(jobs_metadata)
state = ship_job_state_table(jobs_metadata)


async def _noop(ctx: Any, payload: Any) -> None:
    pass


FREE = define_job("hang.free", _noop, payload=dict)


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


async def _insert(scope: TransactionScope) -> int:
    await scope.connection.execute(insert(hang_notes))
    return int(await scope.connection.scalar(text("SELECT pg_backend_pid()")) or 0)


@pytest.fixture
async def proxy(ship_engine: AsyncEngine, ship_engine_url: str) -> AsyncIterator[PausableProxy]:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    server = make_url(ship_engine_url)
    async with PausableProxy(server.host or "127.0.0.1", server.port or 5432) as running:
        yield running


def engine_via(proxy: PausableProxy, url: str, **options: Any) -> AsyncEngine:
    """An engine whose first host is ``proxy``, its second the server itself."""
    hosts = (f"127.0.0.1:{proxy.port}", server_of(url))
    return create_engine(multi_host_url(url, *hosts), pool_size=2, max_overflow=0, **options)


def follower(engine: AsyncEngine) -> Hosts:
    hosts = hosts_of(engine)
    assert hosts is not None
    return hosts


async def test_a_hung_host_costs_the_hang_check_not_the_operation_timeout(
    proxy: PausableProxy, ship_engine_url: str
) -> None:
    """J24: a statement of a ``uow.run`` (the default 30 s operation timeout) on a host that
    hangs fails as a lost connection (DatabaseUnavailableError) once the host gave no answer to
    the hang check's new connection (``hang_check_after`` + ``hang_probe_timeout``), every
    connection to it dropped; the next run connects to the other host first and commits. A run
    whose FIRST statement met the hang is re-run at once on the other host (nothing of it could
    commit): it succeeds, with no restart."""
    engine = engine_via(proxy, ship_engine_url, hang_check_after=0.5, hang_probe_timeout=0.5)
    hung = ("127.0.0.1", proxy.port)

    async def hang_midway(scope: TransactionScope) -> int:
        pid = await _insert(scope)
        proxy.pause()  # the host hangs after the run's first statement
        await _insert(scope)
        return pid

    try:
        uow = create_unit_of_work(engine, repositories=scope_only)
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailableError):
            await uow.run(hang_midway)
        cost = time.monotonic() - started
        assert follower(engine).suspect == {hung}
        with anyio.fail_after(10):
            await uow.run(_insert)  # the other host first: no connect waits on the hung one
        assert follower(engine).last_good not in {None, hung}

        proxy.resume()  # the first host is healthy again and is tried first after a restart
        await engine.dispose()
        await uow.run(_insert)
        assert follower(engine).last_good not in {None, hung}  # the last to accept goes first
        follower(engine).last_good = hung
        await engine.dispose()
        await uow.run(_insert)
        assert follower(engine).last_good == hung
        proxy.pause()
        started = time.monotonic()
        with anyio.fail_after(10):
            await uow.run(_insert)  # its first statement hangs: re-run on the other host
        first_statement_cost = time.monotonic() - started
    finally:
        proxy.resume()
        await engine.dispose()
    assert 0.9 <= cost < 5, cost
    assert 0.9 <= first_statement_cost < 5, first_statement_cost


async def test_a_stores_own_call_on_a_hung_host_fails_within_the_hang_check(
    proxy: PausableProxy, ship_engine_url: str
) -> None:
    """J24, J11: a job backend's own call (an enqueue outside a unit of work: the direct
    asyncpg path, 30 s operation timeout by default) waiting on a hung host fails as
    DatabaseUnavailableError within the hang check, and the next call lands on the other host."""
    engine = engine_via(proxy, ship_engine_url, hang_check_after=0.5, hang_probe_timeout=0.5)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(jobs_metadata.create_all)
        backend = create_job_backend(database=engine, table=runs, state_table=state)
        await backend.enqueue(FREE, {"n": 0})
        assert follower(engine).last_good == ("127.0.0.1", proxy.port)
        proxy.pause()
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailableError):
            await backend.enqueue(FREE, {"n": 1})
        cost = time.monotonic() - started
        with anyio.fail_after(10):
            await backend.enqueue(FREE, {"n": 2})
    finally:
        proxy.resume()
        await engine.dispose()
    assert 0.9 <= cost < 5, cost


async def test_a_listener_leaves_a_hung_host_with_the_engine(
    proxy: PausableProxy, ship_engine_url: str
) -> None:
    """J24, K1: a listener made from the engine's URL shares the engine's hosts: its health
    probe waiting on a hung host runs the hang check, its connection is dropped with the
    engine's, and it is live again on the other host within seconds (not after its probe and
    IO timeouts, 5 s + 10 s)."""
    engine = engine_via(proxy, ship_engine_url, hang_check_after=0.5, hang_probe_timeout=0.5)
    errors = Errors()
    listener = listener_for(engine, True, name="hang test", report_error=errors)
    assert listener is not None
    subscription = listener.subscribe("ship_sqla.hang_test", lambda _payload: None)
    try:
        with anyio.fail_after(10):
            await listener.wait_live()
        assert follower(engine).last_good == ("127.0.0.1", proxy.port)
        proxy.pause()
        started = time.monotonic()
        await errors.wait_for(ListenerLostError, within=10)
        with anyio.fail_after(10):
            await listener.wait_live()  # cleared when the connection was lost: live again
        cost = time.monotonic() - started
        assert listener.connects == 2
    finally:
        await subscription.close()
        proxy.resume()
        await engine.dispose()
    # The health probe comes every 2 s; then 0.5 s to the check, 0.5 s for the probe.
    assert cost < 5, cost


async def test_a_long_statement_on_a_healthy_host_drops_nothing(
    proxy: PausableProxy, ship_engine_url: str
) -> None:
    """J24: a statement that is merely long (here 1.5 s, three times ``hang_check_after``)
    has its host checked, the host answers, and nothing is dropped: the statement completes on
    its connection and the host stays first."""
    engine = engine_via(proxy, ship_engine_url, hang_check_after=0.3, hang_probe_timeout=0.5)

    async def long_statement(scope: TransactionScope) -> int:
        await scope.connection.execute(text("SELECT pg_sleep(1.5)"))
        return await _insert(scope)

    try:
        uow = create_unit_of_work(engine, repositories=scope_only)
        before = await uow.run(_insert)
        with anyio.fail_after(10):
            after = await uow.run(long_statement)
        hosts = follower(engine)
        assert hosts.checks >= 1
        assert hosts.suspect == set()
        assert after == before  # the same pooled connection: nothing was dropped
    finally:
        await engine.dispose()


async def test_a_two_second_pause_drops_nothing_at_the_defaults(
    proxy: PausableProxy, ship_engine_url: str
) -> None:
    """J24: at the library's defaults (check after 2 s, 2 s to answer), a healthy primary that
    pauses for 2 s (a loaded machine) answers the hang check once it resumes, within its
    bound: the statement waiting on it completes, its connection is kept, no host is suspect."""
    assert (HANG_CHECK_AFTER, HANG_PROBE_TIMEOUT) == (2.0, 2.0)
    engine = engine_via(proxy, ship_engine_url)
    try:
        uow = create_unit_of_work(engine, repositories=scope_only)
        before = await uow.run(_insert)
        proxy.pause()
        async with anyio.create_task_group() as group:
            pids: list[int] = []

            async def run() -> None:
                pids.append(await uow.run(_insert))

            group.start_soon(run)
            await anyio.sleep(2.0)  # the pause itself: the fault's duration
            proxy.resume()
        hosts = follower(engine)
        assert hosts.checks >= 1
        assert hosts.suspect == set()
        assert pids == [before]
    finally:
        proxy.resume()
        await engine.dispose()


def _options(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    return {"user": parsed.username, "password": parsed.password, "database": parsed.database}


async def test_the_probe_tells_an_answer_from_silence(ship_engine_url: str) -> None:
    """J24: the hang check's probe: a server that answers (even with a refusal: an unknown
    database) is alive; a host that accepts TCP and never answers, or refuses TCP, is not,
    within the probe's bound."""
    server = make_url(ship_engine_url)
    host = (server.host or "127.0.0.1", server.port or 5432)
    options = _options(ship_engine_url)
    assert await answers(host, options, 1.0)
    assert await answers(host, {**options, "database": "no_such_database_here"}, 1.0)
    with silent_port() as silent:
        started = time.monotonic()
        assert not await answers(("127.0.0.1", silent), options, 0.5)
        assert time.monotonic() - started < 2
    with silent_port() as closed:
        pass  # bound, then closed: nothing listens there now
    assert not await answers(("127.0.0.1", closed), options, 0.5)


async def test_a_stall_of_the_own_event_loop_is_not_the_servers_silence(
    ship_engine_url: str,
) -> None:
    """J24: when this process's event loop stalls (a loaded machine) for longer than the
    probe's bound while the probe connects, the server's answer, waiting in the socket, still
    counts: the stall is not counted as the server's time, so a healthy primary is not dropped
    for the process's own pause."""
    server = make_url(ship_engine_url)
    host = (server.host or "127.0.0.1", server.port or 5432)
    stall = 0.8
    # The stall itself: a blocking call on the event loop, as a CPU-bound task makes one.
    asyncio.get_running_loop().call_soon(time.sleep, stall)
    started = time.monotonic()
    assert await answers(host, _options(ship_engine_url), 0.3)
    assert time.monotonic() - started >= stall
