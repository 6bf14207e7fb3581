"""Transactional handlers (SPEC §8 J13, J14) on PostgreSQL: the interleavings of a fenced
transaction with lapsing leases, other workers' claims, an operator's cancel and a hung holder,
each under READ COMMITTED, REPEATABLE READ and SERIALIZABLE.

The effects table has no unique constraint: exactly once comes from the fence and the
completion committing with the handler's writes, never from the table refusing a duplicate.
Attempts are driven one at a time (what the executor does: InFlight, JobContext, FusedAttempt)
so each step of an interleaving happens where the test puts it; the tests about heartbeats and
workflows run the real runtime (a fenced run is not heartbeated, a heartbeat never waits behind
a fence, a workflow's completing transaction). Handlers wait on events the test sets.

One wait has no event to wait on and polls with short awaits, bounded by ``anyio.fail_after``:
a session starting to wait on a row lock (the server tells no one; ``pg_blocking_pids`` is read
until it names the holder). The server ending an idle holder is waited for with a blocking
``SELECT ... FOR UPDATE`` of the run's row, which returns when the lock goes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from job_helpers import ErrorLog, claim_request, record_of, settle_loop
from spy_backend import SpyBackend
from sqlalchemy import MetaData, select, text

from ship_sqla import (
    JobContext,
    create_job_operations,
    create_unit_of_work,
    define_job,
    start_job_runtime,
)
from ship_sqla._cli._output import format_cancel
from ship_sqla._jobs import (
    create_job_backend,
    ship_job_events_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_job_steps_table,
)
from ship_sqla.errors import DatabaseUnavailableError, JobLeaseStaleError
from ship_sqla.jobs import Concurrency, RetryPolicy
from ship_sqla.kernel import SystemClock
from ship_sqla.kernel._runtime.fused import FusedAttempt, SettlesApart
from ship_sqla.kernel._runtime.state import InFlight, describe_failure
from ship_sqla.kernel._settlement import failed
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ship_sqla.kernel import Clock

LEASE = 30.0
"""The lease of the frozen-clock tests: frozen seconds for the claims, and real seconds for the
server's bound on an idle holder (the fence sets it to the lease), never reached by them."""

HUNG_LEASE = 2.0
"""The hung-holder test's lease: the real time the server lets the holder sit idle (short for a
fast test, long enough that a loaded machine never idles that long between two statements)."""

LIMIT = 10.0
"""Bound of every wait (seconds)."""


@pytest.fixture(params=["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def isolation_level(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


class Repositories:
    """The handler's repositories: an effect row, and the holder's server process id."""

    def __init__(self, scope: Any) -> None:
        self.scope = scope

    async def add_effect(self, key: str) -> None:
        await self.scope.connection.execute(
            text("INSERT INTO j14_effects (key) VALUES (:key)"), {"key": key}
        )

    async def backend_pid(self) -> int:
        return int((await self.scope.connection.execute(text("SELECT pg_backend_pid()"))).scalar())


class World:
    """One database with the job tables and the effects table; ``backend(clock)`` makes a job
    backend on it, ``uow`` the handlers' unit of work at the test's isolation level."""

    def __init__(self, engine: AsyncEngine, isolation_level: str) -> None:
        self.engine = engine
        self.isolation_level = isolation_level
        self.metadata = MetaData()
        self.runs = ship_job_runs_table(self.metadata)
        self.state = ship_job_state_table(self.metadata)
        self.steps = ship_job_steps_table(self.metadata)
        self.events = ship_job_events_table(self.metadata)
        self.errors = ErrorLog()
        self.uow = create_unit_of_work(
            engine,
            repositories=Repositories,
            isolation_level=isolation_level,  # type: ignore[arg-type]
        )

    def backend(self, clock: Clock) -> Any:
        return create_job_backend(
            database=self.engine,
            table=self.runs,
            state_table=self.state,
            steps_table=self.steps,
            events_table=self.events,
            clock=clock,
            on_error=self.errors,
            listen=False,
        )

    async def effects(self) -> list[str]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(text("SELECT key FROM j14_effects ORDER BY seq"))
            return [row.key for row in rows]

    async def blocked_by(self, holder_pid: int) -> bool:
        """Whether some session waits on a lock ``holder_pid`` holds."""
        async with self.engine.connect() as connection:
            found = await connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE CAST(:pid AS integer) = ANY(pg_blocking_pids(pid))"
                ),
                {"pid": holder_pid},
            )
            return bool(found.scalar())

    async def wait_blocked_by(self, holder_pid: int) -> None:
        """Until a session waits on ``holder_pid``'s lock. Polled: the server announces no lock
        wait, so there is no event to wait on."""
        with anyio.fail_after(LIMIT):
            while not await self.blocked_by(holder_pid):  # noqa: ASYNC110 - no event exists
                await anyio.sleep(0.01)

    async def wait_lock_released(self, run_id: str) -> None:
        """Until no transaction holds run ``run_id``'s row lock: a plain ``FOR UPDATE`` waits
        for it (then rolls back at once)."""
        async with self.engine.connect() as connection:
            await connection.execute(
                select(self.runs.c.id).where(self.runs.c.id == run_id).with_for_update()
            )
            await connection.rollback()


