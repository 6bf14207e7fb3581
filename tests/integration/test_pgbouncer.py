"""Everything but push wake through a real PgBouncer in transaction pooling mode (SPEC F7).

The ``pgbouncer`` fixture (tests/support/pgbouncer.py) runs the machine's PgBouncer in front of
the test server: ``pool_mode = transaction``, a few server connections per database shared
round-robin, so a client connection's consecutive transactions move between server sessions.
The application's engines reach the database only through it, with the connect arguments
docs/production.md names (``CONNECT_ARGS``: both statement caches off); the tables are made
and checked over a direct connection, as migrations and an operator would.

Push wake is the one exception (K1 through F7): a worker or relay behind PgBouncer listens with
``listen=`` a direct URL of the server. Shown here as well, as what does NOT work through
transaction pooling: LISTEN (accepted, but what other sessions notify never reaches the idle
client), session-level settings and session-level advisory locks (they stay with the server
session, for whichever client it serves next).
"""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest
from job_helpers import record_of, settle_loop
from pgbouncer import CONNECT_ARGS, SINGLE, PgBouncer
from sqlalchemy import Column, Integer, MetaData, PrimaryKeyConstraint, String, Table, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from wake_helpers import Errors, Recorded, parked, plain_dsn

from ship_sqla import (
    JobContext,
    TableRepository,
    TransactionScope,
    advisory_lock_provider,
    create_idempotency_store,
    create_job_backend,
    create_outbox,
    create_unit_of_work,
    define_job,
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_lock_fences_table,
    ship_outbox_table,
    start_job_runtime,
    start_outbox_relay,
)
from ship_sqla import _direct as direct_module
from ship_sqla._direct import DirectConnection
from ship_sqla._jobs._sql.enqueue import ENQUEUE_COPY_MIN_RUNS
from ship_sqla._notify import ListenerNotLiveError
from ship_sqla._outbox import Backoff
from ship_sqla.errors import LockHeldError, StaleFenceError, VersionConflictError
from ship_sqla.idempotency import (
    IdempotencyInProgress,
    IdempotencyReplay,
    IdempotencyStarted,
    StoredResponse,
)
from ship_sqla.jobs import Concurrency, EnqueueRequest, PostgresJobBackend, RetryPolicy, Schedule
from ship_sqla.outbox import OutboxMessage
from ship_sqla.testing import FrozenClock, ResolvedServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

