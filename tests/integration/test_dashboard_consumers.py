"""The dashboard's Consumers & backfills page over HTTP (httpx's ASGI transport), on the
in-memory backend and ledger: each consumer key's lag and last batch from its runs (C3), each
backfill's ledger row (C4: progress, pace, last key, stalled), and the backfill actions (S1:
permissioned, CSRF-checked, audited; S2: a read-only user sees no form)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from dashboard_support import actor, authorizer, csrf_of, dashboard_tables
from job_helpers import claim_request
from sqlalchemy import MetaData
from starlette.applications import Starlette
from starlette.routing import Mount

from ship_sqla import create_dashboard, create_job_backend, create_unit_of_work, define_job
from ship_sqla._backfills import create_backfill_ledger, ship_backfills_table
from ship_sqla.jobs import Concurrency, IdempotencyPolicy
from ship_sqla.kernel import (
    InMemoryBackfillLedger,
    InMemoryJobBackend,
    InMemoryUnitOfWork,
    completed,
)
from ship_sqla.operators import InMemoryAuditLog


async def _noop(ctx: Any, payload: Any) -> None:
    return None


FEED = define_job(
    "dash.feed",
    _noop,
    payload=dict,
    idempotency=IdempotencyPolicy(key=lambda p: p["key"]),
    concurrency=Concurrency(single_runner=True, key=lambda p: p["key"]),
)
"""Keyed as a consumer's per-key job is (C2): one live run per key, single runner per key."""


@pytest.fixture
def backend(ship_clock):
    return InMemoryJobBackend(clock=ship_clock)


@pytest.fixture
def audit(ship_clock):
    return InMemoryAuditLog(ship_clock)


@pytest.fixture
def ledger(ship_clock):
    return InMemoryBackfillLedger(ship_clock)


def _client(app: Any) -> httpx.AsyncClient:
    mounted = Starlette(routes=[Mount("/ops", app=app)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=mounted), base_url="http://app")


@pytest.fixture
def client(backend, audit, ledger):
    return _client(
        create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit, backfills=ledger)
    )


async def _consumer_keys(backend: Any, clock: Any, uow: Any = None) -> dict[str, Any]:
    """Key ``k1`` committed a batch (lag 1234) and its run completed, then the supervisor armed
    it again (a waiting run); key ``k2`` is in its first run, before any batch."""
    await backend.enqueue(FEED, {"key": "k1"})
    await backend.enqueue(FEED, {"key": "k2"})
    runs = {run.key: run for run in await backend.claim(claim_request(FEED, worker="w", limit=2))}

    async def batch(repositories: Any) -> None:
        progress = {
            "lag": 1234,
            "last_batch_at": clock.now().isoformat(),
            "batch_items": 5,
            "batches": 2,
            "items": 9,
        }
        assert await backend.record_progress(runs["k1"], progress)

    await (uow or InMemoryUnitOfWork()).run(batch)
    assert await backend.settle([completed(runs["k1"])]) == ["completed"]
    again = await backend.enqueue(FEED, {"key": "k1"})
    return {"k1": runs["k1"].run_id, "k1.next": again.run_id, "k2": runs["k2"].run_id}


async def _backfills(ledger: Any, clock: Any) -> None:
    """``bf.live`` running with two checkpoints then silent past its stalled threshold;
    ``bf.done`` completed; ``bf.new`` pending (requested, never begun)."""
    await ledger.request("bf.live", pace=2.5, stall_after=60.0, required_by="0042_add_col")
    await ledger.begin(
        "bf.live", run_id="r-live", token=7, pace=2.5, stall_after=60.0, required_by="0042_add_col"
    )
    await ledger.checkpoint(
        "bf.live", run_id="r-live", token=7, pages_before=0, last_key=(100,), rows=100
    )
    await ledger.checkpoint(
        "bf.live", run_id="r-live", token=7, pages_before=1, last_key=(200,), rows=100
    )
    await ledger.begin(
        "bf.done", run_id="r-done", token=1, pace=1.0, stall_after=60.0, required_by=None
    )
    await ledger.finish("bf.done", run_id="r-done", token=1, state="completed")
    await ledger.request("bf.new")
    clock.advance(timedelta(minutes=5))


async def test_c3_c4_the_page_shows_consumer_keys_and_backfills(
    client, backend, ledger, ship_clock
):
    """C3: each consumer key that committed a batch is listed with its lag, last batch time,
    totals, the run that recorded them (completed) and its live run (waiting); a key without a
    batch is not listed. C4: each backfill with its status (stalled when its checkpoints
    stopped for longer than its threshold), pages, rows, pace, last key and stalled time. The
    page is in the header."""
    ids = await _consumer_keys(backend, ship_clock)
    batch_time = ship_clock.now()
    await _backfills(ledger, ship_clock)
    page = await client.get("/ops/consumers", headers={"x-user": "viewer"})
    assert page.status_code == 200, page.text
    html = page.text
    assert 'href="/ops/consumers"' in html
    assert "Consumers &amp; backfills" in html
    assert "1,234" in html
    assert f"{batch_time:%Y-%m-%d %H:%M:%S} UTC" in html
    assert ids["k1"] in html
    assert f'href="/ops/runs/{ids["k1.next"]}"' in html
    assert ">k2<" not in html  # no batch yet: nothing to report
    assert '<span class="state-stalled">stalled</span>' in html
    assert "2.5 pages/s" in html
    assert "<code>200</code>" in html
    assert "0042_add_col" in html
    assert '<span class="state-completed">completed</span>' in html
    assert '<span class="state-pending">pending</span>' in html
    assert 'method="post"' not in html  # S2: a read-only user gets no form


