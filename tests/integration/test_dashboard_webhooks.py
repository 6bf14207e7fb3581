"""The dashboard's Webhooks page over HTTP (httpx's ASGI transport), on the in-memory backend
and webhook store: each endpoint's state, failure streak, topics and url, never a secret (W2);
the latest deliveries with their attempts (W3: status, duration, error, a bounded excerpt, all
escaped); disable, enable (W4: the paused deliveries resume) and redeliver (S1: permissioned,
CSRF-checked, audited; S2: a read-only user sees no form and is refused). On PostgreSQL: a
missing webhook table is named, and the deliveries listing reads the primary key backwards."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any

import anyio
import httpx
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from dashboard_support import actor, csrf_of, dashboard_tables
from sqlalchemy import MetaData, text
from sqlalchemy.dialects import postgresql
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_dashboard, create_job_backend
from ship_sqla._webhooks._out_sql import LIST_DELIVERIES
from ship_sqla.kernel import InMemoryJobBackend
from ship_sqla.kernel._memory.webhooks_out import InMemoryWebhookDeliveryStore
from ship_sqla.kernel._webhooks_out import DeliveryAttempt, WebhookDeliveryRecord
from ship_sqla.operators import InMemoryAuditLog
from ship_sqla.webhooks import (
    create_webhook_delivery_store,
    create_webhook_sender,
    ship_webhook_deliveries_table,
    ship_webhook_endpoints_table,
)

SECRET = "whsec_" + "c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1zaG93"
USERS = {
    "admin": {"ship.jobs:manage", "ship.jobs:read", "ship.webhooks:manage", "ship.webhooks:read"},
    "viewer": {"ship.jobs:read", "ship.webhooks:read"},
    "nobody": {"ship.jobs:read"},
}


def authorizer(request: Any, permission: str, _operation: str) -> bool:
    return permission in USERS.get(actor(request), set())


@pytest.fixture
def backend(ship_clock):
    return InMemoryJobBackend(clock=ship_clock)


@pytest.fixture
def store(ship_clock):
    return InMemoryWebhookDeliveryStore(ship_clock)


@pytest.fixture
def audit(ship_clock):
    return InMemoryAuditLog(ship_clock)


@pytest.fixture
def sender(backend, store):
    return create_webhook_sender(backend=backend, store=store)


def _client(app: Any) -> httpx.AsyncClient:
    mounted = Starlette(routes=[Mount("/ops", app=app)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=mounted), base_url="http://app")


@pytest.fixture
def client(backend, audit, sender):
    return _client(
        create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit, webhooks=sender)
    )


def _delivery(clock: Any, delivery_id: str, endpoint_id: str, state: str, attempts: Any) -> Any:
    now = clock.now()
    return WebhookDeliveryRecord(
        delivery_id, endpoint_id, "order.paid", {"n": 1}, None, state, attempts, now, now
    )


async def _data(sender: Any, store: Any) -> None:
    """``ep.live`` enabled with a streak of 2 and one failed delivery (7 attempts: an HTTP 500
    with a long HTML body, then no answer); ``ep.off`` disabled (a reason with markup) with one
    paused delivery."""
    clock = store.clock
    await sender.add_endpoint(
        "https://hooks.example.com/in", ["order.paid", "*"], secret=SECRET, endpoint_id="ep.live"
    )
    await sender.add_endpoint("https://other.example.com/x", ["a.b"], endpoint_id="ep.off")
    for _ in range(2):
        await store.record_outcome("ep.live", delivered=False, disable_after=20)
    await sender.disable_endpoint("ep.off", reason="<b>flaky</b> receiver")
    body = "<script>alert(1)</script>" + "x" * 5000
    attempts = (
        *(DeliveryAttempt(clock.now(), 500, 0.25, body) for _ in range(6)),
        DeliveryAttempt(clock.now(), None, 10.0, None, "ConnectError: <refused>"),
    )
    await store.insert_deliveries(
        [
            _delivery(clock, "d-0001", "ep.live", "failed", attempts),
            _delivery(clock, "d-0002", "ep.off", "paused", ()),
        ]
    )


async def test_w2_w3_w4_the_page_shows_endpoints_and_deliveries_never_a_secret(
    client, sender, store, ship_clock
):
    """W4: each endpoint's state (a disabled one's reason, escaped), failure streak, topics and
    url; W3: each delivery's latest attempts (status, duration, error, the answer's excerpt cut
    and escaped; the earlier ones counted, not shown); W2: no secret anywhere on the page, and
    no add or rotate form. S2: a read-only user gets no form. The page is in the header."""
    await _data(sender, store)
    page = await client.get("/ops/webhooks", headers={"x-user": "viewer"})
    assert page.status_code == 200, page.text
    html = page.text
    assert 'href="/ops/webhooks"' in html
    assert "ep.live" in html
    assert "https://hooks.example.com/in" in html
    assert "order.paid, *" in html
    assert "<td>2</td>" in html
    assert '<span class="state-disabled">disabled</span>' in html
    assert "&lt;b&gt;flaky&lt;/b&gt; receiver" in html
    assert "<b>flaky" not in html
    assert "d-0001" in html
    assert "HTTP 500" in html
    assert "0.250 s" in html
    assert "no answer" in html
    assert "ConnectError: &lt;refused&gt;" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert" not in html
    assert "more characters]" in html  # the excerpt is cut, and says so
    assert "x" * 300 not in html
    assert "2 earlier attempt(s) not shown" in html
    assert '<span class="state-paused">paused</span>' in html
    assert SECRET not in html
    assert "whsec_" not in html
    assert 'id="no-secrets"' in html
    assert 'method="post"' not in html  # S2: a read-only user gets no form
    assert "rotate-secret</" not in html


async def test_s1_w4_a_manager_disables_enables_and_redelivers_audited(
    client, sender, store, backend, audit
):
    """S1, W4: a manager sees Disable on the enabled endpoint, Enable on the disabled one and
    Redeliver on the ended delivery; disable (with its reason) pauses the endpoint, enable
    resumes its paused delivery (pending, its run enqueued), redeliver makes the failed
    delivery pending again: each writes its audit entry (``webhooks.<method>``, no secret). A
    POST without the page's CSRF token is refused (403) and changes nothing."""
    await _data(sender, store)
    admin = {"x-user": "admin"}
    page = await client.get("/ops/webhooks", headers=admin)
    html = page.text
    assert 'action="/ops/webhooks/endpoints/ep.live/disable"' in html
    assert 'action="/ops/webhooks/endpoints/ep.off/enable"' in html
    assert 'action="/ops/webhooks/deliveries/d-0001/redeliver"' in html
    assert "/ops/webhooks/deliveries/d-0002/" not in html  # paused: enable resumes it
    assert "rotate" not in html.replace("rotate-secret)", "").replace("rotate its", "")
    token = csrf_of(html)

    forged = await client.post(
        "/ops/webhooks/endpoints/ep.live/disable", data={"reason": "x"}, headers=admin
    )
    assert forged.status_code == 403
    assert (await store.get_endpoint("ep.live")).state == "enabled"

    back = {"csrf_token": token, "next": "/ops/webhooks"}
    done = await client.post(
        "/ops/webhooks/endpoints/ep.live/disable",
        data={**back, "reason": "receiver migrating"},
        headers=admin,
    )
    assert done.status_code == 303, done.text
    off = await store.get_endpoint("ep.live")
    assert (off.state, off.disabled_reason) == ("disabled", "receiver migrating")

    enabled = await client.post("/ops/webhooks/endpoints/ep.off/enable", data=back, headers=admin)
    assert enabled.status_code == 303
    assert "1+paused+delivery" in enabled.headers["location"]
    assert (await store.get_endpoint("ep.off")).state == "enabled"
    assert (await store.get_delivery("d-0002")).state == "pending"

    again = await client.post("/ops/webhooks/deliveries/d-0001/redeliver", data=back, headers=admin)
    assert again.status_code == 303
    assert (await store.get_delivery("d-0001")).state == "pending"
    assert len(backend.runs(sender.job.id)) == 2

    unknown = await client.post(
        "/ops/webhooks/deliveries/d-none/redeliver", data=back, headers=admin
    )
    assert unknown.status_code == 404
    assert [(e.operation, e.target, e.actor) for e in audit.entries] == [
        ("webhooks.disable_endpoint", "ep.live", "admin"),
        ("webhooks.enable_endpoint", "ep.off", "admin"),
        ("webhooks.redeliver", "d-0001", "admin"),
    ]
    assert SECRET not in json.dumps([e.details for e in audit.entries], default=str)


