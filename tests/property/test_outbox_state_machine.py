"""The PostgreSQL outbox against an in-Python model (Hypothesis RuleBasedStateMachine).

Rules: enqueue; claim as relay A or B; complete (one or a batch), fail or release with the
current or a stale token; advance the frozen clock past leases and backoffs; retry dead rows.
After every step: the database equals the model; no row has two live holders; nothing
completed comes back; attempts never exceed the bound. Every settle with a stale token is
checked to have changed nothing; completing again with the claim that delivered a row answers
"delivered" and changes nothing (a retried completion is idempotent).

Hypothesis has no async rules, so the sync rules drive the async outbox through one event loop
kept for the whole test (``anyio.from_thread.start_blocking_portal``), on one engine bound to a
database this module creates; the table is truncated between examples.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import asyncpg
import attrs
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import MetaData, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._outbox import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    Backoff,
    Outbox,
    OutboxDeadLetteredError,
    OutboxIntent,
    OutboxMessage,
    create_outbox,
    create_outbox_operations,
    ship_outbox_table,
)

# Private on purpose: asyncpg_dsn turns the plugin's server URL into asyncpg's connect()
# arguments, as the plugin's own database factory does; no public name (test infrastructure).
from ship_sqla._server import asyncpg_dsn
from ship_sqla.testing import FrozenClock, ResolvedServer

metadata = MetaData()
table = ship_outbox_table(metadata)

MAX_ATTEMPTS = 2  # small, so examples of ~30 steps reach the dead-letter paths
OUTBOX = "main"
BACKOFF = Backoff(base=5.0, factor=2.0, max_delay=60.0, jitter="none")

LARGE = os.environ.get("SHIP_SQLA_HYPOTHESIS_PROFILE") == "large"
SETTINGS = settings(
    max_examples=300 if LARGE else 25,
    derandomize=not LARGE,
    stateful_step_count=50 if LARGE else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


COVERAGE: Counter[str] = Counter()
"""Paths the examples went through; the test fails if a key path was never exercised."""


def seen(label: str) -> None:
    event(label)
    COVERAGE[label] += 1


@attrs.define
class ModelRow:
    seq: int
    state: str
    attempts: int
    available_at: datetime
    created_at: datetime
    lease_expires_at: datetime | None = None
    token: uuid.UUID | None = None
    holder: str | None = None


@pytest.fixture
def outbox_database(ship_server: ResolvedServer) -> Iterator[URL]:
    """A database of this test's own, created and dropped outside the test's event loop."""
    name = f"ship_sqla_test_outbox_sm_{secrets.token_hex(5)}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(**asyncpg_dsn(ship_server.url), timeout=30)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield ship_server.database_url(name)
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class OutboxMachine(RuleBasedStateMachine):
    portal: BlockingPortal
    engine: AsyncEngine

    def __init__(self) -> None:
        super().__init__()
        self.call(self._truncate)
        self.clock = FrozenClock()
        self.errors: list[BaseException] = []
        self.outbox: Outbox = create_outbox(
            database=self.engine,
            table=table,
            clock=self.clock,
            max_attempts=MAX_ATTEMPTS,
            backoff=BACKOFF,
            on_error=self.errors.append,
        )
        self.ops = create_outbox_operations(
            self.outbox, authorizer=lambda _permission, _operation: True
        )
        self.model: dict[uuid.UUID, ModelRow] = {}
        self.claims: list[OutboxMessage] = []  # every claim ever handed out, current or stale
        self.tokens: set[uuid.UUID] = set()
        self.completed: set[uuid.UUID] = set()

    # -- plumbing ------------------------------------------------------------------------------

    def call(self, fn: Any, *args: Any) -> Any:
        return self.portal.call(fn, *args)

    async def _truncate(self) -> None:
        async with self.engine.begin() as c:
            await c.execute(text(f"TRUNCATE {table.name}"))

    async def _rows(self) -> dict[uuid.UUID, dict[str, Any]]:
        async with self.engine.connect() as c:
            result = await c.execute(select(table))
            return {r.id: dict(r._mapping) for r in result}

    def rows(self) -> dict[uuid.UUID, dict[str, Any]]:
        result: dict[uuid.UUID, dict[str, Any]] = self.call(self._rows)
        return result

    def is_current(self, message: OutboxMessage) -> bool:
        row = self.model[message.id]
        return row.state == "claimed" and row.token == message.token

    def delivered_by(self, message: OutboxMessage) -> bool:
        """This claim already completed its row: completing again answers "delivered"."""
        row = self.model[message.id]
        return row.state == "delivered" and row.token == message.token

    def settle_stale(self, message: OutboxMessage, outcome: str) -> None:
        seen("stale settle")
        assert outcome == "stale", (outcome, message)

    # -- rules ---------------------------------------------------------------------------------

    @rule(delay=st.sampled_from([0, 0, 0, 7]), count=st.integers(1, 3))
    def enqueue(self, delay: int, count: int) -> None:
        now = self.clock.now()
        available_at = now + timedelta(seconds=delay) if delay else None

        async def go() -> list[uuid.UUID]:
            if count == 1:
                return [await self.outbox.enqueue(OUTBOX, "t", {}, available_at=available_at)]
            intents = [OutboxIntent("t", {"i": i}, available_at=available_at) for i in range(count)]
            return await self.outbox.enqueue_many(OUTBOX, intents)

        for message_id in self.call(go):
            self.model[message_id] = ModelRow(
                seq=len(self.model),
                state="pending",
                attempts=0,
                available_at=available_at or now,
                created_at=now,
            )

    @rule(
        relay=st.sampled_from(["A", "B"]), batch=st.integers(1, 3), lease=st.sampled_from([10, 30])
    )
    def claim(self, relay: str, batch: int, lease: int) -> None:
        now = self.clock.now()
        lapsed = sorted(
            (r.lease_expires_at, i)
            for i, r in self.model.items()
            if r.state == "claimed" and r.lease_expires_at is not None and r.lease_expires_at <= now
        )
        due = sorted(
            (r.available_at, r.created_at, r.seq, i)
            for i, r in self.model.items()
            if r.state == "pending" and r.available_at <= now
        )
        errors_before = len(self.errors)
        got: list[OutboxMessage] = self.call(
            partial(self.outbox.claim, OUTBOX, batch, lease, worker=relay)
        )
        dead = [
            e.record.id
            for e in self.errors[errors_before:]
            if isinstance(e, OutboxDeadLetteredError)
        ]
        taken = {m.id for m in got} | set(dead)
        # O2: lapsed leases first (earliest lease first), then due rows; the batch is filled.
        n_lapsed = min(batch, len(lapsed))
        n_due = min(batch - n_lapsed, len(due))
        assert len(taken) == n_lapsed + n_due
        taken_lapsed = {i for _, i in lapsed} & taken
        if taken_lapsed:
            seen("lapsed lease retaken")
        assert len(taken_lapsed) == n_lapsed
        if lapsed and n_lapsed < len(lapsed):
            cutoff = max(self.model[i].lease_expires_at for i in taken_lapsed)  # type: ignore[type-var]
            assert all(t >= cutoff for t, i in lapsed if i not in taken)
        taken_due = taken - taken_lapsed
        assert taken_due <= {i for *_, i in due}
        if taken_due and n_due < len(due):
            cutoff_due = max(self.model[i].available_at for i in taken_due)
            assert all(a >= cutoff_due for a, _, _, i in due if i not in taken)
        assert not taken & self.completed  # nothing completed comes back
        for message_id in dead:
            seen("dead-lettered by a lapsed final lease")
            row = self.model[message_id]
            assert row.attempts >= MAX_ATTEMPTS
            row.state, row.token, row.lease_expires_at = "dead", None, None
        for m in got:
            row = self.model[m.id]
            assert m.attempt == row.attempts + 1 <= MAX_ATTEMPTS
            assert m.token not in self.tokens  # a new token per claim
            assert m.lease_expires_at == now + timedelta(seconds=lease)
            self.tokens.add(m.token)
            row.state, row.attempts, row.token = "claimed", m.attempt, m.token
            row.lease_expires_at, row.holder = m.lease_expires_at, relay
            self.claims.append(m)

    def _pick(self, data: st.DataObject) -> OutboxMessage:
        """A claim to settle: a current one half of the time (when there is one), else any
        claim ever handed out, which is mostly stale by now."""
        current = [m for m in self.claims if self.is_current(m)]
        if current and data.draw(st.booleans(), label="current"):
            return data.draw(st.sampled_from(current))
        return data.draw(st.sampled_from(self.claims))

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        message = self._pick(data)
        before = self.rows()[message.id]
        current = self.is_current(message)
        again = self.delivered_by(message)
        outcome = self.call(self.outbox.complete, message)
        if again:
            seen("complete retried after it landed")
            assert outcome == "delivered"
            assert self.rows()[message.id] == before  # idempotent: nothing changes
            return
        if not current:
            self.settle_stale(message, outcome)
            assert self.rows()[message.id] == before  # a stale token never changes a row
            return
        assert outcome == "delivered"
        row = self.model[message.id]
        row.state, row.lease_expires_at = "delivered", None  # the row keeps its token
        self.completed.add(message.id)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def complete_batch(self, data: st.DataObject) -> None:
        batch = data.draw(st.lists(st.sampled_from(self.claims), min_size=1, max_size=4))
        unique = list({m.token: m for m in batch}.values())
        current_ids: set[uuid.UUID] = set()
        expected = []
        for m in unique:
            ok = self.is_current(m) and m.id not in current_ids
            if ok:
                current_ids.add(m.id)
            expected.append("delivered" if ok or self.delivered_by(m) else "stale")
        outcomes = self.call(self.outbox.complete_many, unique)
        assert outcomes == expected
        for m in unique:
            if m.id in current_ids:
                row = self.model[m.id]
                row.state, row.lease_expires_at = "delivered", None  # the row keeps its token
                self.completed.add(m.id)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        message = self._pick(data)
        before = self.rows()[message.id]
        current = self.is_current(message)
        outcome = self.call(self.outbox.fail, message, "boom")
        if not current:
            self.settle_stale(message, outcome)
            assert self.rows()[message.id] == before
            return
        row = self.model[message.id]
        row.token, row.lease_expires_at = None, None
        if row.attempts >= MAX_ATTEMPTS:
            seen("dead after the last failure")
            assert outcome == "dead"
            row.state = "dead"
        else:
            assert outcome == "retrying"
            row.state = "pending"
            row.available_at = self.clock.now() + timedelta(seconds=BACKOFF.delay(row.attempts))

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        message = self._pick(data)
        before = self.rows()[message.id]
        current = self.is_current(message)
        outcome = self.call(self.outbox.release, message)
        if not current:
            self.settle_stale(message, outcome)
            assert self.rows()[message.id] == before
            return
        assert outcome == "released"
        row = self.model[message.id]
        row.state, row.token, row.lease_expires_at = "pending", None, None
        row.attempts -= 1
        row.available_at = self.clock.now()

    @rule(seconds=st.sampled_from([1, 6, 11, 31, 61]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: any(r.state == "claimed" for r in self.model.values()))
    @rule(relay=st.sampled_from(["A", "B"]))
    def let_every_lease_lapse_then_claim(self, relay: str) -> None:
        """The relay holding the claims died: time passes every lease and another claims."""
        self.clock.advance(31)
        self.claim(relay=relay, batch=3, lease=10)

    @precondition(lambda self: any(r.state == "dead" for r in self.model.values()))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        dead = sorted(i for i, r in self.model.items() if r.state == "dead")
        chosen = data.draw(st.lists(st.sampled_from(dead), min_size=1, max_size=3, unique=True))
        seen("retry")
        moved = self.call(self.ops.retry, chosen)
        assert moved == chosen
        for message_id in chosen:
            row = self.model[message_id]
            row.state, row.attempts, row.available_at = "pending", 0, self.clock.now()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_equals_model(self) -> None:
        rows = self.rows()
        assert set(rows) == set(self.model)
        for message_id, row in self.model.items():
            db = rows[message_id]
            actual = (db["state"], db["attempts"], db["lease_token"], db["lease_expires_at"])
            expected = (row.state, row.attempts, row.token, row.lease_expires_at)
            assert actual == expected, (message_id, actual, expected)
            if row.state == "pending":
                assert db["available_at"] == row.available_at
            if row.state == "dead" and db["last_error"] is not None:
                assert db["last_error"] in {"boom", LEASE_LAPSED_FINAL_ATTEMPT}

    @invariant()
    def no_row_has_two_live_holders(self) -> None:
        live: dict[uuid.UUID, int] = {}
        for m in self.claims:
            if self.is_current(m):
                live[m.id] = live.get(m.id, 0) + 1
        assert all(n == 1 for n in live.values()), live

    @invariant()
    def completed_stays_delivered_and_attempts_bounded(self) -> None:
        for message_id in self.completed:
            assert self.model[message_id].state == "delivered"
        assert all(0 <= r.attempts <= MAX_ATTEMPTS for r in self.model.values())


def test_outbox_matches_its_model(outbox_database: URL) -> None:
    """O2, O3, O4 against a model: lapsed leases are retaken first, a stale token never changes a
    row, a repeated completion by the delivering claim is idempotent, no row has two live
    holders, nothing completed comes back, attempts stay within
    max_attempts, failures retry with backoff and end dead, and the database equals the model
    after every step."""
    with start_blocking_portal(backend="asyncio") as portal:

        async def setup() -> AsyncEngine:
            engine = create_async_engine(outbox_database, pool_size=2)
            async with engine.begin() as c:
                await c.run_sync(metadata.create_all)
            return engine

        engine = portal.call(setup)
        try:
            machine = type(
                "BoundOutboxMachine", (OutboxMachine,), {"portal": portal, "engine": engine}
            )
            COVERAGE.clear()
            run_state_machine_as_test(machine, settings=SETTINGS)
        finally:
            portal.call(engine.dispose)
    exercised = {
        "stale settle",
        "lapsed lease retaken",
        "dead-lettered by a lapsed final lease",
        "dead after the last failure",
        "retry",
    }
    missing = exercised - set(COVERAGE)
    assert not missing, (
        f"the examples never exercised {sorted(missing)} ({dict(COVERAGE)}): bias the rules"
        " towards those paths or raise stateful_step_count / max_examples"
    )
