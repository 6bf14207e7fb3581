"""Transactional handlers (SPEC §8 J13, J14) step by step: the PostgreSQL backend against the
in-memory model, in lockstep.

Every run is of one transactional job whose handler writes an effect row and enqueues an outbox
message (O1) in its unit of work, and whose :class:`~ship_sqla.jobs.Inbox` key is the payload's
``key``, drawn from three keys so that duplicates are frequent (I1). Hypothesis drives both
backends with the same calls: enqueue a run with a key (now and then another payload under a
used key: an I2 mismatch), claim as worker A or B, run a holder's attempt (fence, inbox mark,
handler, completion, as :class:`~ship_sqla.kernel._runtime.fused.FusedAttempt` runs it), with a
current or a stale claim, to completion, to a handler that raises, to a COMMIT that fails
before it applies or applies and loses its answer, or after an operator's cancel of its run;
the holder survives (the executor's rule settles what the transaction left: K4, the claim state
read after a lost COMMIT) or crashes (nothing more); a claim by another worker while a holder's
transaction holds the fence (the handler paused after its writes, its lease lapsed or not); the
frozen clock moves past leases (J6).

After every step: the database equals the model (runs, effects, outbox messages, inbox marks);
each run has 0 or 1 effect, 1 exactly when it completed through its handler (not as a
duplicate); each inbox key has at most one effect; outbox messages equal effects; a key is
marked exactly when it has an effect; every stale holder's attempt changed nothing, and no
claim took a fenced run (J14).

The COMMIT faults: in memory ``InMemoryUnitOfWork.commit_fault``; on PostgreSQL
:class:`FaultyUnitOfWork` around the real unit of work: ``"before"`` raises as the last thing in
the transaction (after the completion's UPDATE, so PostgreSQL's own rollback undoes it all),
``"after"`` raises once ``uow.run`` committed (the answer of a COMMIT that applied, lost). Both
raise the same ``InMemoryCommitError`` (the in-memory unit of work's), so the K4 settlements (whose
history quotes the error) agree on both sides.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Coroutine, Iterator
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import anyio
import attrs
import pytest
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from job_helpers import claim_request
from machine_support import Claim, module_database, normalized, replay_machine, run_machine
from sqlalchemy import Column, MetaData, Table, Text, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import (
    JobContext,
    create_idempotency_store,
    create_job_backend,
    create_outbox,
    create_unit_of_work,
    define_job,
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
)
from ship_sqla._jobs._admin import run_record
from ship_sqla._jobs._sql import JobStatements
from ship_sqla._jobs._sql.admin import GET_RUN
from ship_sqla._sql import Template
from ship_sqla.errors import JobLeaseStaleError
from ship_sqla.jobs import Concurrency, Inbox, RetryPolicy, RunRecord
from ship_sqla.kernel import (
    InMemoryInbox,
    InMemoryJobBackend,
    InMemoryOutbox,
    InMemoryUnitOfWork,
)
from ship_sqla.kernel._memory.transactions import InMemoryCommitError
from ship_sqla.kernel._runtime.executor import raised_settlement
from ship_sqla.kernel._runtime.fused import FusedAttempt
from ship_sqla.kernel._runtime.state import InFlight
from ship_sqla.kernel._transactional import SettlesApart
from ship_sqla.testing import FrozenClock, ResolvedServer

T = TypeVar("T")

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SETTINGS = settings(
    max_examples=200 if LARGE else 20,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

JOB_ID = "sm.tx"
OUTBOX_ID = "sm"
LEASE = 10
KEYS = ("k1", "k2", "k3")
# The inbox remembers a key far longer than any example's clock moves (40 steps of <= 11 s).
INBOX_TTL = timedelta(days=1)
BEFORE = "the in-memory COMMIT failed before it applied"
AFTER = "the in-memory COMMIT applied, then its answer was lost"

metadata = MetaData()
runs_table = ship_job_runs_table(metadata)
state_table = ship_job_state_table(metadata)
idempotency_table = ship_idempotency_table(metadata)
outbox_table = ship_outbox_table(metadata)
# NO unique constraint: exactly once must come from the fence, the inbox and the completion
# committing together, never from the table refusing a second row.
effects_table = Table(
    "sm_effects",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("key", Text, nullable=False),
)
ALL_RUNS = JobStatements(runs="ship_job_runs", state="ship_job_state")[
    Template(GET_RUN.sql.replace("WHERE r.id = :id", "ORDER BY r.id"))
]

ENDINGS: Counter[tuple[Any, ...]] = Counter()
"""How the attempts ended, over the whole test (printed with ``pytest -s``)."""

Effect = tuple[str, str]
"""(run id, inbox key) of one effect row or outbox message."""


class BoomError(Exception):
    """What the handler raises when a rule asks it to (after its writes)."""


class FaultyUnitOfWork:
    """PostgreSQL's stand-in for ``InMemoryUnitOfWork.commit_fault`` around a real unit of work
    (see the module docstring); the fault applies to the next run only."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.commit_fault: str | None = None

    async def run(self, handler: Any, **options: Any) -> Any:
        fault, self.commit_fault = self.commit_fault, None

        async def body(repositories: Any) -> Any:
            result = await handler(repositories)
            if fault == "before":
                raise InMemoryCommitError(BEFORE)
            return result

        result = await self.inner.run(body, **options)
        if fault == "after":
            raise InMemoryCommitError(AFTER)
        return result