async def test_s2_a_read_only_user_cannot_act_and_nobody_cannot_read(
    client, sender, store, audit, ship_clock
):
    """S2: a read-only user's disable (with a valid CSRF token) is refused by the operations
    surface (403, naming ship.webhooks:manage), nothing changes or is audited; a user without
    ship.webhooks:read is refused the page (403)."""
    await _data(sender, store)
    token = csrf_of((await client.get("/ops/upkeep", headers={"x-user": "admin"})).text)
    refused = await client.post(
        "/ops/webhooks/endpoints/ep.live/disable",
        data={"csrf_token": token, "reason": "x"},
        headers={"x-user": "viewer"},
    )
    assert refused.status_code == 403
    assert "ship.webhooks:manage" in refused.text
    assert (await store.get_endpoint("ep.live")).state == "enabled"
    assert audit.entries == []
    page = await client.get("/ops/webhooks", headers={"x-user": "nobody"})
    assert page.status_code == 403
    assert "ep.live" not in page.text


async def test_the_page_without_a_sender_says_how_to_give_one(backend, audit):
    """A dashboard given no webhook sender says how to add one (create_dashboard(webhooks=...),
    --webhooks); its webhook actions are refused (400), changing nothing."""
    client = _client(create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit))
    page = await client.get("/ops/webhooks", headers={"x-user": "admin"})
    assert page.status_code == 200
    assert 'id="no-webhooks"' in page.text
    assert "--webhooks" in page.text
    token = csrf_of((await client.get("/ops/upkeep", headers={"x-user": "admin"})).text)
    refused = await client.post(
        "/ops/webhooks/endpoints/e/enable", data={"csrf_token": token}, headers={"x-user": "admin"}
    )
    assert refused.status_code == 400
    assert "webhook sender" in refused.text
    assert audit.entries == []


