"""The PostgreSQL job backend on real PostgreSQL: J1-J7, J11, batching and the unit of work."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import anyio
import pytest
from job_helpers import claim_request
from sqlalchemy import MetaData, TextClause, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ship_sqla import (
    TransactionScope,
    create_job_operations,
    create_unit_of_work,
    start_job_runtime,
)
from ship_sqla._direct import DirectConnection
from ship_sqla._jobs import (
    JobBackendTimeoutError,
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._jobs._sql.claim import CLAIM_COLUMNS
from ship_sqla._jobs._sql.settle import HEARTBEAT_COLUMNS, SETTLE_COLUMNS
from ship_sqla.errors import DatabaseUnavailableError, InvalidPayloadError
from ship_sqla.jobs import Aging, Fairness, RateLimit
from ship_sqla.kernel import completed, failed, released

# Private on purpose: the backend stores the run ids of the kernel's one UUIDv7 generator (no
# public name); a test here pins their shape, which keeps the runs table's pkey append-mostly.
from ship_sqla.kernel._ids import new_run_ids
from ship_sqla.kernel._jobs import (
    Concurrency,
    IdempotencyPolicy,
    Retention,
    RetryPolicy,
    define_job,
)
from ship_sqla.kernel._plans.claim_floor import DEFAULT_FLOOR_SWEEP
from ship_sqla.kernel._ports import (
    LEASE_LAPSED,
    LEASE_LAPSED_FINAL_ATTEMPT,
    DeadQuery,
    EnqueueRequest,
    JobBackend,
)
from ship_sqla.locks import AdvisoryLockProvider
from ship_sqla.testing import FrozenClock

metadata = MetaData()
# F2, F8, F9: fair jobs and partitioned ones (by tenant, by key)
runs = ship_job_runs_table(metadata, fair_claims=True, partitioned_claims=True, partition_keys=True)
state = ship_job_state_table(metadata)


async def noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("mail.send", noop, payload=dict, concurrency=Concurrency(max=3, lease=30))


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def backend(engine: AsyncEngine, ship_clock: FrozenClock) -> PostgresJobBackend:
    return create_job_backend(database=engine, table=runs, state_table=state, clock=ship_clock)


async def let_tasks_run(rounds: int = 20) -> None:
    """Give every ready task a few steps (no wall-clock wait)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def rows(engine: AsyncEngine, job_id: str = JOB.id) -> list[Any]:
    async with engine.connect() as connection:
        result = await connection.execute(
            text("SELECT * FROM ship_job_runs WHERE job_id = :j ORDER BY created_at, id"),
            {"j": job_id},
        )
        return list(result.all())


async def test_backend_satisfies_the_protocol(backend: PostgresJobBackend) -> None:
    assert isinstance(backend, JobBackend)


async def test_j4_a_runtime_takes_the_engines_advisory_locks_by_default(
    backend: PostgresJobBackend,
) -> None:
    """J3, J4: on an engine the backend's default_lock_provider is advisory locks on it, and a
    runtime started with no lock_provider takes it; the runtime's knobs are start_job_runtime's,
    not create_job_backend's."""
    assert isinstance(backend.default_lock_provider, AdvisoryLockProvider)
    async with await start_job_runtime(JOB, backend=backend, mode="enqueue-only") as runtime:
        assert runtime.lock_provider is backend.default_lock_provider
    for knob in ("poll_interval", "max_in_flight", "lock_provider", "meter_provider"):
        with pytest.raises(TypeError, match=knob):
            create_job_backend(database=backend.database, **{knob: None})  # type: ignore[call-arg]


# --- J1 dedupe ---------------------------------------------------------------------------------


async def test_enqueue_dedupes_by_key_while_not_terminal(backend: PostgresJobBackend) -> None:
    """J1: a dedupe key held by a waiting or running run returns that run, deduplicated; once
    the run is terminal the key is free again."""
    first = await backend.enqueue(JOB, {"to": "a"}, dedupe_key="k")
    again = await backend.enqueue(JOB, {"to": "b"}, dedupe_key="k")
    assert first.accepted
    assert not first.deduplicated
    assert again.deduplicated
    assert again.run_id == first.run_id
    [claimed] = await backend.claim(claim_request(JOB, worker="w", limit=5))
    running = await backend.enqueue(JOB, {"to": "c"}, dedupe_key="k")
    assert running.deduplicated
    assert running.run_id == first.run_id
    assert await backend.settle([completed(claimed)]) == ["completed"]
    fresh = await backend.enqueue(JOB, {"to": "d"}, dedupe_key="k")
    assert fresh.accepted
    assert not fresh.deduplicated
    assert fresh.run_id != first.run_id