@pytest.fixture
async def world(ship_engine: AsyncEngine, isolation_level: str) -> World:
    made = World(ship_engine, isolation_level)
    async with ship_engine.begin() as connection:
        await connection.run_sync(made.metadata.create_all)
        await connection.execute(
            text("CREATE TABLE j14_effects (seq bigserial, key text NOT NULL)")
        )
    return made


def _attempt(backend: Any, job: Any, run: Any) -> FusedAttempt:
    """One transactional attempt of ``run`` outside a runtime (what the executor builds)."""
    entry = InFlight(job, run, backend.clock.monotonic())
    ctx = JobContext(run, entry, worker_id="w")
    return FusedAttempt(entry, ctx, job.decode(run.payload), backend, backend.clock)


def _same_job(job: Any, handler: Any, *, lease: float) -> Any:
    """``job`` with another handler and lease (the same job as another process declares it)."""
    return define_job(
        job.id,
        handler,
        payload=dict,
        transaction=job.transaction,
        concurrency=Concurrency(lease=lease),
    )


class Gate:
    """A handler's checkpoints: ``entered`` (set once it runs, fenced, its write sent, ``pid``
    its server process), and ``release`` (what it waits for before it returns)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.pid = 0
        self.calls: list[int] = []

    def handler(self, label: str) -> Any:
        async def handler(ctx: Any, payload: Any, repositories: Repositories) -> None:
            self.calls.append(ctx.token)
            await repositories.add_effect(f"{label}-{ctx.token}")
            self.pid = await repositories.backend_pid()
            self.entered.set()
            await self.release.wait()

        return handler


# --- 1. A lapse after the fence ------------------------------------------------------------------


async def test_j14_a_lease_lapsing_after_the_fence_is_not_retaken(world: World) -> None:
    """J14, J13, J5, J6: a holder that fenced and is in its handler for longer than three
    heartbeat intervals (the whole lease) sends no heartbeat for the fenced run
    (Cancellation.fenced: the runtime skips it; a plain run beside it is heartbeated
    meanwhile); its lease lapses, yet another worker's claim returns nothing (claims skip the
    locked row); the holder's commit completes the run once: one effect, attempt 1, nothing
    reported."""
    clock = FrozenClock()
    backend = SpyBackend(world.backend(clock))
    gate = Gate()
    plain_release = anyio.Event()
    plain_started = anyio.Event()

    async def plain(ctx: Any, payload: Any) -> None:
        plain_started.set()
        await plain_release.wait()

    job = define_job(
        "j14.after",
        gate.handler("after"),
        payload=dict,
        transaction=world.uow,
        concurrency=Concurrency(lease=LEASE),
    )
    beside = define_job("j14.beside", plain, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    plain_run = await backend.enqueue(beside, {})
    async with await start_job_runtime([job, beside], backend=backend, worker_id="w1"):
        try:
            with anyio.fail_after(LIMIT):
                await gate.entered.wait()
                await plain_started.wait()
            # Three beats of the plain run: a whole lease of frozen time with the fenced one idle.
            # A second at a time, every call answered before time moves on: frozen time must not
            # run ahead of a heartbeat's round trip, or the plain run's own lease would lapse.
            with anyio.fail_after(LIMIT):
                while len(backend.calls.get("heartbeat", ())) < 3:
                    clock.advance(1.0)
                    await settle_loop()
                    await backend.wait_idle(limit=LIMIT)
            clock.advance(1.0)
            beaten = [run.run_id for call in backend.calls["heartbeat"] for run in call.args[0]]
            assert result.run_id not in beaten
            assert beaten.count(plain_run.run_id) >= 3
            held = await record_of(backend, result.run_id)
            assert held.state == "running"
            assert held.lease_expires_at is not None
            assert held.lease_expires_at < clock.now()
            # Another worker: the lapsed run is locked by the holder's transaction, so skipped.
            assert await backend.inner.claim(claim_request(job, worker="w2")) == []
            assert await world.effects() == []
            gate.release.set()
            await backend.wait_calls("settle_within", 1, limit=LIMIT)
            plain_release.set()
            await backend.wait_settled("complete", 1, limit=LIMIT)
        finally:
            # A failed step must not leave the drain waiting for the handlers.
            gate.release.set()
            plain_release.set()
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.history) == ("completed", 1, ())
    assert await world.effects() == [f"after-{gate.calls[0]}"]
    assert len(gate.calls) == 1
    assert world.errors.errors == []


# --- 2. A lapse before the fence -----------------------------------------------------------------


async def test_j14_a_lease_lapsing_before_the_fence_leaves_the_holder_stale(world: World) -> None:
    """J14, J5, J6: the holder's lease lapsed and another claim retook the run before the
    holder's transaction started: its fence answers stale (JobLeaseStaleError), its handler is
    not called and nothing is written; the new holder completes the run once."""
    clock = FrozenClock()
    backend = world.backend(clock)
    gate = Gate()
    gate.release.set()
    job = define_job(
        "j14.before",
        gate.handler("before"),
        payload=dict,
        transaction=world.uow,
        concurrency=Concurrency(lease=LEASE),
    )
    result = await backend.enqueue(job, {})
    [stale] = await backend.claim(claim_request(job, worker="A"))
    clock.advance(LEASE + 1)
    [current] = await backend.claim(claim_request(job, worker="B"))
    late = _attempt(backend, job, stale)
    with pytest.raises(JobLeaseStaleError):
        await late.run()
    assert (late.stale, late.landed, gate.calls) == (True, None, [])
    assert await world.effects() == []
    done = _attempt(backend, job, current)
    await done.run()
    assert done.landed is not None
    assert gate.calls == [current.token]
    assert await world.effects() == [f"before-{current.token}"]
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 2)


async def test_j14_a_stale_holder_fencing_while_the_new_holder_holds_the_fence(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """J14, J5, U3: the stale holder's transaction starts while the new holder is fenced and in
    its handler: the stale fence waits on the row lock, and once the new holder commits it
    answers stale (READ COMMITTED reads the committed row; REPEATABLE READ and SERIALIZABLE fail
    with a serialization error, the unit of work re-runs, and the new fence reads it): one
    effect, the new holder's."""
    caplog.set_level(logging.INFO, logger="ship_sqla")
    clock = FrozenClock()
    backend = world.backend(clock)
    gate = Gate()
    job = define_job(
        "j14.race",
        gate.handler("race"),
        payload=dict,
        transaction=world.uow,
        concurrency=Concurrency(lease=LEASE),
    )
    result = await backend.enqueue(job, {})
    [stale] = await backend.claim(claim_request(job, worker="A"))
    clock.advance(LEASE + 1)
    [current] = await backend.claim(claim_request(job, worker="B"))
    late = _attempt(backend, job, stale)
    outcome: list[BaseException] = []

    async def stale_holder() -> None:
        try:
            await late.run()
        except JobLeaseStaleError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(_attempt(backend, job, current).run)
        with anyio.fail_after(LIMIT):
            await gate.entered.wait()
        try:
            group.start_soon(stale_holder)
            await world.wait_blocked_by(gate.pid)
            # The new holder outlives its own lease too: holding the fence, it still completes.
            clock.advance(LEASE + 1)
        finally:
            gate.release.set()
    assert len(outcome) == 1
    assert late.landed is None
    assert gate.calls == [current.token]
    assert await world.effects() == [f"race-{current.token}"]
    assert (await record_of(backend, result.run_id)).state == "completed"
    reruns = [r for r in caplog.records if "re-running after SQLSTATE 40001" in r.getMessage()]
    assert bool(reruns) == (world.isolation_level != "READ COMMITTED")


