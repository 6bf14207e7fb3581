"""examples/orders_app.py driven over HTTP (httpx ASGITransport) on a private database."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from examples.orders_app import (
    Repositories,
    Services,
    build_app,
    idempotency_table,
    metadata,
    orders,
    outbox_table,
    place_order,
    webhook_events_table,
)
from ship_sqla.idempotency import IdempotencyStarted, StoredResponse
from ship_sqla.testing import FrozenClock
from ship_sqla.webhooks import webhook_headers, webhook_idempotency_prefix

pytestmark = pytest.mark.anyio

SECRET = "whsec_" + base64.b64encode(b"p" * 32).decode()


class BoomError(Exception):
    pass


@pytest.fixture
async def app(ship_engine: AsyncEngine, ship_clock: FrozenClock) -> Starlette:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return build_app(
        ship_engine,
        webhook_secrets={"payments": [SECRET]},
        clock=ship_clock,
        credit_limit_cents=10_000,
    )


def client(app: Starlette) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://orders")


async def counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as c:
        return {
            t.name: int((await c.execute(select(func.count()).select_from(t))).scalar_one())
            for t in (orders, outbox_table, idempotency_table, webhook_events_table)
        }


def nothing() -> dict[str, int]:
    return dict.fromkeys(
        ("example_orders", "ship_outbox", "ship_idempotency", "ship_webhook_events"), 0
    )


def key() -> dict[str, str]:
    return {"idempotency-key": f'"{uuid.uuid4()}"'}


async def test_same_key_twice_writes_one_order_and_one_message(
    app: Starlette, ship_engine: AsyncEngine
) -> None:
    """I1/O1: the order, its outbox message, the claim and the response commit together; the
    retry with the same Idempotency-Key replays the response and writes nothing."""
    headers = key()
    order = {"customer": "ada", "total_cents": 1250}
    async with client(app) as http:
        first = await http.post("/orders", json=order, headers=headers)
        second = await http.post("/orders", json=order, headers=headers)
        other = await http.post("/orders", json={**order, "total_cents": 99}, headers=headers)
    assert first.status_code == 201
    assert second.status_code == 201
    assert second.headers["idempotent-replayed"] == "true"
    assert second.json() == first.json()
    assert other.status_code == 422
    assert await counts(ship_engine) == {
        "example_orders": 1,
        "ship_outbox": 1,
        "ship_idempotency": 1,
        "ship_webhook_events": 0,
    }
    async with ship_engine.connect() as c:
        message = (await c.execute(select(outbox_table))).one()
    assert message.topic == "order.created"
    assert message.payload["order_id"] == first.json()["id"]


async def test_rejected_order_rolls_back_order_message_and_claim(
    app: Starlette, ship_engine: AsyncEngine
) -> None:
    """U1/I1: an order rejected after its row and message were written leaves no order, no
    outbox row and no idempotency claim (so the same key can be retried)."""
    headers = key()
    async with client(app) as http:
        rejected = await http.post(
            "/orders", json={"customer": "bob", "total_cents": 20_000}, headers=headers
        )
        assert await counts(ship_engine) == nothing()
        retried = await http.post(
            "/orders", json={"customer": "bob", "total_cents": 20_000}, headers=headers
        )
    assert rejected.status_code == 422
    assert rejected.json() == {"error": "credit limit exceeded for bob"}
    assert retried.status_code == 422  # the claim was released: it ran again, not replayed
    assert "idempotent-replayed" not in retried.headers
    assert await counts(ship_engine) == nothing()


async def test_webhook_is_received_once(
    app: Starlette, ship_engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """A verified delivery is recorded and enqueued once; the redelivery is acknowledged."""
    body = json.dumps({"type": "payment.succeeded"}).encode()
    async with client(app) as http:
        first = await http.post(
            "/webhooks/payments",
            content=body,
            headers=webhook_headers(SECRET, "msg_1", ship_clock.now(), body),
        )
        ship_clock.advance(30)
        again = await http.post(
            "/webhooks/payments",
            content=body,
            headers=webhook_headers(SECRET, "msg_1", ship_clock.now(), body),
        )
        forged = await http.post(
            "/webhooks/payments",
            content=body,
            headers=webhook_headers(SECRET, "msg_2", ship_clock.now(), b"{}"),
        )
    assert (first.status_code, again.status_code, forged.status_code) == (202, 200, 401)
    assert await counts(ship_engine) == {
        **nothing(),
        "ship_outbox": 1,
        "ship_idempotency": 1,
        "ship_webhook_events": 1,
    }


async def test_failed_webhook_unit_of_work_leaves_nothing(
    app: Starlette,
    ship_engine: AsyncEngine,
    ship_clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """U1/O1: when the receiver's unit of work fails after enqueueing, no outbox row, no
    idempotency claim and no webhook record remain; the sender's retry then succeeds."""
    services: Services = app.state.services
    real_enqueue = type(services.outbox).enqueue

    async def enqueue_then_fail(self: Any, *args: Any, **kwargs: Any) -> Any:
        await real_enqueue(self, *args, **kwargs)
        raise BoomError

    body = json.dumps({"type": "payment.succeeded"}).encode()
    headers = webhook_headers(SECRET, "msg_1", ship_clock.now(), body)
    async with client(app) as http:
        monkeypatch.setattr(type(services.outbox), "enqueue", enqueue_then_fail)
        failed = await http.post("/webhooks/payments", content=body, headers=headers)
        assert await counts(ship_engine) == nothing()
        monkeypatch.undo()
        retried = await http.post("/webhooks/payments", content=body, headers=headers)
    assert failed.status_code == 500
    assert retried.status_code == 202


async def test_rolled_back_unit_of_work_leaves_no_message_claim_or_record(
    app: Starlette, ship_engine: AsyncEngine
) -> None:
    """U1/I1/O1: an order, its outbox message, an idempotency claim and a webhook record
    written in one unit of work that then fails all roll back together."""
    services: Services = app.state.services

    async def handler(repos: Repositories) -> None:
        started = await services.idempotency.begin(
            "msg_9", "fp", prefix=webhook_idempotency_prefix("payments")
        )
        assert isinstance(started, IdempotencyStarted)
        await services.webhook_events.record("payments", "msg_9", {"n": 1})
        await place_order(repos, "carol", 100, services.credit_limit_cents)
        await started.claim.complete(StoredResponse(202))
        raise BoomError

    with pytest.raises(BoomError):
        await services.uow.run(handler)
    assert await counts(ship_engine) == nothing()
