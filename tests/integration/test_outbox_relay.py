"""The outbox relay on real PostgreSQL: claim -> publish -> complete, wake-ups, failures,
graceful stop, outages, lease extension, the job sink."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import define_job
from ship_sqla._outbox import (
    Backoff,
    Outbox,
    OutboxDeadLetteredError,
    OutboxLeaseStaleError,
    OutboxMessage,
    OutboxPublishError,
    OutboxRelay,
    OutboxSinkRejectedError,
    create_outbox,
    create_outbox_operations,
    job_sink,
    ship_outbox_table,
    start_outbox_relay,
)
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel import InMemoryJobBackend, SystemClock

# Private on purpose: the relay's loop backoff is the kernel's one error backoff (shared with the
# job runtime, no public name); the tests move the clock by its bound.
from ship_sqla.kernel._plans.backoff import ERROR_BACKOFF
from ship_sqla.testing import FrozenClock

metadata = MetaData()
table = ship_outbox_table(metadata)


class BoomError(Exception):
    pass


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return ship_engine


class Errors(list[BaseException]):
    """An on_error handler that records errors and lets a test wait for the n-th one."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def __call__(self, error: BaseException) -> None:
        self.append(error)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, count: int, within: float = 10) -> None:
        with anyio.fail_after(within):
            while len(self) < count:
                await self._changed.wait()


@pytest.fixture
def errors() -> Errors:
    return Errors()


@pytest.fixture
def outbox(engine: AsyncEngine, ship_clock: FrozenClock, errors: Errors) -> Outbox:
    return create_outbox(
        database=engine,
        table=table,
        clock=ship_clock,
        max_attempts=3,
        backoff=Backoff(base=10.0, jitter="none"),
        on_error=errors,
    )


async def dead_ids(outbox: Outbox) -> list[uuid.UUID]:
    """The outbox's dead messages, read through the operator gate (an allow-all authorizer)."""
    ops = create_outbox_operations(outbox, authorizer=lambda _permission, _operation: True)
    return [record.id for record in (await ops.list_dead("main")).items]


async def statuses(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with engine.connect() as c:
        result = await c.execute(
            select(table.c.state, table.c.attempts).order_by(table.c.created_at, table.c.id)
        )
        return [(r.state, r.attempts) for r in result]


class Recorder:
    """A sink that records what it published and signals when ``expected`` have arrived."""

    def __init__(self, expected: int) -> None:
        self.published: list[OutboxMessage] = []
        self.expected = expected
        self.done = anyio.Event()

    async def __call__(self, message: OutboxMessage) -> None:
        self.published.append(message)
        if len(self.published) >= self.expected:
            self.done.set()


async def until_parked(clock: FrozenClock, sleepers: int = 1) -> None:
    """Yield until ``sleepers`` tasks are parked on the frozen clock (never a wall-clock sleep)."""
    with anyio.fail_after(10):
        # FrozenClock offers no "a task parked" event; each turn is a bare checkpoint.
        while clock.sleepers < sleepers:
            await anyio.lowlevel.checkpoint()


async def test_relay_publishes_and_completes_everything(engine, outbox, ship_clock):
    """O2/O3: the relay claims, publishes in enqueue order and completes in batches."""
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(25)]
    sink = Recorder(25)
    async with await start_outbox_relay(
        outbox, "main", sink, batch_size=10, poll_interval=3600
    ) as relay:
        with anyio.fail_after(10):
            await sink.done.wait()
    assert [m.id for m in sink.published] == ids
    assert await statuses(engine) == [("delivered", 1)] * 25
    assert relay.delivered == 25
    assert not relay.running


async def test_relay_wakes_immediately_after_a_local_commit(engine, outbox, ship_clock):
    """O1: a committed enqueue wakes the relay at once; the frozen clock never reaches its
    hour-long poll interval."""
    sink = Recorder(1)
    async with await start_outbox_relay(outbox, "main", sink, poll_interval=3600):
        await until_parked(ship_clock)
        await outbox.enqueue("main", "t", {"n": 1})
        with anyio.fail_after(10):
            await sink.done.wait()
    assert await statuses(engine) == [("delivered", 1)]


