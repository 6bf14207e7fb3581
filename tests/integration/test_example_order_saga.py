"""examples/order_saga.py on a private database: in process, and as the script a reader runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from examples.order_saga import job_events, run, webhook_events

ROOT = Path(__file__).parents[2]


async def test_the_saga_ships_one_order_and_compensates_the_other(ship_engine: AsyncEngine) -> None:
    """D2, D4: the order whose webhook came is shipped and charged once; the one whose wait timed
    out is refunded and its stock released (the example asserts the rows); the duplicate webhook
    delivery is recorded once and published one event."""
    saga = await run(ship_engine)
    assert saga.outcomes == {"A-1": "shipped", "B-2": "cancelled"}
    assert sorted(saga.mailer.sent) == ["A-1: shipped", "B-2: cancelled"]
    async with ship_engine.connect() as connection:
        deliveries = (await connection.execute(select(webhook_events.c.event_id))).all()
        published = (await connection.execute(select(job_events.c.key))).all()
    assert [d.event_id for d in deliveries] == ["dlv_1"]
    assert [e.key for e in published] == ["A-1"]


@pytest.mark.timeout(120)
async def test_the_example_runs_as_a_script(ship_engine_url: str) -> None:
    """``python examples/order_saga.py`` (not only ``python -m``) finds its imports and exits 0
    on the server SHIP_SQLA_DATABASE_URL names."""
    env = {**os.environ, "SHIP_SQLA_DATABASE_URL": ship_engine_url, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(110):
        done = await anyio.run_process(
            [sys.executable, "examples/order_saga.py"], cwd=ROOT, env=env, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    assert "orders    : {'A-1': 'shipped', 'B-2': 'cancelled'}" in done.stdout.decode()
