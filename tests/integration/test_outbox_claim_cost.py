"""O2 claim cost: EXPLAIN (ANALYZE, BUFFERS) of a claim of 100 at backlogs of 1,000 and
1,000,000 pending rows. The claim must walk the partial indexes in order and touch about the
same number of buffers whatever the backlog. The completion of a batch (O3) reads only its
rows, by primary key, and so does the one batch settle (delivered, retrying, dead, released)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from seeded_template import SeedStep
from sqlalchemy import MetaData, Table
from sqlalchemy.ext.asyncio import AsyncEngine

from ship_sqla._outbox import ship_outbox_table
from ship_sqla._outbox._sql import build_statements

SMALL = 1_000
LARGE = 1_000_000
BATCH = 100


def _load_sql(table: Table, rows: int) -> str:
    # Server defaults fill id (gen_random_uuid) and the rest; one statement, no round trips.
    # A handful of lapsed claimed rows makes the lapsed-lease scan do real work as well.
    return f"""
        INSERT INTO {table.name} (outbox_id, topic, payload, state, attempts, max_attempts,
                                  available_at, created_at, lease_expires_at, lease_token)
        SELECT 'main', 'bench', '{{}}'::jsonb,
               CASE WHEN g <= 10 THEN 'claimed' ELSE 'pending' END,
               CASE WHEN g <= 10 THEN 1 ELSE 0 END,
               10,
               now() - interval '1 day' + g * interval '1 millisecond',
               now() - interval '1 day' + g * interval '1 millisecond',
               CASE WHEN g <= 10 THEN now() - interval '1 hour' END,
               CASE WHEN g <= 10 THEN gen_random_uuid() END
        FROM generate_series(1, {rows}) AS g
    """


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def _explain_claim(
    engine: AsyncEngine, table: Table, *, ordered: bool, generic: bool = False
) -> dict[str, Any]:
    statements = build_statements(table)
    statement = statements.claim_ordered if ordered else statements.claim
    params = {"outbox": "main", "batch_size": BATCH, "lease": 30.0, "worker": "w", "now": None}
    return await _explain(engine, statement, params, generic=generic)


async def _explain(
    engine: AsyncEngine, statement: Any, params: dict[str, Any], *, generic: bool = False
) -> dict[str, Any]:
    async with engine.connect() as connection:
        compiled = statement.compile(dialect=engine.dialect)
        values = compiled.construct_params(params)
        assert compiled.positiontup is not None
        args = [values[name] for name in compiled.positiontup]
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        transaction = driver.transaction()
        await transaction.start()
        try:  # EXPLAIN ANALYZE runs the UPDATE: roll it back
            if generic:  # what asyncpg's cached prepared statement may run after 5 executions
                await driver.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            value = await driver.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {compiled}", *args
            )
        finally:
            await transaction.rollback()
        plan: dict[str, Any] = (json.loads(value) if isinstance(value, str) else value)[0]
    return plan


metadata = MetaData()
small_table = ship_outbox_table(metadata, name="cost_small")
large_table = ship_outbox_table(metadata, name="cost_large")
SEED = SeedStep(
    name="outbox_claim_cost",
    metadata=metadata,
    statements=[_load_sql(small_table, SMALL), _load_sql(large_table, LARGE)],
)
"""The module's data set in the session's seeded template (tests/support/seeded_template.py):
the two backlogs, analyzed."""


def _buffers(plan: dict[str, Any]) -> int:
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def _describe(nodes: list[dict[str, Any]]) -> list[tuple[object, ...]]:
    return [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows")) for n in nodes]


def _check_shape(plan: dict[str, Any], table: Table, *, claimed: int, large: bool) -> None:
    nodes = _nodes(plan["Plan"])
    kinds = {n["Node Type"] for n in nodes}
    described = "\n".join(map(str, _describe(nodes)))
    # Both scans walk their partial index in order (a plain Index Scan, never a bitmap scan,
    # which loses the order and must then sort every due row).
    ordered_scans = {n.get("Index Name") for n in nodes if n["Node Type"] == "Index Scan"}
    assert {f"{table.name}_pending_idx", f"{table.name}_lease_idx"} <= ordered_scans, described
    assert "Sort" not in kinds, described
    # At 1,000 rows the planner may fetch the claimed rows by scanning the small heap instead of
    # primary-key probes (cheaper there); at 1,000,000 nothing may scan the table.
    if large:
        assert "Seq Scan" not in kinds, described
        assert "Bitmap Heap Scan" not in kinds, described
    assert plan["Plan"]["Actual Rows"] == claimed


async def test_claim_reads_about_batch_size_entries_whatever_the_backlog(seeded_engine):
    """O2: at 1,000 and 1,000,000 pending rows the claim of 100 walks <table>_lease_idx and
    <table>_pending_idx in order (no Seq Scan, no Sort of the backlog) and the shared buffers it
    touches at 1,000,000 are within 2x of those at 1,000."""
    ship_engine = seeded_engine
    small, large = small_table, large_table
    results = {}
    for label, table in (("1k", small), ("1M", large)):
        for ordered in (False, True):
            plan = await _explain_claim(ship_engine, table, ordered=ordered)
            _check_shape(plan, table, claimed=BATCH, large=label == "1M")
            results[label, ordered] = _buffers(plan)
            if ordered:
                indexes = {n.get("Index Name") for n in _nodes(plan["Plan"])}
                assert f"{table.name}_ordering_idx" in indexes
        generic = await _explain_claim(ship_engine, table, ordered=False, generic=True)
        _check_shape(generic, table, claimed=BATCH, large=label == "1M")
    for ordered in (False, True):
        small_buffers, large_buffers = results["1k", ordered], results["1M", ordered]
        assert large_buffers <= 2 * small_buffers, results
    print(f"claim of {BATCH}: shared buffers (1k, 1M, ordered?) = {results}")  # noqa: T201
    await _check_complete_cost(ship_engine, large)
    await _check_settle_cost(ship_engine, large)


async def _check_complete_cost(engine: AsyncEngine, table: Table) -> None:
    """O3: completing a batch of 100 current claims and 100 stale ones at 1,000,000 rows
    reads only those rows by primary key: the idempotency probe for pairs the update did not
    match (were they delivered under this token already?) never scans the table."""
    statements = build_statements(table)
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        claimed = (
            await connection.execute(
                statements.claim,
                {"outbox": "main", "batch_size": BATCH, "lease": 30.0, "worker": "w", "now": None},
            )
        ).all()
    stale = [(uuid.uuid4(), uuid.uuid4()) for _ in range(BATCH)]
    pairs = [(row.id, row.lease_token) for row in claimed] + stale
    params = {"ids": [i for i, _ in pairs], "tokens": [t for _, t in pairs], "now": None}
    for generic in (False, True):
        plan = await _explain(engine, statements.complete, params, generic=generic)
        nodes = _nodes(plan["Plan"])
        described = "\n".join(map(str, _describe(nodes)))
        assert "Seq Scan" not in {n["Node Type"] for n in nodes}, described
        assert f"{table.name}_pkey" in {n.get("Index Name") for n in nodes}, described
        assert plan["Plan"]["Actual Rows"] == BATCH, described  # the stale pairs come back


async def _check_settle_cost(engine: AsyncEngine, table: Table) -> None:
    """O3, O4: the one fenced batch settle of 100 current claims (each way a message settles)
    and 100 stale ones at 1,000,000 rows reads only those rows by primary key
    (``<outbox>_pkey``), and answers the stale pairs alone."""
    statements = build_statements(table)
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        claimed = (
            await connection.execute(
                statements.claim,
                {"outbox": "main", "batch_size": BATCH, "lease": 30.0, "worker": "w", "now": None},
            )
        ).all()
    stale = [(uuid.uuid4(), uuid.uuid4()) for _ in range(BATCH)]
    pairs = [(row.id, row.lease_token) for row in claimed] + stale
    kinds = ("delivered", "retrying", "dead", "released")
    params = {
        "ids": [i for i, _ in pairs],
        "tokens": [t for _, t in pairs],
        "settled_as": [kinds[n % 4] for n in range(len(pairs))],
        "delays": [1.0] * len(pairs),
        "release_ats": [None] * len(pairs),
        "errors": ["boom"] * len(pairs),
        "now": None,
    }
    for generic in (False, True):
        plan = await _explain(engine, statements.settle, params, generic=generic)
        nodes = _nodes(plan["Plan"])
        described = "\n".join(map(str, _describe(nodes)))
        assert "Seq Scan" not in {n["Node Type"] for n in nodes}, described
        assert f"{table.name}_pkey" in {n.get("Index Name") for n in nodes}, described
        assert plan["Plan"]["Actual Rows"] == BATCH, described  # the stale pairs come back