class MemoryWrites:
    """The in-memory repositories: an effect row (undone if the transaction rolls back) and an
    outbox message (InMemoryOutbox.enqueue undoes it itself: O1)."""

    def __init__(self, side: MemorySide, tx: Any) -> None:
        self._side = side
        self._tx = tx

    async def write(self, run_id: str, key: str) -> None:
        rows = self._side.rows
        rows.append((run_id, key))
        self._tx.on_rollback(lambda: rows.remove((run_id, key)))
        message = await self._side.outbox.enqueue(OUTBOX_ID, "effect", {"run": run_id, "key": key})
        self._side.messages.append(message)


class PostgresWrites:
    """The PostgreSQL repositories: an effect row through the scope's connection and an outbox
    message joining the ambient unit of work (O1)."""

    def __init__(self, outbox: Any, scope: Any) -> None:
        self._outbox = outbox
        self._scope = scope

    async def write(self, run_id: str, key: str) -> None:
        await self._scope.connection.execute(insert(effects_table), {"run_id": run_id, "key": key})
        await self._outbox.enqueue(OUTBOX_ID, "effect", {"run": run_id, "key": key})


class MemorySide:
    def __init__(self, clock: FrozenClock, handler: Any) -> None:
        self.backend = InMemoryJobBackend(clock=clock, live_only=False)
        self.outbox = InMemoryOutbox(clock=clock)
        self.inbox = InMemoryInbox(clock=clock)
        self.rows: list[Effect] = []
        self.messages: list[Any] = []
        self.uow = InMemoryUnitOfWork(lambda tx: MemoryWrites(self, tx))
        self.job = _job(handler, self.uow, self.inbox)

    async def effects(self) -> list[Effect]:
        return sorted(self.rows)

    async def outbox_messages(self) -> list[Effect]:
        found = [await self.outbox.get(message) for message in self.messages]
        return sorted((r.payload["run"], r.payload["key"]) for r in found if r is not None)

    async def marked(self) -> list[str]:
        prefix = f"job:{JOB_ID}"
        return [key for key in KEYS if self.inbox.marked(key, prefix=prefix)]