# --- 3. A cancel before the completion -----------------------------------------------------------


async def test_j14_a_cancel_committed_before_the_fence_ends_the_run_cancelled(
    world: World,
) -> None:
    """J14, K2: an operator's cancel committed after the claim and before the fence: the
    transaction rolls back before the handler is called and asks for a cancellation, which
    the completer lands: the run ends cancelled, no effect."""
    clock = FrozenClock()
    backend = world.backend(clock)
    gate = Gate()
    gate.release.set()
    job = define_job("j14.cancel", gate.handler("cancel"), payload=dict, transaction=world.uow)
    result = await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="A"))
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    assert (await ops.cancel(result.run_id)).outcome == "requested"
    attempt = _attempt(backend, job, run)
    with pytest.raises(SettlesApart) as apart:
        await attempt.run()
    assert gate.calls == []
    assert await backend.settle([apart.value.settlement]) == ["cancelled"]
    record = await record_of(backend, result.run_id)
    assert record.state == "cancelled"
    assert await world.effects() == []


async def test_j14_a_cancel_during_the_fence_waits_and_the_completion_wins(world: World) -> None:
    """J14, K2, J13: an operator cancels while the fence of a holder that no notification
    reaches (an attempt driven outside a runtime; a runtime's holder is told first and rolls
    back: test_k2_j14_a_cancel_reaches_a_transactional_handler_inside_its_transaction) is held:
    the cancel waits on the run's row lock (blocked by the holder's session) until the holder
    commits; the
    completion commits with the handler's write (completion wins, K2), and the cancel then
    finds a finished run and changes nothing. The operator sees "had already finished
    (completed): nothing changed." (CancelResult outcome ``"finished"``); the run has no
    ``cancel_requested_at``; one effect."""
    clock = FrozenClock()
    backend = world.backend(clock)
    gate = Gate()
    job = define_job("j14.cancel-held", gate.handler("held"), payload=dict, transaction=world.uow)
    result = await backend.enqueue(job, {})
    [run] = await backend.claim(claim_request(job, worker="A"))
    ops = create_job_operations(backend, authorizer=lambda *_: True)
    attempt = _attempt(backend, job, run)
    answers: list[Any] = []

    async def operator() -> None:
        answers.append(await ops.cancel(result.run_id))

    async with anyio.create_task_group() as group:
        group.start_soon(attempt.run)
        with anyio.fail_after(LIMIT):
            await gate.entered.wait()
        try:
            group.start_soon(operator)
            await world.wait_blocked_by(gate.pid)
            assert answers == []
            # The handler outlives its lease while the cancel waits: holding the fence, it still
            # completes (the completion is fenced on the token, not on the lease's time).
            clock.advance(LEASE + 1)
        finally:
            gate.release.set()
    assert attempt.landed is not None
    [answer] = answers
    assert answer.outcome == "finished"
    assert answer.record.state == "completed"
    assert format_cancel(answer).endswith("had already finished (completed): nothing changed.")
    record = await record_of(backend, result.run_id)
    assert (record.state, record.cancel_requested_at) == ("completed", None)
    assert await world.effects() == [f"held-{run.token}"]


