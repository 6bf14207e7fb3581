"""Issue 36 item 6: the outbox page's trend, on real PostgreSQL. A relay given ``stats=``
writes its delivered count and the sampled pending backlog into the job history table every
flush (and once more when it stops), never per message; the outbox page charts them and its
JSON twin carries the buckets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from dashboard_support import MAIL, actor, authorizer, dashboard_tables
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla import create_audit_log, create_dashboard, create_job_backend
from ship_sqla._jobs._stats import create_job_stats, ship_job_stats_table
from ship_sqla._outbox import (
    OutboxMessage,
    create_outbox,
    create_outbox_operations,
    ship_outbox_table,
    start_outbox_relay,
)
from ship_sqla._outbox._stats import OutboxStatsRecorder, outbox_stats_id
from ship_sqla.kernel._memory.stats import InMemoryJobStats
from ship_sqla.kernel._stats import minute_of

JSON = {"x-user": "admin", "accept": "application/json"}


async def test_s2_a_relay_with_stats_writes_the_outbox_trend_the_page_charts(
    ship_engine: AsyncEngine,
) -> None:
    """S2 (issue 36 item 6): five messages delivered by a relay started with ``stats=``: when
    it stops, the history table holds five delivered for the outbox's row (``outbox/main``)
    and a pending sample; the outbox page shows both charts and the JSON twin's buckets sum
    to five. No job's rows are touched (the row id is no job id)."""
    metadata, runs, state, workers, audit_table = dashboard_tables()
    outbox_table = ship_outbox_table(metadata)
    stats_table = ship_job_stats_table(MetaData())
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.run_sync(stats_table.metadata.create_all)
    stats = create_job_stats(ship_engine, stats_table)
    outbox = create_outbox(database=ship_engine, table=outbox_table)
    for n in range(5):
        await outbox.enqueue("main", "topic", {"n": n})
    got: list[OutboxMessage] = []
    all_in = asyncio.Event()

    async def sink(message: OutboxMessage) -> None:
        got.append(message)
        if len(got) == 5:
            all_in.set()

    relay = await start_outbox_relay(outbox, "main", sink, stats=stats, listen=False)
    await asyncio.wait_for(all_in.wait(), 30)
    await relay.stop()
    now = datetime.now(UTC)
    rows = await stats.read_stats(outbox_stats_id("main"), now - timedelta(hours=1), now)
    assert sum(r.completed for r in rows) == 5
    assert any(r.waiting is not None for r in rows)
    audit = create_audit_log(database=ship_engine, table=audit_table)
    backend = create_job_backend(
        database=ship_engine, table=runs, state_table=state, workers_table=workers
    )
    app = create_dashboard(
        backend,
        authorizer=authorizer,
        actor=actor,
        audit=audit,
        definitions=[MAIL],
        outbox=create_outbox_operations(outbox, authorizer=lambda *_: True, audit=audit),
        outbox_ids=["main"],
        stats=stats,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://app"
    ) as client:
        page = await client.get("/outbox", headers={"x-user": "admin"})
        assert page.status_code == 200
        assert 'id="trend-main"' in page.text
        assert "5 delivered" in page.text
        assert "pending messages (sampled by the relays)" in page.text
        twin = (await client.get("/outbox", headers=JSON)).json()["data"]["outboxes"][0]
    trend = twin["trend"]
    assert trend["range"] == "6h"
    assert trend["sampled"] is True
    assert sum(b["delivered"] for b in trend["buckets"]) == 5
    assert any(b["pending"] is not None for b in trend["buckets"])
    assert await stats.read_stats(MAIL.id, now - timedelta(hours=1), now) == []


class _Flaky(InMemoryJobStats):
    """The in-memory history whose ``add_stats`` raises while ``down``."""

    down = False

    async def add_stats(self, rows: Any) -> None:
        if self.down:
            raise RuntimeError("down")
        await super().add_stats(rows)


class _Counts:
    """An outbox admin whose ``counts`` answers ``pending`` (or raises ``error``)."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.error: Exception | None = None

    async def counts(self, outbox_id: str, *, cap: int) -> tuple[int, int]:  # noqa: ARG002
        if self.error is not None:
            raise self.error
        return self.pending, 0


async def test_the_recorder_writes_deltas_only_and_keeps_an_unwritten_count(
    ship_clock: Any,
) -> None:
    """J11 (issue 36 item 6): a flush adds only what was delivered since the last one; a
    flush that fails is reported and its count is written by the next; the gauge is the last
    sample of the minute."""
    stats = _Flaky()
    admin = _Counts(7)
    delivered = [3]
    reported: list[BaseException] = []
    recorder = OutboxStatsRecorder(
        stats,
        admin,  # type: ignore[arg-type]
        "main",
        delivered=lambda: delivered[0],
        clock=ship_clock,
        report=reported.append,
    )
    delivered[0] = 5
    await recorder.flush()
    stats.down, delivered[0] = True, 9  # 4 more, not written
    await recorder.flush()
    admin.error = RuntimeError("counts down")  # the 4 written, the gauge not sampled
    stats.down = False
    await recorder.flush()
    assert [str(e) for e in reported] == ["down", "counts down"]
    admin.error, admin.pending = None, 2
    await recorder.flush()
    minute = minute_of(ship_clock.now())
    rows = await stats.read_stats("outbox/main", minute, minute + timedelta(minutes=1))
    assert [(r.completed, r.waiting) for r in rows] == [(6, 2)]