class PostgresSide:
    def __init__(self, engine: AsyncEngine, clock: FrozenClock, handler: Any) -> None:
        self.engine = engine
        self.backend = create_job_backend(
            database=engine, table=runs_table, state_table=state_table, clock=clock
        )
        outbox = create_outbox(database=engine, table=outbox_table, clock=clock)
        self.inbox = create_idempotency_store(database=engine, table=idempotency_table, clock=clock)
        self.uow = FaultyUnitOfWork(
            create_unit_of_work(engine, repositories=lambda scope: PostgresWrites(outbox, scope))
        )
        self.job = _job(handler, self.uow, self.inbox)

    async def _rows(self, statement: Any) -> list[Any]:
        async with self.engine.connect() as connection:
            return [tuple(row) for row in await connection.execute(statement)]

    async def effects(self) -> list[Effect]:
        return sorted(await self._rows(select(effects_table.c.run_id, effects_table.c.key)))

    async def outbox_messages(self) -> list[Effect]:
        payload = outbox_table.c.payload
        query = select(payload["run"].astext, payload["key"].astext).where(
            outbox_table.c.outbox_id == OUTBOX_ID
        )
        return sorted(await self._rows(query))

    async def marked(self) -> list[str]:
        query = (
            select(idempotency_table.c.key)
            .where(idempotency_table.c.prefix == f"job:{JOB_ID}")
            .where(idempotency_table.c.status == "completed")
            .order_by(idempotency_table.c.key)
        )
        return [key for (key,) in await self._rows(query)]

    async def records(self) -> dict[str, Any]:
        async with self.engine.connect() as connection:
            return {
                record.run_id: record
                for record in (run_record(row) for row in await connection.execute(ALL_RUNS))
            }


def comparable(record: RunRecord) -> RunRecord:
    """:func:`normalized`, the errors without their tracebacks (whose frames are each unit of
    work's own)."""
    record = normalized(record)
    history = tuple({**entry, "error": _first_part(entry["error"])} for entry in record.history)
    last_error = None if record.last_error is None else _first_part(record.last_error)
    return attrs.evolve(record, history=history, last_error=last_error)


def _first_part(error: str) -> str:
    return error.split("\n\nTraceback", 1)[0]


def _job(handler: Any, uow: Any, inbox: Any) -> Any:
    return define_job(
        JOB_ID,
        handler,
        payload=dict,
        transaction=uow,
        inbox=Inbox(inbox, key=lambda p: p["key"], ttl=INBOX_TTL),
        concurrency=Concurrency(max=3, lease=LEASE),
        # No jitter: the K4 retry time is computed once per side.
        retry=RetryPolicy(attempts=3, base_delay=2.0, jitter="none"),
    )


async def attempt(  # noqa: PLR0911 - one return per way an attempt ends
    side: Any, run: Any, clock: FrozenClock, *, fault: str | None, survives: bool
) -> tuple[Any, ...]:
    """One transactional attempt of ``run`` (what the executor does with a transactional job),
    then, when the holder ``survives``, the executor's rule for how it ended: a settlement
    apart (a cancel before the fence, a mismatched inbox key), nothing (stale: J14), the claim
    state read after a failed COMMIT (landed after all), else the K4 settlement of the error.
    A holder that does not survive died there: nothing more (its lease lapses, J6). Returns
    how it ended, comparable across backends."""
    job = side.job
    entry = InFlight(job, run, clock.monotonic())
    ctx: JobContext[Any] = JobContext(run, entry, worker_id="w")
    fused = FusedAttempt(entry, ctx, job.decode(run.payload), side.backend, clock)
    side.uow.commit_fault = fault if fault in ("before", "after") else None
    try:
        await fused.run()
    except SettlesApart as apart:
        if not survives:
            return ("crashed", "apart")
        return ("apart", *await side.backend.settle([apart.settlement]))
    except JobLeaseStaleError:
        assert fused.stale
        return ("stale",)
    except (BoomError, InMemoryCommitError) as error:
        if not survives:
            return ("crashed", type(error).__name__)
        if fused.landed is not None:
            state = await side.backend.claim_state(run)
            if state == fused.landed[0].state:
                return ("landed after all", fused.landed[1])
        settlement = raised_settlement(job, run, error, clock.now())
        return ("raised", *await side.backend.settle([settlement]))
    finally:
        side.uow.commit_fault = None
    assert fused.landed is not None
    return ("landed", fused.landed[1])