async def test_enqueue_dedupes_by_idempotency_policy_and_durable_id(
    backend: PostgresJobBackend,
) -> None:
    """J1: the job's idempotency policy derives the key; a durable run id that exists (in any
    state) is that run."""
    job = define_job(
        "invoice.render",
        noop,
        payload=dict,
        idempotency=IdempotencyPolicy(key=lambda p: f"invoice:{p['id']}"),
    )
    a = await backend.enqueue(job, {"id": 7})
    b = await backend.enqueue(job, {"id": 7})
    assert b.deduplicated
    assert b.run_id == a.run_id
    durable = await backend.enqueue(job, {"id": 8}, run_id="invoice.render/2030-01-01T00:00")
    [claimed] = [
        run
        for run in await backend.claim(claim_request(job, worker="w", limit=5))
        if run.run_id == durable.run_id
    ]
    await backend.settle([completed(claimed)])
    replay = await backend.enqueue(job, {"id": 9}, run_id="invoice.render/2030-01-01T00:00")
    assert replay.deduplicated
    assert replay.run_id == "invoice.render/2030-01-01T00:00"


async def test_enqueue_many_is_one_statement(
    backend: PostgresJobBackend, engine: AsyncEngine
) -> None:
    """J1: enqueue_many of a batch is ONE insert statement; requests matching stored runs (by
    dedupe key or durable id) come back deduplicated, in request order."""
    stored = await backend.enqueue(JOB, {"n": 0}, dedupe_key="old")
    durable = await backend.enqueue(JOB, {"n": 0}, run_id="fixed-0")
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        results = await backend.enqueue_many(
            JOB,
            [EnqueueRequest({"n": n}, dedupe_key=f"k{n}") for n in range(50)]
            + [
                EnqueueRequest({"n": 50}, dedupe_key="old"),
                EnqueueRequest({"n": 51}, run_id="fixed-0"),
                EnqueueRequest({"n": 52}),
            ],
        )
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert len([s for s in statements if "INSERT" in s]) == 1
    assert [r.deduplicated for r in results] == [False] * 50 + [True, True, False]
    assert results[50].run_id == stored.run_id
    assert results[51].run_id == durable.run_id
    assert len(await rows(engine)) == 2 + 51


async def test_enqueue_many_equals_enqueueing_one_by_one(
    backend: PostgresJobBackend, engine: AsyncEngine
) -> None:
    """J1: requests repeating an earlier request's dedupe key or run id inside one batch are
    deduplicated against it, exactly as if the requests were enqueued one by one."""
    stored = await backend.enqueue(JOB, {"n": 0}, dedupe_key="old")
    results = await backend.enqueue_many(
        JOB,
        [
            EnqueueRequest({"n": 1}, dedupe_key="x"),
            EnqueueRequest({"n": 2}),
            EnqueueRequest({"n": 3}, dedupe_key="x"),
            EnqueueRequest({"n": 4}, dedupe_key="old", run_id="fixed-1"),
            EnqueueRequest({"n": 5}, run_id="fixed-1"),  # fixed-1 was never inserted
            EnqueueRequest({"n": 6}, run_id="fixed-1"),
        ],
    )
    assert [r.deduplicated for r in results] == [False, False, True, True, False, True]
    assert results[2].run_id == results[0].run_id
    assert results[3].run_id == stored.run_id
    assert results[4].run_id == results[5].run_id == "fixed-1"
    assert len(await rows(engine)) == 4


async def test_enqueue_validates_every_payload_before_writing(
    backend: PostgresJobBackend, engine: AsyncEngine
) -> None:
    """Nothing is written when one payload of a batch is invalid or not JSON."""
    with pytest.raises(InvalidPayloadError):
        await backend.enqueue_many(JOB, [EnqueueRequest({"ok": 1}), EnqueueRequest(["no"])])
    with pytest.raises(InvalidPayloadError):
        await backend.enqueue(JOB, {"nan": float("nan")})
    # The plain path encodes a batch in one call; the error still names what is wrong.
    batch = [EnqueueRequest({"ok": 1}), EnqueueRequest({"nan": float("nan")})]
    with pytest.raises(InvalidPayloadError, match="not JSON: Out of range float values"):
        await backend.enqueue_many(JOB, batch)
    assert await rows(engine) == []


# --- J2 queue-full ------------------------------------------------------------------------------