# --- 4. A hung holder ----------------------------------------------------------------------------


async def test_j14_a_hung_holder_is_ended_by_the_server_and_the_run_retaken(
    world: World,
) -> None:
    """J14, J6, J5: the holder's transaction sits idle in its handler (waiting for an event that
    does not come in time) past its lease: the server's idle_in_transaction_session_timeout,
    which the fence set to the lease, ends the holder's session and the row lock goes with it;
    the run's lease has lapsed, another claim retakes it and completes it once. When the hung
    handler finally goes on, its attempt ends in an error (DatabaseUnavailableError: its
    connection is gone), none of its writes committed, and the K4 settle the runtime would send
    for that error answers stale and changes nothing.

    Real time: the server's timer is the real clock (HUNG_LEASE seconds). The test waits for it
    with a blocking ``SELECT ... FOR UPDATE`` of the run's row, which returns once the lock
    goes (no poll)."""
    backend = world.backend(SystemClock())
    hung = Gate()
    job = define_job(
        "j14.hung",
        hung.handler("hung"),
        payload=dict,
        transaction=world.uow,
        concurrency=Concurrency(lease=HUNG_LEASE),
    )
    result = await backend.enqueue(job, {})
    [first] = await backend.claim(claim_request(job, worker="A"))
    attempt = _attempt(backend, job, first)
    outcome: list[BaseException] = []

    async def holder() -> None:
        try:
            await attempt.run()
        except Exception as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(holder)
        try:
            with anyio.fail_after(LIMIT):
                await hung.entered.wait()
                await world.wait_lock_released(result.run_id)
            # Process B runs the same job with the frozen-clock tests' lease (its transaction
            # need not race the server's bound).
            retaker = Gate()
            retaker.release.set()
            job_b = _same_job(job, retaker.handler("retaken"), lease=LEASE)
            [retaken] = await backend.claim(claim_request(job_b, worker="B"))
            assert (retaken.token != first.token, retaken.attempt) == (True, 2)
            done = _attempt(backend, job_b, retaken)
            await done.run()
            assert done.landed is not None
        finally:
            # The hung handler goes on at last (its session is gone).
            hung.release.set()
    [error] = outcome
    assert isinstance(error, DatabaseUnavailableError)
    assert attempt.landed is None
    assert await backend.settle([failed(first, describe_failure(error), None)]) == ["stale"]
    assert await world.effects() == [f"retaken-{retaken.token}"]
    # The connection the server ended is never handed out again (every pooled one works).
    for _ in range(2 * world.engine.pool.size()):  # type: ignore[attr-defined]
        async with world.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt, record.history[-1]["kind"]) == (
        "completed",
        2,
        "lapsed",
    )