async def test_sink_errors_fail_the_message_and_reach_on_error(engine, outbox, ship_clock, errors):
    """O4: a sink error fails the message (retry after backoff, then dead), is reported to
    on_error with the message, and never stops the loop."""
    calls: list[int] = []
    ok = anyio.Event()

    async def sink(message: OutboxMessage) -> None:
        calls.append(message.attempt)
        if message.attempt < 2:
            raise BoomError("broker down")
        ok.set()

    async with await start_outbox_relay(outbox, "main", sink, poll_interval=3600):
        await outbox.enqueue("main", "t", {})
        await errors.wait_for(1)
        (error,) = errors
        assert isinstance(error, OutboxPublishError)
        assert error.code == "SHIP_SQLA_OUTBOX_PUBLISH_FAILED"
        assert error.outcome == "retrying"
        assert isinstance(error.__cause__, BoomError)
        await until_parked(ship_clock)
        ship_clock.advance(3600)  # past the backoff and the poll interval
        with anyio.fail_after(10):
            await ok.wait()
    assert calls == [1, 2]
    assert await statuses(engine) == [("delivered", 2)]


async def test_a_message_failing_every_attempt_ends_dead_and_is_reported(
    engine, outbox, ship_clock, errors
):
    """O4: after max_attempts failures the message is dead (listed), reported each time."""

    async def sink(message: OutboxMessage) -> None:
        raise BoomError(message.attempt)

    async with await start_outbox_relay(outbox, "main", sink, poll_interval=3600):
        await outbox.enqueue("main", "t", {})
        for n in range(1, 4):
            await errors.wait_for(n)
            await until_parked(ship_clock)
            ship_clock.advance(3600)
    assert [e.outcome for e in errors if isinstance(e, OutboxPublishError)] == [
        "retrying",
        "retrying",
        "dead",
    ]
    assert await statuses(engine) == [("dead", 3)]
    assert len(await dead_ids(outbox)) == 1


async def test_graceful_stop_finishes_in_flight_and_releases_the_rest(engine, outbox, ship_clock):
    """O3: stop() lets the message being published finish, completes it, and releases the
    batch's unpublished messages with their attempt given back."""
    entered = anyio.Event()
    proceed = anyio.Event()
    published: list[uuid.UUID] = []

    async def sink(message: OutboxMessage) -> None:
        entered.set()
        await proceed.wait()
        published.append(message.id)

    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(5)]
    relay = await start_outbox_relay(outbox, "main", sink, batch_size=5, poll_interval=3600)
    with anyio.fail_after(10):
        await entered.wait()
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.stop)
        await anyio.lowlevel.checkpoint()
        proceed.set()
    assert published == ids[:1]
    assert await statuses(engine) == [("delivered", 1)] + [("pending", 0)] * 4
    assert not relay.running


async def test_stop_with_grace_cancels_a_hung_sink_and_leaves_it_to_its_lease(
    engine, outbox, ship_clock
):
    """O3: a sink that never returns is cancelled after the grace period; its message stays
    claimed until the lease lapses, the rest of the batch is released."""
    entered = anyio.Event()

    async def sink(message: OutboxMessage) -> None:
        entered.set()
        await anyio.Event().wait()

    await outbox.enqueue("main", "t", {})
    await outbox.enqueue("main", "t", {})
    relay = await start_outbox_relay(outbox, "main", sink, batch_size=5, poll_interval=3600)
    with anyio.fail_after(10):
        await entered.wait()
        await relay.stop(drain_timeout=0.05)
    assert await statuses(engine) == [("claimed", 1), ("pending", 0)]


async def test_stop_tolerates_a_relay_never_started_and_run_in_a_task_group(outbox):
    relay = OutboxRelay(outbox, "main", Recorder(1), poll_interval=3600)
    await relay.stop()
    relay2 = OutboxRelay(outbox, "main", Recorder(1), poll_interval=3600)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay2.run)
        with anyio.fail_after(10):
            while not relay2.running:
                await anyio.lowlevel.checkpoint()
            await relay2.stop()
    assert not relay2.running