class TransactionalMachine(RuleBasedStateMachine):
    portal: ClassVar[BlockingPortal]
    engine: ClassVar[AsyncEngine]

    def __init__(self) -> None:
        super().__init__()
        self.run(self._truncate())
        self.clock = FrozenClock()
        self.handler_raises = False
        # (entered, release): the handler tells it made its writes, then waits for release.
        self.pause: tuple[asyncio.Event, asyncio.Event] | None = None

        async def handler(ctx: Any, payload: Any, repositories: Any) -> None:
            await repositories.write(ctx.run_id, payload["key"])
            if self.pause is not None:
                entered, release = self.pause
                entered.set()
                await release.wait()
            if self.handler_raises:
                raise BoomError("the handler failed after its writes")

        self.model = MemorySide(self.clock, handler)
        self.pg = PostgresSide(self.engine, self.clock, handler)
        self.claims: list[Claim] = []
        self.tokens: dict[str, int] = {}
        self.counter = 0
        self.seen: dict[str, str] = {}

    # --- plumbing ----------------------------------------------------------------------------

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        async def awaited() -> T:
            return await coroutine

        return self.portal.call(awaited)

    async def _truncate(self) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    "TRUNCATE ship_job_runs, ship_job_state, ship_idempotency, ship_outbox,"
                    " sm_effects"
                )
            )

    def model_records(self) -> dict[str, Any]:
        return {record.run_id: record for record in self.model.backend.runs()}

    def snapshot(self) -> tuple[Any, ...]:
        """Everything either side stores (to show a stale holder changed nothing)."""

        async def both() -> tuple[Any, ...]:
            pg = [await self.pg.effects(), await self.pg.outbox_messages(), await self.pg.marked()]
            model = [
                await self.model.effects(),
                await self.model.outbox_messages(),
                await self.model.marked(),
            ]
            return (await self.pg.records(), *pg, *model)

        return (*self.run(both()), self.model_records())

    def pick(self, index: int, stale: bool) -> tuple[Claim, bool]:
        """A recorded claim: one whose token is current (its run running), or with ``stale`` one
        that is not (its run retaken by a newer claim, or settled since); whether it is stale."""
        model = self.model_records()
        current = [
            claim
            for claim in self.claims
            if model[claim.pg.run_id].state == "running"
            and self.tokens[claim.pg.run_id] == claim.pg.token
        ]
        old = [claim for claim in self.claims if claim not in current]
        pool = (old or current) if stale else (current or old)
        claim = pool[index % len(pool)]
        return claim, claim not in current

    # --- rules -------------------------------------------------------------------------------

    @initialize(keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=5))
    def some_runs(self, keys: list[str]) -> None:
        for key in keys:
            self.enqueue(key, 0)

    @rule(key=st.sampled_from(KEYS), variant=st.sampled_from([0, 0, 0, 1]))
    def enqueue(self, key: str, variant: int) -> None:
        """A run of ``key``; ``variant`` 1 is another payload under the key (I2: a mismatch once
        the key is marked by a variant 0)."""
        self.counter += 1
        run_id = f"run-{self.counter:04d}"
        payload = {"key": key, "variant": variant}
        expected = self.run(self.model.backend.enqueue(self.model.job, payload, run_id=run_id))
        actual = self.run(self.pg.backend.enqueue(self.pg.job, payload, run_id=run_id))
        assert actual == expected

    @rule(worker=st.sampled_from(["A", "B"]), limit=st.integers(min_value=1, max_value=3))
    def claim(self, worker: str, limit: int) -> None:
        """J5, J6: both claim the same runs (a lapsed one retaken under a new token, one lapsed
        on its final attempt dead-lettered and answered as buried)."""
        expected = self.run(
            self.model.backend.claim(claim_request(self.model.job, worker=worker, limit=limit))
        )
        actual = self.run(
            self.pg.backend.claim(claim_request(self.pg.job, worker=worker, limit=limit))
        )
        self.claimed(expected, actual, worker)

    @precondition(lambda self: self.claims)
    @rule(
        pick=st.integers(min_value=0, max_value=1_000),
        worker=st.sampled_from(["A", "B"]),
        lapse=st.booleans(),
    )
    def claim_while_fenced(self, pick: int, worker: str, lapse: bool) -> None:
        """J14: while a current holder's transaction holds the fence (its writes made; with
        ``lapse`` its lease lapsed meanwhile), another claim skips the run: it is neither
        retaken nor, on its final attempt, dead-lettered; other runs are claimed alike on both
        sides. Released, the holder's transaction commits once (J13)."""
        claim, is_stale = self.pick(pick, stale=False)
        if is_stale:
            return
        if lapse:
            self.clock.advance(LEASE + 1)
        expected, expected_end = self.run(self.fenced_claim(self.model, claim.model, worker))
        actual, actual_end = self.run(self.fenced_claim(self.pg, claim.pg, worker))
        assert claim.pg.run_id not in [r.run_id for r in actual]
        assert claim.pg.run_id not in [r.run_id for r in actual.buried]
        self.claimed(expected, actual, worker)
        assert actual_end == expected_end
        ENDINGS["fenced", *actual_end] += 1

    async def fenced_claim(self, side: Any, run: Any, worker: str) -> tuple[Any, Any]:
        """A claim by ``worker`` while ``run``'s attempt waits in its handler (this task holds no
        unit of work: the claim runs on its own connection), then the attempt's end; the claim
        must not take ``run`` either way."""
        entered, release = asyncio.Event(), asyncio.Event()
        self.pause = (entered, release)
        holder = asyncio.create_task(attempt(side, run, self.clock, fault=None, survives=True))
        # An attempt that ends without calling the handler (a duplicate, a cancel before the
        # fence, a mismatch) ends its transaction first: the claim then comes after it.
        holder.add_done_callback(lambda _: entered.set())
        try:
            with anyio.fail_after(10):
                await entered.wait()
                claimed = await side.backend.claim(claim_request(side.job, worker=worker, limit=3))
        finally:
            self.pause = None
            release.set()
            with anyio.fail_after(10):
                ended = await holder
        return claimed, ended

    def claimed(self, expected: Any, actual: Any, worker: str) -> None:
        """Both claims took the same runs: record them (their tokens differ)."""
        assert [(r.run_id, r.attempt) for r in actual] == [(r.run_id, r.attempt) for r in expected]
        assert sorted(actual.buried, key=str) == sorted(expected.buried, key=str)
        for pg_run, model_run in zip(actual, expected, strict=True):
            assert pg_run.token > self.tokens.get(pg_run.run_id, 0)  # J5
            self.tokens[pg_run.run_id] = pg_run.token
            self.claims.append(Claim(pg_run, model_run, worker))

    @precondition(lambda self: self.claims)
    @rule(
        pick=st.integers(min_value=0, max_value=1_000),
        stale=st.sampled_from([False, False, True]),
        ending=st.sampled_from([None, None, None, "raise", "before", "after", "cancel"]),
        survives=st.sampled_from([True, True, False]),
    )
    def holder_attempt(self, pick: int, stale: bool, ending: str | None, survives: bool) -> None:
        """J13: a holder runs its attempt to completion, or to a raising handler, or to a COMMIT
        that fails before applying / applies and loses its answer, or after an operator's cancel
        of its run (K2: the fence finds it requested, the run ends cancelled), then survives or
        crashes; both sides end it alike. J14: a stale holder's attempt (its run retaken or
        settled) is refused at the fence and changes nothing."""
        claim, is_stale = self.pick(pick, stale)
        if ending == "cancel":
            self.cancel(claim.pg.run_id)
        before = self.snapshot() if is_stale else None
        self.handler_raises = ending == "raise"
        try:
            expected = self.run(
                attempt(self.model, claim.model, self.clock, fault=ending, survives=survives)
            )
            actual = self.run(
                attempt(self.pg, claim.pg, self.clock, fault=ending, survives=survives)
            )
        finally:
            self.handler_raises = False
        assert actual == expected, (claim, ending, survives)
        ENDINGS[("stale " if is_stale else "") + actual[0], *actual[1:]] += 1
        if is_stale:
            assert actual == ("stale",)
            assert self.snapshot() == before  # J14

    def cancel(self, run_id: str) -> None:
        """K2: an operator's cancel, answered alike by both (None: the run had ended)."""
        expected = self.run(self.model.backend.admin.cancel(run_id))
        actual = self.run(self.pg.backend.admin.cancel(run_id))
        assert (actual is None) == (expected is None)
        if actual is not None and expected is not None:
            assert comparable(actual) == comparable(expected)

    @rule(seconds=st.sampled_from([1, 4, LEASE + 1]))
    def advance(self, seconds: int) -> None:
        """J6: time moves (past a lease at LEASE + 1 s, or past a K4 retry's wait)."""
        self.clock.advance(seconds)

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def database_equals_model_and_exactly_once_holds(self) -> None:
        pg_records, pg_effects, pg_outbox, pg_marked, *model = self.snapshot()
        model_effects, model_outbox, model_marked, model_records = model
        assert sorted(pg_records) == sorted(model_records)
        for run_id, record in pg_records.items():
            assert comparable(record) == comparable(model_records[run_id]), run_id
        assert pg_effects == model_effects
        assert pg_outbox == model_outbox  # O1 on both
        assert pg_marked == model_marked  # I1 on both
        per_run = Counter(run_id for run_id, _ in pg_effects)
        per_key = Counter(key for _, key in pg_effects)
        for run_id, record in pg_records.items():
            handled = record.state == "completed" and (
                not record.history or record.history[-1]["kind"] != "duplicate"
            )
            # J13: one effect exactly when the run completed through its handler.
            assert per_run[run_id] == int(handled), (run_id, record.state, per_run[run_id])
            # A completed run never executes again; a terminal one stays so.
            previous = self.seen.get(run_id)
            if previous in ("completed", "dead", "cancelled"):
                assert record.state == previous, (run_id, previous, record.state)
        self.seen = {run_id: record.state for run_id, record in pg_records.items()}
        # I1: an inbox key's effect happens at most once, and the key is marked exactly then.
        assert all(count <= 1 for count in per_key.values()), per_key
        assert pg_marked == sorted(per_key)
        # O1: one outbox message per effect, committed with it.
        assert pg_outbox == pg_effects


