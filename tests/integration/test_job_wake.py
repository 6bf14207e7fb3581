"""Push wake for jobs (K1) on real PostgreSQL: an enqueue announces its due runs in its own
transaction; a worker runtime in another process (a subprocess, or a second engine and backend,
which share nothing with the runtime's backend but the database) wakes when it commits.

The runtimes here run on a FrozenClock that the tests never move unless they say so: their
poll (5 s) can then never fire, so a run that starts was started by an announcement (or the
listener's reconnect), not by polling.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from wake_helpers import (
    Errors,
    NotificationDroppingProxy,
    Recorded,
    connections_refused,
    listener_pids,
    parked,
    spy_on,
    until_no_listener,
)

from ship_sqla import (
    JobContext,
    TransactionScope,
    create_unit_of_work,
    define_job,
    start_job_runtime,
)
from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._notify import ListenerLostError, ListenerNotLiveError
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import EnqueueRequest, JobDefinition
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

POLL = 5.0


class Started(Recorded):
    """A handler that records the payloads it started with."""

    async def __call__(self, _ctx: JobContext, payload: dict[str, Any]) -> None:
        self.record(payload)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
async def other_engine(engine: AsyncEngine, ship_engine_url: str) -> AsyncIterator[AsyncEngine]:
    """A second engine on the same database: the "other process" of most tests."""
    other = create_async_engine(ship_engine_url)
    try:
        yield other
    finally:
        await other.dispose()


@pytest.fixture
def errors() -> Errors:
    return Errors()


def receiver(engine: AsyncEngine, clock: FrozenClock, errors: Errors, **options: Any) -> Any:
    """The worker's backend (its runtimes poll every ``POLL`` seconds)."""
    return create_job_backend(
        database=engine,
        table=runs,
        state_table=state,
        clock=clock,
        on_error=errors,
        **options,
    )


def sender(engine: AsyncEngine, **options: Any) -> PostgresJobBackend:
    return create_job_backend(
        database=engine, table=runs, state_table=state, listen=False, **options
    )


def job(job_id: str, handler: Started | None = None) -> JobDefinition[dict[str, Any]]:
    return define_job(job_id, handler or Started(), payload=dict)


async def live(backend: PostgresJobBackend) -> None:
    assert backend.listener is not None
    with anyio.fail_after(10):
        await backend.listener.wait_live()


