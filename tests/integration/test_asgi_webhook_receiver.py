"""The ASGI webhook receiver mounted in Starlette, driven with httpx, on real PostgreSQL."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import MetaData, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Route

from ship_sqla import (
    create_idempotency_store,
    create_outbox,
    create_webhook_event_store,
    ship_idempotency_table,
    ship_outbox_table,
    ship_webhook_events_table,
)
from ship_sqla.asgi import WebhookEndpoint, WebhookReceiver
from ship_sqla.testing import FrozenClock
from ship_sqla.webhooks import webhook_headers

pytestmark = pytest.mark.anyio

metadata = MetaData()
events = ship_webhook_events_table(metadata)
outbox_table = ship_outbox_table(metadata)
keys = ship_idempotency_table(metadata)

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
GITHUB_SECRET = "whsec_" + base64.b64encode(b"g" * 32).decode()


class BoomError(Exception):
    pass


class GatedOutbox:
    """Wraps the real outbox: can hold the first enqueue open, or fail after enqueueing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate: anyio.Event | None = None
        self.entered = anyio.Event()
        self.fail = False

    async def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        message_id = await self.inner.enqueue(*args, **kwargs)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise BoomError
        return message_id


class Harness:
    def __init__(self, engine: AsyncEngine, clock: FrozenClock) -> None:
        self.engine = engine
        self.clock = clock
        idempotency = create_idempotency_store(
            database=engine, table=keys, clock=clock, lock_timeout=timedelta(milliseconds=200)
        )
        self.events = create_webhook_event_store(
            database=engine,
            table=events,
            outbox_table=outbox_table,
            idempotency_table=keys,
            clock=clock,
        )
        self.outbox = GatedOutbox(create_outbox(database=engine, table=outbox_table, clock=clock))
        self.receiver = WebhookReceiver(
            endpoints=[
                WebhookEndpoint("stripe", secrets=[SECRET, OLD_SECRET], topic="stripe.event"),
                WebhookEndpoint("github", secrets=GITHUB_SECRET, tenant="acme"),
            ],
            events=self.events,
            idempotency=idempotency,
            outbox=self.outbox,
            clock=clock,
            keep_raw_body=True,
        )
        self.app = Starlette(routes=[Route("/webhooks/{name}", self.receiver, methods=["POST"])])

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url="http://test")

    def signed(
        self, event_id: str, payload: Any, *, secret: str = SECRET, body: bytes | None = None
    ) -> tuple[bytes, dict[str, str]]:
        raw = body if body is not None else json.dumps(payload).encode()
        headers = webhook_headers(secret, event_id, self.clock.now(), raw)
        return raw, {**headers, "content-type": "application/json"}

    async def counts(self) -> tuple[int, int, int]:
        async with self.engine.connect() as c:
            found = [
                int((await c.execute(select(func.count()).select_from(t))).scalar_one())
                for t in (events, keys, outbox_table)
            ]
        return found[0], found[1], found[2]


@pytest.fixture
async def harness(ship_engine: AsyncEngine, ship_clock: FrozenClock) -> Harness:
    async with ship_engine.begin() as c:
        await c.run_sync(metadata.create_all)
    return Harness(ship_engine, ship_clock)


async def test_delivery_is_recorded_claimed_and_enqueued_in_one_unit_of_work(
    harness: Harness,
) -> None:
    """A verified delivery is answered 202 after the event, its idempotency claim and its
    outbox intent (linked to the event) committed together (U1, O1)."""
    body, headers = harness.signed("evt_1", {"type": "invoice.paid"})
    async with harness.client() as client:
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 202
    assert response.json() == {"status": "accepted", "webhook": "stripe", "event_id": "evt_1"}
    assert await harness.counts() == (1, 1, 1)
    event = await harness.events.get("stripe", "evt_1")
    assert event is not None
    assert event.payload == {"type": "invoice.paid"}
    assert event.raw_body == body
    assert event.headers["webhook-id"] == "evt_1"
    assert event.signed_at == harness.clock.now().replace(microsecond=0)
    async with harness.engine.connect() as c:
        row = (await c.execute(select(outbox_table))).one()
    assert row.id == event.outbox_message_id
    assert (row.outbox_id, row.topic, row.payload) == ("webhooks", "stripe.event", event.payload)
    assert row.headers["webhook-id"] == "evt_1"


async def test_duplicate_delivery_is_acknowledged_and_not_enqueued_twice(
    harness: Harness,
) -> None:
    """A redelivery (same webhook-id, new timestamp and signature) answers 2xx, enqueues nothing."""
    async with harness.client() as client:
        body, headers = harness.signed("evt_1", {"n": 1})
        assert (
            await client.post("/webhooks/stripe", content=body, headers=headers)
        ).status_code == 202
        harness.clock.advance(90)
        body, headers = harness.signed("evt_1", {"n": 1}, secret=OLD_SECRET)
        again = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert await harness.counts() == (1, 1, 1)


async def test_duplicate_after_its_key_expired_is_still_deduplicated(harness: Harness) -> None:
    """The event row deduplicates once the idempotency key is gone: 200, no second intent."""
    async with harness.client() as client:
        body, headers = harness.signed("evt_1", {"n": 1})
        await client.post("/webhooks/stripe", content=body, headers=headers)
        async with harness.engine.begin() as c:
            await c.execute(keys.delete())
        harness.clock.advance(60)
        body, headers = harness.signed("evt_1", {"n": 1})
        again = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert await harness.counts() == (1, 1, 1)


