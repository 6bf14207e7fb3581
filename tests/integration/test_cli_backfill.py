"""`ship-sqla backfill status|verify|start|cancel` driven as an operator would (C4, C5),
against a real database (the commands run in this process by click's runner). Exit codes: 0
ok, 1 failed (the deploy gate holds, or the operation was refused), 2 bad input."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from cli_runner import ship_sqla_in_process
from sqlalchemy import MetaData, text

from ship_sqla import ship_audit_table
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla.backfills import create_backfill_ledger, ship_backfills_table
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

COMMON = {"pace": 2.0, "stall_after": 60.0}


@pytest.fixture
async def ledger(ship_engine: AsyncEngine) -> Any:
    metadata = MetaData()
    ship_job_runs_table(metadata)
    ship_job_state_table(metadata)
    ship_audit_table(metadata)  # S1: start and cancel write their entries
    table = ship_backfills_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_backfill_ledger(database=ship_engine, table=table)


async def test_c5_verify_is_the_deploy_gate_naming_what_holds_it(
    ledger: Any, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """C5: ``backfill verify`` exits 0 while no required backfill is left, and 1 naming each
    required one that is pending, running or stalled (and an --id the ledger does not hold);
    once they complete it exits 0 again; ``status`` shows progress and stalled (C4)."""
    url = ("--database-url", ship_engine_url)
    assert (await ship_sqla_in_process("backfill", "verify", *url))[0] == 0
    await ledger.request("bf.users", required_by="0042_users", **COMMON)
    await ledger.request("bf.audit_only", **COMMON)  # not tied to a migration: no gate
    # A running one whose last progress is an hour old (its clock was then): stalled.
    past = create_backfill_ledger(
        database=ship_engine,
        table=ledger.table,
        clock=FrozenClock(ledger.clock.now() - timedelta(hours=1)),
    )
    await past.begin("bf.orders", run_id="r1", token=1, required_by="0043_orders", **COMMON)
    await past.checkpoint(
        "bf.orders", run_id="r1", token=1, pages_before=0, last_key=(500,), rows=500
    )

    code, out, err = await ship_sqla_in_process("backfill", "verify", *url)
    assert code == 1, (out, err)
    assert "bf.orders (stalled)" in err
    assert "bf.users (pending)" in err
    assert "bf.audit_only" not in err

    code, out, err = await ship_sqla_in_process(
        "backfill", "verify", "--required-by", "0042_users", "--id", "bf.nope", "--json", *url,
    )  # fmt: skip
    assert code == 1, err
    body = json.loads(out)
    assert body["ok"] is False
    assert [(b["id"], b["reason"]) for b in body["blocking"]] == [
        ("bf.users", "pending"),
        ("bf.nope", "unknown"),
    ]

    code, out, err = await ship_sqla_in_process("backfill", "status", "--json", *url)
    assert code == 0, err
    rows = {b["id"]: b for b in json.loads(out)["backfills"]}
    orders = rows["bf.orders"]
    assert (orders["state"], orders["status"], orders["pages"], orders["rows"]) == (
        "running",
        "stalled",
        1,
        500,
    )
    assert orders["last_key"] == [500]
    assert orders["stalled_since"] is not None
    assert rows["bf.users"]["status"] == "pending"

    for backfill_id in ("bf.users", "bf.orders"):
        record = await ledger.begin(backfill_id, run_id="r2", token=2, required_by="x", **COMMON)
        assert await ledger.finish(backfill_id, run_id="r2", token=2, state="completed")
        assert record is not None
    code, out, err = await ship_sqla_in_process("backfill", "verify", *url)
    assert code == 0, (out, err)
    assert "every required backfill is completed" in out
    code, out, _ = await ship_sqla_in_process("backfill", "status", *url)
    assert "bf.orders  completed  pages 1  rows 500" in out


async def test_c4_start_enqueues_once_and_cancel_is_an_audited_operator_action(
    ledger: Any, ship_engine: AsyncEngine, ship_engine_url: str
) -> None:
    """C4, S1: ``backfill start ID`` records the backfill pending and enqueues one run of its
    job (a second start adds none: its dedupe key); ``backfill cancel ID`` cancels it; both
    write their audit entry; a cancel of an unknown backfill is exit 1."""
    url = ("--database-url", ship_engine_url)
    code, out, err = await ship_sqla_in_process("backfill", "start", "bf.users", *url)
    assert code == 0, err
    assert "bf.users started" in out
    code, out, err = await ship_sqla_in_process("backfill", "start", "bf.users", *url)
    assert code == 0, err
    assert "has a live run already" in out
    async with ship_engine.connect() as connection:
        runs = (
            await connection.execute(
                text("SELECT job_id, state, dedupe_key, key FROM ship_job_runs")
            )
        ).all()
    assert [tuple(r) for r in runs] == [("bf.users", "waiting", "backfill:bf.users", "")]
    assert (await ledger.get("bf.users")).state == "pending"

    code, out, err = await ship_sqla_in_process("backfill", "cancel", "bf.users", *url)
    assert code == 0, err
    assert "cancelled after 0 pages" in out
    assert (await ledger.get("bf.users")).state == "cancelled"
    code, out, err = await ship_sqla_in_process("backfill", "cancel", "bf.users", *url)
    assert code == 0, err
    assert "nothing changed" in out
    code, out, err = await ship_sqla_in_process("backfill", "cancel", "bf.nope", *url)
    assert code == 1
    assert "SHIP_SQLA_BACKFILL_REFUSED" in err

    async with ship_engine.connect() as connection:
        entries = (
            await connection.execute(text("SELECT operation, target FROM ship_audit ORDER BY id"))
        ).all()
    assert [tuple(e) for e in entries] == [
        ("backfills.start", "bf.users"),
        ("backfills.start", "bf.users"),
        ("backfills.cancel", "bf.users"),
    ]