async def test_queue_full_rejects_and_dedupe_wins(
    engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """J2: once the job holds queue_depth_limit waiting runs (due or delayed) enqueue answers
    queue-full and writes nothing; a duplicate still gets its run; a claimed run frees a place."""
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, clock=ship_clock, queue_depth_limit=3
    )
    later = ship_clock.now() + timedelta(hours=1)
    first = await backend.enqueue(JOB, {"n": 1}, dedupe_key="d")
    await backend.enqueue(JOB, {"n": 2}, run_at=later)
    await backend.enqueue(JOB, {"n": 3})
    full = await backend.enqueue(JOB, {"n": 4})
    assert full.rejected == "queue-full"
    assert full.run_id is None
    assert not full.accepted
    dup = await backend.enqueue(JOB, {"n": 5}, dedupe_key="d")
    assert dup.deduplicated
    assert dup.run_id == first.run_id
    assert len(await rows(engine)) == 3
    many = await backend.enqueue_many(JOB, [EnqueueRequest({"n": 6}), EnqueueRequest({"n": 7})])
    assert [r.rejected for r in many] == ["queue-full", "queue-full"]
    await backend.claim(claim_request(JOB, worker="w", limit=1))
    many = await backend.enqueue_many(JOB, [EnqueueRequest({"n": 8}), EnqueueRequest({"n": 9})])
    assert [r.rejected for r in many] == [None, "queue-full"]


# --- unit of work and the local wake (J3) -------------------------------------------------------