async def test_relay_options_are_validated(outbox):
    """Every option is checked before a relay starts; a relay runs once."""
    for kwargs in (
        {"batch_size": 0},
        {"lease": 0},
        {"poll_interval": 0},
        {"drain_timeout": -1},
    ):
        with pytest.raises(ConfigurationError, match="Fix:"):
            await start_outbox_relay(outbox, "main", Recorder(1), **kwargs)
        with pytest.raises(ConfigurationError, match="Fix:"):
            OutboxRelay(outbox, "main", Recorder(1), **kwargs)
    async with await start_outbox_relay(outbox, "main", Recorder(1), poll_interval=3600) as relay:
        assert relay.running
        with pytest.raises(ConfigurationError):
            relay._start()
        with pytest.raises(ConfigurationError, match="already running"):
            await relay.run()
    with pytest.raises(ConfigurationError, match="stopped"):
        relay._start()
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        await relay.stop(drain_timeout=float("nan"))


async def test_relay_reports_lease_lapse_dead_letters_to_its_on_error(engine, ship_clock):
    """O4: a message whose lease lapsed on its final attempt is dead-lettered by the relay's
    claim and reported to the relay's on_error, not dropped."""
    outbox = create_outbox(database=engine, table=table, clock=ship_clock, max_attempts=1)
    relay_errors = Errors()
    message_id = await outbox.enqueue("main", "t", {})
    await outbox.claim("main", 1, lease=10, worker="died")
    ship_clock.advance(11)
    relay = OutboxRelay(outbox, "main", Recorder(1), on_error=relay_errors)
    assert await relay.run_once() == 0
    (error,) = relay_errors
    assert isinstance(error, OutboxDeadLetteredError)
    assert error.record.id == message_id
    assert await dead_ids(outbox) == [message_id]


async def test_relay_heartbeats_leases_and_skips_messages_it_lost(
    engine, outbox, ship_clock, errors
):
    """O3: every third of the lease the relay completes what it published and heartbeats the
    rest; a message whose claim another relay retook is not published by the old holder."""
    ids = [await outbox.enqueue("main", "t", {"n": n}) for n in range(4)]
    published: list[uuid.UUID] = []
    stolen: list[OutboxMessage] = []

    async def sink(message: OutboxMessage) -> None:
        published.append(message.id)
        if message.id == ids[0]:
            ship_clock.advance(5)  # a third of the 12 s lease: a heartbeat before the next
        if message.id == ids[1]:
            ship_clock.advance(13)  # the whole lease: another relay retakes the rest
            stolen.extend(await outbox.claim("main", 10, lease=60, worker="thief"))

    relay = OutboxRelay(outbox, "main", sink, batch_size=4, lease=12, poll_interval=3600)
    with anyio.fail_after(10):
        await relay.run_once()
    # ids[0] was completed before the heartbeat; the thief retook the other three, so the
    # old holder's completion of ids[1] is stale and ids[2:] are never published by it.
    assert published == ids[:2]
    assert [m.id for m in stolen] == ids[1:]
    stale = {(e.message_id, e.operation) for e in errors if isinstance(e, OutboxLeaseStaleError)}
    assert stale == {(ids[1], "complete"), (ids[2], "heartbeat"), (ids[3], "heartbeat")}
    assert await statuses(engine) == [("delivered", 1)] + [("claimed", 2)] * 3


async def test_relay_survives_a_database_outage(engine, ship_engine_url, errors):
    """O4: the loop never raises: poll failures during an outage go to on_error, the relay
    backs off and resumes once the database is back, losing nothing."""
    clock = SystemClock()
    outbox = create_outbox(database=engine, table=table, clock=clock, on_error=errors)
    sink = Recorder(1)
    database = engine.url.database
    admin = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/postgres")
    completed = asyncio.Event()
    real_settle = outbox.settle

    async def settle(settlements, **kwargs):
        outcomes = await real_settle(settlements, **kwargs)
        completed.set()
        return outcomes

    outbox.settle = settle  # type: ignore[method-assign]
    try:
        async with await start_outbox_relay(outbox, "main", sink, poll_interval=0.02) as relay:
            await outbox.enqueue("main", "t", {"n": 0})
            with anyio.fail_after(10):
                await completed.wait()  # before the outage, or message 0 waits for its lease
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                database,
            )
            await errors.wait_for(2, within=20)
            assert relay.running
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            sink.expected, sink.done = 2, anyio.Event()
            with anyio.fail_after(20):
                while True:  # the enqueue itself may meet a connection killed by the outage
                    try:
                        await outbox.enqueue("main", "t", {"n": 1})
                        break
                    except Exception:
                        await anyio.sleep(0.01)
                await sink.done.wait()
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
    assert [m.payload for m in sink.published] == [{"n": 0}, {"n": 1}]
    assert await statuses(engine) == [("delivered", 1), ("delivered", 1)]