# --- 5. A heartbeat sent just before the fence ---------------------------------------------------


class _HeldLock:
    lost = False

    async def release(self) -> None:
        pass


class _SlowLocks:
    """A single-runner lock provider that grants each lock once ``grant`` is set: it keeps a
    run claimed and not yet fenced until its heartbeat falls due."""

    def __init__(self) -> None:
        self.grant = anyio.Event()

    async def acquire(self, _key: str, _lease: float) -> _HeldLock:
        await self.grant.wait()
        return _HeldLock()


async def test_j13_a_heartbeat_sent_before_the_fence_is_answered_before_it(world: World) -> None:
    """J13, J5, J14: a heartbeat call that includes a transactional run, sent before its fence
    (its start was held up past a heartbeat interval, here by its single-runner lock), is
    answered before the fence is taken. Reaching the server after the fence, that call would
    wait on the run's row lock until the handler's transaction ended, and with it the plain
    run heartbeated in the same call and the process's heartbeat loop (their leases lapsing
    meanwhile). Both runs answer alive, the plain one's lease is extended while the
    transactional handler holds its fence, and each run completes once."""
    clock = FrozenClock()
    backend = SpyBackend(world.backend(clock))
    gate = Gate()
    locks = _SlowLocks()
    plain_release = anyio.Event()
    plain_started = anyio.Event()

    async def plain(ctx: Any, payload: Any) -> None:
        plain_started.set()
        await plain_release.wait()

    job = define_job(
        "j13.beat",
        gate.handler("beat"),
        payload=dict,
        transaction=world.uow,
        concurrency=Concurrency(lease=LEASE, single_runner=True),
    )
    beside = define_job("j13.beside", plain, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    plain_run = await backend.enqueue(beside, {})
    beat_gate = backend.gate("heartbeat")
    async with await start_job_runtime(
        [job, beside], backend=backend, worker_id="w1", lock_provider=locks
    ):
        try:
            with anyio.fail_after(LIMIT):
                await plain_started.wait()
            # Both runs fall due together; their call is held in the spy, not yet sent.
            clock.advance(job.concurrency.heartbeat_interval)
            await backend.wait_started("heartbeat", 1, limit=LIMIT)
            locks.grant.set()
            await settle_loop()
            assert backend.started.get("fence", 0) == 0
            beat_gate.set()
            with anyio.fail_after(LIMIT):
                await gate.entered.wait()
            # Answered while the handler still holds its fence: the call never waited on it.
            await backend.wait_calls("heartbeat", 1, limit=LIMIT)
            [beat] = backend.calls["heartbeat"]
            assert {run.run_id for run in beat.args[0]} == {result.run_id, plain_run.run_id}
            assert list(beat.result) == [True, True]
            assert not await world.blocked_by(gate.pid)
            gate.release.set()
            await backend.wait_calls("settle_within", 1, limit=LIMIT)
            plain_release.set()
            await backend.wait_settled("complete", 1, limit=LIMIT)
        finally:
            beat_gate.set()
            locks.grant.set()
            gate.release.set()
            plain_release.set()
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert (await record_of(backend, plain_run.run_id)).state == "completed"
    assert await world.effects() == [f"beat-{gate.calls[0]}"]
    assert world.errors.errors == []


# --- 6. A workflow's completing transaction ------------------------------------------------------


async def test_j13_a_workflows_completing_transaction_is_not_heartbeated(world: World) -> None:
    """J13, D2, J5: a workflow whose ``ctx.transaction(..., completes_run=True)`` holds its
    run's fence for longer than three heartbeat intervals: the run is not heartbeated
    meanwhile (a heartbeat would wait on the fence's row lock, stalling the heartbeat loop and
    every run of its call, then find the run completed and report a lost lease); the plain run
    beside it is. The transaction commits the step, the effect and the completion once;
    nothing is reported."""
    clock = FrozenClock()
    backend = SpyBackend(world.backend(clock))
    gate = Gate()
    plain_release = anyio.Event()
    plain_started = anyio.Event()

    async def plain(ctx: Any, payload: Any) -> None:
        plain_started.set()
        await plain_release.wait()

    async def workflow(ctx: Any, payload: Any) -> None:
        async def finish(repositories: Repositories) -> int:
            await gate.handler("wf")(ctx, payload, repositories)
            return 1

        await ctx.transaction("finish", world.uow, finish, completes_run=True)

    job = define_job("j13.wf", workflow, payload=dict, concurrency=Concurrency(lease=LEASE))
    beside = define_job("j13.wf-beside", plain, payload=dict, concurrency=Concurrency(lease=LEASE))
    result = await backend.enqueue(job, {})
    plain_run = await backend.enqueue(beside, {})
    async with await start_job_runtime([job, beside], backend=backend, worker_id="w1"):
        try:
            with anyio.fail_after(LIMIT):
                await gate.entered.wait()
                await plain_started.wait()
            with anyio.fail_after(LIMIT):
                while len(backend.calls.get("heartbeat", ())) < 3:
                    clock.advance(1.0)
                    await settle_loop()
                    await backend.wait_idle(limit=LIMIT)
            beaten = [run.run_id for call in backend.calls["heartbeat"] for run in call.args[0]]
            assert result.run_id not in beaten
            assert beaten.count(plain_run.run_id) >= 3
            gate.release.set()
            await backend.wait_calls("settle_within", 1, limit=LIMIT)
            plain_release.set()
            await backend.wait_settled("complete", 1, limit=LIMIT)
        finally:
            gate.release.set()
            plain_release.set()
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 1)
    assert await world.effects() == [f"wf-{gate.calls[0]}"]
    assert world.errors.errors == []