async def test_c3_the_run_page_shows_a_consumer_runs_progress(client, backend, ship_clock):
    """C3: a consumer run's page shows its recorded progress (kept after it completed)."""
    ids = await _consumer_keys(backend, ship_clock)
    page = await client.get(f"/ops/runs/{ids['k1']}", headers={"x-user": "viewer"})
    assert page.status_code == 200
    assert "lag 1234, last batch " in page.text
    assert "2 batches, 9 items" in page.text


async def test_s1_a_manager_cancels_and_starts_a_backfill_from_the_page_audited(
    client, backend, ledger, audit, ship_clock
):
    """S1, C4: a manager sees Cancel on the live backfills (running, pending) and none on the
    completed one; the cancel (with the page's CSRF token) cancels it and writes
    ``backfills.cancel``; the page then offers Start, which resumes it (its run enqueued) and
    writes ``backfills.start``; a POST without the token is refused (403) and changes
    nothing."""
    await _backfills(ledger, ship_clock)
    admin = {"x-user": "admin"}
    page = await client.get("/ops/consumers", headers=admin)
    assert 'action="/ops/backfills/bf.live/cancel"' in page.text
    assert 'action="/ops/backfills/bf.new/cancel"' in page.text
    assert "/ops/backfills/bf.done/" not in page.text
    token = csrf_of(page.text)
    forged = await client.post("/ops/backfills/bf.live/cancel", data={}, headers=admin)
    assert forged.status_code == 403
    live = await ledger.get("bf.live")
    assert live is not None
    assert live.state == "running"

    back = {"csrf_token": token, "next": "/ops/consumers"}
    done = await client.post("/ops/backfills/bf.live/cancel", data=back, headers=admin)
    assert done.status_code == 303
    assert "cancelled" in done.headers["location"]
    cancelled = await ledger.get("bf.live")
    assert cancelled is not None
    assert cancelled.state == "cancelled"
    page = await client.get("/ops/consumers", headers=admin)
    assert 'action="/ops/backfills/bf.live/start"' in page.text
    started = await client.post("/ops/backfills/bf.live/start", data=back, headers=admin)
    assert started.status_code == 303
    assert "enqueued" in started.headers["location"]
    resumed = await ledger.get("bf.live")
    assert resumed is not None
    assert (resumed.state, resumed.pages) == ("pending", 2)
    assert [(e.operation, e.target, e.actor) for e in audit.entries] == [
        ("backfills.cancel", "bf.live", "admin"),
        ("backfills.start", "bf.live", "admin"),
    ]


async def test_s2_a_read_only_user_cannot_cancel_a_backfill(client, ledger, audit, ship_clock):
    """S2: a read-only user's forged cancel (with a valid CSRF token) is refused by the
    operations surface (403): the backfill stays live, nothing is audited."""
    await _backfills(ledger, ship_clock)
    token = csrf_of((await client.get("/ops/consumers", headers={"x-user": "admin"})).text)
    refused = await client.post(
        "/ops/backfills/bf.live/cancel", data={"csrf_token": token}, headers={"x-user": "viewer"}
    )
    assert refused.status_code == 403
    assert "ship.jobs:manage" in refused.text
    live = await ledger.get("bf.live")
    assert live is not None
    assert live.state == "running"
    assert audit.entries == []


async def test_the_page_without_a_ledger_says_how_to_give_one(backend, audit):
    """C4: a dashboard given no backfill ledger lists the consumers and says how to add the
    backfills (create_dashboard(backfills=...), --backfills-table); its backfill actions are
    refused (400), changing nothing."""
    client = _client(create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit))
    page = await client.get("/ops/consumers", headers={"x-user": "admin"})
    assert page.status_code == 200
    assert 'id="no-backfills"' in page.text
    assert "--backfills-table" in page.text
    token = csrf_of((await client.get("/ops/upkeep", headers={"x-user": "admin"})).text)
    refused = await client.post(
        "/ops/backfills/bf.x/cancel", data={"csrf_token": token}, headers={"x-user": "admin"}
    )
    assert refused.status_code == 400
    assert "backfill ledger" in refused.text
    assert audit.entries == []


async def test_on_postgres_a_missing_ledger_table_is_named_on_the_page(ship_engine, audit):
    """C3, C4 on PostgreSQL: the page reads the consumer keys from the runs table and, when
    the ledger's table does not exist, says so in place of the backfills (the table and the
    ``schema apply --only backfills`` command), never a 500; the consumer keys still show."""
    metadata, runs, state, workers, _ = dashboard_tables()
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    ids = await _consumer_keys(
        backend, backend.clock, create_unit_of_work(ship_engine, repositories=lambda scope: scope)
    )
    ledger = create_backfill_ledger(database=ship_engine, table=ship_backfills_table(MetaData()))
    client = _client(
        create_dashboard(backend, authorizer=authorizer, actor=actor, audit=audit, backfills=ledger)
    )
    page = await client.get("/ops/consumers", headers={"x-user": "admin"})
    assert page.status_code == 200, page.text
    assert ids["k1"] in page.text
    assert "1,234" in page.text
    assert "SHIP_SQLA_TABLES_MISSING" in page.text
    assert "--only backfills" in page.text