@pytest.fixture(scope="module")
def tx_database(ship_server: ResolvedServer) -> Iterator[str]:
    """A database of this module's own (created and dropped synchronously)."""
    yield from module_database(ship_server, "txsm")


@pytest.mark.timeout(900 if LARGE else 300)
def test_transactional_handlers_match_the_model(tx_database: str) -> None:
    """J13, J14, J5, J6, I1, O1 in lockstep on PostgreSQL and the in-memory model, through
    enqueues of three inbox keys, claims as worker A or B, attempts that complete, raise, or
    fail their COMMIT before or after it applies, holders that survive or crash, stale holders,
    operator cancels and lapsing leases. After every step the database equals the model; each
    run has one effect exactly when it completed through its handler (J13), else none (a raised
    handler, a failed COMMIT or a crash rolled it all back; a duplicate completed without
    calling the handler); each inbox key has at most one effect and is marked exactly when it
    has one (I1); the outbox holds one message per effect (O1); a stale holder's attempt is
    refused and changes nothing on either side (J14, J5); a claim made while a holder's
    transaction holds the fence neither retakes nor dead-letters that run, lease lapsed or not
    (J14); lapsed leases are retaken or dead-lettered alike (J6); a terminal run stays
    terminal."""
    ENDINGS.clear()
    run_machine(TransactionalMachine, tx_database, metadata, SETTINGS)
    print(f"\ntransactional machine, attempts ended: {dict(ENDINGS)}")  # noqa: T201 - with -s


def test_a_fenced_run_on_its_final_attempt_is_not_dead_lettered(tx_database: str) -> None:
    """J14, J6: a run on its final attempt whose lease lapsed while its holder's transaction
    holds the fence is neither retaken nor dead-lettered by a claim (PostgreSQL's claim skips
    the locked row; the model skips the fenced run); the holder then commits it, once (J13)."""

    def steps(state: TransactionalMachine) -> None:
        state.some_runs(keys=["k1"])
        for _ in range(2):
            state.claim(worker="A", limit=1)
            state.holder_attempt(pick=0, stale=False, ending="raise", survives=True)
            state.advance(seconds=LEASE + 1)
        state.claim(worker="A", limit=1)
        state.database_equals_model_and_exactly_once_holds()
        [running] = [r for r in state.model_records().values() if r.state == "running"]
        assert running.attempt == running.max_attempts
        state.claim_while_fenced(pick=0, worker="B", lapse=True)
        state.database_equals_model_and_exactly_once_holds()
        [record] = state.model_records().values()
        assert record.state == "completed"
        assert state.run(state.pg.effects()) == [(record.run_id, "k1")]

    replay_machine(TransactionalMachine, tx_database, metadata, steps)
