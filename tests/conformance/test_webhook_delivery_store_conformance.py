"""The outbound webhooks' store port (SPEC §16) on both stores: the in-memory model and
PostgreSQL. Time is a FrozenClock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import MetaData

from ship_sqla.kernel import DeliveryAttempt, InMemoryWebhookDeliveryStore, WebhookDeliveryRecord
from ship_sqla.testing import FrozenClock
from ship_sqla.webhooks import (
    create_webhook_delivery_store,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 - a test secret


@pytest.fixture
async def postgres_store_factory(ship_engine: Any) -> Any:
    metadata = MetaData()
    endpoints = ship_webhook_endpoints_table(metadata)
    deliveries = ship_webhook_deliveries_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return lambda clock: create_webhook_delivery_store(
        database=ship_engine, endpoints_table=endpoints, deliveries_table=deliveries, clock=clock
    )


@pytest.fixture(params=["memory", "postgres"])
def make_store(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return InMemoryWebhookDeliveryStore
    return request.getfixturevalue("postgres_store_factory")


def _delivery(clock: FrozenClock, delivery_id: str, endpoint_id: str) -> WebhookDeliveryRecord:
    now = clock.now()
    return WebhookDeliveryRecord(
        id=delivery_id,
        endpoint_id=endpoint_id,
        topic="order.paid",
        payload={"order": 1, "note": "é"},
        tenant=None,
        state="pending",
        attempts=(),
        created_at=now,
        updated_at=now,
    )


async def test_endpoints_subscribe_by_topic_and_tenant(make_store: Any) -> None:
    """W1: a topic's deliveries go to the enabled endpoints of the tenant subscribed to it
    (or to ``*``); a disabled one is skipped."""
    clock = FrozenClock()
    store = make_store(clock)
    await store.add_endpoint(
        endpoint_id="a", url="https://a.test/h", topics=["order.paid"], secret=SECRET, tenant=None
    )
    await store.add_endpoint(
        endpoint_id="b", url="https://b.test/h", topics=["*"], secret=SECRET, tenant=None
    )
    await store.add_endpoint(
        endpoint_id="c", url="https://c.test/h", topics=["order.paid"], secret=SECRET, tenant="t1"
    )
    await store.add_endpoint(
        endpoint_id="d", url="https://d.test/h", topics=["user.new"], secret=SECRET, tenant=None
    )
    found = await store.subscribed_endpoints("order.paid", tenant=None)
    assert [e.id for e in found] == ["a", "b"]
    assert [e.id for e in await store.subscribed_endpoints("order.paid", tenant="t1")] == ["c"]
    await store.set_endpoint_state("a", "disabled", reason="operator")
    assert [e.id for e in await store.subscribed_endpoints("order.paid", tenant=None)] == ["b"]
    endpoint = await store.get_endpoint("a")
    assert (endpoint.state, endpoint.disabled_reason) == ("disabled", "operator")
    assert [e.id for e in await store.list_endpoints(limit=10)] == ["a", "b", "c", "d"]
    assert SECRET not in repr(endpoint)


async def test_rotation_keeps_both_secrets_until_the_old_expires(make_store: Any) -> None:
    """W2: after a rotation both secrets are in force until the old one expires."""
    clock = FrozenClock()
    store = make_store(clock)
    await store.add_endpoint(
        endpoint_id="a", url="https://a.test/h", topics=["*"], secret=SECRET, tenant=None
    )
    new = "whsec_" + "A" * 32
    rotated = await store.rotate_secret(
        "a", secret=new, old_expires_at=clock.now() + timedelta(hours=1)
    )
    assert rotated.active_secrets(clock.now()) == [SECRET, new]
    clock.advance(timedelta(hours=2))
    endpoint = await store.get_endpoint("a")
    assert endpoint.active_secrets(clock.now()) == [new]
    assert await store.rotate_secret("nope", secret=new, old_expires_at=clock.now()) is None


async def test_attempts_are_recorded_in_order_and_the_streak_disables(make_store: Any) -> None:
    """W3: each attempt is appended with its status, duration, excerpt and error; W4: failed
    deliveries extend the streak and disable the endpoint at N, a delivered one resets it;
    paused deliveries resume when asked."""
    clock = FrozenClock()
    store = make_store(clock)
    await store.add_endpoint(
        endpoint_id="a", url="https://a.test/h", topics=["*"], secret=SECRET, tenant=None
    )
    await store.insert_deliveries([_delivery(clock, "msg_1", "a"), _delivery(clock, "msg_2", "a")])
    first = DeliveryAttempt(clock.now(), 503, 0.25, body="busy", error=None)
    second = DeliveryAttempt(clock.now(), None, 1.5, body=None, error="ConnectError: refused")
    await store.record_attempt("msg_1", first, state="pending")
    recorded = await store.record_attempt("msg_1", second, state="failed")
    assert recorded.attempts == (first, second)
    assert recorded.state == "failed"
    assert recorded.payload == {"order": 1, "note": "é"}
    assert (await store.get_delivery("msg_1")).attempts == (first, second)

    assert (
        await store.record_outcome("a", delivered=False, disable_after=3)
    ).consecutive_failures == 1
    assert (
        await store.record_outcome("a", delivered=True, disable_after=3)
    ).consecutive_failures == 0
    for _ in range(2):
        await store.record_outcome("a", delivered=False, disable_after=3)
    endpoint = await store.record_outcome("a", delivered=False, disable_after=3)
    assert (endpoint.state, endpoint.consecutive_failures) == ("disabled", 3)
    assert endpoint.disabled_reason == "3 consecutive failed deliveries"

    await store.set_delivery_state("msg_2", "paused")
    assert [
        d.id for d in await store.list_deliveries(endpoint_id="a", state="paused", limit=5)
    ] == ["msg_2"]
    enabled = await store.set_endpoint_state("a", "enabled", reason=None)
    assert (enabled.state, enabled.consecutive_failures, enabled.disabled_reason) == (
        "enabled",
        0,
        None,
    )
    assert await store.resume_paused("a") == ["msg_2"]
    assert (await store.get_delivery("msg_2")).state == "pending"
    assert [d.id for d in await store.list_deliveries(limit=5)] == ["msg_2", "msg_1"]
    assert await store.get_delivery("nope") is None


async def test_an_attempt_reads_once_and_writes_once(make_store: Any) -> None:
    """W3, W4: ``get_for_send`` reads a delivery with its endpoint (None when gone);
    ``end_attempt`` appends the attempt and, when it ends the delivery, moves the endpoint's
    streak (disabling it at N) as record_attempt then record_outcome would; a retried attempt
    leaves the streak."""
    clock = FrozenClock()
    store = make_store(clock)
    await store.add_endpoint(
        endpoint_id="a", url="https://a.test/h", topics=["*"], secret=SECRET, tenant=None
    )
    await store.insert_deliveries(
        [_delivery(clock, f"msg_{n}", "a") for n in range(3)] + [_delivery(clock, "lost", "x")]
    )
    delivery, endpoint = await store.get_for_send("msg_0")
    assert (delivery.id, delivery.payload, endpoint.id, endpoint.secrets) == (
        "msg_0",
        {"order": 1, "note": "é"},
        "a",
        (await store.get_endpoint("a")).secrets,
    )
    assert (await store.get_for_send("lost"))[1] is None
    assert await store.get_for_send("nope") is None
    attempt = DeliveryAttempt(clock.now(), 503, 0.1, body="busy")
    await store.end_attempt("msg_0", attempt, state="pending", disable_after=2)
    assert (await store.get_endpoint("a")).consecutive_failures == 0
    await store.end_attempt("msg_0", attempt, state="failed", disable_after=2)
    await store.end_attempt("msg_1", attempt, state="failed", disable_after=2)
    endpoint = await store.get_endpoint("a")
    assert (endpoint.state, endpoint.consecutive_failures) == ("disabled", 2)
    assert endpoint.disabled_reason == "2 consecutive failed deliveries"
    assert (await store.get_delivery("msg_0")).attempts == (attempt, attempt)
    await store.set_endpoint_state("a", "enabled", reason=None)
    await store.end_attempt("msg_2", attempt, state="delivered", disable_after=2)
    assert (await store.get_delivery("msg_2")).state == "delivered"
    assert (await store.get_endpoint("a")).consecutive_failures == 0