async def test_bad_signature_is_401_with_a_json_error(harness: Harness) -> None:
    body, headers = harness.signed("evt_1", {"n": 1}, secret=GITHUB_SECRET)
    async with harness.client() as client:
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
        body, headers = harness.signed("evt_2", {"n": 1})
        tampered = await client.post(
            "/webhooks/stripe", content=body.replace(b"1", b"2"), headers=headers
        )
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "SHIP_SQLA_WEBHOOK_SIGNATURE_MISMATCH"
    assert "fix" in response.json()
    assert tampered.status_code == 401
    assert await harness.counts() == (0, 0, 0)


async def test_stale_timestamp_is_401(harness: Harness) -> None:
    body, headers = harness.signed("evt_1", {"n": 1})
    harness.clock.advance(timedelta(minutes=6))
    async with harness.client() as client:
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["code"] == "SHIP_SQLA_WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE"


async def test_malformed_deliveries_are_400(harness: Harness) -> None:
    async with harness.client() as client:
        missing = await client.post("/webhooks/stripe", content=b"{}")
        body, headers = harness.signed("evt_1", None, body=b"not json")
        not_json = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert missing.status_code == 400
    assert missing.json()["code"] == "SHIP_SQLA_WEBHOOK_HEADER_INVALID"
    assert not_json.status_code == 400
    assert not_json.json()["code"] == "SHIP_SQLA_WEBHOOK_BODY_NOT_JSON"
    assert await harness.counts() == (0, 0, 0)


async def test_unknown_webhook_reused_id_and_too_large(harness: Harness) -> None:
    async with harness.client() as client:
        body, headers = harness.signed("evt_1", {"n": 1})
        unknown = await client.post("/webhooks/nope", content=body, headers=headers)
        await client.post("/webhooks/stripe", content=body, headers=headers)
        body, headers = harness.signed("evt_1", {"n": 2})
        reused = await client.post("/webhooks/stripe", content=body, headers=headers)
        big = b"[" + b"1," * 600_000 + b"1]"
        body, headers = harness.signed("evt_big", None, body=big)
        too_large = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert unknown.status_code == 404
    assert reused.status_code == 422
    assert reused.json()["code"] == "SHIP_SQLA_WEBHOOK_ID_REUSED"
    assert too_large.status_code == 413
    assert await harness.counts() == (1, 1, 1)


async def test_tenant_endpoint_stamps_its_tenant(harness: Harness) -> None:
    body, headers = harness.signed("gh_1", {"n": 1}, secret=GITHUB_SECRET)
    async with harness.client() as client:
        response = await client.post("/webhooks/github", content=body, headers=headers)
    assert response.status_code == 202
    event = await harness.events.get("github", "gh_1")
    assert event is not None
    assert event.tenant == "acme"
    async with harness.engine.connect() as c:
        assert (await c.execute(select(outbox_table.c.tenant_id))).scalar_one() == "acme"
        assert (await c.execute(select(keys.c.tenant_id, keys.c.prefix))).one() == (
            "acme",
            "webhook:github",
        )


async def test_concurrent_duplicate_is_409_not_a_hang(harness: Harness) -> None:
    """A redelivery racing an uncommitted first delivery is answered 409 within the
    idempotency lock_timeout; the first then commits once, and a later retry is a duplicate."""
    harness.outbox.gate = anyio.Event()
    body, headers = harness.signed("evt_1", {"n": 1})
    statuses: list[int] = []
    async with harness.client() as client:

        async def first() -> None:
            response = await client.post("/webhooks/stripe", content=body, headers=headers)
            statuses.append(response.status_code)

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await harness.outbox.entered.wait()
                racing = await client.post("/webhooks/stripe", content=body, headers=headers)
                harness.outbox.gate.set()
            later = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert racing.status_code == 409
    assert statuses == [202]
    assert later.status_code == 200
    assert await harness.counts() == (1, 1, 1)


async def test_failed_unit_of_work_leaves_nothing_behind(harness: Harness) -> None:
    """U1: when the unit of work fails after enqueueing, the event record, the idempotency
    claim and the outbox row all roll back, and the sender's retry is processed normally."""
    harness.outbox.fail = True
    body, headers = harness.signed("evt_1", {"n": 1})
    async with harness.client() as client:
        failed = await client.post("/webhooks/stripe", content=body, headers=headers)
        assert await harness.counts() == (0, 0, 0)
        harness.outbox.fail = False
        retried = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert failed.status_code == 500
    assert retried.status_code == 202
    assert await harness.counts() == (1, 1, 1)


async def test_receiver_mounted_alone_serves_its_single_endpoint(harness: Harness) -> None:
    """Without a {name} path parameter, a one-endpoint receiver is the whole app (lifespan
    included); other methods are 405."""
    receiver = WebhookReceiver(
        endpoints=WebhookEndpoint("solo", secrets=[SECRET]),
        events=harness.events,
        idempotency=create_idempotency_store(database=harness.engine, table=keys),
        outbox=harness.outbox,
        clock=harness.clock,
    )
    body, headers = harness.signed("evt_solo", {"n": 1})
    transport = httpx.ASGITransport(app=receiver)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        accepted = await client.post("/anything", content=body, headers=headers)
        wrong_method = await client.get("/anything")
    assert accepted.status_code == 202
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    startup = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return startup.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await receiver({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_json_that_jsonb_cannot_store_is_400(harness: Harness) -> None:
    r"""A NUL character (\u0000) is valid JSON but not storable in jsonb: a clear 400, nothing
    recorded."""
    body, headers = harness.signed("evt_nul", None, body=b'{"note": "a\\u0000b"}')
    async with harness.client() as client:
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["code"] == "SHIP_SQLA_WEBHOOK_BODY_UNSTORABLE"
    assert await harness.counts() == (0, 0, 0)
