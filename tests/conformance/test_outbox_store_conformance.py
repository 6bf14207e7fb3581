"""The outbox store port (``OutboxStore``, kernel/_outbox.py) on every outbox: the in-memory
reference outbox and the PostgreSQL one answer the same claims, heartbeats and batch settles
(SPEC §4: O2, O3, O4).

Each test gets ``outbox_store_factory`` (conftest: ``[memory]`` and ``[postgres]``) and a frozen
clock; a message is put in with the outbox's own ``enqueue`` and read back with ``get``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ship_sqla.errors import OutboxDeadLetteredError
from ship_sqla.kernel import (
    OutboxStore,
    message_delivered,
    message_failed,
    message_released,
)
from ship_sqla.kernel._plans.backoff import Backoff
from ship_sqla.testing import FrozenClock

BACKOFF = Backoff(kind="fixed", base=5.0, jitter="none")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def errors() -> list[BaseException]:
    return []


@pytest.fixture
def store(outbox_store_factory: Any, clock: FrozenClock, errors: list[BaseException]) -> Any:
    return outbox_store_factory(clock, max_attempts=2, backoff=BACKOFF, on_error=errors.append)


async def test_the_outbox_is_an_outbox_store(store: Any) -> None:
    """O2, O3: both outboxes implement the port the relay calls."""
    assert isinstance(store, OutboxStore)
    assert store.backoff == BACKOFF


async def test_claim_takes_due_messages_in_enqueue_order(store: Any, clock: FrozenClock) -> None:
    """O2: a claim hands out due pending messages by (created_at, id), each under a new token and
    its first attempt, at most ``batch_size``; a message due later is not taken."""
    first = await store.enqueue("main", "t", {"n": 1})
    second = await store.enqueue("main", "t", {"n": 2})
    await store.enqueue("main", "t", {"n": 3}, available_at=clock.now() + timedelta(seconds=60))
    await store.enqueue("other", "t", {"n": 4})
    claimed = await store.claim("main", 10, 30.0, worker="A")
    assert [m.id for m in claimed] == [first, second]
    assert [m.payload for m in claimed] == [{"n": 1}, {"n": 2}]
    assert {m.attempt for m in claimed} == {1}
    assert len({m.token for m in claimed}) == 2
    assert {m.claimed_by for m in claimed} == {"A"}
    assert {m.lease_expires_at for m in claimed} == {clock.now() + timedelta(seconds=30)}
    assert await store.claim("main", 10, 30.0) == []
    record = await store.get(first)
    assert record.state == "claimed"
    assert record.attempts == 1


async def test_claim_retakes_lapsed_leases_first(store: Any, clock: FrozenClock) -> None:
    """O2, O3: once a lease lapsed the next claim retakes the message before due pending ones,
    under a new token and its next attempt; the old holder's heartbeat and settles are stale and
    change nothing."""
    lapsing = await store.enqueue("main", "t", {})
    (old,) = await store.claim("main", 1, 10.0, worker="A")
    clock.advance(11)
    waiting = await store.enqueue("main", "t", {})
    (new,) = await store.claim("main", 1, 10.0, worker="B")
    assert new.id == lapsing
    assert new.token != old.token
    assert new.attempt == 2
    before = await store.get(lapsing)
    assert await store.heartbeat([old], 60.0) == [False]
    assert await store.settle(
        [
            message_delivered(old),
            message_failed(old, "boom", BACKOFF),
            message_released(old),
        ]
    ) == ["stale", "stale", "stale"]
    assert await store.get(lapsing) == before
    (rest,) = await store.claim("main", 5, 10.0)
    assert rest.id == waiting


async def test_a_lapsed_final_attempt_is_dead_not_handed_out(
    store: Any, clock: FrozenClock, errors: list[BaseException]
) -> None:
    """O4: a message whose lease lapsed on its final attempt is dead-lettered by the next claim,
    reported to ``on_error``, and never handed out again."""
    message_id = await store.enqueue("main", "t", {})
    await store.claim("main", 1, 10.0)
    clock.advance(11)
    await store.claim("main", 1, 10.0)  # attempt 2 of 2
    clock.advance(11)
    assert await store.claim("main", 1, 10.0) == []
    record = await store.get(message_id)
    assert record.state == "dead"
    assert record.last_error == "SHIP_SQLA_OUTBOX_LEASE_LAPSED_FINAL_ATTEMPT"
    (error,) = errors
    assert isinstance(error, OutboxDeadLetteredError)
    assert error.record.id == message_id


async def test_heartbeat_keeps_the_lease(store: Any, clock: FrozenClock) -> None:
    """O3: a heartbeat moves each held lease to now + lease, so the message is not retaken when
    its first lease would have lapsed."""
    await store.enqueue("main", "t", {})
    (held,) = await store.claim("main", 1, 10.0)
    clock.advance(8)
    assert await store.heartbeat([held], 10.0) == [True]
    clock.advance(8)
    assert await store.claim("main", 1, 10.0) == []
    record = await store.get(held.id)
    assert record.lease_expires_at == clock.now() + timedelta(seconds=2)


async def test_one_settle_applies_every_outcome(store: Any, clock: FrozenClock) -> None:
    """O3, O4: one batch settle takes delivered, retrying, dead and released settlements and a
    stale one, answers each in order, and leaves each row as the kernel's record said: delivered
    at now; pending again after the backoff with the error; dead with the error; released due
    now with its attempt given back."""
    ids = [await store.enqueue("main", "t", {"n": n}) for n in range(4)]
    ok, retried, killed, handed_back = await store.claim("main", 4, 30.0)
    retaken = await store.enqueue("main", "t", {})
    (old,) = await store.claim("main", 1, 1.0)
    clock.advance(2)
    (current,) = await store.claim("main", 1, 30.0)
    assert current.id == old.id == retaken
    outcomes = await store.settle(
        [
            message_delivered(ok),
            message_failed(retried, "flaky", BACKOFF),
            message_failed(killed, ValueError("bad"), BACKOFF, permanent=True),
            message_released(handed_back),
            message_delivered(old),
        ]
    )
    assert outcomes == ["delivered", "retrying", "dead", "released", "stale"]
    now = clock.now()
    delivered, retrying, dead, released = [await store.get(i) for i in ids]
    assert (delivered.state, delivered.delivered_at) == ("delivered", now)
    assert (retrying.state, retrying.available_at, retrying.last_error) == (
        "pending",
        now + timedelta(seconds=5),
        "flaky",
    )
    assert retrying.attempts == 1
    assert (dead.state, dead.last_error) == ("dead", "ValueError: bad")
    assert (released.state, released.available_at, released.attempts) == ("pending", now, 0)
    assert released.last_error is None
    assert (await store.get(retaken)).state == "claimed"


async def test_retry_or_dead_is_the_kernels_rule(store: Any) -> None:
    """O4: a failure on the message's last attempt is dead whatever the backoff says (the
    kernel's ``attempts_spent``, the runs' rule); before it, pending again."""
    message_id = await store.enqueue("main", "t", {})
    (first,) = await store.claim("main", 1, 30.0)
    failed_first = message_failed(first, "boom", BACKOFF, retry_in=0)
    assert failed_first.settled_as == "retrying"
    assert await store.settle([failed_first]) == ["retrying"]
    (second,) = await store.claim("main", 1, 30.0)
    assert second.attempt == 2
    failed_second = message_failed(second, "boom again", BACKOFF, retry_in=0)
    assert failed_second.settled_as == "dead"
    assert await store.settle([failed_second]) == ["dead"]
    record = await store.get(message_id)
    assert (record.state, record.attempts, record.last_error) == ("dead", 2, "boom again")


async def test_a_repeated_completion_answers_delivered(store: Any) -> None:
    """O3: completing again with the claim that delivered answers "delivered" and changes
    nothing (a retry after a lost reply); any other settle of a delivered message is stale."""
    message_id = await store.enqueue("main", "t", {})
    (message,) = await store.claim("main", 1, 30.0)
    assert await store.settle([message_delivered(message)]) == ["delivered"]
    before = await store.get(message_id)
    assert await store.settle(
        [
            message_delivered(message),
            message_failed(message, "late", BACKOFF),
            message_released(message),
        ]
    ) == ["delivered", "stale", "stale"]
    assert await store.get(message_id) == before


async def test_a_release_may_name_a_later_time(store: Any, clock: FrozenClock) -> None:
    """O3: a release at a later time makes the message due then, not before."""
    await store.enqueue("main", "t", {})
    (message,) = await store.claim("main", 1, 30.0)
    later = clock.now() + timedelta(seconds=20)
    assert await store.settle([message_released(message, later)]) == ["released"]
    assert await store.claim("main", 1, 30.0) == []
    clock.advance(20)
    (again,) = await store.claim("main", 1, 30.0)
    assert again.attempt == 1


async def test_an_ordered_claim_holds_back_later_messages_of_a_key(store: Any) -> None:
    """O2 (ordered): a message is handed out only when no earlier message of its ordering key is
    pending or claimed; keyless messages are not held back; a dead message stops blocking."""
    a1 = await store.enqueue("main", "t", {}, ordering_key="a")
    a2 = await store.enqueue("main", "t", {}, ordering_key="a")
    b1 = await store.enqueue("main", "t", {}, ordering_key="b")
    loose = await store.enqueue("main", "t", {})
    claimed = await store.claim("main", 10, 30.0, ordered=True)
    assert [m.id for m in claimed] == [a1, b1, loose]
    assert await store.claim("main", 10, 30.0, ordered=True) == []
    first = claimed[0]
    assert await store.settle([message_failed(first, "poison", BACKOFF, permanent=True)]) == [
        "dead"
    ]
    (next_of_a,) = await store.claim("main", 10, 30.0, ordered=True)
    assert next_of_a.id == a2