ENQUEUER = textwrap.dedent(
    """
    import asyncio, sys
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine
    from ship_sqla._jobs import create_job_backend, ship_job_runs_table, ship_job_state_table
    from ship_sqla import define_job

    async def nothing(ctx, payload):
        return None

    async def main(url, job_id):
        engine = create_async_engine(url)
        md = MetaData()
        backend = create_job_backend(
            database=engine,
            table=ship_job_runs_table(md),
            state_table=ship_job_state_table(md),
            listen=False,
        )
        await backend.enqueue(define_job(job_id, nothing, payload=dict), {"from": "elsewhere"})
        await engine.dispose()

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def test_k1_an_enqueue_committed_in_another_process_wakes_the_runtime(
    engine: AsyncEngine, ship_engine_url: str, ship_clock: FrozenClock, errors: Errors
) -> None:
    """K1: a run enqueued and committed by a real subprocess starts in this process's parked
    runtime without any poll: the runtime's clock never moves (its 5 s poll cannot fire)."""
    started = Started()
    backend = receiver(engine, ship_clock, errors)
    async with await start_job_runtime(
        job("k1.remote", started), backend=backend, poll_interval=POLL
    ):
        await live(backend)
        await parked(backend)
        await anyio.run_process(
            [sys.executable, "-c", ENQUEUER, ship_engine_url, "k1.remote"], check=True
        )
        await started.wait_for(1)
    assert started.payloads == [{"from": "elsewhere"}]
    assert ship_clock.monotonic() == 0.0
    assert errors == []


async def test_k1_delivered_at_commit_never_before_and_never_after_a_rollback(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    ship_engine_url: str,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K1: the announcement is sent in the enqueueing transaction: nothing is delivered while
    that transaction is open, nothing ever when it rolls back (the runtime is not woken), and
    it is delivered, waking the runtime, when it commits (a rolled-back announcement does not
    throttle the next one either)."""
    started = Started()
    definition = job("k1.commit", started)
    backend = receiver(engine, ship_clock, errors)
    other = sender(other_engine)
    uow = create_unit_of_work(other_engine, repositories=lambda scope: scope)

    class Rollback(Exception):  # noqa: N818 - a signal, not an error
        pass

    async with (
        spy_on(ship_engine_url, backend.wake_channel) as spy,
        await start_job_runtime(definition, backend=backend, poll_interval=POLL),
    ):
        await live(backend)

        async def enqueue_then_fail(_scope: TransactionScope) -> None:
            await other.enqueue(definition, {"n": "rolled back"})
            assert await spy.everything_before_now() == []  # open: nothing delivered yet
            raise Rollback

        with pytest.raises(Rollback):
            await uow.run(enqueue_then_fail)
        assert await spy.everything_before_now() == []
        assert started.payloads == []

        async def enqueue(_scope: TransactionScope) -> None:
            await other.enqueue(definition, {"n": "committed"})
            assert await spy.everything_before_now() == []

        await uow.run(enqueue)
        await started.wait_for(1)
        assert await spy.everything_before_now() == ["k1.commit"]
    assert started.payloads == [{"n": "committed"}]
    assert ship_clock.monotonic() == 0.0


async def test_k8_every_due_enqueue_is_announced_in_its_transaction_or_after_its_commit(
    engine: AsyncEngine, ship_engine_url: str
) -> None:
    """K1, K8 (SPEC §11): plain, many, checked (dedupe key), capped (J2) and unit-of-work
    enqueues each announce their job: the first in its own transaction, those right behind it
    after their commit (the announcer's notify-only transaction, one for every job committed
    meanwhile); none is silenced. A delayed run is not announced, and a backend with
    announce=False announces nothing."""
    clock = FrozenClock()
    plain = sender(engine, clock=clock)
    capped = sender(engine, clock=clock, queue_depth_limit=100)
    silent = sender(engine, clock=clock, announce=False)
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)
    a, b, c, d, e, f, g = (job(f"k1.{name}") for name in "abcdefg")
    async with spy_on(ship_engine_url, plain.wake_channel) as spy:
        await plain.enqueue(a, {})
        folded = await spy.everything_before_now()
        await plain.enqueue(a, {})  # right behind: after its commit
        await plain.enqueue_many(a, [EnqueueRequest({}) for _ in range(3)])
        await plain.enqueue_many(b, [EnqueueRequest({}, dedupe_key=f"k{n}") for n in range(3)])
        await plain.enqueue(c, {}, run_at=clock.now() + timedelta(hours=1))  # not due
        await capped.enqueue(f, {})
        await silent.enqueue(g, {})

        async def several(_scope: TransactionScope) -> None:
            await plain.enqueue(d, {})
            await plain.enqueue_many(d, [EnqueueRequest({}), EnqueueRequest({})])
            await plain.enqueue(e, {}, dedupe_key="once")

        await uow.run(several)
        for backend in (plain, capped):
            assert backend._announcer is not None
            await backend._announcer.flush()
        heard = await spy.everything_before_now()
    assert folded == ["k1.a"]
    assert set(heard) == {"k1.a", "k1.b", "k1.d", "k1.e", "k1.f"}
    assert len(heard) < 9  # the nine due commits, coalesced into fewer announcements


async def test_k8_a_burst_right_behind_an_announcement_starts_without_a_recheck_or_a_poll(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    ship_engine_url: str,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K8: the second enqueue of a burst, committed right behind the first's announcement, is
    announced after its commit: the listening runtime starts it at once, though its clock
    (which runs its rechecks and its poll) never moves."""
    started = Started()
    definition = job("k1.burst", started)
    backend = receiver(engine, ship_clock, errors)
    other = sender(other_engine, clock=FrozenClock())
    async with (
        spy_on(ship_engine_url, backend.wake_channel) as spy,
        await start_job_runtime(definition, backend=backend, poll_interval=POLL),
    ):
        await live(backend)
        await parked(backend)
        await other.enqueue(definition, {"n": 1})
        await started.wait_for(1)
        await parked(backend)
        await other.enqueue(definition, {"n": 2})
        await started.wait_for(2)
        assert await spy.everything_before_now() == ["k1.burst", "k1.burst"]
    assert ship_clock.monotonic() == 0.0
    assert errors == []


async def test_k1_a_killed_listener_reconnects_and_runs_what_it_missed_at_once(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    ship_engine_url: str,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K1: pg_terminate_backend on the listener's connection is reported
    (ListenerLostError); while it cannot reconnect, a committed enqueue's announcement is lost;
    once the listener is back (with the one backoff) the runtime looks at once: the run starts
    without a poll."""
    started = Started()
    definition = job("k1.killed", started)
    backend = receiver(engine, ship_clock, errors)
    other = sender(other_engine)
    await other.enqueue(job("k1.warm-up"), {})  # the sender's pool holds a connection
    async with await start_job_runtime(definition, backend=backend, poll_interval=POLL):
        await live(backend)
        assert backend.listener is not None
        first_pid = backend.listener.backend_pid
        assert first_pid is not None
        async with connections_refused(ship_engine_url) as admin:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", first_pid)
            await errors.wait_for(ListenerLostError, count=2)  # the loss, a refused reconnect
            assert not backend.listener.live
            await parked(backend)
            await other.enqueue(definition, {"n": "in the gap"})
        await live(backend)
        await started.wait_for(1)
        assert backend.listener.connects == 2
        assert backend.listener.backend_pid != first_pid
    assert started.payloads == [{"n": "in the gap"}]
    assert ship_clock.monotonic() == 0.0
    assert {type(e) for e in errors} == {ListenerLostError}


async def test_k1_an_enqueue_committed_before_the_listener_is_first_live_starts_at_once(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K1, the start gap: a worker runtime claims before its listener is live (the listener's
    connect is held here until the run is committed); a run committed after that first claim
    and before the first live LISTEN was announced to nobody. When the listener goes live the
    runtime looks at once (on_gap, as after a reconnect): the run starts without a poll (the
    runtime's clock never moves)."""
    started = Started()
    definition = job("k1.start-gap", started)
    backend = receiver(engine, ship_clock, errors)
    other = sender(other_engine)
    listener = backend.listener
    assert listener is not None
    connect, release = listener._connect, asyncio.Event()

    async def held_connect() -> Any:
        await release.wait()
        return await connect()

    listener._connect = held_connect
    async with await start_job_runtime(definition, backend=backend, poll_interval=POLL):
        await parked(backend)  # the first claim found nothing
        await other.enqueue(definition, {"n": "before live"})
        assert not listener.live
        release.set()
        await live(backend)
        await started.wait_for(1, within=10)
        assert listener.connects == 1
    assert started.payloads == [{"n": "before live"}]
    assert ship_clock.monotonic() == 0.0
    assert errors == []


async def test_k1_a_listener_behind_a_transaction_mode_pooler_is_not_trusted_and_polling_covers_it(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    ship_engine_url: str,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """K1 (SPEC §10: PgBouncer in transaction mode accepts LISTEN and delivers nothing): behind
    a proxy that drops every notification, the listener's probe never returns, it is never
    live and says so (ListenerNotLiveError with the fix); the run starts at the runtime's next
    poll, one poll interval at most."""
    started = Started()
    definition = job("k1.pooled", started)
    server = engine.url
    async with NotificationDroppingProxy(server.host or "127.0.0.1", server.port or 5432) as proxy:
        backend = receiver(engine, ship_clock, errors, listen=proxy.url_for(ship_engine_url))
        assert backend.listener is not None
        backend.listener._probe_timeout = 0.2
        async with await start_job_runtime(definition, backend=backend, poll_interval=POLL):
            await errors.wait_for(ListenerNotLiveError)
            assert not backend.listener.live
            assert backend.listener.connects == 0
            assert proxy.dropped >= 1  # LISTEN was accepted; the probe came back and was eaten
            await parked(backend)
            await sender(other_engine).enqueue(definition, {"n": 1})
            ship_clock.advance(POLL)
            await started.wait_for(1)
    assert "listen=False" in str(errors.of(ListenerNotLiveError)[0])
    assert ship_clock.monotonic() == POLL


async def test_k1_listen_false_keeps_no_listener_and_stop_closes_it(
    engine: AsyncEngine, ship_engine_url: str, ship_clock: FrozenClock, errors: Errors
) -> None:
    """K1: with listen=False a worker runtime sends no LISTEN and holds no listener
    connection, and its enqueues still announce (other processes may listen); with listen=True
    the runtime holds exactly one dedicated listener connection while it runs, closed by
    stop()."""
    quiet = receiver(engine, ship_clock, errors, listen=False)
    assert quiet.listener is None
    async with (
        spy_on(ship_engine_url, quiet.wake_channel) as spy,
        await start_job_runtime(job("k1.quiet"), backend=quiet, poll_interval=POLL),
    ):
        await quiet.enqueue(job("k1.quiet"), {})
        assert await spy.everything_before_now() == ["k1.quiet"]
        assert await listener_pids(ship_engine_url) == []
    listening = receiver(engine, ship_clock, errors)
    assert listening.listener is not None
    async with await start_job_runtime(job("k1.loud"), backend=listening, poll_interval=POLL):
        await live(listening)
        assert await listener_pids(ship_engine_url) == [listening.listener.backend_pid]
    assert not listening.listener.live
    await until_no_listener(ship_engine_url)
    assert errors == []


async def test_k1_listen_refuses_what_is_no_postgresql_url(engine: AsyncEngine) -> None:
    """K1: ``listen=`` is a bool or a PostgreSQL URL, refused before anything runs."""
    for bad in (1, "mysql://u@h/db", "not a url", None):
        with pytest.raises(ConfigurationError, match="listen="):
            create_job_backend(database=engine, table=runs, state_table=state, listen=bad)
    # On a connection (the test path) there is no listener to hold.
    async with engine.connect() as connection:
        backend = create_job_backend(database=connection, table=runs, state_table=state)
        assert backend.listener is None