async def test_on_postgres_a_missing_webhook_table_is_named_on_the_page(ship_engine, audit):
    """On PostgreSQL, when the webhook tables do not exist the page says so in place (the
    tables and ``schema apply --only webhooks_out``), never a 500."""
    metadata, runs, state, workers, _ = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    sender = create_webhook_sender(backend=backend, database=ship_engine)
    client = _client(
        create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit, webhooks=sender)
    )
    page = await client.get("/ops/webhooks", headers={"x-user": "admin"})
    assert page.status_code == 200, page.text
    assert "SHIP_SQLA_TABLES_MISSING" in page.text
    assert "ship_webhook_deliveries" in page.text
    await sender.aclose()


async def test_on_postgres_the_deliveries_listing_reads_the_primary_key_backwards(ship_engine):
    """The page's deliveries listing (LIST_DELIVERIES, no filter, LIMIT 51) is served by the
    deliveries' primary key read backwards (newest first, delivery ids are time ordered):
    no sort of the table, at 20,000 deliveries."""
    metadata = MetaData()
    endpoints = ship_webhook_endpoints_table(metadata)
    deliveries = ship_webhook_deliveries_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text(
                "INSERT INTO ship_webhook_deliveries (id, endpoint_id, topic, payload, state)"
                " SELECT lpad(g::text, 12, '0'), 'ep' || (g % 20), 't', '{}', 'delivered'"
                " FROM generate_series(1, 20000) g"
            )
        )
        await connection.execute(text("ANALYZE ship_webhook_deliveries"))
    store = create_webhook_delivery_store(
        database=ship_engine, endpoints_table=endpoints, deliveries_table=deliveries
    )
    statement = store._s[LIST_DELIVERIES]
    sql = str(statement.compile(dialect=postgresql.dialect()))
    for name, value in {
        "now": "NULL",
        "endpoint_id": "NULL",
        "state": "NULL",
        "limit": "51",
    }.items():
        sql = sql.replace(f"%({name})s", value)
    async with ship_engine.connect() as connection:
        plan = (await connection.exec_driver_sql("EXPLAIN " + sql)).all()
    text_plan = "\n".join(row[0] for row in plan)
    assert "Index Scan Backward using ship_webhook_deliveries_pkey" in text_plan, text_plan
    assert "Sort" not in text_plan, text_plan
    listed = await store.list_deliveries(limit=51)
    assert [d.id for d in listed[:2]] == ["000000020000", "000000019999"]


def _get(base: str, path: str) -> str:
    with urllib.request.urlopen(base + path, timeout=30) as answer:  # noqa: S310 - local test URL
        return str(answer.read().decode())


async def test_ship_sqla_dashboard_webhooks_shows_the_page_from_the_flag(
    ship_engine, ship_engine_url, tmp_path
):
    """``ship-sqla dashboard --webhooks`` serves the Webhooks page over the default webhook
    tables: the endpoint and its url, never its secret (W2), with the manager's Disable."""
    metadata, runs, state, workers, _ = dashboard_tables()
    ship_webhook_endpoints_table(metadata)
    ship_webhook_deliveries_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    sender = create_webhook_sender(backend=backend, database=ship_engine)
    await sender.add_endpoint(
        "https://hooks.example.com/cli", ["order.paid"], secret=SECRET, endpoint_id="ep.cli"
    )
    await sender.aclose()
    command = [
        sys.executable, "-m", "ship_sqla", "dashboard", "--database-url", ship_engine_url,
        "--port", "0", "--webhooks", "--no-audit",
    ]  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHIP_SQLA_")}
    process = await anyio.open_process(command, cwd=tmp_path, env=environment)
    try:
        assert process.stdout is not None
        with anyio.fail_after(60):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
        base = line.decode().split(" on ", 1)[1].split("/ ", 1)[0]
        page = await anyio.to_thread.run_sync(_get, base, "/webhooks")
    finally:
        process.terminate()
        await process.wait()
    assert "ep.cli" in page
    assert "https://hooks.example.com/cli" in page
    assert "/webhooks/endpoints/ep.cli/disable" in page
    assert SECRET not in page