async def test_enqueue_joins_the_unit_of_work(
    backend: PostgresJobBackend, engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """J3/U1: an enqueue inside uow.run commits with it and wakes the local loop only after the
    commit; a rolled-back enqueue never existed and wakes nothing."""
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    class BoomError(Exception):
        pass

    async def doomed(scope: TransactionScope) -> None:
        await backend.enqueue(JOB, {"n": 1}, scope=scope)
        raise BoomError

    with pytest.raises(BoomError):
        await uow.run(doomed)
    assert await rows(engine) == []

    waiter = asyncio.ensure_future(backend.wait_for_work(3600))
    await asyncio.sleep(0)

    async def committed(scope: TransactionScope) -> None:
        await backend.enqueue(JOB, {"n": 2})  # the ambient scope
        await asyncio.sleep(0)
        assert not waiter.done(), "woken before the commit"

    await uow.run(committed)
    with anyio.fail_after(5):
        await waiter
    assert len(await rows(engine)) == 1
    assert ship_clock.sleepers == 0


async def test_wake_is_kept_when_no_loop_waits(backend: PostgresJobBackend) -> None:
    """J3: a wake that lands while the loop is busy makes its next wait return at once; with
    no wake, the wait lasts the poll interval on the clock."""
    await backend.enqueue(JOB, {"n": 1})
    with anyio.fail_after(5):
        await backend.wait_for_work(3600)
    waiter = asyncio.ensure_future(backend.wait_for_work(10))
    await let_tasks_run()
    assert not waiter.done()
    backend.clock.advance(10)  # type: ignore[attr-defined]
    with anyio.fail_after(5):
        await waiter


async def test_delayed_enqueue_does_not_wake(backend: PostgresJobBackend) -> None:
    """J3: only a run that is due now wakes the loop."""
    await backend.enqueue(JOB, {"n": 1}, run_at=backend.clock.now() + timedelta(minutes=5))
    waiter = asyncio.ensure_future(backend.wait_for_work(10))
    await let_tasks_run()
    assert not waiter.done()
    waiter.cancel()


# --- J3 claim ----------------------------------------------------------------------------------


async def test_claim_honours_concurrency_max_and_run_at_order(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J3: a claim takes due runs by run_at (then creation order), skips delayed ones, and never
    lets the job's unexpired leases exceed concurrency.max, whoever holds them."""
    now = ship_clock.now()
    ids = []
    for n, delay in enumerate([5, 0, 0, -3600, 1, 2]):
        result = await backend.enqueue(JOB, {"n": n}, run_at=now - timedelta(seconds=delay))
        ids.append(result.run_id)
    a = await backend.claim(claim_request(JOB, worker="A", limit=2))
    assert [r.run_id for r in a] == [ids[0], ids[5]]
    b = await backend.claim(claim_request(JOB, worker="B", limit=10))
    assert [r.run_id for r in b] == [ids[4]]  # max=3: one place left
    assert await backend.claim(claim_request(JOB, worker="B", limit=10)) == []
    assert await backend.settle([completed(r) for r in a]) == ["completed", "completed"]
    c = await backend.claim(claim_request(JOB, worker="B", limit=10))
    assert [r.run_id for r in c] == [ids[1], ids[2]]
    assert {r.attempt for r in a + b + c} == {1}
    assert len({r.token for r in a + b + c}) == 5


async def test_claims_settles_and_heartbeats_return_the_columns_read_by_position(
    backend: PostgresJobBackend, engine: AsyncEngine
) -> None:
    """J3, J5: the backend reads the rows of its hot statements by position, so each claim
    statement (uncapped, gated, fair, fair and gated, partitioned by tenant and by key F8/F9,
    aged and aged gated F10; each keyed too) returns CLAIM_COLUMNS,
    the settle SETTLE_COLUMNS and the heartbeat HEARTBEAT_COLUMNS, in that order."""
    every = backend.statements.every_statement()
    claims = [statement for name, statement in every.items() if name.startswith("claim.CLAIM_")]
    assert len(claims) == 16
    expected = {
        **dict.fromkeys(claims, CLAIM_COLUMNS),
        every["settle.SETTLE_IF_TOKEN_CURRENT"]: SETTLE_COLUMNS,
        every["settle.HEARTBEAT_IF_TOKEN_CURRENT"]: HEARTBEAT_COLUMNS,
    }
    texts = {str(statement.compile(dialect=engine.dialect)): statement for statement in expected}
    described: dict[TextClause, tuple[str, ...]] = {}

    def on_execute(*args: Any) -> None:
        _connection, cursor, statement, *_ = args
        if statement in texts:
            described[texts[statement]] = tuple(column[0] for column in cursor.description)

    jobs = [
        define_job("claim.plain", noop, payload=dict),
        define_job("claim.capped", noop, payload=dict, concurrency=Concurrency(max=2)),
        define_job("claim.fair", noop, payload=dict, fairness=Fairness()),
        define_job(
            "claim.fair_capped",
            noop,
            payload=dict,
            concurrency=Concurrency(max=2),
            fairness=Fairness(max_tenants=1),
        ),
        define_job("claim.aged", noop, payload=dict, aging=Aging(step=1, every=1.0)),
        define_job(
            "claim.aged_capped",
            noop,
            payload=dict,
            concurrency=Concurrency(max=2),
            aging=Aging(step=1, every=1.0),
        ),
        define_job(
            "claim.partitioned",
            noop,
            payload=dict,
            concurrency=Concurrency(max=5, partition="tenant"),
        ),
        define_job(
            "claim.partitioned_by_key",
            noop,
            payload=dict,
            rate_limit=RateLimit(100, 1.0, partition="key"),
            partition_key=lambda payload: str(payload["n"]),
        ),
    ]
    event.listen(engine.sync_engine, "after_cursor_execute", on_execute)
    try:
        for job in jobs:
            for keys in ((), ("excluded",)):
                await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
                claimed = await backend.claim(
                    claim_request(job, worker="w", limit=5, exclude_keys=keys)
                )
                assert claimed
                assert all(await backend.heartbeat(claimed))
                settled = await backend.settle([completed(run) for run in claimed])
                assert set(settled) == {"completed"}
    finally:
        event.remove(engine.sync_engine, "after_cursor_execute", on_execute)
    assert described == expected


async def test_claim_heartbeat_and_settle_run_on_the_driver_unless_the_engine_is_watched(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """J3, J5: the claim, the heartbeat and the settle run straight on a pooled asyncpg
    connection (``ship_sqla._direct``) while nothing watches the engine's statements, and
    through SQLAlchemy while a listener does (which then sees each of them); both paths
    answer the same and leave the same rows."""
    fetched: list[str] = []
    real = DirectConnection.fetch

    async def spy(self: DirectConnection, statement: Any, params: Any) -> Any:
        fetched.append(statement)
        return await real(self, statement, params)

    monkeypatch.setattr(DirectConnection, "fetch", spy)

    async def cycle(job_id: str) -> tuple[Any, ...]:
        clock = FrozenClock()
        backend = create_job_backend(
            database=engine, table=runs, state_table=state, clock=clock, announce=False
        )
        job = define_job(job_id, noop, payload=dict, concurrency=Concurrency(max=5))
        await backend.enqueue_many(job, [EnqueueRequest({"n": n}) for n in range(3)])
        claimed = await backend.claim(claim_request(job, worker="w", limit=2))
        beats = list(await backend.heartbeat(claimed))
        first, second = claimed
        settled = await backend.settle(
            [completed(first), failed(second, "boom", clock.now() + timedelta(seconds=5))]
        )
        stale = await backend.settle([completed(first)])
        answered = [
            (r.payload, r.attempt, r.max_attempts, r.key, r.lease_expires_at, r.lease, r.snoozes)
            for r in claimed
        ]
        async with engine.connect() as connection:
            left = await connection.execute(
                text(
                    "SELECT payload, state, attempt, run_at, last_error FROM ship_job_runs"
                    " WHERE job_id = :job ORDER BY seq"
                ),
                {"job": job_id},
            )
            stored = [tuple(row) for row in left]
        return answered, beats, settled, stale, stored

    direct = await cycle("direct.cycle")
    assert len(fetched) == 5  # the gated claim (its first: twice, making the gate), beat, 2 settles
    watched: list[str] = []

    def on_execute(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        watched.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        through_sqlalchemy = await cycle("sqlalchemy.cycle")
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", on_execute)
    assert len(fetched) == 5, "a watched engine takes SQLAlchemy's path"
    assert len([statement for statement in watched if "lease_token" in statement]) == 5
    assert direct == through_sqlalchemy
    assert direct[1:4] == ([True, True], ["completed", "retrying"], ["stale"])


async def test_claim_skips_excluded_keys(backend: PostgresJobBackend) -> None:
    """J4: a single-runner job's claim skips the keys this process already runs."""
    job = define_job(
        "sync.account",
        noop,
        payload=dict,
        concurrency=Concurrency(single_runner=True, key=lambda p: p["account"]),
    )
    await backend.enqueue(job, {"account": "a"})
    await backend.enqueue(job, {"account": "b"})
    [run] = await backend.claim(claim_request(job, worker="w", limit=1, exclude_keys=["a"]))
    assert run.key == "b"
    assert await backend.claim(claim_request(job, worker="w", limit=5, exclude_keys=["a"])) == []


async def test_claim_leaves_no_row_locked(backend: PostgresJobBackend, engine: AsyncEngine) -> None:
    """J3: rows the claim's SKIP LOCKED scan locked but its limit dropped are free once claim
    returns: the claim is its own short, committed transaction."""
    for n in range(5):
        await backend.enqueue(JOB, {"n": n})
    [_one] = await backend.claim(claim_request(JOB, worker="w", limit=1))
    async with engine.connect() as connection:
        locked = await connection.execute(
            text("SELECT id FROM ship_job_runs WHERE state = 'waiting' FOR UPDATE NOWAIT")
        )
        assert len(locked.all()) == 4
        idle = await connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
            )
        )
        assert idle.scalar_one() == 0
        await connection.rollback()


# --- J5 fencing ---------------------------------------------------------------------------------


async def test_stale_token_changes_nothing(
    backend: PostgresJobBackend, engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """J5: once a lapsed run is retaken, its old holder's complete / fail / release / heartbeat
    answer stale and change nothing; the new holder settles normally."""
    await backend.enqueue(JOB, {"n": 1})
    [old] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    assert await backend.heartbeat([old]) == [True]
    ship_clock.advance(31)
    [new] = await backend.claim(claim_request(JOB, worker="B", limit=1))
    assert new.run_id == old.run_id
    assert new.token != old.token
    assert new.attempt == 2
    before = [dict(r._mapping) for r in await rows(engine)]
    assert await backend.settle([completed(old)]) == ["stale"]
    assert await backend.settle([failed(old, "late", retry_at=ship_clock.now())]) == ["stale"]
    assert await backend.settle([released(old, ship_clock.now(), reason="lock-held")]) == ["stale"]
    assert await backend.heartbeat([old]) == [False]
    assert [dict(r._mapping) for r in await rows(engine)] == before
    assert await backend.heartbeat([old, new]) == [False, True]
    assert await backend.settle([completed(old), completed(new)]) == ["stale", "completed"]
    assert await backend.settle([completed(new)]) == ["stale"]


async def test_lapsed_lease_not_retaken_is_still_current(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J5: a lease that lapsed but that no claim retook is never revived by a heartbeat (its
    holder must stop), yet its token is still current: a completion that arrives first lands."""
    await backend.enqueue(JOB, {"n": 1})
    [run] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    ship_clock.advance(60)
    assert await backend.heartbeat([run]) == [False]
    record = await backend.admin.get_run(run.run_id)
    assert record is not None
    assert record.state == "running"
    assert record.lease_expires_at is not None
    assert record.lease_expires_at < ship_clock.now()
    assert await backend.settle([completed(run)]) == ["completed"]


async def test_heartbeat_extends_the_lease(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J5: a heartbeat pushes the lease to now + concurrency.lease, so the run is not retaken."""
    await backend.enqueue(JOB, {"n": 1})
    [run] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    for _ in range(4):
        ship_clock.advance(20)
        assert await backend.heartbeat([run]) == [True]
        assert await backend.claim(claim_request(JOB, worker="B", limit=1)) == []
    record = await backend.admin.get_run(run.run_id)
    assert record is not None
    assert record.lease_expires_at == ship_clock.now() + timedelta(seconds=30)


# --- J6 lapsed leases ---------------------------------------------------------------------------


async def test_lapse_on_final_attempt_is_dead_lettered(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J6: a run whose holder died is retaken once its lease lapses, as a new attempt; a lapse
    on the final attempt dead-letters it with LEASE_LAPSED_FINAL_ATTEMPT, not returned."""
    job = define_job(
        "report.build",
        noop,
        payload=dict,
        concurrency=Concurrency(max=1, lease=10),
        retry=RetryPolicy(attempts=2),
    )
    queued = await backend.enqueue(job, {"n": 1})
    [first] = await backend.claim(claim_request(job, worker="A", limit=1))
    ship_clock.advance(10)
    [second] = await backend.claim(claim_request(job, worker="B", limit=1))
    assert (second.run_id, second.attempt) == (queued.run_id, 2)
    ship_clock.advance(10)
    follower = await backend.enqueue(job, {"n": 2})
    [third] = await backend.claim(claim_request(job, worker="C", limit=1))
    assert third.run_id == follower.run_id
    record = await backend.admin.get_run(queued.run_id)
    assert record is not None
    assert record.state == "dead"
    assert record.attempt == 2
    assert record.finished_at is not None
    assert record.last_error is not None
    assert record.last_error.startswith(LEASE_LAPSED_FINAL_ATTEMPT)
    # J6: both lapsed attempts are history: the retaken first, the dead-lettered second.
    assert [entry["attempt"] for entry in record.history] == [1, 2]
    assert record.history[0]["error"].startswith(LEASE_LAPSED)
    assert await backend.settle([completed(first), completed(second)]) == ["stale", "stale"]


# --- J7 fail and release ------------------------------------------------------------------------


async def test_a_lapsed_final_run_a_heartbeat_holds_keeps_its_slot(
    backend: PostgresJobBackend, engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """J3 (F1), J5: concurrency.max is exact even against a heartbeat in flight. A run whose
    lease lapsed on its final attempt is normally buried by the next claim, freeing its slot;
    but while another statement holds its row (a heartbeat that read the lease before it
    lapsed, say) SKIP LOCKED passes it by, and it must still count as holding its slot: this
    claim takes no due run in its place. Once the row is free a claim buries it (J6) and only
    then starts the due run, so the job never has two running runs at concurrency.max = 1.
    J19's lapsed floor: the claim that passed it by was a complete probe, so the run is below
    the floor and the claim that buries it is the next probe from the start, within ``sweep``
    seconds (plus one claim interval); until then every claim takes nothing (its slot held)."""
    job = define_job(
        "report.single",
        noop,
        payload=dict,
        concurrency=Concurrency(max=1, lease=10),
        retry=RetryPolicy(attempts=1),
    )
    lapsing = await backend.enqueue(job, {"n": 1})
    [held] = await backend.claim(claim_request(job, worker="A", limit=1))
    ship_clock.advance(11)
    due = await backend.enqueue(job, {"n": 2})
    async with engine.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM ship_job_runs WHERE id = :id FOR UPDATE"), {"id": held.run_id}
        )
        claimed = await backend.claim(claim_request(job, worker="B", limit=1))
        assert claimed == []
        assert claimed.buried == ()
        await holder.rollback()
    freed_at = ship_clock.now()
    claimed = await backend.claim(claim_request(job, worker="B", limit=1))
    while not claimed.buried:
        assert claimed == []
        ship_clock.advance(1.0)
        assert ship_clock.now() - freed_at <= timedelta(seconds=DEFAULT_FLOOR_SWEEP + 1.0)
        claimed = await backend.claim(claim_request(job, worker="B", limit=1))
    assert [run.run_id for run in claimed] == [due.run_id]
    assert [buried.run_id for buried in claimed.buried] == [lapsing.run_id]
    running = [row for row in await rows(engine, job.id) if row.state == "running"]
    assert [row.id for row in running] == [due.run_id]


async def test_fail_retries_then_dead_letters_with_history(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J7: a failure appends to the history and waits for retry_at; the last attempt's failure
    dead-letters; retry_at None dead-letters at once."""
    job = define_job("fragile", noop, payload=dict, retry=RetryPolicy(attempts=2))
    queued = await backend.enqueue(job, {"n": 1})
    [run] = await backend.claim(claim_request(job, worker="A", limit=1))
    retry_at = ship_clock.now() + timedelta(seconds=5)
    assert await backend.settle([failed(run, "boom 1", retry_at=retry_at)]) == ["retrying"]
    assert await backend.claim(claim_request(job, worker="A", limit=1)) == []
    ship_clock.advance(5)
    [run] = await backend.claim(claim_request(job, worker="A", limit=1))
    assert run.attempt == 2
    assert await backend.settle([failed(run, "boom 2", retry_at=ship_clock.now())]) == ["dead"]
    record = await backend.admin.get_run(queued.run_id)
    assert record is not None
    assert record.state == "dead"
    assert record.last_error == "boom 2"
    assert [(e["attempt"], e["error"]) for e in record.history] == [(1, "boom 1"), (2, "boom 2")]
    other = await backend.enqueue(job, {"n": 2})
    [run] = await backend.claim(claim_request(job, worker="A", limit=1))
    assert run.run_id == other.run_id
    assert await backend.settle([failed(run, "fatal", retry_at=None)]) == ["dead"]


async def test_release_does_not_consume_an_attempt(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J7: JOB_LOCK_HELD returns the run to waiting without consuming its attempt; a release
    with an error (drain cancellation) keeps that error in the history."""
    queued = await backend.enqueue(JOB, {"n": 1})
    [run] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    later = ship_clock.now() + timedelta(seconds=2)
    assert await backend.settle([released(run, later, reason="lock-held")]) == ["released"]
    assert await backend.claim(claim_request(JOB, worker="A", limit=1)) == []
    ship_clock.advance(2)
    [run] = await backend.claim(claim_request(JOB, worker="A", limit=1))
    assert run.attempt == 1
    assert await backend.settle(
        [released(run, ship_clock.now(), reason="lock-held", error="cancelled")]
    ) == ["released"]
    record = await backend.admin.get_run(queued.run_id)
    assert record is not None
    assert record.attempt == 0
    assert record.state == "waiting"
    assert [(e["attempt"], e["error"]) for e in record.history] == [(1, "cancelled")]


# --- operator operations ------------------------------------------------------------------------


async def test_operator_retry_discard_list_and_cleanup(
    backend: PostgresJobBackend, ship_clock: FrozenClock
) -> None:
    """J8 (storage side, the admin port the operator surface gates): retry gives a dead run one
    more attempt (not while its dedupe key is taken), discard ends waiting/dead runs, list_dead
    pages dead runs, cleanup applies the retention in bounded batches."""
    admin = backend.admin
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    job = define_job(
        "ops",
        noop,
        payload=dict,
        retry=RetryPolicy(attempts=1),
        retention=Retention(completed=timedelta(hours=1), dead=timedelta(days=1)),
    )
    dead_ids = []
    for n in range(3):
        result = await backend.enqueue(job, {"n": n}, dedupe_key=f"d{n}")
        [run] = await backend.claim(claim_request(job, worker="A", limit=1))
        assert await backend.settle([failed(run, f"e{n}", retry_at=None)]) == ["dead"]
        dead_ids.append(result.run_id)
        ship_clock.advance(1)
    page = await admin.list_dead(DeadQuery(limit=2, job_id=job.id))
    assert [r.run_id for r in page] == dead_ids[::-1][:2]
    last = page[-1]
    assert last.finished_at is not None
    rest = await admin.list_dead(
        DeadQuery(limit=2, job_id=job.id, after=(last.finished_at, last.run_id))
    )
    assert [r.run_id for r in rest] == [dead_ids[0]]

    blocker = await backend.enqueue(job, {"n": 9}, dedupe_key="d0")
    assert not blocker.deduplicated
    assert await admin.retry_dead(dead_ids[0]) is None  # its dedupe key is live again (J1)
    assert await admin.retry_dead(dead_ids[1]) is not None
    record = await admin.get_run(dead_ids[1])
    assert record is not None
    assert (record.state, record.max_attempts, record.finished_at) == ("waiting", 2, None)
    assert await admin.retry_dead(dead_ids[1]) is None
    assert await admin.discard(blocker.run_id) is not None
    assert await admin.discard(dead_ids[2]) is not None
    assert await admin.discard(dead_ids[2]) is None

    [run] = await backend.claim(claim_request(job, worker="A", limit=1))
    assert run.run_id == dead_ids[1]
    assert run.attempt == 2
    await backend.settle([completed(run)])
    assert (await ops.cleanup([job]))[job.id] == 0
    ship_clock.advance(timedelta(hours=1))
    assert (await ops.cleanup([job]))[job.id] == 1  # the completed one
    ship_clock.advance(timedelta(days=7))
    # one batch of one beyond the (empty) completed batch: one run of the three past retention
    assert (await ops.cleanup([job], batch_size=1, max_batches=2))[job.id] == 1
    assert (await ops.cleanup([job], batch_size=10))[job.id] == 2
    assert await admin.get_run(dead_ids[0]) is None


# --- J11 failures surface as exceptions, and the backend recovers ------------------------------


async def test_dropped_connections_raise_then_recover(
    backend: PostgresJobBackend, engine: AsyncEngine
) -> None:
    """J11: when the database drops the backend's connections (a restart), the next operation
    raises (the runtime reports it) and the one after works again; nothing hangs. The enqueue's
    connection is still kept for its turn of the event loop when the admin connects, so the
    admin takes another one and the enqueue's, idle in the pool by then, is among those
    dropped: the claim meets it."""
    await backend.enqueue(JOB, {"n": 1})
    async with engine.connect() as admin:
        await admin.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
        await admin.commit()
    outcomes: list[str] = []
    with anyio.fail_after(30):
        for _ in range(3):
            try:
                claimed = await backend.claim(claim_request(JOB, worker="w", limit=1))
            except (DBAPIError, DatabaseUnavailableError):
                outcomes.append("error")
                continue
            outcomes.append(f"claimed {len(claimed)}")
            break
    assert outcomes[0] == "error", outcomes  # a dropped connection was met
    assert outcomes[-1] == "claimed 1", outcomes


async def test_operation_timeout_bounds_a_stuck_claim(
    engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """J11: a claim that cannot finish (here: another session holds the runs table locked) ends
    with JobBackendTimeoutError after operation_timeout instead of hanging, and the backend
    works once the obstacle is gone."""
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, clock=ship_clock, operation_timeout=0.5
    )
    await backend.enqueue(JOB, {"n": 1})
    async with engine.connect() as blocker:
        await blocker.execute(text("LOCK TABLE ship_job_runs IN ACCESS EXCLUSIVE MODE"))
        with anyio.fail_after(10), pytest.raises(JobBackendTimeoutError) as caught:
            await backend.claim(claim_request(JOB, worker="w", limit=1))
        assert caught.value.code == "SHIP_SQLA_JOB_BACKEND_TIMEOUT"
        await blocker.rollback()
    with anyio.fail_after(10):
        assert len(await backend.claim(claim_request(JOB, worker="w", limit=1))) == 1


async def test_report_error_never_raises(engine: AsyncEngine) -> None:
    """J11: report_error hands errors to on_error; an on_error that raises is logged."""
    seen: list[BaseException] = []
    backend = create_job_backend(
        database=engine, table=runs, state_table=state, on_error=seen.append
    )
    error = RuntimeError("poll failed")
    backend.report_error(error)
    assert seen == [error]

    def broken(_exc: BaseException) -> None:
        raise ValueError

    create_job_backend(
        database=engine, table=runs, state_table=state, on_error=broken
    ).report_error(error)


# --- the test path: an AsyncConnection in a transaction ----------------------------------------


async def test_backend_on_a_connection_in_a_transaction(
    ship_connection: AsyncConnection, ship_clock: FrozenClock
) -> None:
    """The backend works on a connection already in a transaction (SAVEPOINTs), taking turns
    between concurrent callers; it has no default lock provider there (J4)."""
    await ship_connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_connection, table=runs, state_table=state, clock=ship_clock
    )
    assert backend.default_lock_provider is None
    await backend.enqueue_many(JOB, [EnqueueRequest({"n": n}) for n in range(4)])
    first, second = await asyncio.gather(
        backend.claim(claim_request(JOB, worker="A", limit=2)),
        backend.claim(claim_request(JOB, worker="B", limit=2)),
    )
    assert len(first) + len(second) == 3
    outcomes = await asyncio.gather(
        backend.settle([completed(r) for r in first]),
        backend.settle([completed(r) for r in second]),
    )
    assert sum(len(o) for o in outcomes) == 3


def test_run_ids_are_increasing_version_7_uuids() -> None:
    """Generated run ids are RFC 9562 version 7 UUIDs, strictly increasing within the process,
    across batches (the pkey stays append-mostly)."""
    ids = new_run_ids(1000) + new_run_ids(1) + new_run_ids(500)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    parsed = [uuid.UUID(i) for i in ids]
    assert {(u.version, u.variant) for u in parsed} == {(7, uuid.RFC_4122)}