metadata = MetaData()
orders = Table(
    "pgb_orders",
    metadata,
    Column("tenant_id", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("version", Integer, nullable=False, server_default="1"),
    Column("status", String, nullable=False),
    PrimaryKeyConstraint("tenant_id", "id", name="pgb_orders_pkey"),
)
outbox_table = ship_outbox_table(metadata)
idempotency_keys = ship_idempotency_table(metadata)
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
fences = ship_lock_fences_table(metadata)

ORDERS = TableRepository(orders, tenant_column="tenant_id", key="id", version_column="version")
POLL = 60.0
"""Seconds, on the tests' frozen clock: a run or message that starts while the clock stands
still was started by a wake, not by a poll."""
OK = StoredResponse(201, [("content-type", "text/plain")], b"created")


@pytest.fixture
async def direct(ship_engine: AsyncEngine) -> AsyncEngine:
    """The test database over a direct connection: its tables made, for checking, and JIT off
    for its sessions, as docs/production.md asks of a database behind PgBouncer (asyncpg turns
    JIT off around its type introspection with session-level statements of their own, which
    PgBouncer may run on another server session: the introspection then pays for JIT, seconds
    per new client connection)."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        database = ship_engine.url.database
        await connection.execute(text(f'ALTER DATABASE "{database}" SET jit = off'))
    return ship_engine


@pytest.fixture
async def bounced(pgbouncer: PgBouncer, direct: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """The application's engine: the test database through PgBouncer (more client connections
    than PgBouncer has server connections for it)."""
    engine = pgbouncer.engine(str(direct.url.database), max_overflow=10)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def elsewhere(pgbouncer: PgBouncer, direct: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """A second engine through PgBouncer: another process of the application (a web tier)."""
    engine = pgbouncer.engine(str(direct.url.database))
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def errors() -> Errors:
    return Errors()


async def held_advisory_locks(engine: AsyncEngine) -> set[int]:
    """The advisory-lock ids granted in ``engine``'s database right now, as pg_locks shows."""
    async with engine.connect() as connection:
        result = await connection.execute(
            text(
                "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks"
                " WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        )
        return {(value + 2**63) % 2**64 - 2**63 for value in result.scalars()}


# --- the fixture is what it says -----------------------------------------------------------------


async def test_f7_the_bouncer_pools_transactions_not_sessions(pgbouncer: PgBouncer) -> None:
    """F7 (the fixture): two client connections open at once run their transactions on ONE
    server session (the single-connection pool): only transaction pooling hands a session to
    another client while the first client is still connected."""
    engine = pgbouncer.engine(SINGLE, poolclass=NullPool)
    try:
        async with engine.connect() as first, engine.connect() as second:
            pids = []
            for client in (first, second, first):
                pids.append((await client.execute(text("SELECT pg_backend_pid()"))).scalar_one())
                await client.commit()
        assert len(set(pids)) == 1
    finally:
        await engine.dispose()


async def test_f7_the_documented_connect_args_are_what_it_takes(
    pgbouncer: PgBouncer, direct: AsyncEngine
) -> None:
    """F7 (docs/production.md): behind transaction pooling, asyncpg's default statement cache
    runs a statement prepared on one server session on another ("does not exist"), and so
    does a named statement of SQLAlchemy's ``prepared_statement_name_func`` recipe outside a
    transaction (prepare and execute are two round trips, possibly two sessions). With both
    caches off (CONNECT_ARGS) statements are unnamed and the same statements all succeed."""
    database = str(direct.url.database)

    def named() -> str:
        return f"__asyncpg_{uuid.uuid4()}__"

    async def failures(connect_args: dict[str, Any]) -> list[str]:
        # Two server sessions in the pool (two clients in a transaction at once), then ONE
        # client connection: round-robin hands it the other session at every statement.
        warm = pgbouncer.engine(database, poolclass=NullPool)
        try:
            async with warm.connect() as one, warm.connect() as two:
                for client in (one, two):
                    await client.execute(text("SELECT 1"))
                for client in (one, two):
                    await client.commit()
        finally:
            await warm.dispose()
        engine = create_async_engine(
            pgbouncer.url_of(database), connect_args=connect_args, pool_size=1, max_overflow=0
        )
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        failed: list[str] = []
        try:
            for n in range(8):
                try:
                    async with (autocommit if n % 2 else engine).connect() as client:
                        await client.execute(text("SELECT count(*) FROM pgb_orders"))
                        await client.commit()
                except DBAPIError as exc:
                    failed.append(str(exc.orig))
        finally:
            await engine.dispose()
        return failed

    cached = await failures({})
    assert cached
    assert all("does not exist" in message for message in cached)
    recipe = await failures({**CONNECT_ARGS, "prepared_statement_name_func": named})
    assert recipe
    assert all("does not exist" in message for message in recipe)
    assert await failures(CONNECT_ARGS) == []


# --- what works through it -----------------------------------------------------------------------


async def test_f7_units_of_work_and_repositories_through_pgbouncer(
    bounced: AsyncEngine, direct: AsyncEngine
) -> None:
    """F7 with U1/U3/R2: units of work through PgBouncer commit their repository writes and
    plain statements together, roll back together, keep optimistic versions, run at any
    isolation level (each run is one transaction, so one server session) and re-run on a
    serialization failure."""
    uow = create_unit_of_work(bounced, repositories=lambda scope: (scope, ORDERS.for_scope(scope)))

    async def place(tx: tuple[TransactionScope, Any]) -> int:
        scope, repo = tx
        await repo.insert({"id": 1, "status": "new"})
        await repo.insert({"id": 2, "status": "new"})
        await scope.connection.execute(
            text("UPDATE pgb_orders SET status = 'paid' WHERE id = 2 AND tenant_id = 'acme'")
        )
        return int((await repo.get(1))["version"])

    assert await uow.run(place, tenant="acme") == 1

    class Abandon(Exception):  # noqa: N818 - a signal, not an error
        pass

    async def abandoned(tx: tuple[TransactionScope, Any]) -> None:
        _, repo = tx
        await repo.insert({"id": 3, "status": "new"})
        raise Abandon

    with pytest.raises(Abandon):
        await uow.run(abandoned, tenant="acme")

    async def ship(tx: tuple[TransactionScope, Any]) -> Any:
        _, repo = tx
        await repo.update(1, {"status": "shipped"}, expected_version=1)
        return await repo.find(limit=10, order_by="id")

    page = await uow.run(ship, tenant="acme", isolation_level="SERIALIZABLE")
    assert [(row["id"], row["status"], row["version"]) for row in page.items] == [
        (1, "shipped", 2),
        (2, "paid", 1),
    ]

    async def stale(tx: tuple[TransactionScope, Any]) -> None:
        _, repo = tx
        await repo.update(1, {"status": "lost"}, expected_version=1)

    with pytest.raises(VersionConflictError):
        await uow.run(stale, tenant="acme")

    # U3: two SERIALIZABLE runs that read what the other writes: one is re-run, both commit.
    both_read = anyio.Event()
    calls = {"a": 0, "b": 0}
    first_reads: set[str] = set()

    def count_then_insert(name: str, order_id: int) -> Any:
        async def run(tx: tuple[TransactionScope, Any]) -> None:
            _, repo = tx
            calls[name] += 1
            seen = await repo.count(up_to=100)
            if calls[name] == 1:
                first_reads.add(name)
                if len(first_reads) == 2:
                    both_read.set()
                with anyio.fail_after(10):
                    await both_read.wait()
            await repo.insert({"id": order_id, "status": f"after {seen}"})

        return run

    async with anyio.create_task_group() as group:
        for name, order_id in (("a", 10), ("b", 11)):
            group.start_soon(
                lambda n=name, i=order_id: uow.run(
                    count_then_insert(n, i), tenant="acme", isolation_level="SERIALIZABLE"
                )
            )
    assert min(calls.values()) == 1  # one committed at once
    assert max(calls.values()) >= 2  # the other re-ran (SSI may refuse a re-run once more)
    async with direct.connect() as connection:
        stored = await connection.execute(text("SELECT id, status FROM pgb_orders ORDER BY id"))
        rows = [tuple(row) for row in stored]
    assert rows[:2] == [(1, "shipped"), (2, "paid")]
    assert sorted(status for _, status in rows[2:]) == ["after 2", "after 3"]


async def test_f7_outbox_enqueue_and_relay_through_pgbouncer_push_wake_direct(
    bounced: AsyncEngine,
    elsewhere: AsyncEngine,
    direct: AsyncEngine,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """F7 with O1-O4 and K1: an enqueue committed in a unit of work of another process
    through PgBouncer wakes a relay whose claims, completions and failures all go through
    PgBouncer and whose listener alone connects directly (``listen=`` the server's URL): the
    message is published while the clock stands still; a failed publish is retried after its
    backoff and delivered."""
    outbox = create_outbox(
        database=bounced,
        table=outbox_table,
        clock=ship_clock,
        max_attempts=3,
        backoff=Backoff(base=10.0, jitter="none"),
        on_error=errors,
    )
    web = create_outbox(database=elsewhere, table=outbox_table)
    web_uow = create_unit_of_work(elsewhere, repositories=lambda scope: scope)
    published = Recorded()

    async def sink(message: OutboxMessage) -> None:
        if message.payload["n"] == 2 and message.attempt == 1:
            raise RuntimeError("broker down")
        published.record(message.payload)

    async def place(_scope: TransactionScope) -> None:
        await web.enqueue("orders", "order.created", {"n": 1})
        await web.enqueue("orders", "order.created", {"n": 2})

    async with await start_outbox_relay(
        outbox, "orders", sink, poll_interval=POLL, listen=plain_dsn(direct.url)
    ) as relay:
        assert relay.listener is not None
        with anyio.fail_after(10):
            await relay.listener.wait_live()
        await relay_parked(ship_clock)
        await web_uow.run(place)
        await published.wait_for(1)
        assert ship_clock.monotonic() == 0.0  # a wake, not a poll
        await errors.wait_for(Exception)
        with anyio.fail_after(10):  # the failure settled: the message waits out its backoff
            while await outbox_states(direct) != [("delivered", 1), ("pending", 1)]:
                await anyio.lowlevel.checkpoint()

        async def republished() -> bool:
            return len(published.payloads) >= 2

        await advance_while_idle(ship_clock, 20, republished, lambda: relay_parked(ship_clock))
    assert published.payloads == [{"n": 1}, {"n": 2}]
    assert await outbox_states(direct) == [("delivered", 1), ("delivered", 2)]
    assert [type(error).__name__ for error in errors] == ["OutboxPublishError"]


async def relay_parked(clock: FrozenClock) -> None:
    """Until the relay waits out its poll on the frozen clock (its only sleeper here, with its
    rechecks after an announcement)."""
    with anyio.fail_after(10):
        while clock.sleepers < 1:
            await anyio.lowlevel.checkpoint()


async def outbox_states(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with engine.connect() as connection:
        stored = await connection.execute(
            text("SELECT state, attempts FROM ship_outbox ORDER BY created_at, id")
        )
        return [(row.state, row.attempts) for row in stored]


def worker_backend(
    engine: AsyncEngine, clock: FrozenClock, errors: Errors, **options: Any
) -> PostgresJobBackend:
    """The workers' backend (their runtimes poll every ``POLL`` seconds)."""
    return create_job_backend(
        database=engine,
        table=runs,
        state_table=state,
        clock=clock,
        on_error=errors,
        **options,
    )


async def test_f7_jobs_enqueue_claim_settle_and_locks_through_pgbouncer_push_wake_direct(
    bounced: AsyncEngine,
    elsewhere: AsyncEngine,
    direct: AsyncEngine,
    ship_clock: FrozenClock,
    errors: Errors,
) -> None:
    """F7 with J3, J4 and K1: a worker runtime whose backend reaches the database through
    PgBouncer (claims, settles, its single-runner advisory locks) and listens directly
    (``listen=`` the server's URL). Runs enqueued in a unit of work of a web tier through
    PgBouncer start while the clock stands still (push wake); a single-runner run holds its
    advisory lock through PgBouncer while it runs; a failed attempt is retried after its
    backoff (at the next poll) and completes; a run out of attempts ends dead."""
    backend = worker_backend(bounced, ship_clock, errors, listen=plain_dsn(direct.url))
    web = create_job_backend(database=elsewhere, table=runs, state_table=state, listen=False)
    web_uow = create_unit_of_work(elsewhere, repositories=lambda scope: scope)
    settled = Recorded()
    held: list[tuple[bool, bool]] = []

    async def greet(ctx: JobContext, payload: dict[str, Any]) -> None:
        settled.record(payload)

    async def flaky(ctx: JobContext, payload: dict[str, Any]) -> None:
        settled.record({**payload, "attempt": ctx.attempt})
        if ctx.attempt == 1 or payload["always"]:
            raise RuntimeError("not yet")

    async def alone(ctx: JobContext, payload: dict[str, Any]) -> None:
        key = f"pgb.alone/{(await record_of(backend, ctx.run_id)).key}"
        taken = await advisory_lock_provider(elsewhere, clock=ship_clock).acquire(key, 5)
        if taken is not None:
            await taken.release()
        held.append(
            (
                backend.default_lock_provider.lock_id(key) in await held_advisory_locks(direct),
                taken is None,
            )
        )
        settled.record(payload)

    greet_job = define_job("pgb.greet", greet, payload=dict)
    flaky_job = define_job(
        "pgb.flaky",
        flaky,
        payload=dict,
        retry=RetryPolicy(attempts=2, backoff="fixed", base_delay=10.0, jitter="none"),
    )
    alone_job = define_job(
        "pgb.alone", alone, payload=dict, concurrency=Concurrency(single_runner=True)
    )
    ids: dict[str, str | None] = {}

    async def place(_scope: TransactionScope) -> None:
        ids["greet"] = (await web.enqueue(greet_job, {"order": 42})).run_id
        ids["retried"] = (await web.enqueue(flaky_job, {"always": False})).run_id
        ids["dead"] = (await web.enqueue(flaky_job, {"always": True})).run_id
        ids["alone"] = (await web.enqueue(alone_job, {"n": 1})).run_id

    async with await start_job_runtime(
        [greet_job, flaky_job, alone_job], backend=backend, poll_interval=POLL
    ):
        assert backend.listener is not None
        with anyio.fail_after(10):
            await backend.listener.wait_live()
        await parked(backend)
        await web_uow.run(place)
        await settled.wait_for(4)  # greet, alone, both flaky runs' first attempts
        assert ship_clock.monotonic() == 0.0  # woken, never polled
        await until_states(backend, {"greet": "completed", "alone": "completed"}, ids)
        await until_states(backend, {"retried": "waiting", "dead": "waiting"}, ids)

        async def retried() -> bool:
            return len(settled.payloads) >= 6

        # Past the 10 s backoff: the next poll claims both again.
        await advance_while_idle(ship_clock, 20, retried, lambda: parked(backend))
        await until_states(backend, {"retried": "completed", "dead": "dead"}, ids)
    assert held == [(True, True)]
    assert (await record_of(backend, ids["retried"])).attempt == 2
    assert (await record_of(backend, ids["dead"])).attempt == 2
    assert errors == []


async def test_f7_plain_enqueues_outside_a_unit_of_work_run_on_the_driver_through_pgbouncer(
    bounced: AsyncEngine,
    elsewhere: AsyncEngine,
    direct: AsyncEngine,
    ship_clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """F7 with J1 and K1: plain enqueues outside any unit of work run straight on the pooled
    asyncpg connection (``ship_sqla._direct``) through PgBouncer, announced or not, single and
    batched, while another engine's transactions move the client's server sessions between
    them (asyncpg sends each statement unnamed with both caches off): every run is stored
    once."""
    direct_calls: list[int] = []
    real_execute, real_fetch = DirectConnection.execute, DirectConnection.fetch

    def count(statement: Any) -> None:
        # The enqueues only (announced or not), not the announcer's post-commit sends (K8).
        if str(statement).lstrip().startswith(("WITH ship_enqueued", "INSERT INTO")):
            direct_calls.append(1)

    async def counted(self: DirectConnection, statement: Any, params: Any) -> None:
        count(statement)
        await real_execute(self, statement, params)

    async def counted_fetch(self: DirectConnection, statement: Any, params: Any) -> Any:
        count(statement)
        return await real_fetch(self, statement, params)

    monkeypatch.setattr(DirectConnection, "execute", counted)
    monkeypatch.setattr(DirectConnection, "fetch", counted_fetch)
    job = define_job("pgb.plain", _noop_handler, payload=dict)
    web = create_job_backend(
        database=bounced, table=runs, state_table=state, clock=ship_clock, listen=False
    )
    other = create_unit_of_work(elsewhere, repositories=lambda scope: scope)

    async def busy(scope: TransactionScope) -> None:
        await scope.connection.execute(text("SELECT count(*) FROM ship_job_runs"))

    for n in range(12):
        await web.enqueue(job, {"n": n})
        if n % 4 == 0:
            ship_clock.advance(timedelta(seconds=1))
        await other.run(busy)
    await web.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(12, 15)])
    assert len(direct_calls) == 13
    async with direct.connect() as connection:
        payloads = (
            await connection.execute(
                text("SELECT payload FROM ship_job_runs WHERE job_id = 'pgb.plain'")
            )
        ).scalars()
        assert sorted(payload["n"] for payload in payloads) == list(range(15))


async def test_f7_bulk_enqueues_copy_through_pgbouncer(
    bounced: AsyncEngine, elsewhere: AsyncEngine, direct: AsyncEngine
) -> None:
    """F7 with J1, K1 and U1: a bulk of plain runs is a COPY through PgBouncer (it needs no
    prepared statement): outside a unit of work with its announcement in one transaction, and
    inside one as a statement of the run's transaction (a rollback takes it back), while another
    engine's transactions move the client's server sessions between them."""
    copies: list[int] = []
    real = direct_module._copy_on

    async def counted(driver: Any, copy: Any) -> None:
        copies.append(1)
        await real(driver, copy)

    job = define_job("pgb.bulk", _noop_handler, payload=dict)
    web = create_job_backend(database=bounced, table=runs, state_table=state, listen=False)
    uow = create_unit_of_work(bounced, repositories=lambda scope: scope)
    other = create_unit_of_work(elsewhere, repositories=lambda scope: scope)
    bulk = [EnqueueRequest({"n": n}) for n in range(ENQUEUE_COPY_MIN_RUNS)]

    async def busy(scope: TransactionScope) -> None:
        await scope.connection.execute(text("SELECT count(*) FROM ship_job_runs"))

    class RolledBackError(Exception):
        pass

    async def in_uow(scope: TransactionScope, *, fail: bool) -> None:
        await scope.connection.execute(text("SELECT 1"))
        await web.enqueue_many(job, bulk)
        if fail:
            raise RolledBackError

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(direct_module, "_copy_on", counted)
        for _ in range(3):
            await web.enqueue_many(job, bulk)
            await other.run(busy)
        await uow.run(lambda scope: in_uow(scope, fail=False))
        with pytest.raises(RolledBackError):
            await uow.run(lambda scope: in_uow(scope, fail=True))
    assert len(copies) == 5
    async with direct.connect() as connection:
        stored = await connection.scalar(
            text("SELECT count(*) FROM ship_job_runs WHERE job_id = 'pgb.bulk'")
        )
    assert stored == 4 * ENQUEUE_COPY_MIN_RUNS


async def _noop_handler(ctx: JobContext, payload: dict[str, Any]) -> None:
    return None


async def test_f7_heartbeats_through_pgbouncer(
    bounced: AsyncEngine, elsewhere: AsyncEngine, ship_clock: FrozenClock, errors: Errors
) -> None:
    """F7 with J5: a running run's heartbeats go through PgBouncer and move its lease on; the
    run then completes."""
    running = Recorded()
    finish = anyio.Event()

    async def slow(ctx: JobContext, payload: dict[str, Any]) -> None:
        running.record(ctx.run_id)
        await finish.wait()

    job = define_job("pgb.slow", slow, payload=dict, concurrency=Concurrency(lease=30))
    backend = worker_backend(bounced, ship_clock, errors, listen=False)
    beats = Recorded()
    heartbeat = backend.heartbeat

    async def observed(claimed: Any) -> Any:
        beats.record(len(claimed))
        return await heartbeat(claimed)

    backend.heartbeat = observed  # the runtime's heartbeats, counted as they start
    web = create_job_backend(database=elsewhere, table=runs, state_table=state, listen=False)
    async with await start_job_runtime(job, backend=backend, poll_interval=POLL):
        await parked(backend)
        run_id = (await web.enqueue(job, {})).run_id

        async def claimed() -> bool:
            return bool(running.payloads)

        # No listener and another backend's enqueue: only the poll finds the run.
        await advance_while_idle(ship_clock, 20, claimed, lambda: parked(backend))
        first = (await record_of(backend, run_id)).lease_expires_at
        assert first is not None

        async def beating() -> bool:
            return bool(beats.payloads)

        # A third of the 30 s lease (a heartbeat is due) in steps well inside the lease; then
        # the clock stands still until the heartbeat has landed.
        await advance_while_idle(ship_clock, 4, beating, lambda: parked(backend))
        with anyio.fail_after(10):
            while (await record_of(backend, run_id)).lease_expires_at == first:
                await anyio.lowlevel.checkpoint()
        moved = (await record_of(backend, run_id)).lease_expires_at
        assert moved is not None
        assert moved > first
        finish.set()
        ids = {"slow": run_id}
        await until_states(backend, {"slow": "completed"}, ids)
    assert errors == []


async def advance_while_idle(
    clock: FrozenClock,
    step: float,
    done: Callable[[], Awaitable[bool]],
    idle: Callable[[], Awaitable[object]],
) -> None:
    """Move ``clock`` forward ``step`` seconds at a time until ``done()``, each time only once
    ``idle()`` says the loop under test waits on the clock (and its sleep is registered). A
    loop woken by something else just before a move sleeps again from the moved time: the
    next move wakes it; moving only while it waits keeps claimed leases from lapsing."""
    with anyio.fail_after(10):
        while not await done():
            await idle()
            await settle_loop()
            if await done():
                return
            clock.advance(step)
            await settle_loop()


async def until_states(
    backend: PostgresJobBackend, expected: dict[str, str], ids: dict[str, str | None]
) -> None:
    """Until every run named in ``expected`` (by its name in ``ids``) is in its state."""
    with anyio.fail_after(10):
        for name, wanted in expected.items():
            while (await record_of(backend, ids[name])).state != wanted:
                await anyio.lowlevel.checkpoint()


async def test_f7_schedules_tick_through_pgbouncer(
    bounced: AsyncEngine, direct: AsyncEngine, ship_clock: FrozenClock, errors: Errors
) -> None:
    """F7 with J9: a worker runtime through PgBouncer (no listener: listen=False) installs its
    schedule and ticks it: one run per occurrence, each completed."""
    ship_clock.set(datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC))
    ticked = Recorded()

    async def report(ctx: JobContext, payload: dict[str, Any]) -> None:
        ticked.record(ctx.run_id)

    job = define_job(
        "pgb.report", report, payload=dict, schedule=Schedule(interval=timedelta(minutes=1))
    )
    backend = worker_backend(bounced, ship_clock, errors, listen=False)
    occurrences = ["pgb.report/2030-01-01T12:01:00Z", "pgb.report/2030-01-01T12:02:00Z"]
    async with await start_job_runtime(job, backend=backend, poll_interval=POLL):
        for n, occurrence in enumerate(occurrences, start=1):

            async def fired(n: int = n) -> bool:
                return len(ticked.payloads) >= n

            await advance_while_idle(ship_clock, 20, fired, lambda: parked(backend))
            await until_states(backend, {occurrence: "completed"}, {occurrence: occurrence})
    assert ticked.payloads == occurrences
    async with direct.connect() as connection:
        next_at = await connection.scalar(
            text("SELECT next_at FROM ship_job_state WHERE job_id = 'pgb.report'")
        )
    assert next_at == datetime(2030, 1, 1, 12, 3, tzinfo=UTC)
    assert errors == []


async def test_f7_advisory_xact_locks_and_fences_through_pgbouncer(
    bounced: AsyncEngine, elsewhere: AsyncEngine, direct: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """F7 with L1/L2/F4: the advisory-lock provider's transaction-level locks hold through
    PgBouncer (the holding transaction keeps its server session): one holder per key across
    engines, freed at release and at lease end; fences are drawn and checked through it."""
    provider = advisory_lock_provider(bounced, clock=ship_clock, fence_table=fences)
    other = advisory_lock_provider(elsewhere, clock=ship_clock, fence_table=fences)
    lock = await provider.acquire("report", 30)
    assert lock is not None
    assert await other.acquire("report", 30) is None
    assert provider.lock_id("report") in await held_advisory_locks(direct)
    assert await lock.extend(30)
    await lock.release()
    again = await other.acquire("report", 10)
    assert again is not None
    ship_clock.advance(10)  # its lease ends: the timer rolls the transaction back
    with anyio.fail_after(10):
        await again.wait_freed()
    assert again.lost
    assert provider.lock_id("report") not in await held_advisory_locks(direct)

    uow = create_unit_of_work(bounced, repositories=lambda scope: scope)
    async with provider.with_lock("nightly", 30) as first:
        with pytest.raises(LockHeldError):
            async with other.with_lock("nightly", 30):
                pass
    async with other.with_lock("nightly", 30) as second:
        assert second.fence > first.fence

        async def write(fence: int) -> None:
            async def fenced(scope: TransactionScope) -> None:
                await provider.check_fence("nightly", fence, scope=scope)

            await uow.run(fenced)

        await write(second.fence)
        with pytest.raises(StaleFenceError):
            await write(first.fence)


async def test_f7_idempotency_store_through_pgbouncer(bounced: AsyncEngine) -> None:
    """F7 with I1/I2: idempotency claims through PgBouncer: a duplicate of an uncommitted
    claim waits its lock_timeout (SET LOCAL in a savepoint, transaction-scoped) and is told
    in progress; once the first commits its response, a duplicate replays it."""
    store = create_idempotency_store(
        database=bounced, table=idempotency_keys, lock_timeout=timedelta(milliseconds=200)
    )
    uow = create_unit_of_work(bounced, repositories=lambda scope: scope)
    claimed = anyio.Event()
    finish = anyio.Event()

    async def first(_scope: TransactionScope) -> None:
        outcome = await store.begin("order-1", "fp")
        assert isinstance(outcome, IdempotencyStarted)
        claimed.set()
        await finish.wait()
        await outcome.claim.complete(OK)

    async with anyio.create_task_group() as group:
        group.start_soon(uow.run, first)
        with anyio.fail_after(10):
            await claimed.wait()
        assert isinstance(await store.begin("order-1", "fp"), IdempotencyInProgress)
        finish.set()
    replay = await store.begin("order-1", "fp")
    assert isinstance(replay, IdempotencyReplay)
    assert replay.response == OK


# --- what does not work through it ---------------------------------------------------------------


async def test_f7_listen_through_pgbouncer_never_goes_live_and_polling_covers_it(
    bounced: AsyncEngine, elsewhere: AsyncEngine, ship_clock: FrozenClock, errors: Errors
) -> None:
    """F7/K1: PgBouncer in transaction mode accepts LISTEN, and what other sessions notify
    never reaches the idle client. A backend listening through it (listen=True on the bounced
    engine) never goes live and says so (ListenerNotLiveError, naming the fix); its runs start
    at the next poll. (Its first probe comes from another session: sent on the listening
    connection, PgBouncer could run it on the very server session holding the LISTEN and hand
    it back, and the listener went live and heard nothing else.)"""
    started = Recorded()

    async def greet(ctx: JobContext, payload: dict[str, Any]) -> None:
        started.record(payload)

    job = define_job("pgb.polled", greet, payload=dict)
    backend = worker_backend(bounced, ship_clock, errors)
    assert backend.listener is not None
    backend.listener._probe_timeout = 0.2  # real seconds until the probe counts as lost
    web = create_job_backend(database=elsewhere, table=runs, state_table=state, listen=False)
    async with await start_job_runtime(job, backend=backend, poll_interval=POLL):
        await errors.wait_for(ListenerNotLiveError)
        assert not backend.listener.live
        assert backend.listener.connects == 0
        await parked(backend)
        await web.enqueue(job, {"n": 1})

        async def polled() -> bool:
            return bool(started.payloads)

        await advance_while_idle(ship_clock, POLL, polled, lambda: parked(backend))
    assert "listen=False" in str(errors.of(ListenerNotLiveError)[0])
    assert {type(error) for error in errors} == {ListenerNotLiveError}


async def test_f7_session_settings_stay_with_the_server_session_through_pgbouncer(
    pgbouncer: PgBouncer,
) -> None:
    """F7 (why every setting ship_sqla makes is transaction-local, ``set_config(..., true)``,
    and why JIT is turned off per role or database behind PgBouncer, not per session): a
    session-level setting made through transaction pooling stays on the server session and
    applies to the next client that session serves; a transaction-local one ends with its
    transaction."""
    token = secrets.token_hex(4)
    one = await asyncpg.connect(**single_connect_args(pgbouncer))
    two = await asyncpg.connect(**single_connect_args(pgbouncer))
    try:
        await one.execute("SELECT set_config('ship.f7_session', $1, false)", token)
        await one.execute("SELECT set_config('ship.f7_local', $1, true)", token)
        assert await two.fetchval("SELECT current_setting('ship.f7_session', true)") == token
        assert await two.fetchval("SELECT current_setting('ship.f7_local', true)") in (None, "")
    finally:
        await two.execute("RESET ship.f7_session")
        await one.close()
        await two.close()


def single_connect_args(pgbouncer: PgBouncer) -> dict[str, Any]:
    """asyncpg's arguments for a client of SINGLE (PgBouncer's one-server-session pool)."""
    return {
        "host": "127.0.0.1",
        "port": pgbouncer.port,
        "user": pgbouncer.user,
        "database": SINGLE,
        "statement_cache_size": 0,
    }


async def test_f7_session_advisory_locks_do_not_exclude_through_pgbouncer(
    pgbouncer: PgBouncer, ship_server: ResolvedServer
) -> None:
    """F7 (why the lock provider takes transaction-level locks only): a session-level advisory
    lock taken through transaction pooling belongs to the server session, not to the client:
    another client served by that session "takes" it too, and it outlives the client that
    took it."""
    key = secrets.randbits(62)
    one = await asyncpg.connect(**single_connect_args(pgbouncer))
    two = await asyncpg.connect(**single_connect_args(pgbouncer))
    admin = await asyncpg.connect(plain_dsn(ship_server.url))
    try:
        assert await one.fetchval("SELECT pg_try_advisory_lock($1)", key)
        assert await two.fetchval("SELECT pg_try_advisory_lock($1)", key)  # no exclusion
        await one.close()
        holders = await admin.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objsubid = 1 AND classid = $1 AND objid = $2",
            key >> 32,
            key & 0xFFFFFFFF,
        )
        assert holders == 1  # still held, by the server session one used
    finally:
        await two.execute("SELECT pg_advisory_unlock_all()")
        await two.close()
        await admin.close()
        if not one.is_closed():
            await one.close()