async def test_job_sink_enqueues_a_job_deduplicated_by_message_id(engine, outbox, ship_clock):
    """O3: the job sink enqueues one run per message, keyed by the message id, so a redelivered
    message (lease lapsed after publishing) does not enqueue a second run."""
    backend = InMemoryJobBackend(clock=ship_clock)

    async def handler(payload: dict[str, Any]) -> None:
        return None

    job = define_job("send-email", handler, payload=dict)
    sink = job_sink(backend, job)
    message_id = await outbox.enqueue("main", "email", {"to": "a@example.com"})
    (first,) = await outbox.claim("main", 1, lease=10)
    await sink(first)
    ship_clock.advance(11)  # the relay died before completing
    (again,) = await outbox.claim("main", 1, lease=10)
    await sink(again)
    (run,) = backend.runs("send-email")
    assert run.payload == {"to": "a@example.com"}
    assert run.dedupe_key == str(message_id)


async def test_job_sink_turns_queue_full_into_a_retry(engine, outbox, ship_clock):
    """O4: a full job queue rejects the message; the sink raises so it is retried later."""
    backend = InMemoryJobBackend(clock=ship_clock, queue_depth_limit=1)

    async def handler(payload: dict[str, Any]) -> None:
        return None

    job = define_job("send-email", handler, payload=dict)
    sink = job_sink(backend, job, payload=lambda m: {"wrapped": m.payload})
    await outbox.enqueue("main", "email", {"n": 1})
    await outbox.enqueue("main", "email", {"n": 2})
    a, b = await outbox.claim("main", 2, lease=10)
    await sink(a)
    with pytest.raises(OutboxSinkRejectedError, match="queue-full"):
        await sink(b)
    assert backend.runs("send-email")[0].payload == {"wrapped": {"n": 1}}


async def test_run_once_propagates_database_errors_the_loop_absorbs_them(errors):
    """O4: run_once lets a database error through; the loop reports it and keeps going."""
    engine = create_async_engine(
        "postgresql+asyncpg://postgres@127.0.0.1:5432/ship_sqla_outbox_no_such_database"
    )
    clock = FrozenClock()
    outbox = create_outbox(database=engine, table=table, clock=clock, on_error=errors)
    relay = OutboxRelay(outbox, "main", Recorder(1), poll_interval=1)
    try:
        with pytest.raises(DBAPIError):
            await relay.run_once()
        # listen=False: only the loop's errors are counted here (a listener would report its
        # own failed connections too, K1).
        async with await start_outbox_relay(
            outbox, "main", Recorder(1), poll_interval=1, listen=False
        ) as relay:
            await errors.wait_for(1)
            await until_parked(clock)
            clock.advance(60)
            await errors.wait_for(2)
            assert relay.running
        assert all(isinstance(e, DBAPIError) for e in errors)
    finally:
        await engine.dispose()


# -- outages: settles retried in place, a capped error backoff ---------------------------------


class InjectedError(Exception):
    """A database error injected into one outbox call (the connection died mid-call)."""