class _CommitFails:
    """A unit of work whose transaction fails once its function returned, as one whose COMMIT
    failed looks to its caller: nothing of it commits, and the call raises."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def run(self, fn: Any) -> Any:
        async def then_fail(repositories: Any) -> Any:
            await fn(repositories)
            msg = "the COMMIT failed"
            raise RuntimeError(msg)

        return await self.inner.run(then_fail)


async def test_j13_a_completing_transaction_whose_commit_failed_is_not_taken_as_landed(
    world: World,
) -> None:
    """J13, D2, K4: a workflow's ``ctx.transaction(..., completes_run=True)`` sent the
    completion but its transaction did not commit (the call raised after it): the runtime
    reads the run's row (still running under its claim) rather than taking the completion as
    landed, so the attempt settles as K4 says (retrying, its error in the history) instead of
    the run being left running until its lease lapses; the next attempt commits once."""
    clock = FrozenClock()
    backend = SpyBackend(world.backend(clock))
    failing = _CommitFails(world.uow)

    async def workflow(ctx: Any, payload: Any) -> None:
        async def finish(repositories: Repositories) -> int:
            await repositories.add_effect(f"attempt-{ctx.attempt}")
            return 1

        uow = failing if ctx.attempt == 1 else world.uow
        await ctx.transaction("finish", uow, finish, completes_run=True)

    job = define_job(
        "j13.wf-commit",
        workflow,
        payload=dict,
        retry=RetryPolicy(attempts=3, base_delay=1.0, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend, worker_id="w1"):
        await backend.wait_settled("fail", 1, limit=LIMIT)
        clock.advance(1.0)  # past the retry's delay (1 s, no jitter)
        # The due retry is claimed at the runtime's next poll: a second of the clock after its
        # pass began, so at once whenever that pass was (J3).
        await backend.wait_calls("settle_within", 2, limit=LIMIT)
    record = await record_of(backend, result.run_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert "the COMMIT failed" in record.history[0]["error"]
    assert record.history[0]["kind"] == "failure"
    assert await world.effects() == ["attempt-2"]
    assert world.errors.errors == []


# --- 7. A fenced single-runner run keeps its lock -------------------------------------------------


class _RenewedLock:
    """A renewable single-runner lock that counts its extensions."""

    def __init__(self) -> None:
        self.extended = 0
        self.released = False

    @property
    def lost(self) -> bool:
        return False

    async def extend(self, _lease: float) -> bool:
        self.extended += 1
        return True

    async def release(self) -> None:
        self.released = True


class _OneLock:
    def __init__(self) -> None:
        self.lock = _RenewedLock()

    async def acquire(self, _key: str, _lease: float) -> _RenewedLock:
        return self.lock


async def test_j13_a_fenced_single_runner_run_keeps_its_lock_extended(world: World) -> None:
    """J4, J13, J5: a single-runner transactional handler fenced for longer than three
    heartbeat intervals is not heartbeated, yet its single-runner lock is extended on the
    heartbeat schedule all along (else the lock's lease would end mid-handler and another run
    of the same key could start beside it); it is released once the run completed."""
    clock = FrozenClock()
    backend = SpyBackend(world.backend(clock))
    gate = Gate()
    locks = _OneLock()
    job = define_job(
        "j13.locked",
        gate.handler("locked"),
        payload=dict,
        transaction=world.uow,
        concurrency=Concurrency(lease=LEASE, single_runner=True),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend, worker_id="w1", lock_provider=locks):
        try:
            with anyio.fail_after(LIMIT):
                await gate.entered.wait()
            for _ in range(int(LEASE) + 1):
                clock.advance(1.0)
                await settle_loop()
                await backend.wait_idle(limit=LIMIT)
            assert locks.lock.extended >= 3
            assert "heartbeat" not in backend.calls
            gate.release.set()
            await backend.wait_calls("settle_within", 1, limit=LIMIT)
        finally:
            gate.release.set()
    assert (await record_of(backend, result.run_id)).state == "completed"
    assert locks.lock.released
    assert world.errors.errors == []