class Flaky:
    """Makes chosen outbox calls fail: each call of a name in ``odd`` fails on its 1st, 3rd, ...
    call (so each settle fails once, then its retry lands); names in ``down`` fail until
    removed from it."""

    def __init__(
        self, outbox: Outbox, *, odd: set[str] = frozenset(), down: set[str] | None = None
    ):
        self.odd = set(odd)
        self.down = set() if down is None else down
        self.calls: dict[str, int] = {}
        for name in ("settle", "heartbeat", "claim"):
            setattr(outbox, name, self._wrap(name, getattr(outbox, name)))

    def _wrap(self, name: str, real: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.down or (name in self.odd and self.calls[name] % 2 == 1):
                raise InjectedError(f"{name} #{self.calls[name]}: connection lost")
            return await real(*args, **kwargs)

        return call


async def drive(clock: FrozenClock, done: Any, step: float = ERROR_BACKOFF.max_delay) -> None:
    """Move frozen time ``step`` at a time whenever the relay is parked, until ``done()``."""
    with anyio.fail_after(10):
        while not done():
            if clock.sleepers:
                clock.advance(step)
            await anyio.lowlevel.checkpoint()


async def test_failed_settles_are_retried_in_place_and_nothing_is_republished(
    engine, outbox, ship_clock, errors
):
    """O3/O4 under a flapping database: a settle (the completion before the heartbeat; the
    batch's last, with its failure and its completion) and a heartbeat that each fail once are
    retried in place after the error backoff, on the same claim (fenced on its token), instead
    of the batch being dropped and republished after its lease. Each message is published
    exactly once; each injected error is reported once."""
    m0, m1, m2 = [await outbox.enqueue("main", "t", {"n": n}) for n in range(3)]
    flaky = Flaky(outbox, odd={"settle", "heartbeat"})
    published: list[uuid.UUID] = []

    async def sink(message: OutboxMessage) -> None:
        published.append(message.id)
        if message.id == m0:
            ship_clock.advance(10)  # a third of the lease: complete m0, heartbeat m1 and m2
        if message.id == m1:
            raise BoomError("broker said no")

    # One batch, not full: no claim ahead, so the calls counted below are this batch's alone.
    started = start_outbox_relay(outbox, "main", sink, batch_size=4, lease=30, poll_interval=3600)
    async with await started as relay:
        await drive(ship_clock, lambda: relay.delivered == 2 and len(errors) == 4)
    assert published == [m0, m1, m2]
    # The batch's one claim, and at most one more: the start's gap pass (K1: the listener's first
    # live LISTEN looks once for what was announced before it listened; it finds nothing here).
    assert flaky.calls.pop("claim") in (1, 2)
    assert flaky.calls == {"settle": 4, "heartbeat": 2}
    injected = [str(e) for e in errors if isinstance(e, InjectedError)]
    assert sorted(injected) == sorted(
        [
            "settle #1: connection lost",
            "settle #3: connection lost",
            "heartbeat #1: connection lost",
        ]
    )
    (publish_error,) = [e for e in errors if isinstance(e, OutboxPublishError)]
    assert publish_error.outcome == "retrying"
    assert await statuses(engine) == [("delivered", 1), ("pending", 1), ("delivered", 1)]


async def test_a_retried_completion_of_a_retaken_message_is_stale_and_changes_nothing(
    engine, outbox, ship_clock, errors
):
    """O3: the relay retries a failed completion while its lease token is current; once the
    lease lapsed and another relay retook the message, the retry is answered "stale", changes
    nothing and is reported; this relay does not publish the message again."""
    message_id = await outbox.enqueue("main", "t", {})
    down = {"settle"}
    Flaky(outbox, down=down)
    sink = Recorder(1)
    started = start_outbox_relay(outbox, "main", sink, batch_size=1, lease=10, poll_interval=3600)
    async with await started as relay:
        await errors.wait_for(1)
        await drive(ship_clock, lambda: ship_clock.monotonic() > 11)  # the lease lapsed
        # Another relay (its outbox object is not flaky) retakes the message.
        thief = create_outbox(database=engine, table=table, clock=ship_clock)
        (retaken,) = await thief.claim("main", 1, lease=60, worker="thief")
        down.clear()
        await drive(ship_clock, lambda: any(isinstance(e, OutboxLeaseStaleError) for e in errors))
    assert [m.id for m in sink.published] == [message_id]
    assert relay.delivered == 0
    (stale,) = [e for e in errors if isinstance(e, OutboxLeaseStaleError)]
    assert (stale.message_id, stale.operation) == (message_id, "complete")
    assert await statuses(engine) == [("claimed", 2)]
    assert await thief.complete(retaken) == "delivered"


async def test_stop_during_a_completion_retry_makes_one_last_attempt_then_leaves(
    engine, outbox, ship_clock, errors
):
    """O3: stop() while the relay retries a failed completion (the database is still down)
    makes one last attempt, reports its failure and returns; the message stays claimed until
    its lease lapses (at-least-once: it is published again after that)."""
    await outbox.enqueue("main", "t", {})
    Flaky(outbox, down={"settle"})
    relay = await start_outbox_relay(outbox, "main", Recorder(1), lease=10, poll_interval=3600)
    await errors.wait_for(1)
    await until_parked(ship_clock)
    with anyio.fail_after(10):
        await relay.stop()
    assert not relay.running
    assert [type(e) for e in errors] == [InjectedError, InjectedError]
    assert await statuses(engine) == [("claimed", 1)]


async def test_stop_during_a_heartbeats_settle_retry_still_settles_the_batch_on_the_way_out(
    engine, outbox, ship_clock, errors
):
    """O3: stop() while the settle before a heartbeat is being retried makes its last in-place
    attempt and then, leaving, one more of the whole batch (the published message delivered,
    the unpublished ones released) rather than dropping what was published to its lease."""
    for n in range(3):
        await outbox.enqueue("main", "t", {"n": n})
    real_settle = outbox.settle
    calls = 0

    async def settle(settlements, **kwargs):
        nonlocal calls
        calls += 1
        if calls <= 2:  # the heartbeat's settle and its last in-place retry at stop()
            raise InjectedError(f"settle #{calls}: connection lost")
        return await real_settle(settlements, **kwargs)

    outbox.settle = settle  # type: ignore[method-assign]

    async def sink(message: OutboxMessage) -> None:
        if message.payload["n"] == 0:
            ship_clock.advance(10)  # a third of the lease: settle, then heartbeat, before n=1

    relay = await start_outbox_relay(outbox, "main", sink, lease=30, poll_interval=3600)
    await errors.wait_for(1)
    await until_parked(ship_clock)  # the settle's retry waits out its error backoff
    with anyio.fail_after(10):
        await relay.stop()
    assert calls == 3
    assert await statuses(engine) == [("delivered", 1), ("pending", 0), ("pending", 0)]
    assert [str(e) for e in errors] == ["settle #1: connection lost", "settle #2: connection lost"]


async def test_error_backoff_is_capped_at_the_loops_error_backoff(errors):
    """O4 (the loop's error backoff, not message failures): after any number of failed polls
    the relay tries again within ERROR_BACKOFF's max_delay (1 s, the job runtime's too),
    starting at 0.1 s, so it resumes about a second after the database returns however long
    the outage lasted."""
    engine = create_async_engine(
        "postgresql+asyncpg://postgres@127.0.0.1:5432/ship_sqla_outbox_no_such_database"
    )
    clock = FrozenClock()
    outbox = create_outbox(database=engine, table=table, clock=clock, on_error=errors)
    try:
        # listen=False: only the loop's errors are counted here (K1's listener reports its own).
        async with await start_outbox_relay(
            outbox, "main", Recorder(1), poll_interval=30, listen=False
        ) as relay:
            await errors.wait_for(1)
            await until_parked(clock)
            clock.advance(0.1)  # the first retry comes after at most 0.1 s
            await errors.wait_for(2)
            for failures in range(3, 15):
                await until_parked(clock)
                clock.advance(ERROR_BACKOFF.max_delay)
                await errors.wait_for(failures)
            assert relay.running
    finally:
        await engine.dispose()
    assert ERROR_BACKOFF.max_delay == 1.0
    assert all(isinstance(e, DBAPIError | OSError) for e in errors)


async def test_j23_a_sink_error_postgresql_cannot_store_fails_its_message_alone(
    engine, outbox, ship_clock, errors
):
    """O4, J23: a sink whose error message holds a NUL and a lone surrogate (text PostgreSQL
    cannot store) fails its message like any error, its last_error escaped (``\\x00``,
    ``\\udXXX``); the other messages of its batch are delivered in the same settle, nothing is
    retried or republished. Before, the batch's one settle was refused and retried until the
    leases lapsed."""

    async def sink(message: OutboxMessage) -> None:
        if message.payload["n"] == 2:
            raise BoomError("bad \x00 byte and \ud800 half")

    for n in range(5):
        await outbox.enqueue("main", "t", {"n": n})
    async with await start_outbox_relay(outbox, "main", sink, batch_size=10, poll_interval=3600):
        await errors.wait_for(1)
    (error,) = errors
    assert isinstance(error, OutboxPublishError)
    assert error.outcome == "retrying"
    assert (
        await statuses(engine) == [("delivered", 1)] * 2 + [("pending", 1)] + [("delivered", 1)] * 2
    )
    async with engine.connect() as c:
        last_error = (
            await c.execute(select(table.c.last_error).where(table.c.state == "pending"))
        ).scalar_one()
    assert last_error == "BoomError: bad \\x00 byte and \\ud800 half"
